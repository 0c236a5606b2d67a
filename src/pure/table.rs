//! The pure lock table: every rule of the crate as a synchronous state machine.
//!
//! [`LockTable`] knows nothing of tokio, channels or clocks. It maps each key to an entry
//! (holder count, live waiter count, FIFO queue of waiter ids) and keeps one record per
//! acquirer, found by its [`WaiterId`] in O(1), so a waiter can be cancelled or released
//! without a search. The table numbers acquirers in order of arrival, so the same inputs always
//! give the same ids. Its inputs are [`acquire`](LockTable::acquire),
//! [`try_acquire`](LockTable::try_acquire), their forms for permits and for several keys at
//! once ([`acquire_all`](LockTable::acquire_all)), [`release`](LockTable::release),
//! [`cancel`](LockTable::cancel) and [`shutdown`](LockTable::shutdown); its outputs are the
//! [`Grant`]s they cause. The same inputs always give the same grants and the same fencing
//! tokens, which is what makes the table testable step by step and replayable.
//!
//! The table is generic over `D`, the *delivery*: whatever the caller needs to hand a grant to
//! the acquirer (the runtime stores a pending grant's key or a kameo reply there; tests store
//! `()` or a label).
//! The table only stores it and gives it back, inside the [`Grant`] or from
//! [`cancel`](LockTable::cancel) and [`shutdown`](LockTable::shutdown).
//!
//! # Fairness
//!
//! Strict FIFO per key, by order of arrival at the table: a waiter is granted only when every
//! waiter that arrived before it on the same key has been granted or has cancelled. A new
//! acquirer never overtakes a queued one, even at the instant the key is released. A request
//! for several keys at once is queued on all of them in one step and granted when it is first
//! on all of them, so it obeys the same rule on each key, and no requests can wait for each
//! other in a cycle (the earliest waiting request waits only for holders).
//!
//! # Invariants
//!
//! Numbered so that call sites and `check_invariants` can cite
//! them; `check_invariants` checks every one.
//!
//! 1. **No orphan entry, no orphan record.** An entry exists for key `k` exactly when at least
//!    one record (holding or waiting) refers to `k`: the entry is removed in the same step
//!    that its reference count drops to zero.
//! 2. **Reference count.** `entry.waiters` is the number of waiting records of `k`, and
//!    `entry.permits` is above zero exactly when `k` has holding records (each holds at least
//!    one permit); holders plus waiters is the entry's reference count.
//! 3. **Permits.** `entry.permits` is the sum of the permits its holders hold, and at most
//!    the table's capacity. An exclusive acquirer takes every permit, so it holds its key
//!    alone (mutual exclusion); with one permit per key, every acquirer is exclusive.
//! 4. **Queue.** Each waiting record of `k` appears exactly once in `k`'s queue, and the
//!    queue is in order of arrival. Other ids in the queue are *tombstones* of cancelled
//!    waiters, skipped when granting; they are never live again, because the table never
//!    issues an id twice.
//! 5. **No idle waiters.** The first live waiter of a key cannot be granted: it asks for more
//!    permits than are free, or it asks for several keys and is not first (or does not fit)
//!    on another of them. A waiter that could be granted would be a stuck key. (With one
//!    permit per key and no multi-key requests: waiters mean a holder.)
//! 6. **Bounded tombstones.** `queue.len() <= 2 * entry.waiters + TOMBSTONE_SLACK`, so a
//!    timeout storm on a key held for a long time cannot grow its queue without bound.
//! 7. **Counts.** `held_keys` is the number of entries with a holder, `holders` the number
//!    of holding records, `permits_in_use` the sum of the entries' permits, and `waiting` the
//!    number of waiting records (a request for several keys is one record).
//! 8. **Fencing.** Tokens are handed out in strictly increasing order starting at 1, one per
//!    grant (only `next_token` hands them out). Each holder's record keeps its grant's token,
//!    below the next one, and no two holders share one (a request for several keys is one
//!    holder). The token is kept as two `u32` halves, which fit beside the delivery's tag in
//!    the waiting state's room, so a record is no larger for it (a `u64` would add 8 bytes).
//! 9. **Records.** The record store keeps its own invariants (`table/records.rs`): its memory
//!    follows the live records, not the number of arrivals.
//! 10. **Groups.** A request for several keys at once has one record, keyed by its first key,
//!     and its keys (two or more, each once) in the group map, for exactly as long as the
//!     record lives. It counts as a waiter or holder in each of its keys' entries, holds
//!     every permit of each while it holds, and its queue slots are flagged as a group's.
//! 11. **Time marks.** The marks that date arrivals and grants for [`LockTable::snapshot`]
//!     keep their own invariants (`table/marks.rs`): ordered, bounded.

use std::collections::{HashMap, VecDeque, hash_map};
use std::fmt;
use std::hash::Hash;
use std::num::{NonZeroU32, NonZeroU64};

use crate::pure::stats::RegistryStats;

mod marks;
mod records;
mod view;
use marks::Marks;
use records::{NotRemoved, Records};

/// Identifies one acquirer, from arrival until release or cancellation.
///
/// Each shard's lock table numbers acquirers 1, 2, 3, ... in order of arrival: every acquire,
/// and every try-acquire that is granted, takes the next number. A number is never issued twice, so a late release or cancel
/// of an old id cannot touch a newer acquirer. It is shown as `w` and its number (`w17`), and
/// a trace writes the number.
///
/// The numbering is part of the table's contract (traces depend on it) and does not change
/// without a new trace format version.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(transparent)
)]
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

/// The pure, synchronous per-key lock state machine. See the module docs of `src/pure/table.rs`.
///
/// Two parts, so that a step can change one key's entry and everything else at once (two
/// fields borrow apart): the entry map, and the `Ledger` of acquirers and counts.
pub struct LockTable<K, D> {
    /// Keyed with foldhash rather than std's SipHash: every step hashes, and SipHash trades
    /// speed for resistance to chosen keys (`docs/performance-log.md` has the profile that
    /// led to the switch).
    entries: EntryMap<K>,
    ledger: Ledger<K, D>,
}

type EntryMap<K> = HashMap<K, Entry, foldhash::fast::RandomState>;

/// Ids are issued by the table, not chosen by callers, so a fixed-seed hasher is safe here.
type GroupMap<K> = HashMap<WaiterId, Box<[K]>, foldhash::fast::FixedState>;

/// Everything the table knows apart from its entry map: the record of each acquirer, the keys
/// of each request for several keys, the next fencing token, and the counts kept over them.
/// Its methods take the entries they change as arguments.
struct Ledger<K, D> {
    records: Records<Record<K, D>>,
    /// The keys of every acquirer of several keys at once (invariant 10).
    groups: GroupMap<K>,
    next_fencing_token: u64,
    /// Permits per key: an exclusive acquirer takes them all (invariant 3).
    capacity: NonZeroU32,
    counts: Counts,
    /// When the table stood at which arrival and token, to date the view's holds and waits.
    marks: Marks,
}

/// The counts kept in O(1) for [`LockTable::stats`] (invariant 7).
#[derive(Debug, Default)]
struct Counts {
    /// Entries with a holder.
    held_keys: usize,
    /// Holding records.
    holders: usize,
    /// Permits held, over every key.
    permits_in_use: usize,
    /// Waiting records.
    waiting: usize,
}

impl Counts {
    /// Counts `permits` of `entry` as taken, and the key as held if they are its first.
    fn take(&mut self, entry: &mut Entry, permits: Permits) {
        if entry.permits == 0 {
            self.held_keys += 1;
        }
        entry.permits += permits.get();
        self.permits_in_use += permits.get() as usize;
    }

    /// Counts `permits` of `entry` as given back, and the key as no longer held if they were
    /// its last.
    fn give_back(&mut self, entry: &mut Entry, permits: Permits) {
        entry.permits -= permits.get();
        self.permits_in_use -= permits.get() as usize;
        if entry.permits == 0 {
            self.held_keys -= 1;
        }
    }
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

/// The keys of one request for several keys at once ([`LockTable::acquire_all`]): at least
/// one key, each once, in the order first given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySet<K>(Box<[K]>);

impl<K: Hash + Eq> KeySet<K> {
    /// The distinct keys of `keys`, in order of first appearance; `None` if there are none.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::table::KeySet;
    ///
    /// let keys = KeySet::new(["b", "a", "b"]).unwrap();
    /// assert_eq!(keys.as_slice(), ["b", "a"]);
    /// assert!(KeySet::<&str>::new([]).is_none());
    /// ```
    pub fn new(keys: impl IntoIterator<Item = K>) -> Option<Self> {
        let mut keys: Vec<K> = keys.into_iter().collect();
        if keys.is_empty() {
            return None;
        }
        let first_seen: Vec<bool> = {
            let mut seen: std::collections::HashSet<&K, foldhash::fast::RandomState> =
                std::collections::HashSet::with_capacity_and_hasher(keys.len(), Default::default());
            keys.iter().map(|key| seen.insert(key)).collect()
        };
        let mut first_seen = first_seen.into_iter();
        keys.retain(|_| first_seen.next().unwrap_or(false));
        Some(KeySet(keys.into_boxed_slice()))
    }
}

impl<K> KeySet<K> {
    /// The keys, in order of first appearance.
    pub fn as_slice(&self) -> &[K] {
        &self.0
    }

    /// The one key of a set of one, or the set itself.
    pub(crate) fn into_single(self) -> Result<K, Self> {
        match <Box<[K; 1]>>::try_from(self.0) {
            Ok(one) => {
                let [key] = *one;
                Ok(key)
            }
            Err(keys) => Err(KeySet(keys)),
        }
    }

    /// The keys, in order of first appearance.
    pub fn into_vec(self) -> Vec<K> {
        self.0.into_vec()
    }
}

/// One key's state.
///
/// 16 bytes: the number of holders is not kept, since every holder holds at least one
/// permit, so `permits > 0` says whether the key is held.
#[derive(Debug, Default)]
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
/// waiter's record, so that a holder's record carries no permit count; `group` (free: it fills the slot's padding) says that the waiter asks for several
/// keys at once, so that the grant loop learns it without a lookup.
#[derive(Debug, Clone, Copy)]
struct Queued {
    waiter_id: WaiterId,
    permits: Permits,
    group: bool,
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
    /// Holds `permits` of its key's permits, granted under `fencing_token` (invariant 8).
    Holding {
        permits: Permits,
        fencing_token: SplitToken,
    },
}

/// A fencing token as two `u32` halves: aligned to 4 rather than 8, the holding state fits in
/// the bytes a delivery leaves beside its tag, so keeping the token costs a record nothing
/// (24 bytes for a `u64` key, with or without it; a `u64` field makes it 32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SplitToken([u32; 2]);

impl SplitToken {
    fn new(token: u64) -> Self {
        // Truncations on purpose: the low and the high half.
        SplitToken([token as u32, (token >> 32) as u32])
    }

    fn get(self) -> u64 {
        u64::from(self.0[0]) | (u64::from(self.0[1]) << 32)
    }
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
#[cfg(any(test, feature = "unstable-table"))]
pub struct InvariantViolation {
    /// The number of the invariant in the module docs of `src/pure/table.rs`.
    pub invariant: u8,
    /// What was found.
    pub detail: String,
}

#[cfg(any(test, feature = "unstable-table"))]
impl fmt::Display for InvariantViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant {} broken: {}", self.invariant, self.detail)
    }
}

#[cfg(any(test, feature = "unstable-table"))]
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
            ledger: Ledger {
                records: Records::new(),
                groups: HashMap::default(),
                next_fencing_token: 1,
                capacity,
                counts: Counts::default(),
                marks: Marks::new(),
            },
        }
    }

    /// The permits each key has.
    #[cfg(any(test, feature = "unstable-table"))]
    pub fn capacity(&self) -> NonZeroU32 {
        self.ledger.capacity
    }

    /// A request for `count` of a key's permits.
    ///
    /// # Errors
    ///
    /// [`PermitsOutOfRange`] if `count` is 0 or above the table's capacity.
    pub fn permits(&self, count: u32) -> Result<Permits, PermitsOutOfRange> {
        let capacity = self.ledger.capacity;
        NonZeroU32::new(count)
            .filter(|count| *count <= capacity)
            .map(Permits)
            .ok_or(PermitsOutOfRange {
                requested: count,
                capacity: capacity.get(),
            })
    }

    /// A request for every permit of a key: an exclusive lock.
    pub fn all_permits(&self) -> Permits {
        Permits(self.ledger.capacity)
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
        let LockTable { entries, ledger } = self;
        let entry = match entries.entry(key) {
            hash_map::Entry::Occupied(mut occupied) => {
                let entry = occupied.get_mut();
                // Invariant 5: with no live waiter ahead, fitting is the only condition.
                if entry.waiters > 0 || !ledger.fits(entry, permits) {
                    let waiter_id = ledger.records.insert(Record {
                        key: occupied.key().clone(),
                        state: RecordState::Waiting(delivery),
                    });
                    occupied.get_mut().queue_waiter(waiter_id, permits, false);
                    ledger.counts.waiting += 1;
                    return Acquired::Queued(waiter_id);
                }
                occupied
            }
            hash_map::Entry::Vacant(vacant) => vacant.insert_entry(Entry::default()),
        };
        let key = entry.key().clone();
        let (waiter_id, fencing_token) = ledger.hold(entry.into_mut(), key, permits);
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
        let LockTable { entries, ledger } = self;
        let entry = match entries.entry(key) {
            hash_map::Entry::Occupied(occupied) => {
                if occupied.get().waiters > 0 || !ledger.fits(occupied.get(), permits) {
                    return Err(WouldBlock);
                }
                occupied
            }
            hash_map::Entry::Vacant(vacant) => vacant.insert_entry(Entry::default()),
        };
        let key = entry.key().clone();
        let (waiter_id, fencing_token) = ledger.hold(entry.into_mut(), key, permits);
        Ok(Grant {
            waiter_id,
            fencing_token,
            delivery: (),
        })
    }

    /// Asks for every key of `keys` exclusively, all at once: the request takes its place in
    /// the queue of each of its keys in this one step, and is granted, with one grant and one
    /// fencing token for all of them, once it is the first waiter of every one of its keys and
    /// none of them is held. Granted at once if that is already so.
    ///
    /// No set of such requests can wait for each other in a cycle: every queue is in order of
    /// arrival, so the earliest waiting request is the first waiter of each of its keys and
    /// waits only for their holders. A set of one key is the same as [`acquire`](Self::acquire).
    pub fn acquire_all(&mut self, keys: KeySet<K>, delivery: D) -> Acquired<D> {
        let keys = match keys.into_single() {
            Ok(key) => return self.acquire(key, delivery),
            Err(keys) => keys.0,
        };
        let permits = self.all_permits();
        let LockTable { entries, ledger } = self;
        if ledger.all_free(entries, &keys, permits) {
            let (waiter_id, fencing_token) = ledger.hold_all(entries, keys, permits);
            return Acquired::Granted(Grant {
                waiter_id,
                fencing_token,
                delivery,
            });
        }
        let waiter_id = ledger.records.insert(Record {
            key: keys[0].clone(),
            state: RecordState::Waiting(delivery),
        });
        for key in &keys {
            entries
                .entry(key.clone())
                .or_default()
                .queue_waiter(waiter_id, permits, true);
        }
        ledger.counts.waiting += 1;
        ledger.groups.insert(waiter_id, keys);
        Acquired::Queued(waiter_id)
    }

    /// Takes every key of `keys` exclusively if none is held or has waiters; otherwise changes
    /// nothing, creates no entry and returns [`WouldBlock`]. A set of one key is the same as
    /// [`try_acquire`](Self::try_acquire).
    pub fn try_acquire_all(&mut self, keys: KeySet<K>) -> Result<Grant<()>, WouldBlock> {
        let keys = match keys.into_single() {
            Ok(key) => return self.try_acquire(key),
            Err(keys) => keys.0,
        };
        let permits = self.all_permits();
        let LockTable { entries, ledger } = self;
        if !ledger.all_free(entries, &keys, permits) {
            return Err(WouldBlock);
        }
        let (waiter_id, fencing_token) = ledger.hold_all(entries, keys, permits);
        Ok(Grant {
            waiter_id,
            fencing_token,
            delivery: (),
        })
    }

    /// Ends the hold of `waiter_id` on its key (or keys) and grants the permits to the waiters
    /// at the front of the queues that now fit, in order, appending their grants to `granted`.
    /// Returns the released key; for a holder of several keys, the first of them
    /// ([`keys_of`](Self::keys_of) lists them all while the holder is live).
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
        let LockTable { entries, ledger } = self;
        let removed = ledger.records.remove_if(waiter_id, |record| {
            matches!(record.state, RecordState::Holding { .. })
        });
        let (key, permits) = match removed {
            Ok(Record {
                key,
                state: RecordState::Holding { permits, .. },
            }) => (key, permits),
            Err(NotRemoved::Refused) => return Err(WaiterError::NotHolding(waiter_id)),
            // `Ok` with a waiting record is unreachable: `remove_if` took only a holder.
            Ok(_) | Err(NotRemoved::Absent) => return Err(WaiterError::Unknown(waiter_id)),
        };
        ledger.counts.holders -= 1;
        if let Some(keys) = ledger.take_group(waiter_id) {
            ledger.release_group(entries, &keys, permits, granted);
            return Ok(key);
        }
        // One hash and one probe for the usual release, which leaves nobody waiting: the
        // record's key finds the entry, and removes it through the same lookup.
        let hash_map::Entry::Occupied(mut occupied) = entries.entry(key) else {
            // Unreachable while invariant 1 holds; refusing beats panicking (a vacant entry
            // inserts nothing).
            debug_assert!(false, "invariant 1: holder without entry");
            return Err(WaiterError::Unknown(waiter_id));
        };
        let entry = occupied.get_mut();
        ledger.counts.give_back(entry, permits);
        if entry.waiters == 0 {
            if entry.is_unused() {
                // Invariant 1: its last user is gone.
                return Ok(occupied.remove_entry().0);
            }
            return Ok(occupied.key().clone());
        }
        let settled = ledger.grant_fitting(entry, granted);
        let key = occupied.key().clone();
        ledger.finish(entries, &key, settled, granted);
        Ok(key)
    }

    /// Withdraws `waiter_id` from its key's queue (or its keys' queues) and returns its key
    /// (for a request of several keys, the first of them) and delivery.
    ///
    /// A waiter that could not be granted holds back the requests behind it (FIFO);
    /// withdrawing it lets those that now can through, and their grants are appended to
    /// `granted`: a request for more permits than are free, or for several keys at once. The
    /// id stays in the queue as a tombstone until it reaches the front or the queue is
    /// compacted (invariants 4 and 6), which keeps this O(1) amortized per key.
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
        let LockTable { entries, ledger } = self;
        let removed = ledger.records.remove_if(waiter_id, |record| {
            matches!(record.state, RecordState::Waiting(_))
        });
        let (key, delivery) = match removed {
            Ok(Record {
                key,
                state: RecordState::Waiting(delivery),
            }) => (key, delivery),
            Err(NotRemoved::Refused) => return Err(WaiterError::NotWaiting(waiter_id)),
            // `Ok` with a holding record is unreachable: `remove_if` took only a waiter.
            Ok(_) | Err(NotRemoved::Absent) => return Err(WaiterError::Unknown(waiter_id)),
        };
        ledger.counts.waiting -= 1;
        if let Some(keys) = ledger.take_group(waiter_id) {
            let first_new = granted.len();
            for key in &keys {
                match entries.get_mut(key) {
                    Some(entry) => entry.waiters -= 1,
                    None => debug_assert!(false, "invariant 1: waiter without entry"),
                }
            }
            for key in &keys {
                ledger.settle(entries, key, granted);
            }
            ledger.in_arrival_order(&mut granted[first_new..]);
            return Ok((key, delivery));
        }
        let Some(entry) = entries.get_mut(&key) else {
            debug_assert!(false, "invariant 1: waiter without entry");
            return Ok((key, delivery));
        };
        entry.waiters -= 1;
        // Behind a live waiter, the withdrawn one held nobody back: grants go in queue order,
        // and the first live waiter, which could not be granted (invariant 5), is unchanged.
        // The entry stays in use, so only the bound on tombstones (invariant 6) can change.
        // This is the usual cancel of a timed-out waiter, and it skips the grant loop.
        let behind_a_live_waiter = entry.queue.front().is_some_and(|first| {
            first.waiter_id != waiter_id && ledger.records.contains(first.waiter_id)
        });
        if behind_a_live_waiter {
            ledger.compact_queue(entry);
            return Ok((key, delivery));
        }
        ledger.settle(entries, &key, granted);
        Ok((key, delivery))
    }

    /// Empties the table: every waiter is withdrawn and returned with its delivery, in order of
    /// arrival; every hold is forgotten, and later releases of old ids return
    /// [`WaiterError::Unknown`]. Fencing tokens and waiter ids keep increasing afterwards.
    pub fn shutdown(&mut self) -> Vec<(WaiterId, D)> {
        let waiters = self
            .ledger
            .records
            .drain()
            .into_iter()
            .filter_map(|(waiter_id, record)| match record.state {
                RecordState::Waiting(delivery) => Some((waiter_id, delivery)),
                RecordState::Holding { .. } => None,
            })
            .collect();
        self.entries.clear();
        self.ledger.groups.clear();
        self.ledger.counts = Counts::default();
        waiters
    }

    /// The key `waiter_id` holds or waits for, if the id is live; for a request of several
    /// keys, the first of them.
    pub fn key_of(&self, waiter_id: WaiterId) -> Option<&K> {
        self.ledger.records.get(waiter_id).map(|record| &record.key)
    }

    /// Every key `waiter_id` holds or waits for, if the id is live: one key, or the keys of a
    /// request for several at once.
    pub fn keys_of(&self, waiter_id: WaiterId) -> Option<&[K]> {
        let record = self.ledger.records.get(waiter_id)?;
        match self.ledger.groups.get(&waiter_id) {
            Some(keys) => Some(keys),
            None => Some(std::slice::from_ref(&record.key)),
        }
    }

    /// The delivery of a waiter that is still queued.
    #[cfg(any(test, feature = "unstable-table"))]
    pub fn delivery_of(&self, waiter_id: WaiterId) -> Option<&D> {
        match self.ledger.records.get(waiter_id)?.state {
            RecordState::Waiting(ref delivery) => Some(delivery),
            RecordState::Holding { .. } => None,
        }
    }

    /// The delivery of a waiter that is still queued, to replace it. The table never looks
    /// at deliveries, so this changes nothing it records.
    pub fn delivery_mut(&mut self, waiter_id: WaiterId) -> Option<&mut D> {
        match self.ledger.records.get_mut(waiter_id)?.state {
            RecordState::Waiting(ref mut delivery) => Some(delivery),
            RecordState::Holding { .. } => None,
        }
    }

    /// Whether `key` has an entry, that is a holder or a waiter.
    #[cfg(any(test, feature = "unstable-table"))]
    pub fn contains_key(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// Counts at this instant, in O(1).
    pub fn stats(&self) -> RegistryStats {
        let counts = &self.ledger.counts;
        RegistryStats {
            keys: self.entries.len(),
            held: counts.held_keys,
            holders: counts.holders,
            permits: counts.permits_in_use,
            waiting: counts.waiting,
            grants: self.ledger.next_fencing_token - 1,
        }
    }

    /// Checks every invariant of the [module docs](self) in O(keys + records + queued ids).
    ///
    /// # Errors
    ///
    /// The first broken invariant found.
    #[cfg(any(test, feature = "unstable-table"))]
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let broken = |invariant: u8, detail: String| Err(InvariantViolation { invariant, detail });
        if let Err(detail) = self.ledger.records.check() {
            return broken(9, detail);
        }
        for (group, keys) in &self.ledger.groups {
            match self.ledger.records.get(*group) {
                None => return broken(10, format!("group {group:?} has no record")),
                Some(record) if keys.len() < 2 || keys.first() != Some(&record.key) => {
                    return broken(
                        10,
                        format!(
                            "group {group:?} has {} keys, or not its record's",
                            keys.len()
                        ),
                    );
                }
                Some(_) => {}
            }
        }
        let mut holding_of: HashMap<&K, u32> = HashMap::new();
        let mut waiting_of: HashMap<&K, u32> = HashMap::new();
        let mut permits_of: HashMap<&K, u32> = HashMap::new();
        let (mut holding_records, mut waiting_records) = (0, 0);
        for (waiter_id, record) in self.ledger.records.iter() {
            let keys = self.keys_of(waiter_id).unwrap_or_default();
            for key in keys {
                if !self.entries.contains_key(key) {
                    return broken(1, format!("record {waiter_id:?} has no entry"));
                }
                match record.state {
                    RecordState::Holding { permits, .. } => {
                        *holding_of.entry(key).or_default() += 1;
                        *permits_of.entry(key).or_default() += permits.get();
                    }
                    RecordState::Waiting(_) => *waiting_of.entry(key).or_default() += 1,
                }
            }
            match record.state {
                RecordState::Holding { .. } => holding_records += 1,
                RecordState::Waiting(_) => waiting_records += 1,
            }
        }
        let (mut held_keys, mut permits_total) = (0, 0);
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
            if entry.permits != permits || permits > self.ledger.capacity.get() {
                return broken(
                    3,
                    format!(
                        "entry counts {} permits, its holders hold {permits}, capacity {}",
                        entry.permits, self.ledger.capacity
                    ),
                );
            }
            if let Err(detail) = self.check_queue(key, entry) {
                return broken(4, detail);
            }
            if let Some(first) = self.ledger.first_live(entry)
                && self.grantable(first)
            {
                return broken(
                    5,
                    format!(
                        "the first waiter {:?} asks for {} permits, {} are free, and it waits \
                         for nothing else",
                        first.waiter_id,
                        first.permits.get(),
                        self.ledger.capacity.get().saturating_sub(entry.permits)
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
            permits_total += entry.permits as usize;
        }
        if let Err(detail) = self.check_tokens() {
            return broken(8, detail);
        }
        if let Err(detail) = self.ledger.marks.check() {
            return broken(11, detail);
        }
        if self.ledger.next_fencing_token <= holding_records as u64 {
            return broken(
                8,
                format!(
                    "{holding_records} holders but only {} tokens handed out",
                    self.ledger.next_fencing_token - 1
                ),
            );
        }
        let counted = (held_keys, holding_records, permits_total, waiting_records);
        let counts = &self.ledger.counts;
        let kept = (
            counts.held_keys,
            counts.holders,
            counts.permits_in_use,
            counts.waiting,
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

    /// Invariant 8 for the holders' records: each token handed out already, none twice.
    #[cfg(any(test, feature = "unstable-table"))]
    fn check_tokens(&self) -> Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        for (waiter_id, record) in self.ledger.records.iter() {
            if let RecordState::Holding { fencing_token, .. } = record.state {
                let token = fencing_token.get();
                if token >= self.ledger.next_fencing_token || !seen.insert(token) {
                    return Err(format!(
                        "holder {waiter_id:?} keeps token {token}, handed out twice or not yet"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Invariant 4 for `key`'s queue: its live ids wait for `key`, in order of arrival, each
    /// once, flagged as a group exactly when they ask for several keys.
    #[cfg(any(test, feature = "unstable-table"))]
    fn check_queue(&self, key: &K, entry: &Entry) -> Result<(), String> {
        let mut live_in_queue = 0;
        let mut previous: Option<WaiterId> = None;
        for queued in entry.queue.iter() {
            let id = queued.waiter_id;
            if previous.is_some_and(|previous| previous >= id) {
                return Err(format!("{id:?} is queued after {previous:?}"));
            }
            previous = Some(id);
            let Some(record) = self.ledger.records.get(id) else {
                continue;
            };
            if !matches!(record.state, RecordState::Waiting(_)) {
                return Err(format!("holder {id:?} is still queued"));
            }
            if !self.keys_of(id).unwrap_or_default().contains(key) {
                return Err(format!("waiter {id:?} queued under another key"));
            }
            if queued.group != self.ledger.groups.contains_key(&id) {
                return Err(format!(
                    "waiter {id:?} is flagged wrongly as a group or not"
                ));
            }
            live_in_queue += 1;
        }
        if live_in_queue != entry.waiters {
            return Err(format!(
                "{live_in_queue} live ids queued for {} waiters",
                entry.waiters
            ));
        }
        Ok(())
    }

    /// Whether the queued waiter `first`, the first live waiter of one of its keys, could be
    /// granted now: it fits there and, if it asks for several keys, is the first live waiter
    /// of each of them and fits on each.
    #[cfg(any(test, feature = "unstable-table"))]
    fn grantable(&self, first: &Queued) -> bool {
        let keys = self.keys_of(first.waiter_id).unwrap_or_default();
        self.ledger
            .ready(&self.entries, first.waiter_id, keys)
            .is_some()
    }
}

impl Entry {
    /// Queues `waiter_id`, asking for `permits` (as one of several keys if `group`), and
    /// counts it as a waiter of this key (invariants 2 and 4).
    fn queue_waiter(&mut self, waiter_id: WaiterId, permits: Permits, group: bool) {
        self.queue.push_back(Queued {
            waiter_id,
            permits,
            group,
        });
        self.waiters += 1;
    }
}

/// Whether `asked` permits fit beside the `held` ones of a key with `capacity`. Compared as
/// what is left rather than as a sum, which would wrap in `u32` for a capacity near
/// `u32::MAX`. `held` is at most `capacity` (invariant 3); were it not, nothing would fit.
#[inline]
fn fits_beside(capacity: NonZeroU32, held: u32, asked: Permits) -> bool {
    asked.get() <= capacity.get().saturating_sub(held)
}

impl<K, D> Ledger<K, D> {
    /// Whether `permits` more fit in `entry` (invariant 3).
    #[inline]
    fn fits(&self, entry: &Entry, permits: Permits) -> bool {
        fits_beside(self.capacity, entry.permits, permits)
    }

    /// Hands out the next fencing token (invariant 8). A `u64` does not wrap in practice: at
    /// a billion grants a second it lasts 584 years.
    fn next_token(&mut self) -> u64 {
        let token = self.next_fencing_token;
        self.next_fencing_token = token.saturating_add(1);
        token
    }

    /// Makes a new holder of `permits` on `entry`, which has room for them, counts it, and
    /// returns its id and token.
    fn hold(&mut self, entry: &mut Entry, key: K, permits: Permits) -> (WaiterId, u64) {
        let fencing_token = self.next_token();
        let waiter_id = self.records.insert(Record {
            key,
            state: RecordState::Holding {
                permits,
                fencing_token: SplitToken::new(fencing_token),
            },
        });
        self.counts.take(entry, permits);
        self.counts.holders += 1;
        (waiter_id, fencing_token)
    }

    /// Drops the tombstones from `entry`'s queue once they outnumber its live waiters by more
    /// than the slack (invariant 6). Amortized O(1) per cancel or grant.
    fn compact_queue(&self, entry: &mut Entry) {
        if entry.queue.len() > 2 * entry.waiters as usize + TOMBSTONE_SLACK {
            entry
                .queue
                .retain(|queued| self.records.contains(queued.waiter_id));
        }
    }

    /// The first queued waiter of `entry` that is still waiting, skipping tombstones.
    fn first_live<'e>(&self, entry: &'e Entry) -> Option<&'e Queued> {
        entry
            .queue
            .iter()
            .find(|queued| self.records.contains(queued.waiter_id))
    }

    /// The keys of `waiter_id` if it asks for or holds several at once, taken out of the group
    /// map. Free when no group is live: a single-key release then does no lookup here.
    #[inline]
    fn take_group(&mut self, waiter_id: WaiterId) -> Option<Box<[K]>> {
        if self.groups.is_empty() {
            return None;
        }
        self.groups.remove(&waiter_id)
    }

    /// Grants the first live waiter of `entry` if its permits fit, dropping tombstones on the
    /// way, and counts it as a holder.
    fn grant_next(&mut self, entry: &mut Entry) -> Next<D> {
        while let Some(&Queued {
            waiter_id,
            permits,
            group,
        }) = entry.queue.front()
        {
            // A tombstone (cancelled waiter) has no record any more: skip it (invariant 4).
            let Some(record) = self.records.get_mut(waiter_id) else {
                entry.queue.pop_front();
                continue;
            };
            // Fields rather than `fits` and `next_token`: the record stays borrowed, so one
            // lookup serves the whole grant.
            if !fits_beside(self.capacity, entry.permits, permits) {
                return Next::Blocked;
            }
            if group {
                return Next::GroupFirst(waiter_id);
            }
            let fencing_token = self.next_fencing_token;
            let holding = RecordState::Holding {
                permits,
                fencing_token: SplitToken::new(fencing_token),
            };
            let RecordState::Waiting(delivery) = std::mem::replace(&mut record.state, holding)
            else {
                // Invariant 4 says queued live ids are waiting; a holder here would be a bug.
                debug_assert!(false, "invariant 4: a holder in the queue");
                entry.queue.pop_front();
                continue;
            };
            self.next_fencing_token = fencing_token.saturating_add(1);
            entry.queue.pop_front();
            entry.waiters -= 1;
            entry.permits += permits.get();
            self.counts.waiting -= 1;
            self.counts.holders += 1;
            self.counts.permits_in_use += permits.get() as usize;
            return Next::Granted(Grant {
                waiter_id,
                fencing_token,
                delivery,
            });
        }
        Next::Blocked
    }

    /// After a release or a cancel on the key whose entry is `entry`: grants the waiters at
    /// the front of its queue that fit, in order, stopping at the first that does not (FIFO,
    /// invariant 5) or at a request for several keys; then compacts the queue (invariant 6).
    /// Takes the entry rather than its key, so that the caller keeps its one lookup.
    fn grant_fitting(&mut self, entry: &mut Entry, granted: &mut Vec<Grant<D>>) -> Settled {
        let was_held = entry.permits > 0;
        let stop = loop {
            match self.grant_next(entry) {
                Next::Granted(grant) => granted.push(grant),
                Next::Blocked => break None,
                Next::GroupFirst(group) => break Some(group),
            }
        };
        if !was_held && entry.permits > 0 {
            self.counts.held_keys += 1;
        }
        self.compact_queue(entry);
        match stop {
            Some(group) => Settled::GroupFirst(group),
            None => Settled::by_use(entry),
        }
    }
}

impl<K: Hash + Eq + Clone, D> Ledger<K, D> {
    /// Whether `permits` of every key of `keys` could be taken now: nobody waits for any of
    /// them and the permits fit on each (invariant 5).
    fn all_free(&self, entries: &EntryMap<K>, keys: &[K], permits: Permits) -> bool {
        keys.iter().all(|key| {
            entries
                .get(key)
                .is_none_or(|entry| entry.waiters == 0 && self.fits(entry, permits))
        })
    }

    /// Makes a new holder of `permits` on each of `keys`, which have room for them, counts
    /// it, and returns its id and token: one record and one token for all the keys
    /// (invariant 10).
    fn hold_all(
        &mut self,
        entries: &mut EntryMap<K>,
        keys: Box<[K]>,
        permits: Permits,
    ) -> (WaiterId, u64) {
        for key in &keys {
            self.counts
                .take(entries.entry(key.clone()).or_default(), permits);
        }
        let fencing_token = self.next_token();
        let waiter_id = self.records.insert(Record {
            key: keys[0].clone(),
            state: RecordState::Holding {
                permits,
                fencing_token: SplitToken::new(fencing_token),
            },
        });
        self.counts.holders += 1;
        self.groups.insert(waiter_id, keys);
        (waiter_id, fencing_token)
    }

    /// Ends a hold of `permits` on each of `keys`, whose record is already gone and counted
    /// off, then grants what now can be on each key; the step's grants take their tokens in
    /// order of arrival.
    fn release_group(
        &mut self,
        entries: &mut EntryMap<K>,
        keys: &[K],
        permits: Permits,
        granted: &mut Vec<Grant<D>>,
    ) {
        let first_new = granted.len();
        for key in keys {
            let Some(entry) = entries.get_mut(key) else {
                debug_assert!(false, "invariant 1: holder without entry");
                continue;
            };
            self.counts.give_back(entry, permits);
        }
        for key in keys {
            self.settle(entries, key, granted);
        }
        self.in_arrival_order(&mut granted[first_new..]);
    }

    /// Grants on `key` whatever now can be granted, requests for several keys included, and
    /// removes its entry if nobody is left (invariant 1).
    fn settle(&mut self, entries: &mut EntryMap<K>, key: &K, granted: &mut Vec<Grant<D>>) {
        if let Some(entry) = entries.get_mut(key) {
            let settled = self.grant_fitting(entry, granted);
            self.finish(entries, key, settled, granted);
        }
    }

    /// Does what `key`'s grant loop left to do: remove its entry if nobody is left
    /// (invariant 1), or try the request for several keys at its front, and if that is
    /// granted, settle the key again with what that grant left.
    fn finish(
        &mut self,
        entries: &mut EntryMap<K>,
        key: &K,
        settled: Settled,
        granted: &mut Vec<Grant<D>>,
    ) {
        match settled {
            Settled::Unused => {
                entries.remove(key);
            }
            Settled::InUse => {}
            Settled::GroupFirst(group) => {
                if self.grant_group(entries, group, granted) {
                    self.settle(entries, key, granted);
                }
            }
        }
    }

    /// Grants the request for several keys `group` if it is the first live waiter of each of
    /// its keys and fits on each; otherwise changes nothing. Returns whether it was granted.
    fn grant_group(
        &mut self,
        entries: &mut EntryMap<K>,
        group: WaiterId,
        granted: &mut Vec<Grant<D>>,
    ) -> bool {
        let Some(keys) = self.groups.get(&group) else {
            debug_assert!(false, "invariant 10: a group in a queue without its keys");
            return false;
        };
        let Some(permits) = self.ready(entries, group, keys) else {
            return false;
        };
        let Some(record) = self.records.get_mut(group) else {
            return false;
        };
        let fencing_token = self.next_fencing_token;
        let holding = RecordState::Holding {
            permits,
            fencing_token: SplitToken::new(fencing_token),
        };
        let RecordState::Waiting(delivery) = std::mem::replace(&mut record.state, holding) else {
            debug_assert!(false, "invariant 4: a holder in the queue");
            return false;
        };
        for key in keys {
            let Some(entry) = entries.get_mut(key) else {
                continue;
            };
            // Tombstones, then the group itself: it is the first live waiter (checked above).
            while let Some(front) = entry.queue.pop_front() {
                if front.waiter_id == group {
                    break;
                }
            }
            entry.waiters -= 1;
            self.counts.take(entry, permits);
        }
        self.counts.waiting -= 1;
        self.counts.holders += 1;
        self.next_fencing_token = fencing_token.saturating_add(1);
        granted.push(Grant {
            waiter_id: group,
            fencing_token,
            delivery,
        });
        true
    }

    /// The permits `waiter_id` asks for, if it could be granted all of `keys` now: it is the
    /// first live waiter of each and fits on each.
    fn ready(&self, entries: &EntryMap<K>, waiter_id: WaiterId, keys: &[K]) -> Option<Permits> {
        let mut permits = None;
        for key in keys {
            let entry = entries.get(key)?;
            let first = self.first_live(entry)?;
            if first.waiter_id != waiter_id || !self.fits(entry, first.permits) {
                return None;
            }
            permits = Some(first.permits);
        }
        permits
    }
}

/// Where a key stands after its grant loop.
enum Settled {
    /// Nobody holds or waits for it: its entry must go in this step (invariant 1).
    Unused,
    /// Held, or with a waiter that cannot be granted yet.
    InUse,
    /// Its first live waiter asks for several keys and fits on this one: whether it is
    /// granted depends on its other keys, which only the caller can see.
    GroupFirst(WaiterId),
}

impl Settled {
    fn by_use(entry: &Entry) -> Self {
        if entry.is_unused() {
            Settled::Unused
        } else {
            Settled::InUse
        }
    }
}

impl<K, D> Ledger<K, D> {
    /// Puts the grants of one step in order of arrival, with its tokens in increasing order,
    /// and gives each holder's record its grant's new token (invariant 8).
    ///
    /// A step that touches several keys (the release or cancel of a request for several keys)
    /// runs each key's grant loop in turn, so its grants come out by key. Ordering them by
    /// arrival makes the tokens, and so the journal, independent of the order of the keys in
    /// the request.
    fn in_arrival_order(&mut self, grants: &mut [Grant<D>]) {
        // One step's tokens are consecutive: each grant takes the next.
        let Some(first_token) = grants.iter().map(|grant| grant.fencing_token).min() else {
            return;
        };
        grants.sort_unstable_by_key(|grant| grant.waiter_id);
        for (grant, token) in grants.iter_mut().zip(first_token..) {
            grant.fencing_token = token;
            if let Some(Record {
                state: RecordState::Holding { fencing_token, .. },
                ..
            }) = self.records.get_mut(grant.waiter_id)
            {
                *fencing_token = SplitToken::new(token);
            }
        }
    }
}

/// What the grant loop found at the front of a queue.
enum Next<D> {
    /// The first live waiter fit and holds the key now.
    Granted(Grant<D>),
    /// The queue is empty, or its first live waiter does not fit.
    Blocked,
    /// The first live waiter asks for several keys and fits on this one.
    GroupFirst(WaiterId),
}

impl<K: fmt::Debug, D> fmt::Debug for LockTable<K, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockTable")
            .field("keys", &self.entries.len())
            .field("held", &self.ledger.counts.held_keys)
            .field("waiting", &self.ledger.counts.waiting)
            .field("next_fencing_token", &self.ledger.next_fencing_token)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
