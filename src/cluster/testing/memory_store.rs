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
//!    the key is not wanted, or its last lease ended at least a lease length ago. A refused
//!    try changes nothing.
//!
//! What it does not have: a connection (no call fails, none is cut, none times out) and a
//! listener (notices cannot be lost, so it never says [`LeaseNotice::Missed`] unless a
//! receiver falls [`CAPACITY`](crate::cluster::locking::notices::CAPACITY) behind).
//!
//! Only tests use it, so only tests compile it: in the library it would be dead code.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::cluster::error::LeaseError;
use crate::cluster::locking::lease_store::{Fence, LeaseNotice, LeaseStore, check_key};
use crate::cluster::locking::notices::{self, LeaseNotices, NoticeSender};

/// The table that the stores made by [`MemoryLeaseTable::store`] share. Cheap to clone: the
/// clones are the same table.
#[derive(Clone, Default)]
pub(crate) struct MemoryLeaseTable {
    shared: Arc<Mutex<Table>>,
}

#[derive(Default)]
struct Table {
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
}

/// One key's lease, as the PostgreSQL table's row: `owner` is `None` once released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) owner: Option<String>,
    pub(crate) fence: Fence,
    pub(crate) expires_at: Instant,
    /// An acquisition was refused the key since it was taken: its release is announced.
    pub(crate) wanted: bool,
}

impl Row {
    pub(crate) fn is_held_at(&self, now: Instant) -> bool {
        self.owner.is_some() && self.expires_at > now
    }

    pub(crate) fn is_owned_by(&self, owner: &str) -> bool {
        self.owner.as_deref() == Some(owner)
    }
}

impl MemoryLeaseTable {
    /// A table with no rows and no stores.
    pub(crate) fn new() -> Self {
        Self::default()
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
            for listener in self.listeners.values() {
                listener.send(LeaseNotice::Released(key.to_owned()));
            }
        }
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

impl LeaseStore for MemoryLeaseStore {
    async fn acquire(&self, key: &str) -> Result<Option<Fence>, LeaseError> {
        check_key(key)?;
        let now = Instant::now();
        let expires_at = now + self.lease;
        let mut table = self.table();
        match table.rows.get_mut(key) {
            None => {
                let row = Row {
                    owner: Some(self.owner.clone()),
                    fence: 1,
                    expires_at,
                    wanted: false,
                };
                table.rows.insert(key.to_owned(), row);
                Ok(Some(1))
            }
            // Ours too, as in `postgres`: an acquire whose reply was lost must not block the key.
            Some(row) if !row.is_held_at(now) || row.is_owned_by(&self.owner) => {
                // Taken from another owner (or from nobody): whoever wanted it was told.
                row.wanted &= row.is_owned_by(&self.owner);
                row.owner = Some(self.owner.clone());
                row.fence += 1;
                row.expires_at = expires_at;
                Ok(Some(row.fence))
            }
            Some(row) => {
                row.wanted = true;
                Ok(None)
            }
        }
    }

    async fn try_acquire(&self, key: &str) -> Result<Option<Fence>, LeaseError> {
        check_key(key)?;
        let now = Instant::now();
        let mut table = self.table();
        let snatches = table.try_ignores_wanted;
        match table.rows.get_mut(key) {
            // Free, expired or ours, and no waiter can still be on its way (invariant 5).
            Some(row)
                if (!row.is_held_at(now) || row.is_owned_by(&self.owner))
                    && (snatches || !row.wanted || row.expires_at + self.lease <= now) =>
            {
                row.wanted = false;
                row.owner = Some(self.owner.clone());
                row.fence += 1;
                row.expires_at = now + self.lease;
                Ok(Some(row.fence))
            }
            Some(_) => Ok(None),
            None => {
                let row = Row {
                    owner: Some(self.owner.clone()),
                    fence: 1,
                    expires_at: now + self.lease,
                    wanted: false,
                };
                table.rows.insert(key.to_owned(), row);
                Ok(Some(1))
            }
        }
    }

    async fn renew(&self, key: &str, fence: Fence) -> Result<bool, LeaseError> {
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
                Ok(true)
            }
            _ => Ok(false),
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
        Ok(u64::try_from(ours.len()).unwrap_or(u64::MAX))
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
