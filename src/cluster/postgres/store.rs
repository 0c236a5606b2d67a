//! The lease store on PostgreSQL: a table of lease rows and two small tables beside it, a few
//! statements run on a shared connection (`link`), and a connection of its own that listens
//! for releases (`listener`). Acquisitions, renewals and releases of many keys made at once go
//! as one statement (`batch`), which changes their rows in key order.
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
//! Each store is one owner: `{process id}-{64 random bits}`, so that two stores in one process
//! exclude each other like two processes do.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use crate::cluster::error::{ClusterError, LeaseError};
use crate::cluster::locking::entropy::random_u64;
use crate::cluster::locking::lease_store::{Fence, LeaseStore, check_key};
use crate::cluster::locking::notices::LeaseNotices;
use crate::cluster::postgres::batch::{Batched, Batcher};
use crate::cluster::postgres::config::{LeaseTable, PgLeaseConfig};
use crate::cluster::postgres::link::StatementLink;
use crate::cluster::postgres::listener;

/// The lease store on a PostgreSQL table. Dropping it stops its listener and closes its
/// connections; its leases run out unless [`release_all`](LeaseStore::release_all) ran first.
pub(crate) struct PgLeaseStore {
    core: Arc<StoreCore>,
    lease: Duration,
    /// Acquisitions, renewals and releases of many keys go to the server together, as one
    /// statement (`batch`).
    changes: Batcher<Change, Option<Fence>>,
    listener: AbortHandle,
}

/// What the statements need, shared with the task that sends the batches.
struct StoreCore {
    owner: String,
    table: LeaseTable,
    statements: Statements,
    /// The lease in whole milliseconds, as the statements take it.
    lease_millis: i64,
    link: StatementLink,
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
        let owner = format!("{}-{:016x}", std::process::id(), random_u64());
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
        let setup = set_up_tables(&client, &checked.table, &statements, &owner, lease_millis);
        match tokio::time::timeout(server.connect_timeout(), setup).await {
            Ok(result) => result?,
            Err(_elapsed) => return Err(server.timed_out()),
        }
        drop(client);

        let listener_name = format!("keyed-locks listener {owner}");
        let (notices, listener) = listener::start(server, &checked.table, listener_name).await?;
        let core = Arc::new(StoreCore {
            owner,
            table: checked.table,
            statements,
            lease_millis,
            link,
        });
        let store = PgLeaseStore {
            changes: Batcher::new(Box::new({
                let core = Arc::clone(&core);
                move |batch| Box::pin(Arc::clone(&core).change_batch(batch))
            })),
            core,
            lease: checked.lease,
            listener,
        };
        Ok((store, notices))
    }

    /// Sends `change` in the next batch and waits for what it did: the lease's fence if it was
    /// made (taken, renewed or released), `None` if not.
    async fn submit(&self, change: Change) -> Result<Option<Fence>, LeaseError> {
        self.changes.submit(change).await.map_err(LeaseError::Batch)
    }

    /// Renews or releases (`change`) our lease `fence` of `key`: whether it was ours.
    async fn change_lease(
        &self,
        key: &str,
        fence: Fence,
        change: fn(String, i64) -> Change,
    ) -> Result<bool, LeaseError> {
        check_key(key)?;
        // A fence beyond the column's range was never handed out: not ours.
        let Ok(fence) = i64::try_from(fence) else {
            return Ok(false);
        };
        let made = self.submit(change(key.to_owned(), fence)).await?;
        Ok(made.is_some())
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
    ) -> Result<Vec<Option<Fence>>, LeaseError> {
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
            made.insert(key_of(row)?, (taken, fence_of(row)?));
        }
        Ok(batch
            .iter()
            .map(|change| {
                let &(taken, fence) = made.get(change.key())?;
                let acquiring = matches!(change, Change::Acquire { .. });
                (taken || !acquiring).then_some(fence)
            })
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
        self.submit(Change::Acquire {
            key: key.to_owned(),
        })
        .await
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

    async fn renew(&self, key: &str, fence: Fence) -> Result<bool, LeaseError> {
        self.change_lease(key, fence, |key, fence| Change::Renew { key, fence })
            .await
    }

    async fn release(&self, key: &str, fence: Fence) -> Result<bool, LeaseError> {
        self.change_lease(key, fence, |key, fence| Change::Release { key, fence })
            .await
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
    /// `$1` one key, `$3` lease in milliseconds. Takes the row if free, expired or ours, and
    /// not wanted by an acquisition refused less than a lease before its last lease ended
    /// (invariant 5); otherwise changes nothing. Returns `fence` if it took the row.
    try_acquire: String,
    /// `$1` owner, `$2` channel. Returns a row per lease released (invariant 4).
    release_all: String,
    /// `$1` this store's lease in milliseconds. Makes the row of `{prefix}fences` if missing,
    /// with `run`'s row beside it, and records the longest lease. At connect.
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
}

/// A statement's parameters with their types, as `query_typed` takes them.
type Params<'v, const N: usize> = [(&'v (dyn ToSql + Sync), Type); N];

impl Values<'_> {
    fn apply(&self) -> Params<'_, 6> {
        [
            (&self.keys, Type::TEXT_ARRAY),
            (&self.owner, Type::TEXT),
            (&self.lease_millis, Type::INT8),
            (&self.channel, Type::TEXT),
            (&self.fences, Type::INT8_ARRAY),
            (&self.renewing, Type::BOOL_ARRAY),
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
        // - An acquisition takes the row if free, expired or ours (invariants 1, 2), or else
        //   marks it wanted, so that its release is announced (invariant 4). Taking it from
        //   another owner clears the mark.
        // - A renewal extends the lease only if it is ours under its fence and live, a
        //   release frees it only if it is ours under its fence (invariant 3); both leave
        //   `wanted` as it is, for the release's announcement.
        // `free` reads the statement's clock, the same for every column: a clock read per
        // column could take the row without raising its fence. A lease that runs out while
        // the statement waits for its row is refused, and asked for again.
        let releasing = "excluded.owner IS NULL";
        let renewing = "excluded.wanted";
        let acquiring = "(excluded.owner IS NOT NULL AND NOT excluded.wanted)";
        let free = "(held.owner IS NULL OR held.owner = excluded.owner \
                     OR held.expires_at <= statement_timestamp())";
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
                               ELSE true END \
             WHERE {acquiring} \
                OR (held.owner = $2 AND held.fence = excluded.fence \
                    AND ({releasing} OR held.expires_at > clock_timestamp()))"
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
                 SELECT key, fence, coalesce(owner = $2, false) AS taken, \
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
                       wanted = false \
                   WHERE (held.owner IS NULL OR held.owner = excluded.owner \
                          OR held.expires_at <= statement_timestamp()) \
                     AND NOT (held.wanted AND held.expires_at + $3 * interval '1 millisecond' \
                                              > statement_timestamp()) \
                   RETURNING fence) \
                 SELECT fence, {async_commit} FROM taken"
            ),
            release_all: format!(
                "WITH released AS ( \
                   UPDATE {table} SET owner = NULL, expires_at = clock_timestamp() \
                   WHERE owner = $1 \
                   RETURNING key, wanted) \
                 SELECT CASE WHEN wanted THEN pg_notify($2, key)::text END, {async_commit} \
                 FROM released"
            ),
            // The row of a table new to `fences` starts `run` at floor 1: nothing was ever
            // committed without waiting for the disk, so nothing can have been lost. A store
            // with a longer lease than any before raises `longest_lease_ms`.
            record_store: format!(
                "WITH recorded AS ( \
                   INSERT INTO {fences} AS fences (one_row, floor, longest_lease_ms) \
                   VALUES (true, 1, $1) \
                   ON CONFLICT (one_row) DO UPDATE \
                   SET longest_lease_ms = \
                       GREATEST(fences.longest_lease_ms, excluded.longest_lease_ms) \
                   RETURNING floor, xmax = 0 AS created, \
                             set_config('synchronous_commit', 'on', true)) \
                 INSERT INTO {run} (one_row, floor, quiet_until) \
                 SELECT true, floor, clock_timestamp() FROM recorded WHERE created \
                 ON CONFLICT (one_row) DO NOTHING"
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
    add_wanted_if_missing(client, &leases).await?;

    client
        .query_typed(&statements.record_store, &[(&lease_millis, Type::INT8)])
        .await
        .map_err(|error| refusal(&fences, "recording the lease in", error))?;
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

/// Adds the `wanted` column to a lease table made before it existed. Asking first lets a role
/// that does not own the table use one that has it.
async fn add_wanted_if_missing(client: &Client, leases: &str) -> Result<(), ClusterError> {
    let quoted = format!("\"{leases}\"");
    let missing = client
        .query_typed_one(
            "SELECT NOT EXISTS (SELECT FROM pg_attribute \
             WHERE attrelid = to_regclass($1) AND attname = 'wanted' AND NOT attisdropped)",
            &[(&quoted, Type::TEXT)],
        )
        .await
        .and_then(|row| row.try_get::<_, bool>(0))
        .map_err(|error| refusal(leases, "looking at table", error))?;
    if !missing {
        return Ok(());
    }
    let alter = format!(
        "ALTER TABLE {quoted} ADD COLUMN IF NOT EXISTS wanted boolean NOT NULL DEFAULT false"
    );
    client
        .batch_execute(&alter)
        .await
        .map_err(|error| refusal(leases, "adding column \"wanted\" to", error))
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
    client
        .query_typed(&statements.release_all, &release.release_all())
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
