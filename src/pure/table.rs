//! The pure lock table: every rule of the crate as a synchronous state machine.
//!
//! [`LockTable`] knows nothing of tokio, channels or clocks. It maps each key to an entry
//! (holder count, live waiter count, FIFO queue of waiter ids) and keeps one record per
//! acquirer, found by its [`WaiterId`] in O(1), so a waiter can be cancelled or released
//! without a search. The table numbers acquirers in order of arrival, so the same inputs always
//! give the same ids. Its inputs are [`acquire`](LockTable::acquire),
//! [`try_acquire`](LockTable::try_acquire), [`release`](LockTable::release),
//! [`cancel`](LockTable::cancel) and [`shutdown`](LockTable::shutdown); its outputs are the
//! [`Grant`]s they cause. The same inputs always give the same grants and the same fencing
//! tokens, which is what makes the table testable step by step and replayable.
//!
//! The table is generic over `D`, the *delivery*: whatever the caller needs to hand a grant to
//! the acquirer (the registry actor stores a grant channel there; tests store `()` or a label).
//! The table only stores it and gives it back, inside the [`Grant`] or from
//! [`cancel`](LockTable::cancel) and [`shutdown`](LockTable::shutdown).
//!
//! # Fairness
//!
//! Strict FIFO per key, by order of arrival at the table: a waiter is granted only when every
//! waiter that arrived before it on the same key has been granted or has cancelled. A new
//! acquirer never overtakes a queued one, even at the instant the key is released.
//!
//! # Invariants
//!
//! Numbered so that call sites and [`check_invariants`](LockTable::check_invariants) can cite
//! them; `check_invariants` checks every one.
//!
//! 1. **No orphan entry, no orphan record.** An entry exists for key `k` exactly when at least
//!    one record (holding or waiting) refers to `k`: the entry is removed in the same step
//!    that its reference count drops to zero.
//! 2. **Reference count.** `entry.holders` is the number of holding records of `k` and
//!    `entry.waiters` the number of waiting records of `k`; their sum is the entry's reference
//!    count (the seed's counter).
//! 3. **Mutual exclusion.** `entry.holders <= 1`.
//! 4. **Queue.** Each waiting record of `k` appears exactly once in `k`'s queue. Other ids in
//!    the queue are *tombstones* of cancelled waiters, skipped when granting; they are never
//!    live again, because the table never issues an id twice.
//! 5. **No idle waiters.** If `entry.waiters > 0` then `entry.holders > 0`: a free key with a
//!    queue would be a stuck key.
//! 6. **Bounded tombstones.** `queue.len() <= 2 * entry.waiters + TOMBSTONE_SLACK`, so a
//!    timeout storm on a key held for a long time cannot grow its queue without bound.
//! 7. **Counters.** `held_keys` is the number of entries with a holder and `waiting` the number
//!    of waiting records.
//! 8. **Fencing.** Every holder's token is below `next_fencing_token`, and tokens are handed
//!    out in strictly increasing order starting at 1.
//! 9. **Records.** The record store keeps its own invariants (`table/records.rs`): its memory
//!    follows the live records, not the number of arrivals.

use std::collections::{HashMap, VecDeque, hash_map};
use std::fmt;
use std::hash::Hash;
use std::num::NonZeroU64;

use crate::stats::RegistryStats;

mod records;
use records::Records;

/// Identifies one acquirer, from arrival until release or cancellation.
///
/// The table numbers acquirers 1, 2, 3, ... in order of arrival: every
/// [`acquire`](LockTable::acquire), and every [`try_acquire`](LockTable::try_acquire) that is
/// granted, takes the next number. A number is never issued twice, so a late release or cancel
/// of an old id cannot touch a newer acquirer. Journals and traces write an id as `w` and its
/// number (`w17`).
///
/// The numbering is part of the table's contract (traces depend on it) and does not change
/// without a new trace format version.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WaiterId(NonZeroU64);

impl WaiterId {
    /// The id of the `arrival`-th acquirer of a table, counting from 1; `None` for 0.
    ///
    /// Useful to name a waiter in a test or a replay; the table itself issues the ids.
    pub const fn new(arrival: u64) -> Option<Self> {
        match NonZeroU64::new(arrival) {
            Some(number) => Some(WaiterId(number)),
            None => None,
        }
    }

    /// The acquirer's place in the table's order of arrival, counting from 1.
    pub const fn arrival(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Display for WaiterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "w{}", self.0)
    }
}

impl fmt::Debug for WaiterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Tombstones tolerated in a queue beyond its live waiters before it is compacted
/// (invariant 6). Small enough to bound memory, large enough that short queues never compact.
const TOMBSTONE_SLACK: usize = 16;

/// The pure, synchronous per-key lock state machine. See the [module docs](self).
pub struct LockTable<K, D> {
    /// Keyed with foldhash rather than std's SipHash: every step hashes, and SipHash trades
    /// speed for resistance to chosen keys (`docs/performance-log.md` has the profile that
    /// led to the switch).
    entries: HashMap<K, Entry, foldhash::fast::RandomState>,
    records: Records<Record<K, D>>,
    next_fencing_token: u64,
    /// Entries with a holder (invariant 7).
    held_keys: usize,
    /// Waiting records (invariant 7).
    waiting: usize,
}

/// One key's state.
#[derive(Debug, Default)]
struct Entry {
    /// Waiters in order of arrival, plus tombstones of cancelled ones (invariant 4).
    queue: WaiterQueue,
    /// Holding records of this key: 0 or 1 (invariant 3).
    holders: u32,
    /// Waiting records of this key (invariant 2).
    waiters: u32,
}

impl Entry {
    fn holders_and_waiters(&self) -> u32 {
        self.holders + self.waiters
    }
}

/// A FIFO of waiter ids that takes one word until its key first has a waiter.
///
/// Most entries are held and never contended; an inline `VecDeque` would cost them 32 bytes
/// each for nothing (bytes per held key is one of the benchmarks). The box is made on the
/// first waiter and kept until the entry goes.
#[derive(Debug, Default)]
// The extra allocation clippy warns of is the point: 8 bytes inline instead of 32.
#[allow(clippy::box_collection)]
struct WaiterQueue(Option<Box<VecDeque<WaiterId>>>);

impl WaiterQueue {
    fn push_back(&mut self, waiter_id: WaiterId) {
        self.0.get_or_insert_default().push_back(waiter_id);
    }

    fn pop_front(&mut self) -> Option<WaiterId> {
        self.0.as_mut()?.pop_front()
    }

    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |queue| queue.len())
    }

    fn iter(&self) -> impl Iterator<Item = &WaiterId> {
        self.0.iter().flat_map(|queue| queue.iter())
    }

    fn retain(&mut self, keep: impl FnMut(&WaiterId) -> bool) {
        if let Some(queue) = &mut self.0 {
            queue.retain(keep);
        }
    }
}

/// One acquirer.
struct Record<K, D> {
    key: K,
    state: RecordState<D>,
}

enum RecordState<D> {
    Waiting(D),
    Holding { fencing_token: u64 },
}

/// A waiter that became the holder of its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant<D> {
    /// The new holder.
    pub waiter_id: WaiterId,
    /// Strictly greater than every token granted before by this table.
    pub fencing_token: u64,
    /// The delivery the waiter arrived with.
    pub delivery: D,
}

/// What [`LockTable::acquire`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired<D> {
    /// The key was free: the acquirer holds it now.
    Granted(Grant<D>),
    /// The key is held or has waiters: the acquirer is queued behind them.
    Queued(WaiterId),
}

/// [`LockTable::try_acquire`] found the key held or contended; nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WouldBlock;

impl fmt::Display for WouldBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the key is held")
    }
}

impl std::error::Error for WouldBlock {}

/// Why the table refused a [`release`](LockTable::release) or [`cancel`](LockTable::cancel).
///
/// The table is left unchanged in every case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaiterError {
    /// No record has this id: it was never issued, or was already released or cancelled.
    Unknown(WaiterId),
    /// `release` of a waiter that does not hold its key (use `cancel`).
    NotHolding(WaiterId),
    /// `cancel` of a waiter that already holds its key (use `release`).
    NotWaiting(WaiterId),
}

impl fmt::Display for WaiterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaiterError::Unknown(id) => write!(f, "no waiter {id:?} in the table"),
            WaiterError::NotHolding(id) => write!(f, "waiter {id:?} does not hold its key"),
            WaiterError::NotWaiting(id) => write!(f, "waiter {id:?} is not waiting"),
        }
    }
}

impl std::error::Error for WaiterError {}

/// A broken invariant, found by [`LockTable::check_invariants`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InvariantViolation {
    /// The number of the invariant in the [module docs](self).
    pub invariant: u8,
    /// What was found.
    pub detail: String,
}

impl fmt::Display for InvariantViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant {} broken: {}", self.invariant, self.detail)
    }
}

impl std::error::Error for InvariantViolation {}

impl<K, D> Default for LockTable<K, D>
where
    K: Hash + Eq + Clone,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<K, D> LockTable<K, D>
where
    K: Hash + Eq + Clone,
{
    /// An empty table whose first grant carries fencing token 1.
    pub fn new() -> Self {
        LockTable {
            entries: HashMap::default(),
            records: Records::new(),
            next_fencing_token: 1,
            held_keys: 0,
            waiting: 0,
        }
    }

    /// Asks for `key`: granted at once if the key is free, queued behind the current holder
    /// and earlier waiters otherwise.
    pub fn acquire(&mut self, key: K, delivery: D) -> Acquired<D> {
        match self.entries.entry(key) {
            hash_map::Entry::Occupied(mut occupied) => {
                let waiter_id = self.records.insert(Record {
                    key: occupied.key().clone(),
                    state: RecordState::Waiting(delivery),
                });
                // Invariant 1: an entry means a holder or a waiter, and invariant 5: waiters
                // mean a holder. So the key is held: queue behind everyone (FIFO).
                let entry = occupied.get_mut();
                debug_assert!(entry.holders > 0, "invariant 5");
                entry.queue.push_back(waiter_id);
                entry.waiters += 1;
                self.waiting += 1;
                Acquired::Queued(waiter_id)
            }
            hash_map::Entry::Vacant(vacant) => {
                let (waiter_id, fencing_token) =
                    hold_new_entry(vacant, &mut self.records, &mut self.next_fencing_token);
                self.held_keys += 1;
                Acquired::Granted(Grant {
                    waiter_id,
                    fencing_token,
                    delivery,
                })
            }
        }
    }

    /// Takes `key` if it is free; otherwise changes nothing, creates no entry and returns
    /// [`WouldBlock`].
    pub fn try_acquire(&mut self, key: K) -> Result<Grant<()>, WouldBlock> {
        // Invariant 1: an entry means a holder or a waiter, so only a key without one is free.
        let hash_map::Entry::Vacant(vacant) = self.entries.entry(key) else {
            return Err(WouldBlock);
        };
        let (waiter_id, fencing_token) =
            hold_new_entry(vacant, &mut self.records, &mut self.next_fencing_token);
        self.held_keys += 1;
        Ok(Grant {
            waiter_id,
            fencing_token,
            delivery: (),
        })
    }

    /// Ends the hold of `waiter_id` on its key and grants the key to the next live waiter, if
    /// any, appending that grant to `granted`. Returns the released key.
    ///
    /// # Errors
    ///
    /// [`WaiterError::Unknown`] if no record has this id, [`WaiterError::NotHolding`] if the
    /// waiter is still queued. The table is unchanged on error.
    pub fn release(
        &mut self,
        waiter_id: WaiterId,
        granted: &mut Vec<Grant<D>>,
    ) -> Result<K, WaiterError> {
        match self.records.get(waiter_id) {
            None => return Err(WaiterError::Unknown(waiter_id)),
            Some(Record {
                state: RecordState::Waiting(_),
                ..
            }) => return Err(WaiterError::NotHolding(waiter_id)),
            Some(_) => {}
        }
        let Some(record) = self.records.remove(waiter_id) else {
            return Err(WaiterError::Unknown(waiter_id));
        };
        let Some(entry) = self.entries.get_mut(&record.key) else {
            // Unreachable while invariant 1 holds; refusing beats panicking.
            debug_assert!(false, "invariant 1: holder without entry");
            return Err(WaiterError::Unknown(waiter_id));
        };
        entry.holders -= 1;
        self.held_keys -= 1;
        if let Some(grant) = grant_next(
            entry,
            &mut self.records,
            &mut self.next_fencing_token,
            &mut self.waiting,
        ) {
            self.held_keys += 1;
            granted.push(grant);
        }
        // Granting shortens the queue by one but lowers the bound of invariant 6 by two.
        compact_queue(entry, &self.records);
        // Invariant 1: the entry goes in the same step as its last holder or waiter.
        if entry.holders_and_waiters() == 0 {
            self.entries.remove(&record.key);
        }
        Ok(record.key)
    }

    /// Withdraws `waiter_id` from its key's queue and returns its key and delivery.
    ///
    /// Cancelling never grants anything: a queued waiter implies a holder (invariant 5), and
    /// that holder still holds. The id stays in the queue as a tombstone until it reaches the
    /// front or the queue is compacted (invariants 4 and 6), which keeps this O(1) amortized.
    ///
    /// # Errors
    ///
    /// [`WaiterError::Unknown`] if no record has this id (for instance it was granted and then
    /// released), [`WaiterError::NotWaiting`] if it holds its key. The table is unchanged on
    /// error.
    pub fn cancel(&mut self, waiter_id: WaiterId) -> Result<(K, D), WaiterError> {
        match self.records.get(waiter_id) {
            None => return Err(WaiterError::Unknown(waiter_id)),
            Some(Record {
                state: RecordState::Holding { .. },
                ..
            }) => return Err(WaiterError::NotWaiting(waiter_id)),
            Some(_) => {}
        }
        let Some(Record {
            key,
            state: RecordState::Waiting(delivery),
        }) = self.records.remove(waiter_id)
        else {
            return Err(WaiterError::Unknown(waiter_id));
        };
        self.waiting -= 1;
        if let Some(entry) = self.entries.get_mut(&key) {
            entry.waiters -= 1;
            compact_queue(entry, &self.records);
            // Invariant 5 says the key still has its holder, so the entry stays; this only
            // matters if that invariant were ever broken.
            if entry.holders_and_waiters() == 0 {
                self.entries.remove(&key);
            }
        } else {
            debug_assert!(false, "invariant 1: waiter without entry");
        }
        Ok((key, delivery))
    }

    /// Empties the table: every waiter is withdrawn and returned with its delivery, in order of
    /// arrival; every hold is forgotten, and later releases of old ids return
    /// [`WaiterError::Unknown`]. Fencing tokens and waiter ids keep increasing afterwards.
    pub fn shutdown(&mut self) -> Vec<(WaiterId, D)> {
        let waiters = self
            .records
            .drain()
            .into_iter()
            .filter_map(|(waiter_id, record)| match record.state {
                RecordState::Waiting(delivery) => Some((waiter_id, delivery)),
                RecordState::Holding { .. } => None,
            })
            .collect();
        self.entries.clear();
        self.held_keys = 0;
        self.waiting = 0;
        waiters
    }

    /// The key `waiter_id` holds or waits for, if the id is live.
    pub fn key_of(&self, waiter_id: WaiterId) -> Option<&K> {
        self.records.get(waiter_id).map(|record| &record.key)
    }

    /// The delivery of a waiter that is still queued.
    pub fn delivery_of(&self, waiter_id: WaiterId) -> Option<&D> {
        match self.records.get(waiter_id)?.state {
            RecordState::Waiting(ref delivery) => Some(delivery),
            RecordState::Holding { .. } => None,
        }
    }

    /// The delivery of a waiter that is still queued, to replace it. The table never looks
    /// at deliveries, so this changes nothing it records.
    pub fn delivery_mut(&mut self, waiter_id: WaiterId) -> Option<&mut D> {
        match self.records.get_mut(waiter_id)?.state {
            RecordState::Waiting(ref mut delivery) => Some(delivery),
            RecordState::Holding { .. } => None,
        }
    }

    /// Whether `key` has an entry, that is a holder or a waiter.
    pub fn contains_key(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// Counts at this instant, in O(1).
    pub fn stats(&self) -> RegistryStats {
        RegistryStats {
            keys: self.entries.len(),
            held: self.held_keys,
            waiting: self.waiting,
            grants: self.next_fencing_token - 1,
        }
    }

    /// Checks every invariant of the [module docs](self) in O(keys + records + queued ids).
    ///
    /// # Errors
    ///
    /// The first broken invariant found.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let broken = |invariant: u8, detail: String| Err(InvariantViolation { invariant, detail });
        if let Err(detail) = self.records.check() {
            return broken(9, detail);
        }
        let mut holding_of: HashMap<&K, u32> = HashMap::new();
        let mut waiting_of: HashMap<&K, u32> = HashMap::new();
        for (waiter_id, record) in self.records.iter() {
            if !self.entries.contains_key(&record.key) {
                return broken(1, format!("record {waiter_id:?} has no entry"));
            }
            match record.state {
                RecordState::Holding { fencing_token } => {
                    *holding_of.entry(&record.key).or_default() += 1;
                    if fencing_token == 0 || fencing_token >= self.next_fencing_token {
                        return broken(
                            8,
                            format!("holder {waiter_id:?} has token {fencing_token}"),
                        );
                    }
                }
                RecordState::Waiting(_) => *waiting_of.entry(&record.key).or_default() += 1,
            }
        }
        let (mut held_keys, mut waiting) = (0, 0);
        for (key, entry) in &self.entries {
            let holders = holding_of.get(key).copied().unwrap_or(0);
            let waiters = waiting_of.get(key).copied().unwrap_or(0);
            if holders + waiters == 0 {
                return broken(1, "an entry with no holder and no waiter".into());
            }
            if entry.holders != holders || entry.waiters != waiters {
                return broken(
                    2,
                    format!(
                        "entry counts {}+{} but records say {holders}+{waiters}",
                        entry.holders, entry.waiters
                    ),
                );
            }
            if entry.holders > 1 {
                return broken(3, format!("{} holders of one key", entry.holders));
            }
            let mut live_in_queue = 0;
            for id in entry.queue.iter() {
                if let Some(record) = self.records.get(*id)
                    && matches!(record.state, RecordState::Waiting(_))
                {
                    if record.key != *key {
                        return broken(4, format!("waiter {id:?} queued under another key"));
                    }
                    live_in_queue += 1;
                }
            }
            if live_in_queue != waiters {
                return broken(
                    4,
                    format!("{live_in_queue} live ids queued for {waiters} waiters"),
                );
            }
            if entry.waiters > 0 && entry.holders == 0 {
                return broken(5, format!("{} waiters on a free key", entry.waiters));
            }
            if entry.queue.len() > 2 * entry.waiters as usize + TOMBSTONE_SLACK {
                return broken(
                    6,
                    format!(
                        "queue of {} for {} waiters",
                        entry.queue.len(),
                        entry.waiters
                    ),
                );
            }
            held_keys += usize::from(entry.holders > 0);
            waiting += entry.waiters as usize;
        }
        if held_keys != self.held_keys || waiting != self.waiting {
            return broken(
                7,
                format!(
                    "counters say {} held, {} waiting; entries say {held_keys}, {waiting}",
                    self.held_keys, self.waiting
                ),
            );
        }
        Ok(())
    }
}

/// Creates the entry of a free key with one holder and returns the holder's id and token.
///
/// Free functions over the table's fields, like this one, let a caller keep its borrow of the
/// entry map while the records change.
fn hold_new_entry<K: Clone, D>(
    vacant: hash_map::VacantEntry<'_, K, Entry>,
    records: &mut Records<Record<K, D>>,
    next_fencing_token: &mut u64,
) -> (WaiterId, u64) {
    let fencing_token = next_token(next_fencing_token);
    let waiter_id = records.insert(Record {
        key: vacant.key().clone(),
        state: RecordState::Holding { fencing_token },
    });
    vacant.insert(Entry {
        queue: WaiterQueue::default(),
        holders: 1,
        waiters: 0,
    });
    (waiter_id, fencing_token)
}

/// Drops the tombstones from `entry`'s queue once they outnumber its live waiters by more
/// than the slack (invariant 6). Amortized O(1) per cancel or grant.
fn compact_queue<K, D>(entry: &mut Entry, records: &Records<Record<K, D>>) {
    if entry.queue.len() > 2 * entry.waiters as usize + TOMBSTONE_SLACK {
        entry.queue.retain(|id| records.contains(*id));
    }
}

/// Grants a free `entry` to its first live waiter, dropping tombstones on the way.
fn grant_next<K, D>(
    entry: &mut Entry,
    records: &mut Records<Record<K, D>>,
    next_fencing_token: &mut u64,
    waiting: &mut usize,
) -> Option<Grant<D>> {
    debug_assert_eq!(entry.holders, 0, "grant_next on a held key");
    while let Some(waiter_id) = entry.queue.pop_front() {
        // A tombstone (cancelled waiter) has no record any more: skip it (invariant 4).
        let Some(record) = records.get_mut(waiter_id) else {
            continue;
        };
        let fencing_token = next_token(next_fencing_token);
        let RecordState::Waiting(delivery) =
            std::mem::replace(&mut record.state, RecordState::Holding { fencing_token })
        else {
            // Invariant 4 says queued live ids are waiting; a holder here would be a bug.
            debug_assert!(false, "invariant 4: a holder in the queue");
            continue;
        };
        entry.waiters -= 1;
        entry.holders = 1;
        *waiting -= 1;
        return Some(Grant {
            waiter_id,
            fencing_token,
            delivery,
        });
    }
    None
}

/// Hands out the next fencing token (invariant 8). A `u64` does not wrap in practice: at a
/// billion grants a second it lasts 584 years.
fn next_token(next_fencing_token: &mut u64) -> u64 {
    let token = *next_fencing_token;
    *next_fencing_token = token.saturating_add(1);
    token
}

impl<K: fmt::Debug, D> fmt::Debug for LockTable<K, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockTable")
            .field("keys", &self.entries.len())
            .field("held", &self.held_keys)
            .field("waiting", &self.waiting)
            .field("next_fencing_token", &self.next_fencing_token)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
