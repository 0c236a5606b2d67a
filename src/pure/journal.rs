//! The journal: every input the lock table processed and every output it gave, in order.
//!
//! Turned on with [`RegistryBuilder::journal`](crate::RegistryBuilder::journal) and read with
//! [`LockRegistry::journal`](crate::LockRegistry::journal). Because the table is a pure state
//! machine, the inputs of a complete journal determine its outputs: [`replay`](crate::replay)
//! feeds them to a fresh table and checks that the same grants and fencing tokens come out.
//!
//! [`JournaledTable`] is the one place where recording happens: it wraps a
//! [`LockTable`], forwards each call, and records the call and its
//! result when a journal is on. The registry actor and the replayer both use it, so what is
//! recorded in production and what is recomputed in a replay come from the same code.
//!
//! Waiters are named by their [`WaiterId`], shown `w17` for the table's 17th acquirer. The
//! table numbers acquirers in order of arrival, so a replay of the same inputs reproduces the
//! same ids.

use std::collections::VecDeque;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use std::num::NonZeroU32;

use crate::pure::table::{
    Acquired, Grant, KeySet, LockTable, Permits, WaiterError, WaiterId, WouldBlock,
};

/// One thing the table saw (an input) or did (an output), or a note from a layer above it.
///
/// With the `serde` feature it is `Serialize` and `Deserialize`, in `snake_case` (the
/// variant's name as the tag, its fields inside: `{"grant":{"waiter":1,"fencing_token":1}}`);
/// [`trace`](crate::trace) writes journals as JSON Lines that way.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case", deny_unknown_fields)
)]
#[non_exhaustive]
pub enum JournalEvent<K> {
    /// Input: `waiter` asked for `permits` of `key`'s permits and waits until they are free.
    /// An exclusive lock asks for all of them (the table's capacity), a shared lock for 1.
    Acquire {
        /// The id the table gave the new acquirer.
        waiter: WaiterId,
        /// The key asked for.
        key: K,
        /// The permits asked for.
        permits: u32,
    },
    /// Input: someone asked for `permits` of `key`'s permits only if they are free now. The
    /// table names the acquirer only if it grants them, in the `Grant` that follows.
    TryAcquire {
        /// The key asked for.
        key: K,
        /// The permits asked for.
        permits: u32,
    },
    /// Input: `waiter` asked for every key of `keys` exclusively, all at once (two or more
    /// keys, each once; a set of one key is recorded as [`Acquire`](Self::Acquire)).
    AcquireAll {
        /// The id the table gave the new acquirer.
        waiter: WaiterId,
        /// The keys asked for, in the order given, duplicates removed.
        keys: Vec<K>,
    },
    /// Input: someone asked for every key of `keys` exclusively, only if all are free now.
    TryAcquireAll {
        /// The keys asked for, in the order given, duplicates removed.
        keys: Vec<K>,
    },
    /// Input: the table was made with `permits` per key. Recorded first, and only when a key
    /// has more than one permit, so that a replay makes the same table.
    Capacity {
        /// The permits of each key.
        permits: u32,
    },
    /// Input: the holder `waiter` released its key.
    Release {
        /// The releasing holder.
        waiter: WaiterId,
    },
    /// Input: the queued `waiter` gave up.
    Cancel {
        /// The waiter withdrawn.
        waiter: WaiterId,
    },
    /// Input: the registry shut down.
    Shutdown,
    /// Output: `waiter` now holds its key under `fencing_token`.
    Grant {
        /// The new holder.
        waiter: WaiterId,
        /// Its fencing token.
        fencing_token: u64,
    },
    /// Output: the try-acquire just before found its key taken; nothing changed.
    WouldBlock {
        /// The key that was taken.
        key: K,
    },
    /// Output: the [`TryAcquireAll`](Self::TryAcquireAll) just before found one of its keys
    /// taken or awaited; nothing changed.
    WouldBlockAll,
    /// Output: `waiter` was still queued at shutdown and was told the registry closed.
    Closed {
        /// The closed-out waiter.
        waiter: WaiterId,
    },
    /// Output: the table refused a release or cancel and changed nothing.
    Refused {
        /// The waiter the refused call named.
        waiter: WaiterId,
        /// Why.
        reason: Refusal,
    },
    /// A note, neither input nor output of the table: text that a layer above the table
    /// recorded in order with the table's events (cluster mode notes what it did with each
    /// key's lease). The table does not know what it means; a replay copies it as it is.
    Note {
        /// What the layer above recorded.
        text: String,
    },
}

impl<K> JournalEvent<K> {
    /// Whether this is a [`Note`](JournalEvent::Note): recorded in order with the table's
    /// events, but neither an input nor an output of the table.
    pub fn is_note(&self) -> bool {
        matches!(self, JournalEvent::Note { .. })
    }

    /// Whether this is an input to the table (as opposed to an output it produced).
    pub fn is_input(&self) -> bool {
        matches!(
            self,
            JournalEvent::Acquire { .. }
                | JournalEvent::TryAcquire { .. }
                | JournalEvent::AcquireAll { .. }
                | JournalEvent::TryAcquireAll { .. }
                | JournalEvent::Capacity { .. }
                | JournalEvent::Release { .. }
                | JournalEvent::Cancel { .. }
                | JournalEvent::Shutdown
        )
    }
}

/// Why the table refused a release or a cancel (see [`WaiterError`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Refusal {
    /// No such waiter (never issued, or already gone).
    Unknown,
    /// A release of a waiter that does not hold its key.
    NotHolding,
    /// A cancel of a waiter that already holds its key.
    NotWaiting,
}

impl Refusal {
    fn of(error: WaiterError) -> Self {
        match error {
            WaiterError::NotHolding(_) => Refusal::NotHolding,
            WaiterError::NotWaiting(_) => Refusal::NotWaiting,
            // `WaiterError` may grow; anything else means the table did not know the waiter.
            _ => Refusal::Unknown,
        }
    }
}

/// One journal line: a sequence number, the time since the registry started, and the event.
///
/// With the `serde` feature the time is written as whole nanoseconds, `at_ns`, so that it
/// round-trips exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct JournalEntry<K> {
    /// 1 for the first event the registry recorded, then one more for each event. Numbers keep
    /// counting when old entries are dropped from a full journal.
    pub seq: u64,
    /// Time since the registry started, by tokio's clock (so paused time in tests gives
    /// identical journals).
    #[cfg_attr(feature = "serde", serde(rename = "at_ns", with = "nanoseconds"))]
    pub at: Duration,
    /// What happened.
    pub event: JournalEvent<K>,
}

/// A snapshot of a registry's journal.
///
/// With the `serde` feature, [`trace`](crate::trace) writes it as JSON Lines and reads it
/// back.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct Journal<K> {
    /// The retained entries, oldest first.
    pub entries: Vec<JournalEntry<K>>,
    /// How many of the oldest entries were dropped because the journal was full. A journal
    /// with dropped entries shows what happened lately, but cannot be replayed.
    pub dropped: u64,
}

/// `at` as whole nanoseconds: exact, unlike seconds as a float, and one plain number.
#[cfg(feature = "serde")]
mod nanoseconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    const PER_SECOND: u128 = 1_000_000_000;

    pub(super) fn serialize<S: Serializer>(
        at: &Duration,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_u128(at.as_nanos())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Duration, D::Error> {
        let nanoseconds = u128::deserialize(deserializer)?;
        let seconds = u64::try_from(nanoseconds / PER_SECOND)
            .map_err(|_| D::Error::custom("at_ns is beyond the longest time a Duration holds"))?;
        // The remainder is below 10^9, so it fits.
        let subsec = (nanoseconds % PER_SECOND) as u32;
        Ok(Duration::new(seconds, subsec))
    }
}

impl<K> Default for Journal<K> {
    fn default() -> Self {
        Journal {
            entries: Vec::new(),
            dropped: 0,
        }
    }
}

/// The bounded ring the events go into.
#[derive(Debug)]
struct Ring<K> {
    entries: VecDeque<JournalEntry<K>>,
    capacity: usize,
    dropped: u64,
    next_seq: u64,
    now: Duration,
}

impl<K: Clone> Ring<K> {
    fn push(&mut self, event: JournalEvent<K>) {
        if self.capacity == 0 {
            self.dropped += 1;
        } else {
            if self.entries.len() == self.capacity {
                self.entries.pop_front();
                self.dropped += 1;
            }
            self.entries.push_back(JournalEntry {
                seq: self.next_seq,
                at: self.now,
                event,
            });
        }
        self.next_seq += 1;
    }
}

/// A [`LockTable`] that records its calls into a journal when one is on.
///
/// Each method forwards to the table method of the same name and returns its result
/// unchanged. With the journal off, the only cost is one branch per call.
pub struct JournaledTable<K, D> {
    table: LockTable<K, D>,
    ring: Option<Ring<K>>,
}

impl<K, D> JournaledTable<K, D>
where
    K: Hash + Eq + Clone,
{
    /// A fresh table that records nothing.
    pub fn new() -> Self {
        JournaledTable {
            table: LockTable::new(),
            ring: None,
        }
    }

    /// A fresh table that keeps the last `capacity` events.
    pub fn with_journal(capacity: usize) -> Self {
        Self::for_permits(NonZeroU32::MIN, Some(capacity))
    }

    /// A fresh table with `permits_per_key` permits per key
    /// ([`LockTable::with_capacity`]), keeping the last `journal_capacity` events if `Some`.
    /// A journal of a table with more than one permit per key starts with a
    /// [`Capacity`](JournalEvent::Capacity) event.
    pub fn for_permits(permits_per_key: NonZeroU32, journal_capacity: Option<usize>) -> Self {
        let ring = journal_capacity.map(|capacity| Ring {
            entries: VecDeque::with_capacity(capacity.min(4096)),
            capacity,
            dropped: 0,
            next_seq: 1,
            now: Duration::ZERO,
        });
        let mut table = JournaledTable {
            table: LockTable::with_capacity(permits_per_key),
            ring,
        };
        if permits_per_key.get() > 1
            && let Some(ring) = &mut table.ring
        {
            ring.push(JournalEvent::Capacity {
                permits: permits_per_key.get(),
            });
        }
        table
    }

    /// Whether calls are being recorded.
    pub fn is_journaling(&self) -> bool {
        self.ring.is_some()
    }

    /// Sets the time stamped on the events recorded from now on, truncated to whole
    /// microseconds. The table itself never reads a clock: the caller passes time in.
    pub fn set_time(&mut self, since_start: Duration) {
        if let Some(ring) = &mut self.ring {
            // Microseconds are all a timeline shows; whole ones keep a trace's times short
            // (`"at_ns":4113000`) and journals of one run comparable with a replay's.
            ring.now = Duration::new(since_start.as_secs(), since_start.subsec_micros() * 1_000);
        }
    }

    /// The wrapped table, for reading.
    pub fn table(&self) -> &LockTable<K, D> {
        &self.table
    }

    /// [`LockTable::delivery_mut`]: not recorded, since deliveries are not part of the
    /// journal.
    pub fn delivery_mut(&mut self, waiter_id: WaiterId) -> Option<&mut D> {
        self.table.delivery_mut(waiter_id)
    }

    /// A copy of the journal so far (empty if the journal is off).
    pub fn journal(&self) -> Journal<K> {
        match &self.ring {
            Some(ring) => Journal {
                entries: ring.entries.iter().cloned().collect(),
                dropped: ring.dropped,
            },
            None => Journal::default(),
        }
    }

    /// Records a [`Note`](JournalEvent::Note) with `text` in order with the table's events;
    /// the table itself does not change.
    pub fn note(&mut self, text: String) {
        if let Some(ring) = &mut self.ring {
            ring.push(JournalEvent::Note { text });
        }
    }

    /// [`LockTable::acquire_permits`], recorded. An exclusive lock asks for
    /// [`LockTable::all_permits`], and is recorded with that count like any other.
    #[inline]
    pub fn acquire(&mut self, key: K, permits: Permits, delivery: D) -> Acquired<D> {
        if self.ring.is_none() {
            return self.table.acquire_permits(key, permits, delivery);
        }
        self.acquire_recorded(key, permits, delivery)
    }

    /// [`Self::acquire`] with the journal on: out of line, so that the path without one
    /// inlines into its caller.
    #[inline(never)]
    fn acquire_recorded(&mut self, key: K, permits: Permits, delivery: D) -> Acquired<D> {
        let Some(ring) = &mut self.ring else {
            return self.table.acquire_permits(key, permits, delivery);
        };
        let recorded_key = key.clone();
        let acquired = self.table.acquire_permits(key, permits, delivery);
        let waiter = match &acquired {
            Acquired::Granted(grant) => grant.waiter_id,
            Acquired::Queued(waiter_id) => *waiter_id,
        };
        ring.push(JournalEvent::Acquire {
            waiter,
            key: recorded_key,
            permits: permits.get(),
        });
        if let Acquired::Granted(grant) = &acquired {
            ring.push(grant_event(grant));
        }
        acquired
    }

    /// [`LockTable::try_acquire_permits`], recorded.
    pub fn try_acquire(&mut self, key: K, permits: Permits) -> Result<Grant<()>, WouldBlock> {
        let Some(ring) = &mut self.ring else {
            return self.table.try_acquire_permits(key, permits);
        };
        ring.push(JournalEvent::TryAcquire {
            key: key.clone(),
            permits: permits.get(),
        });
        let result = self.table.try_acquire_permits(key.clone(), permits);
        ring.push(match &result {
            Ok(grant) => grant_event(grant),
            Err(WouldBlock) => JournalEvent::WouldBlock { key },
        });
        result
    }

    /// [`LockTable::acquire_all`], recorded: as [`Acquire`](JournalEvent::Acquire) of every
    /// permit for a set of one key, as [`AcquireAll`](JournalEvent::AcquireAll) otherwise.
    pub fn acquire_all(&mut self, keys: KeySet<K>, delivery: D) -> Acquired<D> {
        let keys = match keys.into_single() {
            Ok(key) => {
                let every_permit = self.table.all_permits();
                return self.acquire(key, every_permit, delivery);
            }
            Err(keys) => keys,
        };
        let Some(ring) = &mut self.ring else {
            return self.table.acquire_all(keys, delivery);
        };
        let recorded_keys = keys.as_slice().to_vec();
        let acquired = self.table.acquire_all(keys, delivery);
        let waiter = match &acquired {
            Acquired::Granted(grant) => grant.waiter_id,
            Acquired::Queued(waiter_id) => *waiter_id,
        };
        ring.push(JournalEvent::AcquireAll {
            waiter,
            keys: recorded_keys,
        });
        if let Acquired::Granted(grant) = &acquired {
            ring.push(grant_event(grant));
        }
        acquired
    }

    /// [`LockTable::try_acquire_all`], recorded: as [`TryAcquire`](JournalEvent::TryAcquire)
    /// of every permit for a set of one key, as [`TryAcquireAll`](JournalEvent::TryAcquireAll) otherwise.
    pub fn try_acquire_all(&mut self, keys: KeySet<K>) -> Result<Grant<()>, WouldBlock> {
        let keys = match keys.into_single() {
            Ok(key) => {
                let every_permit = self.table.all_permits();
                return self.try_acquire(key, every_permit);
            }
            Err(keys) => keys,
        };
        let Some(ring) = &mut self.ring else {
            return self.table.try_acquire_all(keys);
        };
        ring.push(JournalEvent::TryAcquireAll {
            keys: keys.as_slice().to_vec(),
        });
        let result = self.table.try_acquire_all(keys);
        ring.push(match &result {
            Ok(grant) => grant_event(grant),
            Err(WouldBlock) => JournalEvent::WouldBlockAll,
        });
        result
    }

    /// [`LockTable::release`], recorded with the grant it causes.
    ///
    /// # Errors
    ///
    /// As [`LockTable::release`].
    #[inline]
    pub fn release(
        &mut self,
        waiter_id: WaiterId,
        granted: &mut Vec<Grant<D>>,
    ) -> Result<K, WaiterError> {
        if self.ring.is_none() {
            return self.table.release(waiter_id, granted);
        }
        self.release_recorded(waiter_id, granted)
    }

    /// [`Self::release`] with the journal on: out of line, so that the path without one
    /// inlines into its caller.
    #[inline(never)]
    fn release_recorded(
        &mut self,
        waiter_id: WaiterId,
        granted: &mut Vec<Grant<D>>,
    ) -> Result<K, WaiterError> {
        let Some(ring) = &mut self.ring else {
            return self.table.release(waiter_id, granted);
        };
        let already_granted = granted.len();
        let result = self.table.release(waiter_id, granted);
        ring.push(JournalEvent::Release { waiter: waiter_id });
        match &result {
            Ok(_) => granted[already_granted..]
                .iter()
                .for_each(|grant| ring.push(grant_event(grant))),
            Err(error) => ring.push(refused(waiter_id, *error)),
        }
        result
    }

    /// [`LockTable::cancel`], recorded with the grants it causes.
    ///
    /// # Errors
    ///
    /// As [`LockTable::cancel`].
    pub fn cancel(
        &mut self,
        waiter_id: WaiterId,
        granted: &mut Vec<Grant<D>>,
    ) -> Result<(K, D), WaiterError> {
        let Some(ring) = &mut self.ring else {
            return self.table.cancel(waiter_id, granted);
        };
        let already_granted = granted.len();
        let result = self.table.cancel(waiter_id, granted);
        ring.push(JournalEvent::Cancel { waiter: waiter_id });
        match &result {
            Ok(_) => granted[already_granted..]
                .iter()
                .for_each(|grant| ring.push(grant_event(grant))),
            Err(error) => ring.push(refused(waiter_id, *error)),
        }
        result
    }

    /// [`LockTable::shutdown`], recorded with a `Closed` event per waiter, in the order
    /// returned.
    pub fn shutdown(&mut self) -> Vec<(WaiterId, D)> {
        let waiters = self.table.shutdown();
        if let Some(ring) = &mut self.ring {
            ring.push(JournalEvent::Shutdown);
            for (waiter, _) in &waiters {
                ring.push(JournalEvent::Closed { waiter: *waiter });
            }
        }
        waiters
    }
}

impl<K, D> Default for JournaledTable<K, D>
where
    K: Hash + Eq + Clone,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<K: fmt::Debug, D> fmt::Debug for JournaledTable<K, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JournaledTable")
            .field("table", &self.table)
            .field("journaling", &self.ring.is_some())
            .finish()
    }
}

fn grant_event<K, D>(grant: &Grant<D>) -> JournalEvent<K> {
    JournalEvent::Grant {
        waiter: grant.waiter_id,
        fencing_token: grant.fencing_token,
    }
}

fn refused<K>(waiter: WaiterId, error: WaiterError) -> JournalEvent<K> {
    JournalEvent::Refused {
        waiter,
        reason: Refusal::of(error),
    }
}
