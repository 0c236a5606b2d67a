//! The lease store on PostgreSQL: a table of lease rows and two small tables beside it, a few
//! statements run on a shared connection (`link`), and a connection of its own that listens
//! for releases (`listener`). Acquisitions, renewals and releases of many keys made at once go
//! as one statement (`batch`), which changes their rows in key order; so do renewals of part
//! leases, those of one key's parts included (`renew_parts`).
//!
//! # The tables
//!
//! `{prefix}leases (key text PRIMARY KEY, owner text, fence bigint NOT NULL, expires_at
//! timestamptz NOT NULL, wanted boolean NOT NULL)`, created if missing (and given `wanted` if
//! made before it). Its invariants, kept by the statements below, each one statement (whatever
//! the number of keys in it) and so atomic:
//!
//! 1. A key is held by `owner` exactly while `owner IS NOT NULL AND expires_at >
//!    clock_timestamp()`. Only the server's clock decides: the clients' clocks may disagree.
//! 2. `fence` only grows, at each acquisition, to at least one more than before and at least
//!    the floor (below), and the row is never deleted (a new row would start again at the
//!    floor). So a fence names one acquisition for ever, and whoever acquires after it gets a
//!    higher one, even across a crash of the server.
//! 3. Renew and release act only on the row of their `(key, owner, fence)`: a holder whose
//!    lease ran out and was taken can neither extend nor end the next holder's.
//! 4. A release is announced (`pg_notify`) in the statement that releases, so exactly when it
//!    commits, if an acquisition was refused the key since it was taken (`wanted`). A waiter
//!    is refused before it waits, so it hears the release; a key nobody waited for costs no
//!    notice.
//! 5. A try (`try_acquire`) takes a row only on an acquisition's terms and if no waiter can
//!    still be on its way: not `wanted`, or its last lease ended at least a lease length
//!    ago (a waiter asks again within its poll interval, shorter than a lease). A refused
//!    try changes nothing, so it neither marks the row nor is announced a release.
//! 6. Part leases are the row's arrays `part_owners`, `part_fences`, `part_permits` and
//!    `part_until`, one element per lease: a key is held by its whole lease or by live part
//!    leases, never both, and its live part leases hold at most the table's capacity of
//!    permits together. Each takes its fence from the key's one `fence` counter.
//! 7. A refused acquisition records its size (the whole capacity for a whole lease) as the
//!    waiting mark, `waiting_permits` until `waiting_until` (a lease from the refusal); while
//!    it lives no smaller request is granted, and a grant at least as large clears it.
//!
//! Because of invariant 2 the table keeps one row per key ever acquired.
//!
//! `{prefix}fences (floor, longest_lease_ms)`, one row kept durably, and `{prefix}run (floor,
//! quiet_until)`, one row in an unlogged table.
//!
//! # Commits
//!
//! The lease statements commit without waiting for the disk (`synchronous_commit` off for
//! their own transaction): a crash of the server may lose the last fraction of a second of
//! them (at most three times `wal_writer_delay`, by PostgreSQL's documentation), and with them
//! fences already handed out. Crash recovery also empties the unlogged `run`, and only crash
//! recovery does: a connection that finds it empty (every connection after a crash is new)
//! raises the floor in `fences` to `FLOOR_RISE_AFTER_CRASH` above the highest fence in the
//! table, durably, before any acquisition can read it, and starts `run` again with it. Every
//! fence handed out before the crash was at most the highest surviving one plus the number of
//! acquisitions lost, so every fence after it is higher, as long as a crash loses fewer than
//! `FLOOR_RISE_AFTER_CRASH` acquisitions of one key. `run` also starts a quiet time as long as
//! the longest lease any store has used: a holder whose acquisition or renewal the crash lost
//! has given up (its lease ran out by its own clock) before anyone else can take the key.
//!
//! Each store is one owner, named `host:pid:random` ([`LeaseOwner`], at most
//! [`LeaseOwner::MAX_LEN`] bytes, as it is written in every row), so that two stores in one
//! process exclude each other like two processes do, and a row says which process holds it.
//! The cluster view reads the live rows on a connection of its own (`view`).

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use crate::cluster::error::{ClusterError, LeaseError};
use crate::cluster::locking::entropy::random_u64;
use crate::cluster::locking::lease_store::{Fence, LeaseStore, Renewal, check_key, check_part};
use crate::cluster::locking::notices::LeaseNotices;
use crate::cluster::owner::LeaseOwner;
use crate::cluster::postgres::batch::{Batched, Batcher};
use crate::cluster::postgres::config::{LeaseTable, PgLeaseConfig};
use crate::cluster::postgres::link::StatementLink;
use crate::cluster::postgres::listener;
use crate::cluster::postgres::view::LeaseView;

/// The lease store on a PostgreSQL table. Dropping it stops its listener and closes its
/// connections; its leases run out unless [`release_all`](LeaseStore::release_all) ran first.
pub(crate) struct PgLeaseStore {
    core: Arc<StoreCore>,
    lease: Duration,
    /// Acquisitions, renewals and releases of many keys go to the server together, as one
    /// statement (`batch`).
    changes: Batcher<Change, Option<Made>>,
    /// Renewals of part leases, of any keys, go to the server together too
    /// (`renew_parts`): the parts of one key share its row, and one statement per part would
    /// queue for that row one after another.
    part_renewals: Batcher<PartRenewal, Renewal>,
    listener: AbortHandle,
    /// The cluster view's reads of the table, for the registry to keep.
    view: Arc<LeaseView>,
}

/// What the statements need, shared with the task that sends the batches.
struct StoreCore {
    owner: String,
    table: LeaseTable,
    statements: Statements,
    /// The lease in whole milliseconds, as the statements take it.
    lease_millis: i64,
    /// Permits per key, the same as the table's (checked at connect).
    capacity: NonZeroU32,
    link: StatementLink,
}

/// What a change in a batch made: the row's fence, and whether the key is wanted, as the
/// statement left the row.
#[derive(Debug, Clone, Copy)]
struct Made {
    fence: Fence,
    wanted: bool,
}

/// One change to a lease row, in a batch.
enum Change {
    Acquire { key: String },
    Renew { key: String, fence: i64 },
    Release { key: String, fence: i64 },
}

impl Change {
    fn key(&self) -> &str {
        match self {
            Change::Acquire { key } | Change::Renew { key, .. } | Change::Release { key, .. } => {
                key
            }
        }
    }

    /// The change as `apply` takes it: key, fence (none to acquire), renewing.
    fn columns(&self) -> (&str, Option<i64>, bool) {
        match self {
            Change::Acquire { key } => (key, None, false),
            Change::Renew { key, fence } => (key, Some(*fence), true),
            Change::Release { key, fence } => (key, Some(*fence), false),
        }
    }
}

/// A renewal of our part lease `part.1` of key `part.0`, in a batch.
struct PartRenewal {
    part: (String, i64),
}

impl Batched for PartRenewal {
    type Conflict = (String, i64);

    /// Parts of one key share a batch (the statement groups them by row); a part goes once.
    fn conflict(&self) -> &(String, i64) {
        &self.part
    }
}

impl Batched for Change {
    type Conflict = str;

    /// One change per row and statement: a row cannot be changed twice in one statement.
    fn conflict(&self) -> &str {
        self.key()
    }
}

impl PgLeaseStore {
    /// Checks `config`, connects, creates the tables if missing, checks that this role can read
    /// and write them, and starts listening for releases.
    ///
    /// # Errors
    ///
    /// A [`ClusterError`] naming the cause: a bad URL, table prefix or lease timing (found
    /// before connecting), an unreachable or silent server (within `connect_timeout`), a missing
    /// permission on the table, or any other refusal by the server.
    pub(crate) async fn connect(
        config: &PgLeaseConfig,
    ) -> Result<(PgLeaseStore, LeaseNotices), ClusterError> {
        let checked = config.check()?;
        let owner_name = LeaseOwner::of_this_process(random_u64());
        let owner = owner_name.to_string();
        let statements = Statements::for_table(&checked.table);
        // At most `MAX_LEASE`, a day, which fits.
        let lease_millis = i64::try_from(checked.lease.as_millis()).unwrap_or(i64::MAX);

        let server = checked.server;
        let statements_name = format!("keyed-locks statements {owner}");
        let (client, connection) = server.open(&statements_name).await?;
        let (link, client) = StatementLink::start(
            server.clone(),
            statements_name,
            checked.heartbeat,
            statements.check_run.clone(),
            client,
            connection,
        );
        let setup = set_up_tables(
            &client,
            &checked.table,
            &statements,
            &owner,
            lease_millis,
            checked.capacity,
        );
        match tokio::time::timeout(server.connect_timeout(), setup).await {
            Ok(result) => result?,
            Err(_elapsed) => return Err(server.timed_out()),
        }
        drop(client);

        let view = Arc::new(LeaseView::new(
            server.clone(),
            &checked.table,
            owner_name,
            checked.capacity,
            checked.heartbeat,
        ));
        let listener_name = format!("keyed-locks listener {owner}");
        let (notices, listener) = listener::start(server, &checked.table, listener_name).await?;
        let core = Arc::new(StoreCore {
            owner,
            table: checked.table,
            statements,
            lease_millis,
            capacity: checked.capacity,
            link,
        });
        let store = PgLeaseStore {
            changes: Batcher::new(Box::new({
                let core = Arc::clone(&core);
                move |batch| Box::pin(Arc::clone(&core).change_batch(batch))
            })),
            part_renewals: Batcher::new(Box::new({
                let core = Arc::clone(&core);
                move |batch| Box::pin(Arc::clone(&core).renew_parts(batch))
            })),
            core,
            lease: checked.lease,
            listener,
            view,
        };
        Ok((store, notices))
    }

    /// Sends `change` in the next batch and waits for what it did: the lease's fence if it was
    /// made (taken, renewed or released), `None` if not.
    async fn submit(&self, change: Change) -> Result<Option<Made>, LeaseError> {
        self.changes.submit(change).await.map_err(LeaseError::Batch)
    }

    /// Renews or releases (`change`) our lease `fence` of `key`: what it made, if it was ours.
    async fn change_lease(
        &self,
        key: &str,
        fence: Fence,
        change: fn(String, i64) -> Change,
    ) -> Result<Option<Made>, LeaseError> {
        check_key(key)?;
        // A fence beyond the column's range was never handed out: not ours.
        let Ok(fence) = i64::try_from(fence) else {
            return Ok(None);
        };
        self.submit(change(key.to_owned(), fence)).await
    }

    /// `acquire_all` (`trying` false) and `try_acquire_all` (true): one statement. If it took
    /// some keys and not others (a key's row made by another statement while it ran), the
    /// ones it took go back at once, in the next statement, and the set is refused.
    async fn take_all(
        &self,
        keys: &[String],
        trying: bool,
    ) -> Result<Option<Vec<Fence>>, LeaseError> {
        for key in keys {
            check_key(key)?;
        }
        debug_assert!(keys.is_sorted(), "a set's keys are sorted");
        let core = &self.core;
        let set = SetRequest {
            keys,
            trying,
            ticket: random_u64().cast_signed(),
        };
        let values = core.values();
        let rows = core
            .query_above_floor(&core.statements.acquire_all, &values.acquire_all(&set))
            .await?;
        let mut taken = HashMap::with_capacity(rows.len());
        for row in &rows {
            if row
                .try_get::<_, bool>("taken")
                .map_err(LeaseError::Statement)?
            {
                taken.insert(key_of(row)?, fence_of(row)?);
            }
        }
        let fences: Option<Vec<Fence>> = keys.iter().map(|key| taken.get(key).copied()).collect();
        if fences.is_none() {
            for (key, fence) in taken {
                self.release(&key, fence).await?;
            }
        }
        Ok(fences)
    }

    /// The cluster view's reads of this store's table, under this store's owner name.
    pub(crate) fn view(&self) -> Arc<LeaseView> {
        Arc::clone(&self.view)
    }

    /// This store's owner id, as the table's `owner` column holds it (the tests look for it).
    #[cfg(test)]
    pub(crate) fn owner(&self) -> &str {
        &self.core.owner
    }
}

impl StoreCore {
    /// The values of this store's statements, with no key yet.
    fn values(&self) -> Values<'_> {
        Values {
            keys: Vec::new(),
            owner: &self.owner,
            fences: Vec::new(),
            renewing: Vec::new(),
            lease_millis: self.lease_millis,
            channel: self.table.name(),
            capacity: capacity_column(self.capacity),
        }
    }

    /// Runs a statement that acquires: fences start at the floor in `run`. With no floor, `run`
    /// lost its row in a crash that this connection did not see (a pooler in between kept it
    /// open), and the fence column refuses the NULL: check `run`, as a new connection does,
    /// and run the statement once more.
    async fn query_above_floor(
        &self,
        statement: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, LeaseError> {
        match self.link.query(statement, params).await {
            Err(LeaseError::Statement(error))
                if error.code() == Some(&SqlState::NOT_NULL_VIOLATION) =>
            {
                tracing::info!(%error, "lease store: no fence floor; checking for a crash");
                self.link.run_on_connect().await?;
                self.link.query(statement, params).await
            }
            answer => answer,
        }
    }

    /// Applies every change of `batch` in one statement: acquires each key to acquire that is
    /// free, expired or ours (marking the others wanted), renews each lease to renew that is
    /// still ours and live, and releases each lease to release that is still ours.
    async fn change_batch(
        self: Arc<Self>,
        batch: Vec<Change>,
    ) -> Result<Vec<Option<Made>>, LeaseError> {
        // Rows are locked in key order in every batch of every process: no two batches can
        // wait for each other.
        let mut changes: Vec<_> = batch.iter().map(Change::columns).collect();
        changes.sort_unstable();
        let mut values = self.values();
        for (key, fence, renewing) in changes {
            values.keys.push(key);
            values.fences.push(fence);
            values.renewing.push(renewing);
        }
        let rows = self
            .query_above_floor(&self.statements.apply, &values.apply())
            .await?;
        // A row comes back for each key taken, wanted, renewed or released; none for a renewal
        // or release that was not ours, or an acquisition in the quiet time after a crash. An
        // acquisition was made if it took the row; a renewal or release, if it has a row.
        let mut made = HashMap::with_capacity(rows.len());
        for row in &rows {
            let taken: bool = row.try_get("taken").map_err(LeaseError::Statement)?;
            let wanted: bool = row.try_get("wanted").map_err(LeaseError::Statement)?;
            let fence = fence_of(row)?;
            made.insert(key_of(row)?, (taken, Made { fence, wanted }));
        }
        Ok(batch
            .iter()
            .map(|change| {
                let &(taken, made) = made.get(change.key())?;
                let acquiring = matches!(change, Change::Acquire { .. });
                (taken || !acquiring).then_some(made)
            })
            .collect())
    }
}

impl StoreCore {
    /// Renews every part lease of `batch` that is still ours and live, in one statement that
    /// locks their rows in key order (as `change_batch` does): each answer says whether its
    /// part was renewed, and whether a request waits for the key.
    async fn renew_parts(
        self: Arc<Self>,
        batch: Vec<PartRenewal>,
    ) -> Result<Vec<Renewal>, LeaseError> {
        let mut values = self.values();
        let mut part_fences = Vec::with_capacity(batch.len());
        for PartRenewal { part: (key, fence) } in &batch {
            values.keys.push(key);
            part_fences.push(*fence);
        }
        let rows = self
            .link
            .query(
                &self.statements.renew_parts,
                &values.renew_parts(&part_fences),
            )
            .await?;
        // A row per key with a part renewed: whether the key is wanted, and which parts.
        let mut renewed = HashMap::with_capacity(rows.len());
        for row in &rows {
            let wanted: bool = row.try_get("wanted").map_err(LeaseError::Statement)?;
            let fences: Vec<i64> = row.try_get("renewed").map_err(LeaseError::Statement)?;
            renewed.insert(key_of(row)?, (wanted, fences));
        }
        Ok(batch
            .iter()
            .map(
                |PartRenewal { part: (key, fence) }| match renewed.get(key) {
                    Some((wanted, fences)) if fences.contains(fence) => {
                        Renewal::Renewed { wanted: *wanted }
                    }
                    _ => Renewal::Lost,
                },
            )
            .collect())
    }
}

/// The key a batch statement returned a row for.
fn key_of(row: &Row) -> Result<String, LeaseError> {
    row.try_get("key").map_err(LeaseError::Statement)
}

impl LeaseStore for PgLeaseStore {
    async fn acquire(&self, key: &str) -> Result<Option<Fence>, LeaseError> {
        check_key(key)?;
        let made = self
            .submit(Change::Acquire {
                key: key.to_owned(),
            })
            .await?;
        Ok(made.map(|made| made.fence))
    }

    async fn try_acquire(&self, key: &str) -> Result<Option<Fence>, LeaseError> {
        check_key(key)?;
        // Its own statement, not in a batch: it must not wait for the statement under way,
        // and its refusal must leave the row as it was, which the batch's acquisition (a
        // refusal marks the row wanted) does not.
        let core = &self.core;
        let values = core.values();
        let rows = core
            .query_above_floor(&core.statements.try_acquire, &values.try_acquire(&key))
            .await?;
        rows.first().map(fence_of).transpose()
    }

    async fn renew(&self, key: &str, fence: Fence) -> Result<Renewal, LeaseError> {
        let made = self
            .change_lease(key, fence, |key, fence| Change::Renew { key, fence })
            .await?;
        Ok(made.map_or(Renewal::Lost, |made| Renewal::Renewed {
            wanted: made.wanted,
        }))
    }

    async fn acquire_part(
        &self,
        key: &str,
        permits: NonZeroU32,
    ) -> Result<Option<Fence>, LeaseError> {
        check_key(key)?;
        let core = &self.core;
        check_part(permits, core.capacity)?;
        let request = PartRequest {
            key,
            permits: capacity_column(permits),
            // Random, so that no two requests of any process share one.
            ticket: random_u64().cast_signed(),
        };
        let values = core.values();
        let rows = core
            .query_above_floor(
                &core.statements.acquire_part,
                &values.acquire_part(&request),
            )
            .await?;
        let Some(row) = rows.first() else {
            // In the quiet time after a crash nothing is proposed, so nothing is taken.
            return Ok(None);
        };
        let taken: bool = row.try_get("taken").map_err(LeaseError::Statement)?;
        if taken {
            fence_of(row).map(Some)
        } else {
            Ok(None)
        }
    }

    async fn try_acquire_part(
        &self,
        key: &str,
        permits: NonZeroU32,
    ) -> Result<Option<Fence>, LeaseError> {
        check_key(key)?;
        let core = &self.core;
        check_part(permits, core.capacity)?;
        let request = PartRequest {
            key,
            permits: capacity_column(permits),
            ticket: 0,
        };
        let values = core.values();
        let rows = core
            .query_above_floor(
                &core.statements.try_acquire_part,
                &values.try_acquire_part(&request),
            )
            .await?;
        rows.first().map(fence_of).transpose()
    }

    async fn acquire_all(&self, keys: &[String]) -> Result<Option<Vec<Fence>>, LeaseError> {
        self.take_all(keys, false).await
    }

    async fn try_acquire_all(&self, keys: &[String]) -> Result<Option<Vec<Fence>>, LeaseError> {
        self.take_all(keys, true).await
    }

    async fn renew_part(&self, key: &str, fence: Fence) -> Result<Renewal, LeaseError> {
        check_key(key)?;
        let Ok(fence) = i64::try_from(fence) else {
            return Ok(Renewal::Lost);
        };
        let part = (key.to_owned(), fence);
        self.part_renewals
            .submit(PartRenewal { part })
            .await
            .map_err(LeaseError::Batch)
    }

    async fn release_part(&self, key: &str, fence: Fence) -> Result<bool, LeaseError> {
        check_key(key)?;
        let Ok(fence) = i64::try_from(fence) else {
            return Ok(false);
        };
        let core = &self.core;
        let values = core.values();
        let rows = core
            .link
            .query(
                &core.statements.release_part,
                &values.release_part(&key, &fence),
            )
            .await?;
        Ok(!rows.is_empty())
    }

    async fn release(&self, key: &str, fence: Fence) -> Result<bool, LeaseError> {
        let made = self
            .change_lease(key, fence, |key, fence| Change::Release { key, fence })
            .await?;
        Ok(made.is_some())
    }

    async fn release_all(&self) -> Result<u64, LeaseError> {
        // No key or fence: this statement takes the owner and the channel only.
        let core = &self.core;
        let values = core.values();
        let rows = core
            .link
            .query(&core.statements.release_all, &values.release_all())
            .await?;
        Ok(u64::try_from(rows.len()).unwrap_or(u64::MAX))
    }
}

impl Drop for PgLeaseStore {
    fn drop(&mut self) {
        // The statement connection closes with its last client; the listener is a task of its
        // own and must be told.
        self.listener.abort();
    }
}

impl fmt::Debug for PgLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLeaseStore")
            .field("owner", &self.core.owner)
            .field("table", &self.core.table.name())
            .field("lease", &self.lease)
            .field("link", &self.core.link)
            .finish_non_exhaustive()
    }
}

/// The statements' text for one table. Parameters: `$1` keys, `$2` owner, then as named.
#[derive(Debug)]
struct Statements {
    /// `$3` lease in milliseconds, `$4` channel, `$5` fences and `$6` renewing flags, one of
    /// each per key: fence NULL to acquire the key, the lease's fence to renew it (flag true)
    /// or release it. In the keys' order, takes each row to acquire that is free, expired or
    /// ours, marking the others wanted (invariants 1, 2, 4); extends each lease to renew that
    /// is ours under its fence and live, and releases each lease to release that is ours
    /// under its fence, announcing it if wanted (invariants 3, 4). Returns `(key, fence,
    /// taken)` for each row it changed.
    apply: String,
    /// `$1` one key, `$3` lease in milliseconds. Takes the row if free, expired or ours, with
    /// no live part lease, not wanted by an acquisition refused less than a lease before its
    /// last lease ended, and with no live waiting mark (invariant 5); otherwise changes
    /// nothing. Returns `fence` if it took the row.
    try_acquire: String,
    /// `$1` key, `$2` owner, `$3` lease in milliseconds, `$4` channel, `$5` permits, `$6`
    /// capacity, `$7` the request's ticket. Takes a part lease if it fits (invariant 6) and no
    /// larger request waits (invariant 7), else records the refusal; announces a grant that
    /// leaves permits free on a wanted key. Returns `(fence, taken)`.
    acquire_part: String,
    /// As `acquire_part` (without a ticket), and only if no request's refusal counts now
    /// (invariant 5); a refusal changes nothing. Returns `fence` if it took a part lease.
    try_acquire_part: String,
    /// `$1` keys (sorted, each once), `$2` owner, `$3` lease in milliseconds, `$4` capacity,
    /// `$5` trying, `$6` the request's ticket. Locks the keys' rows in key order and takes
    /// every key's whole lease if each is free on `acquire`'s terms (on `try_acquire`'s when
    /// trying), else none: marking each wanted and waited for by the whole capacity, or, when
    /// trying, changing nothing. Returns `(key, fence, taken)` per row it wrote.
    acquire_all: String,
    /// `$1` keys, `$2` owner, `$3` lease in milliseconds, `$4` fences, one per key (a key
    /// may come once per part). Locks the keys' rows in key order and extends each of our
    /// live part leases named; returns `(key, wanted, renewed)` per row it renewed a part
    /// of, `renewed` the fences of the parts it extended.
    renew_parts: String,
    /// `$1` key, `$2` owner, `$3` fence, `$4` channel. Ends our part lease, announcing it if
    /// wanted; returns a row if it did.
    release_part: String,
    /// `$1` owner, `$2` channel. Ends every lease of ours, whole and part; returns a row per
    /// key it changed (invariant 4).
    release_all: String,
    /// `$1` this store's lease in milliseconds, `$2` its capacity. Makes the row of
    /// `{prefix}fences` if missing, with `run`'s row beside it, and records the longest lease.
    /// Returns the table's capacity. At connect.
    record_store: String,
    /// No parameters; two statements, for the simple protocol. Raises the fence floor and
    /// starts the quiet time if the server has crashed since `run`'s row was made. On every
    /// new connection.
    check_run: String,
}

/// The table of the fence floor and the longest lease: one row, kept durably.
const FENCES_SUFFIX: &str = "fences";
/// The table of the floor in force since the server last started, and the quiet time after a
/// crash: one row, unlogged, so that crash recovery empties it.
const RUN_SUFFIX: &str = "run";

/// What the statements' placeholders take, and each statement's list of them in the order of
/// its `$n`: the one place that matches the text of [`Statements`], for the store and the
/// check at connect.
struct Values<'a> {
    keys: Vec<&'a str>,
    owner: &'a str,
    fences: Vec<Option<i64>>,
    renewing: Vec<bool>,
    lease_millis: i64,
    channel: &'a str,
    capacity: i32,
}

/// A part lease asked for: its key, its permits, and a ticket of its own, by which the
/// statement's answer says whether this request took it (a refusal leaves the row's fence as
/// it was, which may be a part of ours granted before).
struct PartRequest<'a> {
    key: &'a str,
    permits: i32,
    ticket: i64,
}

/// A set of keys asked for at once (sorted, each once), whether on a try's terms, and the
/// request's ticket (as for a part).
struct SetRequest<'a> {
    keys: &'a [String],
    trying: bool,
    ticket: i64,
}

/// A statement's parameters with their types, as `query_typed` takes them.
type Params<'v, const N: usize> = [(&'v (dyn ToSql + Sync), Type); N];

impl Values<'_> {
    fn apply(&self) -> Params<'_, 7> {
        [
            (&self.keys, Type::TEXT_ARRAY),
            (&self.owner, Type::TEXT),
            (&self.lease_millis, Type::INT8),
            (&self.channel, Type::TEXT),
            (&self.fences, Type::INT8_ARRAY),
            (&self.renewing, Type::BOOL_ARRAY),
            (&self.capacity, Type::INT4),
        ]
    }

    fn acquire_part<'v>(&'v self, part: &'v PartRequest<'v>) -> Params<'v, 7> {
        [
            (&part.key, Type::TEXT),
            (&self.owner, Type::TEXT),
            (&self.lease_millis, Type::INT8),
            (&self.channel, Type::TEXT),
            (&part.permits, Type::INT4),
            (&self.capacity, Type::INT4),
            (&part.ticket, Type::INT8),
        ]
    }

    fn try_acquire_part<'v>(&'v self, part: &'v PartRequest<'v>) -> Params<'v, 6> {
        [
            (&part.key, Type::TEXT),
            (&self.owner, Type::TEXT),
            (&self.lease_millis, Type::INT8),
            (&self.channel, Type::TEXT),
            (&part.permits, Type::INT4),
            (&self.capacity, Type::INT4),
        ]
    }

    fn acquire_all<'v>(&'v self, set: &'v SetRequest<'v>) -> Params<'v, 6> {
        [
            (&set.keys, Type::TEXT_ARRAY),
            (&self.owner, Type::TEXT),
            (&self.lease_millis, Type::INT8),
            (&self.capacity, Type::INT4),
            (&set.trying, Type::BOOL),
            (&set.ticket, Type::INT8),
        ]
    }

    fn renew_parts<'v>(&'v self, part_fences: &'v Vec<i64>) -> Params<'v, 4> {
        [
            (&self.keys, Type::TEXT_ARRAY),
            (&self.owner, Type::TEXT),
            (&self.lease_millis, Type::INT8),
            (part_fences, Type::INT8_ARRAY),
        ]
    }

    fn release_part<'v>(&'v self, key: &'v &'v str, fence: &'v i64) -> Params<'v, 4> {
        [
            (key, Type::TEXT),
            (&self.owner, Type::TEXT),
            (fence, Type::INT8),
            (&self.channel, Type::TEXT),
        ]
    }

    fn try_acquire<'v>(&'v self, key: &'v &'v str) -> Params<'v, 3> {
        [
            (key, Type::TEXT),
            (&self.owner, Type::TEXT),
            (&self.lease_millis, Type::INT8),
        ]
    }

    fn release_all(&self) -> Params<'_, 2> {
        [(&self.owner, Type::TEXT), (&self.channel, Type::TEXT)]
    }
}

/// How much the fence floor rises when the server is found to have crashed: more than the
/// acquisitions of one key that a crash can lose (see the module's "Commits").
const FLOOR_RISE_AFTER_CRASH: i64 = 1 << 24;

impl Statements {
    fn for_table(table: &LeaseTable) -> Self {
        let fences = format!("\"{}\"", table.companion(FENCES_SUFFIX));
        let run = format!("\"{}\"", table.companion(RUN_SUFFIX));
        let table = table.quoted();
        // The lease statements' commits do not wait for the disk. Set in the statement's own
        // transaction (`is_local`), so no connection keeps the setting and a pooler in between
        // cannot lose it; the commit reads it at its end.
        let async_commit = "set_config('synchronous_commit', 'off', true)";
        // What `apply` does to a row that exists (the first acquisition inserts it at the
        // floor). The proposed row says which change: owner NULL, a release; `wanted` true, a
        // renewal; else an acquisition.
        // - An acquisition takes the row if free, expired or ours, with no live part lease
        //   (invariants 1, 2, 6), or else marks it wanted, so that its release is announced
        //   (invariant 4), and records a waiting mark of the whole capacity, the largest
        //   request there is (invariant 7). Taking it from another owner clears both marks,
        //   but keeps `wanted` if a waiting mark lives and keys have several permits: then a
        //   smaller request may have been held back by the mark while the key was free, and
        //   only this holder's release, announced, tells it to ask again.
        // - A renewal extends the lease only if it is ours under its fence and live, a
        //   release frees it only if it is ours under its fence (invariant 3); both leave
        //   `wanted` as it is, for the release's announcement.
        // `free` reads the statement's clock, the same for every column: a clock read per
        // column could take the row without raising its fence. A lease that runs out while
        // the statement waits for its row is refused, and asked for again.
        let releasing = "excluded.owner IS NULL";
        let renewing = "excluded.wanted";
        let acquiring = "(excluded.owner IS NOT NULL AND NOT excluded.wanted)";
        let no_live_parts = "NOT EXISTS (SELECT FROM unnest(held.part_until) AS part(until) \
                             WHERE part.until > statement_timestamp())";
        let free = format!(
            "((held.owner IS NULL OR held.owner = excluded.owner \
               OR held.expires_at <= statement_timestamp()) AND {no_live_parts})"
        );
        let lease = "$3 * interval '1 millisecond'";
        // A waiting mark counts until its time (invariant 7).
        let mark_live = "coalesce(held.waiting_until > statement_timestamp(), false)";
        let change_row = format!(
            "ON CONFLICT (key) DO UPDATE \
             SET owner = CASE WHEN {releasing} THEN NULL \
                              WHEN {acquiring} AND {free} THEN excluded.owner \
                              ELSE held.owner END, \
                 fence = CASE WHEN {acquiring} AND {free} \
                              THEN GREATEST(held.fence + 1, excluded.fence) \
                              ELSE held.fence END, \
                 expires_at = CASE WHEN {releasing} THEN clock_timestamp() \
                                   WHEN {renewing} OR {free} THEN excluded.expires_at \
                                   ELSE held.expires_at END, \
                 wanted = CASE WHEN NOT {acquiring} THEN held.wanted \
                               WHEN {free} \
                               THEN coalesce(held.owner = excluded.owner AND held.wanted, false) \
                                    OR (held.wanted AND $7 > 1 AND {mark_live}) \
                               ELSE true END, \
                 waiting_permits = CASE WHEN NOT {acquiring} THEN held.waiting_permits \
                                        WHEN {free} THEN 0 ELSE $7 END, \
                 waiting_until = CASE WHEN NOT {acquiring} THEN held.waiting_until \
                                      WHEN {free} THEN NULL \
                                      ELSE clock_timestamp() + {lease} END \
             WHERE {acquiring} \
                OR (held.owner = $2 AND held.fence = excluded.fence \
                    AND ({releasing} OR held.expires_at > clock_timestamp()))"
        );
        // Part leases (invariant 6) are the row's four arrays, one element per lease, walked
        // together; a part lease lives while its `until` is ahead.
        let parts = "unnest(held.part_owners, held.part_fences, held.part_permits, \
                     held.part_until) WITH ORDINALITY \
                     AS part(owner, fence, permits, until, position)";
        let live_permits = format!(
            "(SELECT coalesce(sum(part.permits), 0) FROM {parts} \
              WHERE part.until > statement_timestamp())"
        );
        // The parts that stay, in their order: `which` picks them.
        let array_of = |column: &str, which: &str| {
            format!("ARRAY(SELECT part.{column} FROM {parts} WHERE {which} ORDER BY part.position)")
        };
        let live = "part.until > statement_timestamp()";
        // A part a renewal names, ours and live. Read again after the update (in RETURNING),
        // the parts it extended, and only those: one that had run out stays out.
        let ours_asked_live = "part.owner = $2 AND part.fence = ANY(asked.fences) \
                               AND part.until > clock_timestamp()";
        let not_released = "NOT (part.owner = $2 AND part.fence = $3)";
        let not_ours = "part.owner <> $1";
        // A part fits beside no live whole lease (ours counts too: the process gives it back
        // first), within the capacity, and with no larger request waiting (invariant 7).
        let larger_waits = format!("({mark_live} AND held.waiting_permits > $5)");
        let part_fits = format!(
            "((held.owner IS NULL OR held.expires_at <= statement_timestamp()) \
              AND {live_permits} + $5 <= $6 AND NOT {larger_waits})"
        );
        let next_fence = "GREATEST(held.fence + 1, excluded.fence)";
        // Taking a part clears the parts that ran out and adds the new one, as proposed.
        let taken_owners = format!("{} || excluded.part_owners", array_of("owner", live));
        let taken_fences = format!("{} || {next_fence}", array_of("fence", live));
        let taken_permits = format!("{} || excluded.part_permits", array_of("permits", live));
        let taken_until = format!("{} || excluded.part_until", array_of("until", live));
        let kept_owners = array_of("owner", not_released);
        let kept_fences = array_of("fence", not_released);
        let kept_permits = array_of("permits", not_released);
        let kept_until = array_of("until", not_released);
        let others_owners = array_of("owner", not_ours);
        let others_fences = array_of("fence", not_ours);
        let others_permits = array_of("permits", not_ours);
        let others_until = array_of("until", not_ours);
        // Permits held by live parts, on the row as the statement left it (in RETURNING).
        let permits_after = "(SELECT coalesce(sum(part.permits), 0) \
              FROM unnest(held.part_permits, held.part_until) AS part(permits, until) \
              WHERE part.until > statement_timestamp())";
        // A key never acquired gets its row with the part lease in it, at the floor's fence.
        let propose_part = |ticket: &str| {
            format!(
                "INSERT INTO {table} AS held (key, owner, fence, expires_at, wanted, \
               part_owners, part_fences, part_permits, part_until, granted_ticket) \
             SELECT $1, NULL, floor.fence, clock_timestamp(), false, \
                    ARRAY[$2::text], ARRAY[floor.fence], ARRAY[$5::integer], \
                    ARRAY[clock_timestamp() + {lease}], {ticket} \
             FROM (SELECT (SELECT floor FROM {run}) AS fence) AS floor \
             WHERE coalesce((SELECT quiet_until FROM {run}) <= clock_timestamp(), true)"
            )
        };
        let propose_acquired = propose_part("$7::bigint");
        // A try needs no ticket: it changes the row only if it takes it.
        let propose_tried = propose_part("NULL::bigint");
        // A set's key is free on an acquisition's terms, and when trying ($5) on a try's: no
        // request waits. Judged once on each row as locked (the set's decision), and again
        // as each row is written: a row that another statement made after this one's
        // snapshot is judged only then, and a set that finds it taken takes it partly, which
        // the store undoes (see `acquire_all` on the store).
        let set_lease = "$3::bigint * interval '1 millisecond'";
        let try_terms = format!(
            "(NOT $5 OR (NOT {mark_live} \
              AND NOT (held.wanted AND held.expires_at + {set_lease} > statement_timestamp())))"
        );
        let set_key_free = format!(
            "((held.owner IS NULL OR held.owner = $2 \
               OR held.expires_at <= statement_timestamp()) \
              AND {no_live_parts} AND {try_terms})"
        );
        let set_takes = format!(
            "(excluded.owner IS NOT NULL \
              AND (held.owner IS NULL OR held.owner = excluded.owner \
                   OR held.expires_at <= statement_timestamp()) \
              AND {no_live_parts} AND {try_terms})"
        );
        Statements {
            // "Ours" too: an acquire of ours that was applied but whose reply was lost must not
            // block the key until it runs out. Taking it again with a new fence is safe: the
            // old fence was never handed to anyone.
            //
            // No row in `run` (the server lost it and nobody has checked since) makes an
            // acquisition's floor NULL, which the fence column refuses: an error, never a
            // fence below the floor. In the quiet time after a crash nothing is acquired. A
            // renewal or release of a key without a row (never ours) proposes nothing, so
            // inserts nothing; the row is looked up by a scalar subquery, one index probe per
            // key (as EXISTS, the planner hashes the whole table). `run` is read by scalar
            // subqueries too, each run once: as a join, its unknown size makes the plan's
            // estimated cost high enough for the server to compile it (JIT) at every call,
            // which costs milliseconds.
            //
            // `pg_notify` runs for each row the data-modifying WITH returns, in the same
            // statement and so the same transaction.
            apply: format!(
                "WITH changed AS ( \
                   INSERT INTO {table} AS held (key, owner, fence, expires_at, wanted) \
                   SELECT given.key, \
                          CASE WHEN given.fence IS NULL OR given.renewing THEN $2 END, \
                          coalesce(given.fence, (SELECT floor FROM {run})), \
                          clock_timestamp() + $3 * interval '1 millisecond', \
                          given.renewing \
                   FROM unnest($1::text[], $5::bigint[], $6::boolean[]) WITH ORDINALITY \
                        AS given(key, fence, renewing, position) \
                   WHERE CASE WHEN given.fence IS NULL \
                              THEN coalesce((SELECT quiet_until FROM {run}) \
                                            <= clock_timestamp(), true) \
                              ELSE (SELECT true FROM {table} AS known \
                                    WHERE known.key = given.key) IS NOT NULL END \
                   ORDER BY given.position \
                   {change_row} \
                   RETURNING key, fence, owner, wanted) \
                 SELECT key, fence, wanted, coalesce(owner = $2, false) AS taken, \
                        CASE WHEN owner IS NULL AND wanted \
                             THEN pg_notify($4, key)::text END AS announced, \
                        {async_commit} \
                 FROM changed"
            ),
            // The same terms as an acquisition in `apply`, on the row locked for the update
            // (not a snapshot read before it), so that a refusal is decided and leaves no mark
            // in one step. Taking the row clears a `wanted` past its time.
            try_acquire: format!(
                "WITH taken AS ( \
                   INSERT INTO {table} AS held (key, owner, fence, expires_at, wanted) \
                   SELECT $1, $2, (SELECT floor FROM {run}), \
                          clock_timestamp() + $3 * interval '1 millisecond', false \
                   WHERE coalesce((SELECT quiet_until FROM {run}) <= clock_timestamp(), true) \
                   ON CONFLICT (key) DO UPDATE \
                   SET owner = excluded.owner, \
                       fence = GREATEST(held.fence + 1, excluded.fence), \
                       expires_at = excluded.expires_at, \
                       wanted = false, waiting_permits = 0, waiting_until = NULL \
                   WHERE {free} AND NOT {mark_live} \
                     AND NOT (held.wanted AND held.expires_at + $3 * interval '1 millisecond' \
                                              > statement_timestamp()) \
                   RETURNING fence) \
                 SELECT fence, {async_commit} FROM taken"
            ),
            acquire_part: format!(
                "WITH taken AS ( \
                   {propose_acquired} \
                   ON CONFLICT (key) DO UPDATE \
                   SET fence = CASE WHEN {part_fits} THEN {next_fence} ELSE held.fence END, \
                       part_owners = CASE WHEN {part_fits} THEN {taken_owners} \
                                          ELSE held.part_owners END, \
                       part_fences = CASE WHEN {part_fits} THEN {taken_fences} \
                                          ELSE held.part_fences END, \
                       part_permits = CASE WHEN {part_fits} THEN {taken_permits} \
                                           ELSE held.part_permits END, \
                       part_until = CASE WHEN {part_fits} THEN {taken_until} \
                                         ELSE held.part_until END, \
                       granted_ticket = CASE WHEN {part_fits} THEN excluded.granted_ticket \
                                             ELSE held.granted_ticket END, \
                       wanted = held.wanted OR NOT {part_fits}, \
                       waiting_permits = CASE WHEN {part_fits} THEN 0 \
                                              WHEN {larger_waits} THEN held.waiting_permits \
                                              ELSE $5 END, \
                       waiting_until = CASE WHEN {part_fits} THEN NULL \
                                            WHEN {larger_waits} THEN held.waiting_until \
                                            ELSE clock_timestamp() + {lease} END \
                   RETURNING key, fence, wanted, coalesce(granted_ticket = $7, false) AS taken, \
                             {permits_after} AS held_permits) \
                 SELECT fence, taken, \
                        CASE WHEN taken AND wanted AND held_permits < $6 \
                             THEN pg_notify($4, key)::text END AS announced, \
                        {async_commit} \
                 FROM taken"
            ),
            try_acquire_part: format!(
                "WITH taken AS ( \
                   {propose_tried} \
                   ON CONFLICT (key) DO UPDATE \
                   SET fence = {next_fence}, \
                       part_owners = {taken_owners}, \
                       part_fences = {taken_fences}, \
                       part_permits = {taken_permits}, \
                       part_until = {taken_until}, \
                       granted_ticket = NULL, \
                       waiting_permits = 0, waiting_until = NULL \
                   WHERE {part_fits} AND NOT {mark_live} \
                   RETURNING key, fence, wanted, {permits_after} AS held_permits) \
                 SELECT fence, \
                        CASE WHEN wanted AND held_permits < $6 \
                             THEN pg_notify($4, key)::text END AS announced, \
                        {async_commit} \
                 FROM taken"
            ),
            acquire_all: format!(
                "WITH locked AS ( \
                   SELECT held.key, {set_key_free} AS free \
                   FROM {table} AS held WHERE held.key = ANY($1) \
                   ORDER BY held.key COLLATE \"C\" FOR UPDATE), \
                 decision AS ( \
                   SELECT coalesce(bool_and(locked.free), true) AS all_free FROM locked), \
                 changed AS ( \
                   INSERT INTO {table} AS held \
                     (key, owner, fence, expires_at, wanted, granted_ticket, \
                      waiting_permits, waiting_until) \
                   SELECT given.key, CASE WHEN decision.all_free THEN $2 END, \
                          (SELECT floor FROM {run}), clock_timestamp() + {set_lease}, \
                          NOT decision.all_free, \
                          CASE WHEN decision.all_free THEN $6::bigint END, \
                          CASE WHEN decision.all_free THEN 0 ELSE $4 END, \
                          CASE WHEN NOT decision.all_free \
                               THEN clock_timestamp() + {set_lease} END \
                   FROM unnest($1::text[]) WITH ORDINALITY AS given(key, position), decision \
                   WHERE coalesce((SELECT quiet_until FROM {run}) <= clock_timestamp(), true) \
                     AND (decision.all_free OR NOT $5) \
                   ORDER BY given.position \
                   ON CONFLICT (key) DO UPDATE \
                   SET owner = CASE WHEN {set_takes} THEN excluded.owner ELSE held.owner END, \
                       fence = CASE WHEN {set_takes} THEN GREATEST(held.fence + 1, excluded.fence) \
                                    ELSE held.fence END, \
                       expires_at = CASE WHEN {set_takes} THEN excluded.expires_at \
                                         ELSE held.expires_at END, \
                       granted_ticket = CASE WHEN {set_takes} THEN excluded.granted_ticket \
                                             ELSE held.granted_ticket END, \
                       wanted = CASE WHEN {set_takes} \
                                     THEN coalesce(held.owner = excluded.owner AND held.wanted, \
                                                   false) \
                                          OR (held.wanted AND $4 > 1 AND {mark_live}) \
                                     ELSE true END, \
                       waiting_permits = CASE WHEN {set_takes} THEN 0 ELSE $4 END, \
                       waiting_until = CASE WHEN {set_takes} THEN NULL \
                                            ELSE clock_timestamp() + {set_lease} END \
                   RETURNING key, fence, coalesce(granted_ticket = $6, false) AS taken) \
                 SELECT key, fence, taken, {async_commit} FROM changed"
            ),
            // The rows are locked in key order first (`locked`, read by the update as one
            // value before it scans), as in every statement that changes several rows: two
            // processes' renewals never wait for each other.
            renew_parts: format!(
                "WITH asked AS ( \
                   SELECT given.key, array_agg(given.fence) AS fences \
                   FROM unnest($1::text[], $4::bigint[]) AS given(key, fence) \
                   GROUP BY given.key), \
                 locked AS ( \
                   SELECT array_agg(in_order.key) AS keys FROM ( \
                     SELECT held.key FROM {table} AS held WHERE held.key = ANY($1) \
                     ORDER BY held.key COLLATE \"C\" FOR UPDATE) AS in_order), \
                 renewed AS ( \
                   UPDATE {table} AS held \
                   SET part_until = ARRAY(SELECT CASE WHEN {ours_asked_live} \
                                                      THEN clock_timestamp() + {lease} \
                                                      ELSE part.until END \
                                          FROM {parts} ORDER BY part.position) \
                   FROM asked \
                   WHERE held.key = asked.key \
                     AND held.key = ANY((SELECT keys FROM locked)::text[]) \
                     AND EXISTS (SELECT FROM {parts} WHERE {ours_asked_live}) \
                   RETURNING held.key, \
                             coalesce(held.waiting_until > clock_timestamp(), false) AS wanted, \
                             ARRAY(SELECT part.fence FROM {parts} WHERE {ours_asked_live}) \
                             AS renewed) \
                 SELECT key, wanted, renewed, {async_commit} FROM renewed"
            ),
            release_part: format!(
                "WITH released AS ( \
                   UPDATE {table} AS held \
                   SET part_owners = {kept_owners}, part_fences = {kept_fences}, \
                       part_permits = {kept_permits}, part_until = {kept_until} \
                   WHERE held.key = $1 \
                     AND EXISTS (SELECT FROM {parts} WHERE part.owner = $2 AND part.fence = $3) \
                   RETURNING key, wanted) \
                 SELECT CASE WHEN wanted THEN pg_notify($4, key)::text END, {async_commit} \
                 FROM released"
            ),
            release_all: format!(
                "WITH released AS ( \
                   UPDATE {table} AS held \
                   SET owner = CASE WHEN held.owner = $1 THEN NULL ELSE held.owner END, \
                       expires_at = CASE WHEN held.owner = $1 THEN clock_timestamp() \
                                         ELSE held.expires_at END, \
                       part_owners = {others_owners}, part_fences = {others_fences}, \
                       part_permits = {others_permits}, part_until = {others_until} \
                   WHERE held.owner = $1 OR $1 = ANY(held.part_owners) \
                   RETURNING key, wanted) \
                 SELECT CASE WHEN wanted THEN pg_notify($2, key)::text END, {async_commit} \
                 FROM released"
            ),
            // The row of a table new to `fences` starts `run` at floor 1: nothing was ever
            // committed without waiting for the disk, so nothing can have been lost. A store
            // with a longer lease than any before raises `longest_lease_ms`.
            record_store: format!(
                "WITH recorded AS ( \
                   INSERT INTO {fences} AS fences (one_row, floor, longest_lease_ms, capacity) \
                   VALUES (true, 1, $1, $2) \
                   ON CONFLICT (one_row) DO UPDATE \
                   SET longest_lease_ms = \
                       GREATEST(fences.longest_lease_ms, excluded.longest_lease_ms) \
                   RETURNING floor, capacity, xmax = 0 AS created, \
                             set_config('synchronous_commit', 'on', true)), \
                 run_started AS ( \
                   INSERT INTO {run} (one_row, floor, quiet_until) \
                   SELECT true, floor, clock_timestamp() FROM recorded WHERE created \
                   ON CONFLICT (one_row) DO NOTHING) \
                 SELECT capacity FROM recorded"
            ),
            // `run` is unlogged: crash recovery empties it, and only crash recovery (a clean
            // shutdown keeps it). Finding it empty, raise the floor above every fence the
            // crash may have lost, durably (`synchronous_commit` on) before any acquisition can
            // read it, and keep keys quiet for the longest lease any store has used.
            // Two statements, one transaction: the lock on `fences` makes stores that find the
            // crash at once check one after another, and the second statement's snapshot,
            // taken after the lock, sees the first one's `run`: the floor rises once.
            check_run: format!(
                "SELECT FROM {fences} FOR UPDATE; \
                 WITH raised AS ( \
                   UPDATE {fences} \
                   SET floor = GREATEST(floor, \
                       (SELECT coalesce(max(fence), 0) FROM {table})) \
                       + {FLOOR_RISE_AFTER_CRASH} \
                   WHERE NOT EXISTS (SELECT FROM {run}) \
                   RETURNING floor, longest_lease_ms, \
                             set_config('synchronous_commit', 'on', true)) \
                 INSERT INTO {run} (one_row, floor, quiet_until) \
                 SELECT true, floor, \
                        clock_timestamp() + longest_lease_ms * interval '1 millisecond' \
                 FROM raised \
                 ON CONFLICT (one_row) DO NOTHING"
            ),
        }
    }
}

/// Permits as the table's `integer` columns hold them: a capacity above `i32::MAX` is out of
/// any table's reach, and counts as its maximum.
fn capacity_column(permits: NonZeroU32) -> i32 {
    i32::try_from(permits.get()).unwrap_or(i32::MAX)
}

fn fence_of(row: &Row) -> Result<Fence, LeaseError> {
    let fence: i64 = row.try_get("fence").map_err(LeaseError::Statement)?;
    // The column's CHECK keeps fences positive; a table made by hand might not.
    Fence::try_from(fence)
        .ok()
        .filter(|&fence| fence >= 1)
        .ok_or(LeaseError::BadFence(fence))
}

/// Creates the tables if missing, records this store in `fences` and checks `run`, then runs
/// every statement once in a transaction that is rolled back: a missing privilege, a read-only
/// server or a table of another shape shows now, as a [`ClusterError`], rather than at the
/// first lease.
async fn set_up_tables(
    client: &Arc<Client>,
    table: &LeaseTable,
    statements: &Statements,
    owner: &str,
    lease_millis: i64,
    capacity: NonZeroU32,
) -> Result<(), ClusterError> {
    let leases = table.name().to_owned();
    let fences = table.companion(FENCES_SUFFIX);
    let run = table.companion(RUN_SUFFIX);
    let columns = [
        (
            &leases,
            "",
            "key text PRIMARY KEY, owner text, fence bigint NOT NULL CHECK (fence > 0), \
             expires_at timestamptz NOT NULL, wanted boolean NOT NULL DEFAULT false",
        ),
        (
            &fences,
            "",
            "one_row boolean PRIMARY KEY CHECK (one_row), \
             floor bigint NOT NULL CHECK (floor > 0), longest_lease_ms bigint NOT NULL",
        ),
        (
            &run,
            "UNLOGGED",
            "one_row boolean PRIMARY KEY CHECK (one_row), floor bigint NOT NULL, \
             quiet_until timestamptz NOT NULL",
        ),
    ];
    for (name, kind, columns) in columns {
        create_if_missing(client, name, kind, columns).await?;
    }
    // Columns added since the first version of the tables, to tables made before them (and
    // to new ones, made as the first version was).
    for (table, added) in [
        (&leases, ADDED_LEASE_COLUMNS),
        (&fences, ADDED_FENCES_COLUMNS),
    ] {
        for &(column, definition) in added {
            add_column_if_missing(client, table, column, definition).await?;
        }
    }

    let capacity_asked = capacity_column(capacity);
    let recorded = client
        .query_typed_one(
            &statements.record_store,
            &[(&lease_millis, Type::INT8), (&capacity_asked, Type::INT4)],
        )
        .await
        .map_err(|error| refusal(&fences, "recording the lease in", error))?;
    let table_capacity: i32 = recorded
        .try_get("capacity")
        .map_err(|error| refusal(&fences, "reading the capacity of", error))?;
    if table_capacity != capacity_asked {
        return Err(ClusterError::CapacityMismatch {
            table: leases,
            table_capacity: u32::try_from(table_capacity).unwrap_or(0),
            asked: capacity.get(),
        });
    }
    // It reads the lease table too (its highest fence), and fails on any of the three.
    client
        .batch_execute(&statements.check_run)
        .await
        .map_err(|error| refusal(&format!("{leases}, {fences} or {run}"), "checking", error))?;

    client
        .batch_execute("BEGIN")
        .await
        .map_err(|error| refusal(&leases, "checking table", error))?;
    let probe = probe(client, table, statements, owner, lease_millis).await;
    let rollback = client.batch_execute("ROLLBACK").await;
    probe
        .and(rollback)
        .map_err(|error| refusal(&leases, "checking table", error))
}

/// The lease table's columns added after its first version: `wanted` (invariant 4), the part
/// leases (invariant 6), the waiting mark (invariant 7), and the ticket of the last part
/// granted.
const ADDED_LEASE_COLUMNS: &[(&str, &str)] = &[
    ("wanted", "boolean NOT NULL DEFAULT false"),
    ("part_owners", "text[] NOT NULL DEFAULT '{}'"),
    ("part_fences", "bigint[] NOT NULL DEFAULT '{}'"),
    ("part_permits", "integer[] NOT NULL DEFAULT '{}'"),
    ("part_until", "timestamptz[] NOT NULL DEFAULT '{}'"),
    ("waiting_permits", "integer NOT NULL DEFAULT 0"),
    ("waiting_until", "timestamptz"),
    ("granted_ticket", "bigint"),
];

/// The fences table's columns added after its first version: the permits per key, one for a
/// table made before permits (every lease then took the whole key).
const ADDED_FENCES_COLUMNS: &[(&str, &str)] = &[(
    "capacity",
    "integer NOT NULL DEFAULT 1 CHECK (capacity > 0)",
)];

/// Adds `column` to `table` if it lacks it. Asking first lets a role that does not own the
/// table use one that has it.
async fn add_column_if_missing(
    client: &Client,
    table: &str,
    column: &str,
    definition: &str,
) -> Result<(), ClusterError> {
    let quoted = format!("\"{table}\"");
    let missing = client
        .query_typed_one(
            "SELECT NOT EXISTS (SELECT FROM pg_attribute \
             WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)",
            &[(&quoted, Type::TEXT), (&column, Type::TEXT)],
        )
        .await
        .and_then(|row| row.try_get::<_, bool>(0))
        .map_err(|error| refusal(table, "looking at table", error))?;
    if !missing {
        return Ok(());
    }
    let alter = format!("ALTER TABLE {quoted} ADD COLUMN IF NOT EXISTS {column} {definition}");
    client
        .batch_execute(&alter)
        .await
        .map_err(|error| refusal(table, &format!("adding column {column:?} to"), error))
}

/// Creates table `name` (a checked identifier) of `kind` ("" or "UNLOGGED") with `columns`,
/// unless it exists.
async fn create_if_missing(
    client: &Client,
    name: &str,
    kind: &str,
    columns: &str,
) -> Result<(), ClusterError> {
    let quoted = format!("\"{name}\"");
    let exists = client
        .query_typed_one(
            "SELECT to_regclass($1) IS NOT NULL",
            &[(&quoted, Type::TEXT)],
        )
        .await
        .and_then(|row| row.try_get::<_, bool>(0))
        .map_err(|error| refusal(name, "looking for table", error))?;
    if exists {
        return Ok(());
    }
    // `CREATE TABLE IF NOT EXISTS` needs the schema's CREATE privilege even when the table
    // exists; asking first lets a role without it use tables made for it.
    let create = format!("CREATE {kind} TABLE IF NOT EXISTS {quoted} ({columns})");
    match client.batch_execute(&create).await {
        Ok(()) => Ok(()),
        // Two stores creating the table at once: one of them fails on the catalog's unique
        // index or on its type's name, and the table is there all the same.
        Err(error)
            if error.code() == Some(&SqlState::UNIQUE_VIOLATION)
                || error.code() == Some(&SqlState::DUPLICATE_TABLE)
                || error.code() == Some(&SqlState::DUPLICATE_OBJECT) =>
        {
            Ok(())
        }
        Err(error) => Err(refusal(name, "creating table", error)),
    }
}

/// Runs every statement on a key of our own (nobody else's row is touched).
async fn probe(
    client: &Client,
    table: &LeaseTable,
    statements: &Statements,
    owner: &str,
    lease_millis: i64,
) -> Result<(), tokio_postgres::Error> {
    let key = format!("keyed-locks probe {owner}");
    let acquire = Values {
        keys: vec![&key],
        owner,
        fences: vec![None],
        renewing: vec![false],
        lease_millis,
        channel: table.name(),
        // The statements as a table of two permits per key runs them: a part lease fits.
        capacity: 2,
    };
    // Nothing is taken in the quiet time after a crash; the other statements run all the same.
    let taken = client
        .query_typed(&statements.apply, &acquire.apply())
        .await?;
    let fence: i64 = match taken.first() {
        Some(row) => row.try_get("fence")?,
        None => 1,
    };
    let renewal = Values {
        fences: vec![Some(fence)],
        renewing: vec![true],
        ..acquire
    };
    client
        .query_typed(&statements.apply, &renewal.apply())
        .await?;
    let release = Values {
        renewing: vec![false],
        ..renewal
    };
    client
        .query_typed(&statements.apply, &release.apply())
        .await?;
    let part = PartRequest {
        key: &key,
        permits: 1,
        ticket: 1,
    };
    let taken = client
        .query_typed(&statements.acquire_part, &release.acquire_part(&part))
        .await?;
    let part_fence: i64 = match taken.first() {
        Some(row) => row.try_get("fence")?,
        None => 1,
    };
    client
        .query_typed(
            &statements.try_acquire_part,
            &release.try_acquire_part(&part),
        )
        .await?;
    let renewal = Values {
        keys: vec![&key],
        ..release
    };
    client
        .query_typed(
            &statements.renew_parts,
            &renewal.renew_parts(&vec![part_fence]),
        )
        .await?;
    client
        .query_typed(
            &statements.release_part,
            &renewal.release_part(&part.key, &part_fence),
        )
        .await?;
    client
        .query_typed(&statements.release_all, &renewal.release_all())
        .await?;
    Ok(())
}

/// The [`ClusterError`] for the server's refusal of `action` on table `name` (or on one of the
/// tables it lists).
fn refusal(name: &str, action: &str, error: tokio_postgres::Error) -> ClusterError {
    if error.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
        ClusterError::MissingPermission {
            table: name.to_owned(),
            source: Box::new(error),
        }
    } else {
        ClusterError::Database {
            action: format!("{action} {name:?}"),
            source: Box::new(error),
        }
    }
}

#[cfg(test)]
mod tests;
