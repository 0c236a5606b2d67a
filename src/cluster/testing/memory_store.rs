//! The lease store in memory: the table of `postgres` as a map behind a mutex, shared by several
//! stores (one per simulated process, each its own owner), on tokio's clock.
//!
//! It keeps the invariants of the PostgreSQL table (see `postgres`) with the same five
//! operations, each one critical section and so atomic, as each statement is there:
//!
//! 1. A key is held by `owner` exactly while `owner` is set and `expires_at` is after
//!    [`Instant::now`]. tokio's clock decides, so a test on a paused clock decides when leases
//!    run out.
//! 2. `fence` only grows, by one at each acquisition, and a row is never removed.
//! 3. Renew and release act only on the row of their `(key, owner, fence)`.
//! 4. A release queues its notice to every store of the table within the critical section that
//!    releases, so no store sees the key free before its notice is queued, if an acquisition
//!    was refused the key since it was taken (`wanted`), as in `postgres`.
//! 5. A try takes a key only if an acquisition would, and no waiter can still be on its way:
//!    no request's refusal is recorded less than a lease ago (the waiting mark, invariant 7),
//!    and for a whole lease also: the key is not wanted, or its last lease ended at least a
//!    lease length ago. A refused try changes nothing.
//! 6. Part leases: a key is held by its whole lease or by part leases, never both, and its
//!    live part leases hold at most `capacity` permits together. Each has a fence from the
//!    key's one counter.
//! 7. A refused acquisition records its size (the whole of the capacity for a whole lease) as
//!    the key's waiting mark, for a lease; while the mark lives, no smaller request is granted,
//!    and a grant at least as large clears it. A request the mark held back was refused while
//!    the key may have been free, so it hears of the key only through announcements: a part
//!    grant on a wanted key that leaves permits free announces the key, and a whole grant
//!    made while a mark lives keeps the key wanted, so that its release is announced.
//!
//! What it does not have: a connection (no call fails, none is cut, none times out) and a
//! listener (notices cannot be lost, so it never says [`LeaseNotice::Missed`] unless a
//! receiver falls [`CAPACITY`](crate::cluster::locking::notices::CAPACITY) behind).
//!
//! Only tests use it, so only tests compile it: in the library it would be dead code.

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::cluster::error::LeaseError;
use crate::cluster::locking::lease_store::{
    Fence, LeaseNotice, LeaseStore, Renewal, check_key, check_part,
};
use crate::cluster::locking::notices::{self, LeaseNotices, NoticeSender};

/// The table that the stores made by [`MemoryLeaseTable::store`] share. Cheap to clone: the
/// clones are the same table.
#[derive(Clone, Default)]
pub(crate) struct MemoryLeaseTable {
    shared: Arc<Mutex<Table>>,
}

struct Table {
    /// Permits per key: a whole lease takes them all.
    capacity: NonZeroU32,
    rows: BTreeMap<String, Row>,
    /// Each live store's notices, by owner: every release is queued to all of them. Ordered
    /// maps, here and in `rows`, so that a run repeats exactly, notices included.
    listeners: BTreeMap<String, NoticeSender>,
    /// Owners handed out so far, to number the next one: owners are never reused, so a
    /// store made after another dropped cannot release the old one's leases.
    owners_made: u64,
    /// Bugs planted on purpose, for the simulator's proof that it finds them: renewals that
    /// ignore the fence, and tries that take a key a waiter was refused.
    renew_ignores_fence: bool,
    try_ignores_wanted: bool,
    /// More planted bugs: part leases granted past the capacity, whole leases granted over
    /// live part leases, and part leases granted past a larger waiting request.
    part_ignores_capacity: bool,
    whole_ignores_parts: bool,
    part_ignores_waiting: bool,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            capacity: NonZeroU32::MIN,
            rows: BTreeMap::new(),
            listeners: BTreeMap::new(),
            owners_made: 0,
            renew_ignores_fence: false,
            try_ignores_wanted: false,
            part_ignores_capacity: false,
            whole_ignores_parts: false,
            part_ignores_waiting: false,
        }
    }
}

/// One key's lease, as the PostgreSQL table's row: `owner` is `None` once released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) owner: Option<String>,
    pub(crate) fence: Fence,
    pub(crate) expires_at: Instant,
    /// An acquisition was refused the key since it was taken: its release is announced.
    pub(crate) wanted: bool,
    /// The key's part leases, live or run out (cleared away by the next part acquisition).
    pub(crate) parts: Vec<Part>,
    /// The largest request refused lately, and until when its refusal counts (invariant 7).
    pub(crate) waiting: Option<Waiting>,
}

/// A part lease: `permits` of the key's, for `owner`, under its own fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Part {
    pub(crate) owner: String,
    pub(crate) fence: Fence,
    pub(crate) permits: u32,
    pub(crate) expires_at: Instant,
}

/// A key's waiting mark: a request of `permits` was refused, and counts until `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Waiting {
    pub(crate) permits: u32,
    pub(crate) until: Instant,
}

impl Row {
    /// A row made by an acquisition of a key never acquired before.
    fn new(fence: Fence, now: Instant) -> Self {
        Row {
            owner: None,
            fence,
            expires_at: now,
            wanted: false,
            parts: Vec::new(),
            waiting: None,
        }
    }

    /// Whether the whole lease is held.
    pub(crate) fn is_held_at(&self, now: Instant) -> bool {
        self.owner.is_some() && self.expires_at > now
    }

    /// Permits held by live part leases.
    pub(crate) fn parts_held_at(&self, now: Instant) -> u32 {
        self.parts
            .iter()
            .filter(|part| part.expires_at > now)
            .map(|part| part.permits)
            .sum()
    }

    /// The waiting mark, if it still counts.
    pub(crate) fn waiting_at(&self, now: Instant) -> Option<Waiting> {
        self.waiting.filter(|waiting| waiting.until > now)
    }

    pub(crate) fn is_owned_by(&self, owner: &str) -> bool {
        self.owner.as_deref() == Some(owner)
    }

    /// Records a refusal of `permits` until `until` (invariant 7). A smaller refusal leaves a
    /// larger mark as it is: only the larger request's own refusals keep its mark alive, so a
    /// mark outlives a request that went away by at most a lease.
    fn refuse(&mut self, permits: u32, now: Instant, until: Instant) {
        self.wanted = true;
        match self.waiting_at(now) {
            Some(waiting) if waiting.permits > permits => {}
            _ => self.waiting = Some(Waiting { permits, until }),
        }
    }
}

impl MemoryLeaseTable {
    /// A table with no rows and no stores, and one permit per key.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A table whose keys have `capacity` permits each.
    pub(crate) fn with_capacity(capacity: NonZeroU32) -> Self {
        let table = Self::default();
        lock(&table.shared).capacity = capacity;
        table
    }

    /// A new store on this table, with an owner of its own and leases of `lease`, and its
    /// notices, as [`PgLeaseStore::connect`](crate::cluster::postgres::store::PgLeaseStore::connect) gives.
    pub(crate) fn store(&self, lease: Duration) -> (MemoryLeaseStore, LeaseNotices) {
        let (sender, notices) = notices::channel();
        let mut table = lock(&self.shared);
        table.owners_made += 1;
        let owner = format!("memory-{}", table.owners_made);
        table.listeners.insert(owner.clone(), sender);
        drop(table);
        let store = MemoryLeaseStore {
            owner,
            lease,
            table: self.clone(),
        };
        (store, notices)
    }

    /// `key`'s row, if it was ever acquired.
    pub(crate) fn row(&self, key: &str) -> Option<Row> {
        lock(&self.shared).rows.get(key).cloned()
    }

    /// Every row, by key.
    pub(crate) fn rows(&self) -> BTreeMap<String, Row> {
        lock(&self.shared).rows.clone()
    }

    /// Plants a bug: from now on a renewal matches the owner but not the fence, so an owner
    /// renews a lease it took again under a newer fence by naming the older one. Only the
    /// simulator's planted-bug tests call this.
    pub(crate) fn plant_renew_ignoring_fence(&self) {
        lock(&self.shared).renew_ignores_fence = true;
    }

    pub(crate) fn plant_try_ignoring_wanted(&self) {
        lock(&self.shared).try_ignores_wanted = true;
    }

    pub(crate) fn plant_part_ignoring_capacity(&self) {
        lock(&self.shared).part_ignores_capacity = true;
    }

    pub(crate) fn plant_whole_ignoring_parts(&self) {
        lock(&self.shared).whole_ignores_parts = true;
    }

    pub(crate) fn plant_part_ignoring_waiting(&self) {
        lock(&self.shared).part_ignores_waiting = true;
    }

    /// Permits per key.
    pub(crate) fn capacity(&self) -> NonZeroU32 {
        lock(&self.shared).capacity
    }
}

fn lock(shared: &Mutex<Table>) -> MutexGuard<'_, Table> {
    // No code panics while holding the lock; a poisoned table is still a valid table.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Table {
    /// Ends `key`'s lease and, if it was wanted, queues its notice to every store (invariant
    /// 4). `wanted` stays for the next acquisition to clear, as in `postgres`.
    fn release(&mut self, key: &str, now: Instant) {
        let Some(row) = self.rows.get_mut(key) else {
            return;
        };
        row.owner = None;
        row.expires_at = now;
        if row.wanted {
            self.announce(key);
        }
    }

    /// Ends `owner`'s part lease `fence` of `key`, announcing it if wanted: whether it was
    /// there.
    fn release_part(&mut self, key: &str, owner: &str, fence: Fence) -> bool {
        let Some(row) = self.rows.get_mut(key) else {
            return false;
        };
        let before = row.parts.len();
        row.parts
            .retain(|part| !(part.fence == fence && part.owner == owner));
        let released = row.parts.len() < before;
        if released && row.wanted {
            self.announce(key);
        }
        released
    }

    fn announce(&self, key: &str) {
        for listener in self.listeners.values() {
            listener.send(LeaseNotice::Released(key.to_owned()));
        }
    }

    /// Whether a whole lease of `row` for `owner` may be taken now (invariants 1, 6).
    fn whole_is_free(&self, row: &Row, owner: &str, now: Instant) -> bool {
        (!row.is_held_at(now) || row.is_owned_by(owner))
            && (self.whole_ignores_parts || row.parts_held_at(now) == 0)
    }

    /// Whether a part lease of `permits` of `row` may be taken now (invariants 6, 7).
    fn part_fits(&self, row: &Row, permits: u32, now: Instant) -> bool {
        let room =
            self.part_ignores_capacity || row.parts_held_at(now) + permits <= self.capacity.get();
        let overtakes = !self.part_ignores_waiting
            && row
                .waiting_at(now)
                .is_some_and(|waiting| waiting.permits > permits);
        !row.is_held_at(now) && room && !overtakes
    }

    /// Takes a part lease of `permits` of `key` for `owner` (the caller checked it fits, so no
    /// larger request waits): the next fence, the run-out parts cleared away, the waiting
    /// mark cleared, and announced if the key is wanted and permits stay free (invariant 7).
    fn take_part(
        &mut self,
        key: &str,
        owner: &str,
        permits: u32,
        now: Instant,
        lease: Duration,
    ) -> Fence {
        let capacity = self.capacity.get();
        let row = self
            .rows
            .entry(key.to_owned())
            .or_insert_with(|| Row::new(0, now));
        row.fence += 1;
        row.parts.retain(|part| part.expires_at > now);
        row.parts.push(Part {
            owner: owner.to_owned(),
            fence: row.fence,
            permits,
            expires_at: now + lease,
        });
        let fence = row.fence;
        row.waiting = None;
        if row.wanted && row.parts_held_at(now) < capacity {
            self.announce(key);
        }
        fence
    }
}

impl fmt::Debug for MemoryLeaseTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let table = lock(&self.shared);
        f.debug_struct("MemoryLeaseTable")
            .field("rows", &table.rows.len())
            .field("stores", &table.listeners.len())
            .finish()
    }
}

/// One owner's store on a [`MemoryLeaseTable`]. Dropping it ends its notices; its leases run
/// out unless [`release_all`](LeaseStore::release_all) ran first, as with PostgreSQL.
#[derive(Debug)]
pub(crate) struct MemoryLeaseStore {
    owner: String,
    lease: Duration,
    table: MemoryLeaseTable,
}

impl MemoryLeaseStore {
    /// This store's owner id, as its rows hold it.
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        lock(&self.table.shared)
    }
}

impl MemoryLeaseStore {
    /// `acquire_all` (`trying` false) and `try_acquire_all` (true): in one critical section,
    /// every key or none.
    fn take_all(&self, keys: &[String], trying: bool) -> Result<Option<Vec<Fence>>, LeaseError> {
        for key in keys {
            check_key(key)?;
        }
        let now = Instant::now();
        let expires_at = now + self.lease;
        let mut table = self.table();
        let capacity = table.capacity.get();
        let snatches = table.try_ignores_wanted;
        let free = |row: &Row| {
            table.whole_is_free(row, &self.owner, now)
                && !(trying
                    && !snatches
                    && ((row.wanted && row.expires_at + self.lease > now)
                        || row.waiting_at(now).is_some()))
        };
        let all_free = keys.iter().all(|key| table.rows.get(key).is_none_or(&free));
        if !all_free {
            if !trying {
                for key in keys {
                    let row = table
                        .rows
                        .entry(key.clone())
                        .or_insert_with(|| Row::new(0, now));
                    row.refuse(capacity, now, expires_at);
                }
            }
            return Ok(None);
        }
        let fences = keys
            .iter()
            .map(|key| {
                let row = table
                    .rows
                    .entry(key.clone())
                    .or_insert_with(|| Row::new(0, now));
                let held_back = capacity > 1 && row.waiting_at(now).is_some();
                row.wanted &= (row.is_owned_by(&self.owner) || held_back) && !trying;
                row.owner = Some(self.owner.clone());
                row.fence += 1;
                row.expires_at = expires_at;
                row.waiting = None;
                row.fence
            })
            .collect();
        Ok(Some(fences))
    }
}

impl LeaseStore for MemoryLeaseStore {
    async fn acquire(&self, key: &str) -> Result<Option<Fence>, LeaseError> {
        check_key(key)?;
        let now = Instant::now();
        let expires_at = now + self.lease;
        let mut table = self.table();
        let capacity = table.capacity.get();
        let free = table
            .rows
            .get(key)
            .is_none_or(|row| table.whole_is_free(row, &self.owner, now));
        let row = table
            .rows
            .entry(key.to_owned())
            .or_insert_with(|| Row::new(0, now));
        if !free {
            row.refuse(capacity, now, expires_at);
            return Ok(None);
        }
        // Ours too, as in `postgres`: an acquire whose reply was lost must not block the key.
        // Taken from another owner (or from nobody): whoever wanted it was told, unless a
        // smaller request was held back by a live waiting mark while the key was free: it
        // hears of the key only through this holder's release (invariant 7).
        let held_back = capacity > 1 && row.waiting_at(now).is_some();
        row.wanted &= row.is_owned_by(&self.owner) || held_back;
        row.owner = Some(self.owner.clone());
        row.fence += 1;
        row.expires_at = expires_at;
        // A whole lease is the largest request there is: every waiting mark is met.
        row.waiting = None;
        Ok(Some(row.fence))
    }

    async fn try_acquire(&self, key: &str) -> Result<Option<Fence>, LeaseError> {
        check_key(key)?;
        let now = Instant::now();
        let mut table = self.table();
        let snatches = table.try_ignores_wanted;
        let free = table.rows.get(key).is_none_or(|row| {
            // Free, expired or ours, and no waiter can still be on its way (invariant 5).
            table.whole_is_free(row, &self.owner, now)
                && (snatches
                    || (!(row.wanted && row.expires_at + self.lease > now)
                        && row.waiting_at(now).is_none()))
        });
        if !free {
            return Ok(None);
        }
        let row = table
            .rows
            .entry(key.to_owned())
            .or_insert_with(|| Row::new(0, now));
        row.wanted = false;
        row.owner = Some(self.owner.clone());
        row.fence += 1;
        row.expires_at = now + self.lease;
        row.waiting = None;
        Ok(Some(row.fence))
    }

    async fn acquire_part(
        &self,
        key: &str,
        permits: NonZeroU32,
    ) -> Result<Option<Fence>, LeaseError> {
        check_key(key)?;
        let now = Instant::now();
        let mut table = self.table();
        check_part(permits, table.capacity)?;
        let fits = table
            .rows
            .get(key)
            .is_none_or(|row| table.part_fits(row, permits.get(), now));
        if fits {
            return Ok(Some(table.take_part(
                key,
                &self.owner,
                permits.get(),
                now,
                self.lease,
            )));
        }
        if let Some(row) = table.rows.get_mut(key) {
            row.refuse(permits.get(), now, now + self.lease);
        }
        Ok(None)
    }

    async fn try_acquire_part(
        &self,
        key: &str,
        permits: NonZeroU32,
    ) -> Result<Option<Fence>, LeaseError> {
        check_key(key)?;
        let now = Instant::now();
        let mut table = self.table();
        check_part(permits, table.capacity)?;
        let snatches = table.try_ignores_wanted;
        // Any request's refusal counts for its own lease after it (invariant 5): a waiter
        // asks again within it.
        let fits = table.rows.get(key).is_none_or(|row| {
            table.part_fits(row, permits.get(), now) && (snatches || row.waiting_at(now).is_none())
        });
        if !fits {
            return Ok(None);
        }
        Ok(Some(table.take_part(
            key,
            &self.owner,
            permits.get(),
            now,
            self.lease,
        )))
    }

    async fn acquire_all(&self, keys: &[String]) -> Result<Option<Vec<Fence>>, LeaseError> {
        self.take_all(keys, false)
    }

    async fn try_acquire_all(&self, keys: &[String]) -> Result<Option<Vec<Fence>>, LeaseError> {
        self.take_all(keys, true)
    }

    async fn renew(&self, key: &str, fence: Fence) -> Result<Renewal, LeaseError> {
        check_key(key)?;
        let now = Instant::now();
        let mut table = self.table();
        let ignore_fence = table.renew_ignores_fence;
        match table.rows.get_mut(key) {
            Some(row)
                if row.is_held_at(now)
                    && (row.fence == fence || ignore_fence)
                    && row.is_owned_by(&self.owner) =>
            {
                row.expires_at = now + self.lease;
                Ok(Renewal::Renewed { wanted: row.wanted })
            }
            _ => Ok(Renewal::Lost),
        }
    }

    async fn renew_part(&self, key: &str, fence: Fence) -> Result<Renewal, LeaseError> {
        check_key(key)?;
        let now = Instant::now();
        let mut table = self.table();
        let Some(row) = table.rows.get_mut(key) else {
            return Ok(Renewal::Lost);
        };
        let wanted = row.waiting_at(now).is_some();
        let part = row
            .parts
            .iter_mut()
            .find(|part| part.fence == fence && part.owner == self.owner && part.expires_at > now);
        match part {
            Some(part) => {
                part.expires_at = now + self.lease;
                Ok(Renewal::Renewed { wanted })
            }
            None => Ok(Renewal::Lost),
        }
    }

    async fn release(&self, key: &str, fence: Fence) -> Result<bool, LeaseError> {
        check_key(key)?;
        let now = Instant::now();
        let mut table = self.table();
        // Whether or not it ran out: if it is still our owner and fence, nobody took it since.
        let ours = table
            .rows
            .get(key)
            .is_some_and(|row| row.fence == fence && row.is_owned_by(&self.owner));
        if ours {
            table.release(key, now);
        }
        Ok(ours)
    }

    async fn release_part(&self, key: &str, fence: Fence) -> Result<bool, LeaseError> {
        check_key(key)?;
        Ok(self.table().release_part(key, &self.owner, fence))
    }

    async fn release_all(&self) -> Result<u64, LeaseError> {
        let now = Instant::now();
        let mut table = self.table();
        let ours: Vec<String> = table
            .rows
            .iter()
            .filter(|(_, row)| row.is_owned_by(&self.owner))
            .map(|(key, _)| key.clone())
            .collect();
        for key in &ours {
            table.release(key, now);
        }
        let our_parts: Vec<(String, Fence)> = table
            .rows
            .iter()
            .flat_map(|(key, row)| {
                row.parts
                    .iter()
                    .filter(|part| part.owner == self.owner)
                    .map(|part| (key.clone(), part.fence))
            })
            .collect();
        for (key, fence) in &our_parts {
            table.release_part(key, &self.owner, *fence);
        }
        let keys: std::collections::BTreeSet<&String> = ours
            .iter()
            .chain(our_parts.iter().map(|(key, _)| key))
            .collect();
        Ok(u64::try_from(keys.len()).unwrap_or(u64::MAX))
    }
}

impl Drop for MemoryLeaseStore {
    fn drop(&mut self) {
        // Its sender goes, and with it the store's notices end, as a PostgreSQL store's
        // listener does when the store is dropped.
        let sender = self.table().listeners.remove(&self.owner);
        drop(sender);
    }
}

mod tests;
