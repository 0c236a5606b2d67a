//! [`JournaledTable`]: the one place where recording happens.
//!
//! It wraps a [`LockTable`], forwards each call, and records the call and its result into a
//! bounded ring when a journal is on. The shard's owner and the replayer both use it, so what
//! is recorded in production and what is recomputed in a replay come from the same code.

use std::collections::VecDeque;
use std::fmt;
use std::hash::Hash;
use std::num::NonZeroU32;
use std::time::Duration;

use crate::pure::journal::{Journal, JournalEntry, JournalEvent, Refusal};
use crate::pure::snapshot::KeySnapshot;
use crate::pure::table::{
    Acquired, Grant, KeySet, LockTable, Permits, WaiterError, WaiterId, WouldBlock,
};

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
    /// Records a release or a cancel of `waiter`: the input, then the grants it caused, or
    /// the refusal.
    fn push_step<D>(
        &mut self,
        input: JournalEvent<K>,
        waiter: WaiterId,
        outcome: Result<&[Grant<D>], &WaiterError>,
    ) {
        self.push(input);
        match outcome {
            Ok(grants) => grants
                .iter()
                .for_each(|grant| self.push(grant_event(grant))),
            Err(error) => self.push(refused(waiter, *error)),
        }
    }

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
    #[cfg(any(test, feature = "unstable-table"))]
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

    /// [`LockTable::mark_time`]: not recorded, since a time mark changes no lock.
    pub fn mark_time(&mut self, now: Duration) {
        self.table.mark_time(now);
    }

    /// [`LockTable::snapshot`]: not recorded, since a view changes no lock.
    pub fn snapshot(&mut self, now: Duration, limit: Option<usize>) -> Vec<KeySnapshot<K>> {
        self.table.snapshot(now, limit)
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
        let outcome = result.as_ref().map(|_| &granted[already_granted..]);
        ring.push_step(
            JournalEvent::Release { waiter: waiter_id },
            waiter_id,
            outcome,
        );
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
        let outcome = result.as_ref().map(|_| &granted[already_granted..]);
        ring.push_step(
            JournalEvent::Cancel { waiter: waiter_id },
            waiter_id,
            outcome,
        );
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
