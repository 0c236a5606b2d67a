//! Replay: recompute a journal's outputs from its inputs and find where they differ.
//!
//! The lock table is a pure state machine and hands out waiter ids deterministically, so the
//! inputs of a complete journal (acquire, try_acquire, release, cancel, shutdown) fully
//! determine its outputs (grants with their waiters and fencing tokens, would-blocks, closes,
//! refusals). [`replay`] feeds the inputs, in order, to a fresh table and returns everything
//! that table records; [`first_divergence`] compares that with the recorded journal, and
//! [`verify`] does both.
//!
//! A divergence means the journal is not what this version of the table would have recorded:
//! the trace was edited, it comes from a different version of the crate, or the table is not
//! deterministic (a bug). Replay never panics, whatever the journal says: an input that makes
//! no sense (the release of a waiter that never held, an id the table never issued) is fed to
//! the table like any other, the table refuses it, and the comparison reports the difference.
//!
//! ```
//! use keyed_locks::replay::verify;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = keyed_locks::LockRegistry::builder().journal(1_000).spawn();
//! let first = registry.lock("k").await?;
//! let second = tokio::spawn({
//!     let registry = registry.clone();
//!     async move { registry.lock("k").await.map(drop) }
//! });
//! drop(first);
//! second.await??;
//!
//! verify(&registry.journal().await?)?; // same grants, same fencing tokens
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::hash::Hash;
use std::num::NonZeroU32;

use crate::pure::journal::{Journal, JournalEntry, JournalEvent};
use crate::pure::journaled_table::JournaledTable;
use crate::pure::table::KeySet;

/// Why a journal could not be replayed at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplayError {
    /// The journal lost its oldest events to its capacity, so the state the remaining ones
    /// start from is unknown.
    Incomplete {
        /// How many events were dropped.
        dropped: u64,
    },
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Incomplete { dropped } => write!(
                f,
                "the journal dropped its {dropped} oldest events and cannot be replayed \
                 (record with a larger journal capacity)"
            ),
        }
    }
}

impl std::error::Error for ReplayError {}

/// The first place where a replay differs from the recorded journal.
///
/// Sequence numbers and events are compared; times are not, since a replay copies each
/// input's time from the recording.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Divergence<K> {
    /// The sequence number of the first differing entry (the recorded one's if both exist).
    pub seq: u64,
    /// The recorded entry; `None` if the recording ends where the replay goes on.
    pub expected: Option<JournalEntry<K>>,
    /// The replayed entry; `None` if the replay ends where the recording goes on.
    pub got: Option<JournalEntry<K>>,
}

impl<K: fmt::Debug> fmt::Display for Divergence<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "replay diverges at seq {}: expected {}, got {}",
            self.seq,
            ShownEntry(self.expected.as_ref(), "the end of the journal"),
            ShownEntry(self.got.as_ref(), "the end of the replay"),
        )
    }
}

/// Why [`verify`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum VerifyError<K> {
    /// The journal cannot be replayed.
    Replay(ReplayError),
    /// The replay gave different outputs.
    Diverged(Divergence<K>),
}

impl<K: fmt::Debug> fmt::Display for VerifyError<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerifyError::Replay(error) => error.fmt(f),
            VerifyError::Diverged(divergence) => divergence.fmt(f),
        }
    }
}

impl<K: fmt::Debug> std::error::Error for VerifyError<K> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            VerifyError::Replay(error) => Some(error),
            VerifyError::Diverged(_) => None,
        }
    }
}

impl<K> From<ReplayError> for VerifyError<K> {
    fn from(error: ReplayError) -> Self {
        VerifyError::Replay(error)
    }
}

/// Feeds the inputs of `journal`, in order and at their recorded times, to a fresh table and
/// returns every event that table records: the inputs (with the waiter ids it hands out) and
/// the outputs they cause. The recorded outputs are ignored.
///
/// # Errors
///
/// [`ReplayError::Incomplete`] if the journal dropped events (`dropped > 0`).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// use keyed_locks::journal::{Journal, JournalEntry, JournalEvent};
/// use keyed_locks::replay::replay;
/// use keyed_locks::journal::WaiterId;
///
/// // Only the inputs matter: the grant is recomputed.
/// let acquire = JournalEvent::Acquire { waiter: WaiterId::new(1).unwrap(), key: 7u8, permits: 1 };
/// let journal = Journal {
///     entries: vec![JournalEntry { seq: 1, at: Duration::ZERO, event: acquire }],
///     dropped: 0,
/// };
/// let replayed = replay(&journal).unwrap();
/// assert!(matches!(replayed[1].event, JournalEvent::Grant { fencing_token: 1, .. }));
/// ```
pub fn replay<K>(journal: &Journal<K>) -> Result<Vec<JournalEntry<K>>, ReplayError>
where
    K: Hash + Eq + Clone,
{
    if journal.dropped > 0 {
        return Err(ReplayError::Incomplete {
            dropped: journal.dropped,
        });
    }
    // The table's permits per key: a journal that starts with `Capacity` says so, and a table
    // made with more than one permit records that event itself.
    let permits_per_key = match journal.entries.first().map(|entry| &entry.event) {
        Some(JournalEvent::Capacity { permits }) => NonZeroU32::new(*permits),
        _ => None,
    };
    let mut table = JournaledTable::<K, ()>::for_permits(
        permits_per_key.unwrap_or(NonZeroU32::MIN),
        Some(usize::MAX),
    );
    let mut granted = Vec::new();
    let recorded_by_the_table = permits_per_key.is_some_and(|permits| permits.get() > 1);
    for entry in journal
        .entries
        .iter()
        .skip(usize::from(recorded_by_the_table))
        .filter(|entry| entry.event.is_input() || entry.event.is_note())
    {
        table.set_time(entry.at);
        // Results are ignored: the journaled table records them, refusals included, and the
        // comparison is what judges them.
        match &entry.event {
            // The recorded id is not passed in: the table picks ids itself, and a replay that
            // picks another one shows up as a divergence on this very event. A count the table
            // cannot take (an edited trace) is not fed: the replay then lacks this event, and
            // the comparison reports it.
            JournalEvent::Acquire { key, permits, .. } => {
                if let Ok(permits) = table.table().permits(*permits) {
                    let _ = table.acquire(key.clone(), permits, ());
                }
            }
            JournalEvent::TryAcquire { key, permits } => {
                if let Ok(permits) = table.table().permits(*permits) {
                    let _ = table.try_acquire(key.clone(), permits);
                }
            }
            // An empty set (an edited trace) is not fed either; duplicates are removed as the
            // table removes them, so the comparison shows an edited set.
            JournalEvent::AcquireAll { keys, .. } => {
                if let Some(keys) = KeySet::new(keys.iter().cloned()) {
                    let _ = table.acquire_all(keys, ());
                }
            }
            JournalEvent::TryAcquireAll { keys } => {
                if let Some(keys) = KeySet::new(keys.iter().cloned()) {
                    let _ = table.try_acquire_all(keys);
                }
            }
            // Anywhere but first (handled above), a capacity cannot be replayed: the table
            // exists already. Not fed, so the comparison reports it.
            JournalEvent::Capacity { .. } => {}
            JournalEvent::Release { waiter } => {
                granted.clear();
                let _ = table.release(*waiter, &mut granted);
            }
            JournalEvent::Cancel { waiter } => {
                granted.clear();
                let _ = table.cancel(*waiter, &mut granted);
            }
            JournalEvent::Shutdown => {
                let _ = table.shutdown();
            }
            JournalEvent::Note { text } => table.note(text.clone()),
            JournalEvent::Grant { .. }
            | JournalEvent::WouldBlock { .. }
            | JournalEvent::WouldBlockAll
            | JournalEvent::Closed { .. }
            | JournalEvent::Refused { .. } => {}
        }
    }
    Ok(table.journal().entries)
}

/// The first entry where `replayed` differs from `recorded` in sequence number or event, or
/// where one of them ends before the other; `None` if they agree.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// use keyed_locks::journal::{Journal, JournalEntry, JournalEvent};
/// use keyed_locks::replay::{first_divergence, replay};
/// use keyed_locks::journal::WaiterId;
///
/// let events = [
///     JournalEvent::TryAcquire { key: "k", permits: 1 },
///     JournalEvent::Grant { waiter: WaiterId::new(1).unwrap(), fencing_token: 9 },
/// ];
/// let entries = (1..).zip(events).map(|(seq, event)| JournalEntry { seq, at: Duration::ZERO, event });
/// let recorded = Journal { entries: entries.collect(), dropped: 0 };
/// let replayed = replay(&recorded).unwrap();
/// let divergence = first_divergence(&recorded.entries, &replayed).unwrap();
/// assert_eq!(divergence.seq, 2); // a fresh table's first token is 1, not 9
/// ```
pub fn first_divergence<K>(
    recorded: &[JournalEntry<K>],
    replayed: &[JournalEntry<K>],
) -> Option<Divergence<K>>
where
    K: PartialEq + Clone,
{
    let mut recorded_entries = recorded.iter();
    let mut replayed_entries = replayed.iter();
    loop {
        match (recorded_entries.next(), replayed_entries.next()) {
            (None, None) => return None,
            (Some(expected), Some(got))
                if expected.seq == got.seq && expected.event == got.event => {}
            (expected, got) => {
                let seq = expected.or(got).map_or(0, |entry| entry.seq);
                return Some(Divergence {
                    seq,
                    expected: expected.cloned(),
                    got: got.cloned(),
                });
            }
        }
    }
}

/// Replays `journal` and checks that the replay records exactly the same events.
///
/// # Errors
///
/// [`VerifyError::Replay`] if the journal cannot be replayed (it dropped events),
/// [`VerifyError::Diverged`] with the first difference otherwise.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// use keyed_locks::journal::{Journal, JournalEntry, JournalEvent, Refusal};
/// use keyed_locks::replay::{VerifyError, verify};
/// use keyed_locks::journal::WaiterId;
///
/// let (w1, w2) = (WaiterId::new(1).unwrap(), WaiterId::new(2).unwrap());
/// let events = [
///     JournalEvent::Acquire { waiter: w1, key: "k", permits: 1 },
///     JournalEvent::Grant { waiter: w1, fencing_token: 1 },
///     JournalEvent::Release { waiter: w2 },
///     JournalEvent::Grant { waiter: w2, fencing_token: 2 },
/// ];
/// let entries = (1..).zip(events).map(|(seq, event)| JournalEntry { seq, at: Duration::ZERO, event });
/// let journal = Journal { entries: entries.collect(), dropped: 0 };
/// let Err(VerifyError::Diverged(divergence)) = verify(&journal) else { panic!() };
/// assert_eq!(divergence.seq, 4);
/// assert_eq!(
///     divergence.got.as_ref().map(|entry| &entry.event),
///     Some(&JournalEvent::Refused { waiter: w2, reason: Refusal::Unknown })
/// );
/// assert_eq!(
///     divergence.to_string(),
///     "replay diverges at seq 4: expected `4 +0ns Grant { waiter: w2, fencing_token: 2 }`, \
///      got `4 +0ns Refused { waiter: w2, reason: Unknown }`"
/// );
/// ```
pub fn verify<K>(journal: &Journal<K>) -> Result<(), VerifyError<K>>
where
    K: Hash + Eq + Clone,
{
    let replayed = replay(journal)?;
    match first_divergence(&journal.entries, &replayed) {
        None => Ok(()),
        Some(divergence) => Err(VerifyError::Diverged(divergence)),
    }
}

/// An entry shown as its sequence number, its time and its event's `Debug`, in backquotes,
/// or the given words if there is no entry.
struct ShownEntry<'a, K>(Option<&'a JournalEntry<K>>, &'static str);

impl<K: fmt::Debug> fmt::Display for ShownEntry<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(entry) => write!(f, "`{} +{:?} {:?}`", entry.seq, entry.at, entry.event),
            None => f.write_str(self.1),
        }
    }
}
