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
//! 2. **Reference count.** `entry.waiters` is the number of waiting records of `k`, and
//!    `entry.permits` is above zero exactly when `k` has holding records (each holds at least
//!    one permit); holders plus waiters is the entry's reference count (the seed's counter).
//! 3. **Permits.** `entry.permits` is the sum of the permits its holders hold, and at most
//!    the table's capacity. An exclusive acquirer takes every permit, so it holds its key
//!    alone (mutual exclusion); with one permit per key, every acquirer is exclusive.
//! 4. **Queue.** Each waiting record of `k` appears exactly once in `k`'s queue. Other ids in
//!    the queue are *tombstones* of cancelled waiters, skipped when granting; they are never
//!    live again, because the table never issues an id twice.
//! 5. **No idle waiters.** The first live waiter of a key asks for more permits than are
//!    free: a waiter that fits would be a stuck key. (With one permit per key: waiters mean a
//!    holder.)
//! 6. **Bounded tombstones.** `queue.len() <= 2 * entry.waiters + TOMBSTONE_SLACK`, so a
//!    timeout storm on a key held for a long time cannot grow its queue without bound.
//! 7. **Counters.** `held_keys` is the number of entries with a holder, `holders` the number
//!    of holding records, `permits_in_use` the sum of their permits, and `waiting` the number
//!    of waiting records.
//! 8. **Fencing.** Tokens are handed out in strictly increasing order starting at 1, one per
//!    grant (only `next_token` hands them out), so at least one token was handed out per
//!    holder. A holder's record does not keep its token: the grant carried it to the holder,
//!    and a record without it is 8 bytes smaller.
//! 9. **Records.** The record store keeps its own invariants (`table/records.rs`): its memory
//!    follows the live records, not the number of arrivals.

use std::collections::{HashMap, VecDeque, hash_map};
use std::fmt;
use std::hash::Hash;
use std::num::{NonZeroU32, NonZeroU64};

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
    entries: EntryMap<K>,
    records: Records<Record<K, D>>,
    next_fencing_token: u64,
    /// Permits per key: an exclusive acquirer takes them all (invariant 3).
    capacity: NonZeroU32,
    /// Entries with a holder (invariant 7).
    held_keys: usize,
    /// Holding records (invariant 7).
    holders: usize,
    /// Permits held, over every key (invariant 7).
    permits_in_use: usize,
    /// Waiting records (invariant 7).
    waiting: usize,
}

type EntryMap<K> = HashMap<K, Entry, foldhash::fast::RandomState>;

/// The table's fields other than the entry map, borrowed while one entry is changed.
struct Counters<'a, K, D> {
    capacity: NonZeroU32,
    records: &'a mut Records<Record<K, D>>,
    next_fencing_token: &'a mut u64,
    held_keys: &'a mut usize,
    holders: &'a mut usize,
    permits_in_use: &'a mut usize,
    waiting: &'a mut usize,
}

/// How many of a key's permits one acquirer asks for: between 1 and the table's capacity.
/// Made by [`LockTable::permits`] (checked) or [`LockTable::all_permits`] (exclusive), so that
/// a request the table cannot grant ever cannot reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Permits(pub(crate) NonZeroU32);

impl Permits {
    /// The number of permits.
    pub fn get(self) -> u32 {
        self.0.get()
    }
}

/// [`LockTable::permits`] was asked for 0 permits, or more than a key has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitsOutOfRange {
    /// The permits asked for.
    pub requested: u32,
    /// The permits a key has.
    pub capacity: u32,
}

impl fmt::Display for PermitsOutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "asked for {} permits; a key has {}, and a request takes at least 1",
            self.requested, self.capacity
        )
    }
}

impl std::error::Error for PermitsOutOfRange {}

/// One key's state.
#[derive(Debug, Default)]
///
/// 16 bytes: the number of holders is not kept, since every holder holds at least one
/// permit, so `permits > 0` says whether the key is held.
struct Entry {
    /// Waiters in order of arrival with the permits each asks for, plus tombstones of
    /// cancelled ones (invariant 4).
    queue: WaiterQueue,
    /// Waiting records of this key (invariant 2).
    waiters: u32,
    /// Permits its holders hold: at most the table's capacity (invariant 3).
    permits: u32,
}

impl Entry {
    /// Nobody holds or waits for the key: its entry must go (invariant 1).
    fn is_unused(&self) -> bool {
        self.permits == 0 && self.waiters == 0
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
struct WaiterQueue(Option<Box<VecDeque<Queued>>>);

/// A queued waiter and the permits it asks for. The permits live here rather than in the
/// waiter's record, so that a holder's record stays as small as it was with exclusive locks
/// only.
#[derive(Debug, Clone, Copy)]
struct Queued {
    waiter_id: WaiterId,
    permits: Permits,
}

impl WaiterQueue {
    fn push_back(&mut self, queued: Queued) {
        self.0.get_or_insert_default().push_back(queued);
    }

    fn pop_front(&mut self) -> Option<Queued> {
        self.0.as_mut()?.pop_front()
    }

    fn front(&self) -> Option<&Queued> {
        self.0.as_ref()?.front()
    }

    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |queue| queue.len())
    }

    fn iter(&self) -> impl Iterator<Item = &Queued> {
        self.0.iter().flat_map(|queue| queue.iter())
    }

    fn retain(&mut self, keep: impl FnMut(&Queued) -> bool) {
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
    /// Queued; the permits it asks for are in the queue.
    Waiting(D),
    /// Holds `permits` of its key's permits.
    Holding { permits: Permits },
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
    /// An empty table of exclusive locks (one permit per key) whose first grant carries
    /// fencing token 1.
    pub fn new() -> Self {
        Self::with_capacity(NonZeroU32::MIN)
    }

    /// An empty table whose keys have `capacity` permits each: an exclusive acquirer takes
    /// them all, others take [`permits`](Self::permits) of them.
    pub fn with_capacity(capacity: NonZeroU32) -> Self {
        LockTable {
            entries: HashMap::default(),
            records: Records::new(),
            next_fencing_token: 1,
            capacity,
            held_keys: 0,
            holders: 0,
            permits_in_use: 0,
            waiting: 0,
        }
    }

    /// The entry map apart from everything else, so that one entry can be changed together
    /// with the records and counters.
    fn split(&mut self) -> (&mut EntryMap<K>, Counters<'_, K, D>) {
        (
            &mut self.entries,
            Counters {
                capacity: self.capacity,
                records: &mut self.records,
                next_fencing_token: &mut self.next_fencing_token,
                held_keys: &mut self.held_keys,
                holders: &mut self.holders,
                permits_in_use: &mut self.permits_in_use,
                waiting: &mut self.waiting,
            },
        )
    }

    /// The permits each key has.
    pub fn capacity(&self) -> NonZeroU32 {
        self.capacity
    }

    /// A request for `count` of a key's permits.
    ///
    /// # Errors
    ///
    /// [`PermitsOutOfRange`] if `count` is 0 or above the table's capacity.
    pub fn permits(&self, count: u32) -> Result<Permits, PermitsOutOfRange> {
        NonZeroU32::new(count)
            .filter(|count| *count <= self.capacity)
            .map(Permits)
            .ok_or(PermitsOutOfRange {
                requested: count,
                capacity: self.capacity.get(),
            })
    }

    /// A request for every permit of a key: an exclusive lock.
    pub fn all_permits(&self) -> Permits {
        Permits(self.capacity)
    }

    /// Asks for `key` exclusively: granted at once if nobody holds or waits for it, queued
    /// behind the current holders and earlier waiters otherwise.
    pub fn acquire(&mut self, key: K, delivery: D) -> Acquired<D> {
        self.acquire_permits(key, self.all_permits(), delivery)
    }

    /// Asks for `permits` of `key`'s permits: granted at once if nobody waits for the key and
    /// enough permits are free, queued behind the earlier waiters otherwise (strict FIFO: a
    /// request is never overtaken by a later one, however small).
    pub fn acquire_permits(&mut self, key: K, permits: Permits, delivery: D) -> Acquired<D> {
        let capacity = self.capacity;
        let (entries, mut counters) = self.split();
        let entry = match entries.entry(key) {
            hash_map::Entry::Occupied(mut occupied) => {
                let entry = occupied.get_mut();
                // Invariant 5: with no live waiter ahead, fitting is the only condition.
                if entry.waiters > 0 || !fits(entry, permits, capacity) {
                    let waiter_id = counters.records.insert(Record {
                        key: occupied.key().clone(),
                        state: RecordState::Waiting(delivery),
                    });
                    let entry = occupied.get_mut();
                    entry.queue.push_back(Queued { waiter_id, permits });
                    entry.waiters += 1;
                    *counters.waiting += 1;
                    return Acquired::Queued(waiter_id);
                }
                occupied
            }
            hash_map::Entry::Vacant(vacant) => vacant.insert_entry(Entry::default()),
        };
        let key = entry.key().clone();
        let (waiter_id, fencing_token) = hold(entry.into_mut(), key, permits, &mut counters);
        Acquired::Granted(Grant {
            waiter_id,
            fencing_token,
            delivery,
        })
    }

    /// Takes `key` exclusively if nobody holds or waits for it; otherwise changes nothing,
    /// creates no entry and returns [`WouldBlock`].
    pub fn try_acquire(&mut self, key: K) -> Result<Grant<()>, WouldBlock> {
        self.try_acquire_permits(key, self.all_permits())
    }

    /// Takes `permits` of `key`'s permits if nobody waits for the key and enough are free;
    /// otherwise changes nothing, creates no entry and returns [`WouldBlock`].
    pub fn try_acquire_permits(
        &mut self,
        key: K,
        permits: Permits,
    ) -> Result<Grant<()>, WouldBlock> {
        let capacity = self.capacity;
        let (entries, mut counters) = self.split();
        let entry = match entries.entry(key) {
            hash_map::Entry::Occupied(occupied) => {
                if occupied.get().waiters > 0 || !fits(occupied.get(), permits, capacity) {
                    return Err(WouldBlock);
                }
                occupied
            }
            hash_map::Entry::Vacant(vacant) => vacant.insert_entry(Entry::default()),
        };
        let key = entry.key().clone();
        let (waiter_id, fencing_token) = hold(entry.into_mut(), key, permits, &mut counters);
        Ok(Grant {
            waiter_id,
            fencing_token,
            delivery: (),
        })
    }

    /// Ends the hold of `waiter_id` on its key and grants the key's permits to the waiters at
    /// the front of its queue that now fit, in order, appending their grants to `granted`.
    /// Returns the released key.
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
        let Some(Record {
            key,
            state: RecordState::Holding { permits, .. },
        }) = self.records.remove(waiter_id)
        else {
            return Err(WaiterError::Unknown(waiter_id));
        };
        let (entries, mut counters) = self.split();
        let Some(entry) = entries.get_mut(&key) else {
            // Unreachable while invariant 1 holds; refusing beats panicking.
            debug_assert!(false, "invariant 1: holder without entry");
            return Err(WaiterError::Unknown(waiter_id));
        };
        entry.permits -= permits.get();
        *counters.holders -= 1;
        *counters.permits_in_use -= permits.get() as usize;
        if entry.permits == 0 {
            *counters.held_keys -= 1;
        }
        // Most releases leave nobody waiting: skip the grant loop then.
        let unused = if entry.waiters == 0 {
            entry.permits == 0
        } else {
            Self::grant_fitting(entry, &mut counters, granted)
        };
        if unused {
            entries.remove(&key);
        }
        Ok(key)
    }

    /// Withdraws `waiter_id` from its key's queue and returns its key and delivery.
    ///
    /// A waiter that asked for more permits than were free holds back the smaller requests
    /// behind it (FIFO); withdrawing it lets those that now fit through, and their grants are
    /// appended to `granted`. With one permit per key nothing is ever granted here. The id stays
    /// in the queue as a tombstone until it reaches the front or the queue is compacted
    /// (invariants 4 and 6), which keeps this O(1) amortized.
    ///
    /// # Errors
    ///
    /// [`WaiterError::Unknown`] if no record has this id (for instance it was granted and then
    /// released), [`WaiterError::NotWaiting`] if it holds its key. The table is unchanged on
    /// error.
    pub fn cancel(
        &mut self,
        waiter_id: WaiterId,
        granted: &mut Vec<Grant<D>>,
    ) -> Result<(K, D), WaiterError> {
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
            ..
        }) = self.records.remove(waiter_id)
        else {
            return Err(WaiterError::Unknown(waiter_id));
        };
        self.waiting -= 1;
        let (entries, mut counters) = self.split();
        if let Some(entry) = entries.get_mut(&key) {
            entry.waiters -= 1;
            if Self::grant_fitting(entry, &mut counters, granted) {
                entries.remove(&key);
            }
        } else {
            debug_assert!(false, "invariant 1: waiter without entry");
        }
        Ok((key, delivery))
    }

    /// After a release or a cancel on `key`, whose entry is `entry`: grants the waiters at the
    /// front of its queue that fit, in order, stopping at the first that does not (FIFO,
    /// invariant 5); then compacts the queue (invariant 6). Returns whether the entry is left
    /// with nobody, for the caller to remove it in the same step (invariant 1). Takes the
    /// table's fields rather than `self`, so that the caller keeps its one lookup of the entry.
    fn grant_fitting(
        entry: &mut Entry,
        counters: &mut Counters<'_, K, D>,
        granted: &mut Vec<Grant<D>>,
    ) -> bool {
        let was_held = entry.permits > 0;
        while let Some((grant, permits)) = grant_next(
            entry,
            counters.capacity,
            counters.records,
            counters.next_fencing_token,
        ) {
            *counters.waiting -= 1;
            *counters.holders += 1;
            *counters.permits_in_use += permits.get() as usize;
            granted.push(grant);
        }
        if !was_held && entry.permits > 0 {
            *counters.held_keys += 1;
        }
        compact_queue(entry, counters.records);
        entry.is_unused()
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
        self.holders = 0;
        self.permits_in_use = 0;
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
            holders: self.holders,
            permits: self.permits_in_use,
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
        let mut permits_of: HashMap<&K, u32> = HashMap::new();
        for (waiter_id, record) in self.records.iter() {
            if !self.entries.contains_key(&record.key) {
                return broken(1, format!("record {waiter_id:?} has no entry"));
            }
            match record.state {
                RecordState::Holding { permits } => {
                    *holding_of.entry(&record.key).or_default() += 1;
                    *permits_of.entry(&record.key).or_default() += permits.get();
                }
                RecordState::Waiting(_) => *waiting_of.entry(&record.key).or_default() += 1,
            }
        }
        let (mut held_keys, mut holders_total, mut permits_total, mut waiting) = (0, 0, 0, 0);
        for (key, entry) in &self.entries {
            let holders = holding_of.get(key).copied().unwrap_or(0);
            let waiters = waiting_of.get(key).copied().unwrap_or(0);
            if holders + waiters == 0 {
                return broken(1, "an entry with no holder and no waiter".into());
            }
            if entry.waiters != waiters {
                return broken(
                    2,
                    format!(
                        "entry counts {} waiters but records say {waiters}",
                        entry.waiters
                    ),
                );
            }
            let permits = permits_of.get(key).copied().unwrap_or(0);
            if entry.permits != permits || permits > self.capacity.get() {
                return broken(
                    3,
                    format!(
                        "entry counts {} permits, its holders hold {permits}, capacity {}",
                        entry.permits, self.capacity
                    ),
                );
            }
            let mut live_in_queue = 0;
            for Queued { waiter_id: id, .. } in entry.queue.iter() {
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
            let first_waiter = entry
                .queue
                .iter()
                .find(|queued| self.records.contains(queued.waiter_id));
            if let Some(first) = first_waiter
                && fits(entry, first.permits, self.capacity)
            {
                return broken(
                    5,
                    format!(
                        "the first waiter asks for {} permits and {} are free",
                        first.permits.get(),
                        self.capacity.get() - entry.permits
                    ),
                );
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
            held_keys += usize::from(entry.permits > 0);
            holders_total += holders as usize;
            permits_total += entry.permits as usize;
            waiting += entry.waiters as usize;
        }
        if self.next_fencing_token <= holders_total as u64 {
            return broken(
                8,
                format!(
                    "{holders_total} holders but only {} tokens handed out",
                    self.next_fencing_token - 1
                ),
            );
        }
        let counted = (held_keys, holders_total, permits_total, waiting);
        let kept = (
            self.held_keys,
            self.holders,
            self.permits_in_use,
            self.waiting,
        );
        if counted != kept {
            return broken(
                7,
                format!(
                    "(held, holders, permits, waiting): counters say {kept:?}, entries {counted:?}"
                ),
            );
        }
        Ok(())
    }
}

/// Whether `permits` more fit in `entry` (invariant 3).
fn fits(entry: &Entry, permits: Permits, capacity: NonZeroU32) -> bool {
    entry.permits + permits.get() <= capacity.get()
}

/// Makes a new holder of `permits` on `entry`, which has room for them, counts it, and
/// returns its id and token.
///
/// Free functions over the table's fields, like this one, let a caller keep its borrow of the
/// entry map while the records change.
fn hold<K, D>(
    entry: &mut Entry,
    key: K,
    permits: Permits,
    counters: &mut Counters<'_, K, D>,
) -> (WaiterId, u64) {
    let fencing_token = next_token(counters.next_fencing_token);
    let waiter_id = counters.records.insert(Record {
        key,
        state: RecordState::Holding { permits },
    });
    if entry.permits == 0 {
        *counters.held_keys += 1;
    }
    entry.permits += permits.get();
    *counters.holders += 1;
    *counters.permits_in_use += permits.get() as usize;
    (waiter_id, fencing_token)
}

/// Drops the tombstones from `entry`'s queue once they outnumber its live waiters by more
/// than the slack (invariant 6). Amortized O(1) per cancel or grant.
fn compact_queue<K, D>(entry: &mut Entry, records: &Records<Record<K, D>>) {
    if entry.queue.len() > 2 * entry.waiters as usize + TOMBSTONE_SLACK {
        entry
            .queue
            .retain(|queued| records.contains(queued.waiter_id));
    }
}

/// Grants the first live waiter of `entry` if its permits fit, dropping tombstones on the way;
/// `None` if the queue is empty or its first live waiter does not fit.
fn grant_next<K, D>(
    entry: &mut Entry,
    capacity: NonZeroU32,
    records: &mut Records<Record<K, D>>,
    next_fencing_token: &mut u64,
) -> Option<(Grant<D>, Permits)> {
    while let Some(&Queued { waiter_id, permits }) = entry.queue.front() {
        // A tombstone (cancelled waiter) has no record any more: skip it (invariant 4).
        let Some(record) = records.get_mut(waiter_id) else {
            entry.queue.pop_front();
            continue;
        };
        if !fits(entry, permits, capacity) {
            return None;
        }
        entry.queue.pop_front();
        let fencing_token = next_token(next_fencing_token);
        let holding = RecordState::Holding { permits };
        let RecordState::Waiting(delivery) = std::mem::replace(&mut record.state, holding) else {
            // Invariant 4 says queued live ids are waiting; a holder here would be a bug.
            debug_assert!(false, "invariant 4: a holder in the queue");
            continue;
        };
        entry.waiters -= 1;
        entry.permits += permits.get();
        let grant = Grant {
            waiter_id,
            fencing_token,
            delivery,
        };
        return Some((grant, permits));
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
