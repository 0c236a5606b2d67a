//! The journal: every input the lock table processed and every output it gave, in order.
//!
//! Turned on with [`RegistryBuilder::journal`](crate::RegistryBuilder::journal) and read with
//! [`LockRegistry::journal`](crate::LockRegistry::journal). Because the table is a pure state
//! machine, the inputs of a complete journal determine its outputs: [`replay`](crate::replay)
//! feeds them to a fresh table and checks that the same grants and fencing tokens come out.
//!
//! Waiters are named by their [`WaiterId`], shown `w17` for the table's 17th acquirer. The
//! table numbers acquirers in order of arrival, so a replay of the same inputs reproduces the
//! same ids.

use std::hash::Hash;
use std::time::Duration;

use crate::pure::table::WaiterError;
pub use crate::pure::table::WaiterId;

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

/// Why the table refused a release or a cancel, changing nothing.
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
    pub(crate) fn of(error: WaiterError) -> Self {
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
