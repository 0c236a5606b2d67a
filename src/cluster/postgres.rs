//! The lease store on PostgreSQL: one table of lease rows, four statements run on a shared
//! connection (`link`), and a connection of its own that listens for releases (`listener`).
//! Acquisitions and releases of many keys made at once go as one statement each (`batch`):
//! their statements take arrays of keys, locked in key order.
//!
//! # The table
//!
//! `{prefix}leases (key text PRIMARY KEY, owner text, fence bigint NOT NULL, expires_at
//! timestamptz NOT NULL)`, created if missing. Its invariants, kept by the four statements
//! below, each one statement (whatever the number of keys in it) and so atomic:
//!
//! 1. A key is held by `owner` exactly while `owner IS NOT NULL AND expires_at >
//!    clock_timestamp()`. Only the server's clock decides: the clients' clocks may disagree.
//! 2. `fence` only grows, by one at each acquisition, and the row is never deleted (a new row
//!    would start again at 1). So a fence names one acquisition for ever, and whoever acquires
//!    after it gets a higher one.
//! 3. Renew and release act only on the row of their `(key, owner, fence)`: a holder whose
//!    lease ran out and was taken can neither extend nor end the next holder's.
//! 4. A release announces itself (`pg_notify`) in the statement that releases: the notice is
//!    sent exactly when the release commits.
//!
//! Because of invariant 2 the table keeps one row per key ever acquired.
//!
//! Each store is one owner: `{process id}-{64 random bits}`, so that two stores in one process
//! exclude each other like two processes do.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use super::batch::{Batched, Batcher};
use super::config::{LeaseTable, PgLeaseConfig};
use super::entropy::random_u64;
use super::error::{ClusterError, LeaseError};
use super::lease_store::{Fence, LeaseStore, check_key};
use super::link::StatementLink;
use super::listener;
use super::notices::LeaseNotices;

/// The lease store on a PostgreSQL table. Dropping it stops its listener and closes its
/// connections; its leases run out unless [`release_all`](LeaseStore::release_all) ran first.
pub(crate) struct PgLeaseStore {
    core: Arc<StoreCore>,
    lease: Duration,
    /// Acquisitions and releases of many keys go to the server together (`batch`).
    acquisitions: Batcher<Acquisition, Option<Fence>>,
    releases: Batcher<Release, bool>,
    listener: AbortHandle,
}

/// What the statements need, shared with the tasks that send the batches.
struct StoreCore {
    owner: String,
    table: LeaseTable,
    statements: Statements,
    /// The lease in whole milliseconds, as the statements take it.
    lease_millis: i64,
    link: StatementLink,
}

/// One key's acquisition, in a batch.
struct Acquisition {
    key: String,
}

/// One lease's release, in a batch.
struct Release {
    key: String,
    fence: i64,
}

impl Batched for Acquisition {
    type Conflict = String;

    fn conflict(&self) -> String {
        self.key.clone()
    }
}

impl Batched for Release {
    type Conflict = String;

    fn conflict(&self) -> String {
        self.key.clone()
    }
}

impl PgLeaseStore {
    /// Checks `config`, connects, creates the table if missing, checks that this role can read
    /// and write it, and starts listening for releases.
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
            acquisitions: Batcher::new(Box::new({
                let core = Arc::clone(&core);
                move |batch| Box::pin(Arc::clone(&core).acquire_batch(batch))
            })),
            releases: Batcher::new(Box::new({
                let core = Arc::clone(&core);
                move |batch| Box::pin(Arc::clone(&core).release_batch(batch))
            })),
            core,
            lease: checked.lease,
            listener,
        };
        Ok((store, notices))
    }

    /// This store's owner id, as the table's `owner` column holds it (the tests look for it).
    #[cfg(test)]
    pub(crate) fn owner(&self) -> &str {
        &self.core.owner
    }
}

impl StoreCore {
    /// The values of this store's statements for `keys` and `fences`.
    fn values<'a>(&'a self, keys: Vec<&'a str>, fences: Vec<i64>) -> Values<'a> {
        Values {
            keys,
            owner: &self.owner,
            fences,
            lease_millis: self.lease_millis,
            channel: self.table.name(),
        }
    }

    /// Acquires every key of `batch` that is free, expired or ours, in one statement: the
    /// new fence of each, or `None` where another owner holds the key.
    async fn acquire_batch(
        self: Arc<Self>,
        batch: Vec<Acquisition>,
    ) -> Result<Vec<Option<Fence>>, LeaseError> {
        // Rows are locked in key order in every batch of every process: no two batches can
        // wait for each other.
        let mut keys: Vec<&str> = batch.iter().map(|request| request.key.as_str()).collect();
        keys.sort_unstable();
        let values = self.values(keys, Vec::new());
        let statements = &self.statements;
        let acquire = || {
            self.query_one_or_many(
                batch.len(),
                (&statements.acquire_one, values.acquire_one()),
                (&statements.acquire, values.acquire()),
            )
        };
        let rows = match acquire().await {
            // No floor: `run` lost its row in a crash that this connection did not see (a
            // pooler in between kept it open). Check `run`, as a new connection does, and try
            // once more.
            Err(LeaseError::Statement(error))
                if error.code() == Some(&SqlState::NOT_NULL_VIOLATION) =>
            {
                tracing::info!(%error, "lease store: no fence floor; checking for a crash");
                self.link.run_on_connect().await?;
                acquire().await?
            }
            answer => answer?,
        };
        let mut taken = HashMap::with_capacity(rows.len());
        for row in &rows {
            // The others were marked wanted.
            if row.try_get("taken").map_err(LeaseError::Statement)? {
                taken.insert(key_of(row)?, fence_of(row)?);
            }
        }
        Ok(batch
            .iter()
            .map(|request| taken.get(&request.key).copied())
            .collect())
    }

    /// Releases every lease of `batch` still ours under its fence, in one statement that also
    /// announces each: whether each was.
    async fn release_batch(self: Arc<Self>, batch: Vec<Release>) -> Result<Vec<bool>, LeaseError> {
        let mut leases: Vec<(&str, i64)> = batch
            .iter()
            .map(|request| (request.key.as_str(), request.fence))
            .collect();
        leases.sort_unstable();
        let (keys, fences) = leases.into_iter().unzip();
        let values = self.values(keys, fences);
        let statements = &self.statements;
        let rows = self
            .query_one_or_many(
                batch.len(),
                (&statements.release_one, values.release_one()),
                (&statements.release, values.release()),
            )
            .await?;
        let released = rows.iter().map(key_of).collect::<Result<HashSet<_>, _>>()?;
        Ok(batch
            .iter()
            .map(|request| released.contains(&request.key))
            .collect())
    }
}

impl StoreCore {
    /// Runs `one` for a batch of one request (its statement takes a key, not an array, and
    /// plans more simply), `many` for a larger batch.
    async fn query_one_or_many<const N: usize>(
        &self,
        requests: usize,
        one: (&str, Params<'_, N>),
        many: (&str, Params<'_, N>),
    ) -> Result<Vec<Row>, LeaseError> {
        let (statement, params) = if requests == 1 { one } else { many };
        self.link.query(statement, &params).await
    }
}

/// The key a batch statement returned a row for.
fn key_of(row: &Row) -> Result<String, LeaseError> {
    row.try_get("key").map_err(LeaseError::Statement)
}

impl LeaseStore for PgLeaseStore {
    async fn acquire(&self, key: &str) -> Result<Option<Fence>, LeaseError> {
        check_key(key)?;
        let request = Acquisition {
            key: key.to_owned(),
        };
        self.acquisitions
            .submit(request)
            .await
            .map_err(LeaseError::Batch)
    }

    async fn renew(&self, key: &str, fence: Fence) -> Result<bool, LeaseError> {
        check_key(key)?;
        // A fence beyond the column's range was never handed out: not ours.
        let Ok(fence) = i64::try_from(fence) else {
            return Ok(false);
        };
        let core = &self.core;
        let values = core.values(vec![key], vec![fence]);
        let rows = core
            .link
            .query(&core.statements.renew, &values.renew())
            .await?;
        Ok(!rows.is_empty())
    }

    async fn release(&self, key: &str, fence: Fence) -> Result<bool, LeaseError> {
        check_key(key)?;
        let Ok(fence) = i64::try_from(fence) else {
            return Ok(false);
        };
        let request = Release {
            key: key.to_owned(),
            fence,
        };
        self.releases
            .submit(request)
            .await
            .map_err(LeaseError::Batch)
    }

    async fn release_all(&self) -> Result<u64, LeaseError> {
        // No key or fence: this statement takes the owner and the channel only.
        let core = &self.core;
        let values = core.values(Vec::new(), Vec::new());
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

/// The statements' text for one table. Parameters: `$1` keys (an array; renew takes one
/// key), `$2` owner, then as named.
#[derive(Debug)]
struct Statements {
    /// `$3` lease in milliseconds. Takes each row that is free, expired or ours (invariants
    /// 1, 2), in the keys' order; returns `(key, new fence)` for each taken.
    acquire: String,
    /// `acquire` for one key (`$1` a key, not an array): a simpler plan for the batch of one
    /// that a lone lock makes.
    acquire_one: String,
    /// `$1` one key, `$3` fence, `$4` lease in milliseconds. Returns a row if renewed
    /// (invariants 1, 3).
    renew: String,
    /// `$3` fences, one per key, `$4` channel. Returns the key of each lease released, after
    /// locking their rows in key order (invariants 3, 4).
    release: String,
    /// `release` for one key and fence (`$1`, `$3` not arrays).
    release_one: String,
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
    fences: Vec<i64>,
    lease_millis: i64,
    channel: &'a str,
}

/// A statement's parameters with their types, as `query_typed` takes them.
type Params<'v, const N: usize> = [(&'v (dyn ToSql + Sync), Type); N];

impl Values<'_> {
    fn acquire(&self) -> Params<'_, 3> {
        [
            (&self.keys, Type::TEXT_ARRAY),
            (&self.owner, Type::TEXT),
            (&self.lease_millis, Type::INT8),
        ]
    }

    fn acquire_one(&self) -> Params<'_, 3> {
        [
            (&self.keys[0], Type::TEXT),
            (&self.owner, Type::TEXT),
            (&self.lease_millis, Type::INT8),
        ]
    }

    fn release_one(&self) -> Params<'_, 4> {
        [
            (&self.keys[0], Type::TEXT),
            (&self.owner, Type::TEXT),
            (&self.fences[0], Type::INT8),
            (&self.channel, Type::TEXT),
        ]
    }

    /// Renew takes one key and its fence, the first of each.
    fn renew(&self) -> Params<'_, 4> {
        [
            (&self.keys[0], Type::TEXT),
            (&self.owner, Type::TEXT),
            (&self.fences[0], Type::INT8),
            (&self.lease_millis, Type::INT8),
        ]
    }

    fn release(&self) -> Params<'_, 4> {
        [
            (&self.keys, Type::TEXT_ARRAY),
            (&self.owner, Type::TEXT),
            (&self.fences, Type::INT8_ARRAY),
            (&self.channel, Type::TEXT),
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
        // What acquire does to a row that exists (the first acquisition inserts it at the
        // floor): take it if free, expired or ours (invariants 1, 2), or else mark it wanted,
        // so that its release is announced (invariant 4). `free` is evaluated once per row: a
        // clock read per column could take the row without raising its fence.
        let take_or_want = "ON CONFLICT (key) DO UPDATE \
             SET (owner, fence, expires_at, wanted) = ( \
               SELECT CASE WHEN free THEN excluded.owner ELSE held.owner END, \
                      CASE WHEN free THEN GREATEST(held.fence + 1, excluded.fence) \
                           ELSE held.fence END, \
                      CASE WHEN free THEN excluded.expires_at ELSE held.expires_at END, \
                      NOT free \
               FROM (SELECT held.owner IS NULL OR held.owner = excluded.owner \
                            OR held.expires_at <= clock_timestamp() AS free) AS decided) \
             RETURNING key, fence, owner = $2 AS taken";
        // No row in `run` (the server lost it and nobody has checked since) makes the floor
        // NULL, which the fence column refuses: an error, never a fence below the floor. In
        // the quiet time after a crash nothing is acquired.
        let from_run = format!(
            "LEFT JOIN {run} AS run ON true \
             WHERE run.quiet_until IS NULL OR run.quiet_until <= clock_timestamp()"
        );
        // A release announces itself only if an acquisition was refused the key since it was
        // taken (`wanted`, read under the row's lock before the release clears it).
        let announce = "CASE WHEN wanted THEN pg_notify($4, key)::text END";
        let announce_all = "CASE WHEN wanted THEN pg_notify($2, key)::text END";
        let released = format!(
            "released AS ( \
               UPDATE {table} AS held \
               SET owner = NULL, expires_at = clock_timestamp(), wanted = false \
               FROM ours WHERE held.key = ours.key \
               RETURNING held.key, ours.wanted)"
        );
        Statements {
            // "Ours" too: an acquire of ours that was applied but whose reply was lost must not
            // block the key until it runs out. Taking it again with a new fence is safe: the
            // old fence was never handed to anyone.
            acquire: format!(
                "INSERT INTO {table} AS held (key, owner, fence, expires_at) \
                 SELECT asked.key, $2, run.floor, \
                        clock_timestamp() + $3 * interval '1 millisecond' \
                 FROM unnest($1::text[]) WITH ORDINALITY AS asked(key, position) \
                 {from_run} \
                 ORDER BY asked.position \
                 {take_or_want}, {async_commit}"
            ),
            acquire_one: format!(
                "INSERT INTO {table} AS held (key, owner, fence, expires_at) \
                 SELECT $1, $2, run.floor, clock_timestamp() + $3 * interval '1 millisecond' \
                 FROM (VALUES (1)) AS asked(one) \
                 {from_run} \
                 {take_or_want}, {async_commit}"
            ),
            renew: format!(
                "UPDATE {table} \
                 SET expires_at = clock_timestamp() + $4 * interval '1 millisecond' \
                 WHERE key = $1 AND owner = $2 AND fence = $3 \
                   AND expires_at > clock_timestamp() \
                 RETURNING fence, {async_commit}"
            ),
            // A data-modifying WITH runs to completion once, and `pg_notify` runs for each row
            // it returns, in the same statement and so the same transaction.
            release: format!(
                "WITH ours AS ( \
                   SELECT held.key, held.wanted FROM {table} AS held \
                   JOIN unnest($1::text[], $3::bigint[]) AS given(key, fence) \
                     ON held.key = given.key AND held.fence = given.fence \
                   WHERE held.owner = $2 \
                   ORDER BY held.key FOR UPDATE OF held), \
                 {released} \
                 SELECT key, {announce}, {async_commit} FROM released"
            ),
            release_one: format!(
                "WITH ours AS ( \
                   SELECT key, wanted FROM {table} \
                   WHERE key = $1 AND owner = $2 AND fence = $3 FOR UPDATE), \
                 {released} \
                 SELECT key, {announce}, {async_commit} FROM released"
            ),
            release_all: format!(
                "WITH ours AS ( \
                   SELECT key, wanted FROM {table} WHERE owner = $1 ORDER BY key FOR UPDATE), \
                 {released} \
                 SELECT {announce_all}, {async_commit} FROM released"
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
    let values = Values {
        keys: vec![&key],
        owner,
        fences: vec![1],
        lease_millis,
        channel: table.name(),
    };
    client
        .query_typed(&statements.acquire, &values.acquire())
        .await?;
    client
        .query_typed(&statements.acquire_one, &values.acquire_one())
        .await?;
    client
        .query_typed(&statements.renew, &values.renew())
        .await?;
    client
        .query_typed(&statements.release, &values.release())
        .await?;
    client
        .query_typed(&statements.release_one, &values.release_one())
        .await?;
    client
        .query_typed(&statements.release_all, &values.release_all())
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
