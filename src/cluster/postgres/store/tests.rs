//! The PostgreSQL lease store against a real server: `KEYED_LOCKS_TEST_DATABASE_URL`, or
//! `postgres://postgres@127.0.0.1:5432/test`, whose role may create roles, schemas and tables.
//!
//! Unit tests rather than integration tests, so that the store stays crate-private: the crate's
//! public surface does not grow, not even by a hidden module, for tests' sake.
//!
//! Each test has its own table prefix (`kl_test_<test>_`) and drops its table first, so tests
//! run in parallel and after a failed run. Waits for something that should take milliseconds
//! are bounded by [`BOUND`]. The lease contract's tests (`lease_store::contract`) run here too,
//! each on its own table `kl_contract_<test>_leases`.

use std::future::Future;
use std::num::NonZeroU32;
use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};
use tokio_postgres::{Client, NoTls};

use crate::cluster::ClusterError;
use crate::cluster::error::LeaseError;
use crate::cluster::locking::lease_store::{Fence, LeaseNotice, LeaseStore, Renewal};
use crate::cluster::locking::notices::LeaseNotices;
use crate::cluster::postgres::config::PgLeaseConfig;
use crate::cluster::postgres::store::{FLOOR_RISE_AFTER_CRASH, PgLeaseStore};
use crate::cluster::testing::contract::{
    BOUND, Backend, PartView, RowView, contract_tests, next_notice, released,
};

/// The role the permission tests connect as.
const NO_PRIVILEGES_ROLE: &str = "kl_test_no_privileges";

fn url() -> String {
    std::env::var("KEYED_LOCKS_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// `url()` with one more connection parameter, which overrides any earlier one.
fn url_with(param: &str) -> String {
    let url = url();
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{param}")
}

/// A lease that outlives any test (30 s), renewed every 10 s.
fn config(prefix: &str) -> PgLeaseConfig {
    PgLeaseConfig {
        table_prefix: prefix.to_owned(),
        ..PgLeaseConfig::new(url())
    }
}

/// A lease of `lease`, renewed three times per lease (at most every 10 s).
fn lease_config(prefix: &str, lease: Duration) -> PgLeaseConfig {
    PgLeaseConfig {
        lease,
        heartbeat: (lease / 3).min(Duration::from_secs(10)),
        ..config(prefix)
    }
}

async fn admin() -> Client {
    let (client, connection) = tokio_postgres::connect(&url(), NoTls)
        .await
        .expect("the test server is reachable");
    tokio::spawn(connection);
    client
}

/// Drops the test's tables, so that it starts from nothing.
async fn fresh_table(prefix: &str) -> Client {
    let admin = admin().await;
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS \"{prefix}leases\", \"{prefix}fences\", \"{prefix}run\""
        ))
        .await
        .expect("the test table can be dropped");
    admin
}

async fn store(config: &PgLeaseConfig) -> (PgLeaseStore, LeaseNotices) {
    match PgLeaseStore::connect(config).await {
        Ok(connected) => connected,
        Err(error) => panic!(
            "connect failed: {error}: {:?}",
            std::error::Error::source(&error)
        ),
    }
}

/// `(owner, fence)` of `key`'s row, if there is one.
async fn row(admin: &Client, prefix: &str, key: &str) -> Option<(Option<String>, i64)> {
    let statement = format!("SELECT owner, fence FROM \"{prefix}leases\" WHERE key = $1");
    let row = admin
        .query_opt(&statement, &[&key])
        .await
        .expect("the row can be read")?;
    Some((row.get(0), row.get(1)))
}

/// `expires_at` of `key`'s row, in seconds since the epoch.
async fn expires_at(admin: &Client, prefix: &str, key: &str) -> f64 {
    let statement = format!(
        "SELECT extract(epoch FROM expires_at)::float8 FROM \"{prefix}leases\" WHERE key = $1"
    );
    admin
        .query_one(&statement, &[&key])
        .await
        .expect("the row exists")
        .get(0)
}

/// The backend process of the connection named `application_name`, if it is connected.
async fn backend_pid(admin: &Client, application_name: &str) -> Option<i32> {
    let statement = "SELECT pid FROM pg_stat_activity WHERE application_name = $1";
    let row = admin
        .query_opt(statement, &[&application_name])
        .await
        .expect("pg_stat_activity");
    row.map(|row| row.get(0))
}

/// Terminates the backend of the connection named `application_name`; returns its pid.
async fn terminate(admin: &Client, application_name: &str) -> i32 {
    let pid = backend_pid(admin, application_name)
        .await
        .expect("the connection is there");
    let statement = "SELECT pg_terminate_backend($1)";
    let terminated: bool = admin
        .query_one(statement, &[&pid])
        .await
        .expect("terminate")
        .get(0);
    assert!(terminated, "backend {pid} was not terminated");
    pid
}

fn statements_name(store: &PgLeaseStore) -> String {
    format!("keyed-locks statements {}", store.owner())
}

fn listener_name(store: &PgLeaseStore) -> String {
    format!("keyed-locks listener {}", store.owner())
}

/// Polls `condition` until it holds, failing the test after [`BOUND`].
async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + BOUND;
    while !condition().await {
        assert!(Instant::now() < deadline, "{what}: not within {BOUND:?}");
        sleep(Duration::from_millis(20)).await;
    }
}

/// `waiter` is refused `key`, which marks it wanted, then `holder` releases its lease `fence`:
/// a release that is announced.
async fn release_while_wanted(
    holder: &PgLeaseStore,
    waiter: &PgLeaseStore,
    key: &str,
    fence: Fence,
) {
    assert_eq!(waiter.acquire(key).await.ok(), Some(None), "{key} is held");
    assert_eq!(
        holder.release(key, fence).await.ok(),
        Some(true),
        "{key} is ours"
    );
}

async fn acquired(store: &PgLeaseStore, key: &str) -> Fence {
    match store.acquire(key).await {
        Ok(Some(fence)) => fence,
        other => panic!("acquire of {key:?}: {other:?}"),
    }
}

/// Connects a store expected to fail, and how long the failure took.
async fn connect_error(config: &PgLeaseConfig) -> (ClusterError, Duration) {
    let started = Instant::now();
    match timeout(BOUND, PgLeaseStore::connect(config)).await {
        Ok(Err(error)) => (error, started.elapsed()),
        Ok(Ok((store, _))) => panic!("connected: {store:?}"),
        Err(_) => panic!("connect hung for {BOUND:?}"),
    }
}

/// Makes the role without privileges, unless a run before made it.
async fn no_privileges_role(admin: &Client) {
    // Two tests may run this at once: the loser of the race on the catalog gets a
    // unique_violation rather than a duplicate_object.
    let create = format!(
        "DO $$ BEGIN CREATE ROLE {NO_PRIVILEGES_ROLE} LOGIN; \
         EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
    );
    admin
        .batch_execute(&create)
        .await
        .expect("the role can be created");
}

// The lease contract, as every store keeps it.

/// Each contract test's own table, `kl_contract_<test>_leases`, and the admin connection that
/// reads its rows.
struct PgBackend {
    admin: Client,
    prefix: String,
}

impl Backend for PgBackend {
    type Store = PgLeaseStore;

    async fn stores_with_capacity(
        test: &str,
        capacity: NonZeroU32,
        leases: &[Duration],
    ) -> (Self, Vec<(PgLeaseStore, LeaseNotices)>) {
        let prefix = format!("kl_contract_{test}_");
        let admin = fresh_table(&prefix).await;
        let mut stores = Vec::new();
        for &lease in leases {
            let config = PgLeaseConfig {
                capacity,
                ..lease_config(&prefix, lease)
            };
            stores.push(store(&config).await);
        }
        (PgBackend { admin, prefix }, stores)
    }

    async fn parts(&self, key: &str) -> Vec<PartView> {
        let statement = format!(
            "SELECT part.owner, part.fence, part.permits \
             FROM \"{}leases\" AS held, \
                  unnest(held.part_owners, held.part_fences, held.part_permits) \
                  WITH ORDINALITY AS part(owner, fence, permits, position) \
             WHERE held.key = $1 ORDER BY part.position",
            self.prefix
        );
        let rows = self
            .admin
            .query(&statement, &[&key])
            .await
            .expect("the parts can be read");
        rows.iter()
            .map(|row| {
                let fence: i64 = row.get(1);
                let permits: i32 = row.get(2);
                (
                    row.get(0),
                    Fence::try_from(fence).expect("a positive fence"),
                    u32::try_from(permits).expect("positive permits"),
                )
            })
            .collect()
    }

    fn owner(store: &PgLeaseStore) -> String {
        store.owner().to_owned()
    }

    async fn row(&self, key: &str) -> Option<RowView> {
        let (owner, fence) = row(&self.admin, &self.prefix, key).await?;
        let fence = Fence::try_from(fence).expect("the column keeps fences positive");
        Some((owner, fence))
    }

    async fn expires_at(&self, key: &str) -> Duration {
        Duration::from_secs_f64(expires_at(&self.admin, &self.prefix, key).await)
    }
}

contract_tests!(
    #[tokio::test]
    PgBackend
);

// Notices.

#[tokio::test]
async fn a_lost_listening_connection_is_made_again_and_says_missed() {
    let prefix = "kl_test_listener_lost_";
    let admin = fresh_table(prefix).await;
    let (waiter, mut notices) = store(&config(prefix)).await;
    let (holder, _holder_notices) = store(&config(prefix)).await;
    let old_pid = terminate(&admin, &listener_name(&waiter)).await;
    assert_eq!(next_notice(&mut notices).await, Some(LeaseNotice::Missed));
    let new_pid = backend_pid(&admin, &listener_name(&waiter)).await;
    assert!(new_pid.is_some_and(|pid| pid != old_pid));
    // And the new connection listens.
    let fence = acquired(&holder, "k").await;
    release_while_wanted(&holder, &waiter, "k", fence).await;
    assert_eq!(next_notice(&mut notices).await, released("k"));
}

#[tokio::test]
async fn dropping_the_store_ends_its_notices() {
    let prefix = "kl_test_drop_store_";
    let admin = fresh_table(prefix).await;
    let (store, mut notices) = store(&config(prefix)).await;
    let listener = listener_name(&store);
    drop(store);
    assert_eq!(next_notice(&mut notices).await, None);
    eventually("the listening connection closes", || async {
        backend_pid(&admin, &listener).await.is_none()
    })
    .await;
}

#[tokio::test]
async fn dropping_the_notices_closes_the_listening_connection() {
    let prefix = "kl_test_drop_notices_";
    let admin = fresh_table(prefix).await;
    let (store, notices) = store(&config(prefix)).await;
    let listener = listener_name(&store);
    assert!(backend_pid(&admin, &listener).await.is_some());
    drop(notices);
    eventually("the listening connection closes", || async {
        backend_pid(&admin, &listener).await.is_none()
    })
    .await;
    // The store goes on without it.
    assert_eq!(store.acquire("k").await.ok(), Some(Some(1)));
}

// The statement connection.

#[tokio::test]
async fn a_statement_connection_lost_while_idle_is_made_again_by_the_next_call() {
    let prefix = "kl_test_statements_idle_";
    let admin = fresh_table(prefix).await;
    let (store, _notices) = store(&config(prefix)).await;
    let old_pid = terminate(&admin, &statements_name(&store)).await;
    eventually("the store sees its connection lost", || {
        store.core.link.is_known_lost()
    })
    .await;
    // Nothing was sent on the lost connection, so the call reconnects and runs.
    assert_eq!(store.acquire("k").await.ok(), Some(Some(1)));
    let new_pid = backend_pid(&admin, &statements_name(&store)).await;
    assert!(new_pid.is_some_and(|pid| pid != old_pid));
}

/// Holds the row of `key` locked (`FOR UPDATE`) until the returned client rolls back.
async fn lock_row(prefix: &str, key: &str) -> Client {
    let locker = admin().await;
    let statement =
        format!("BEGIN; SELECT 1 FROM \"{prefix}leases\" WHERE key = '{key}' FOR UPDATE");
    locker
        .batch_execute(&statement)
        .await
        .expect("the row can be locked");
    locker
}

async fn waits_on_a_lock(admin: &Client, application_name: &str) -> bool {
    let statement = "SELECT 1 FROM pg_stat_activity \
                     WHERE application_name = $1 AND wait_event_type = 'Lock'";
    let row = admin
        .query_opt(statement, &[&application_name])
        .await
        .expect("pg_stat_activity");
    row.is_some()
}

#[tokio::test]
async fn a_statement_cut_by_a_lost_connection_fails_and_the_next_call_reconnects() {
    let prefix = "kl_test_statements_cut_";
    let admin = fresh_table(prefix).await;
    // A long heartbeat (the statement timeout), so that the cut comes first.
    let config = PgLeaseConfig {
        lease: Duration::from_secs(30),
        heartbeat: Duration::from_secs(10),
        ..config(prefix)
    };
    let (store, _notices) = store(&config).await;
    let fence = acquired(&store, "k").await;
    let locker = lock_row(prefix, "k").await;
    let name = statements_name(&store);
    let (renewed, ()) = tokio::join!(store.renew("k", fence), async {
        eventually("the renewal waits on the row", || {
            waits_on_a_lock(&admin, &name)
        })
        .await;
        terminate(&admin, &name).await;
    });
    // Renewals go in batches, which fail each of their calls with the batch's error.
    assert!(
        matches!(&renewed, Err(LeaseError::Batch(error))
            if matches!(**error, LeaseError::ConnectionLost(_))),
        "{renewed:?}"
    );
    locker.batch_execute("ROLLBACK").await.expect("rollback");
    assert_eq!(
        store.renew("k", fence).await.ok(),
        Some(Renewal::Renewed { wanted: false })
    );
}

#[tokio::test]
async fn a_statement_stalled_past_the_heartbeat_times_out_and_the_next_call_reconnects() {
    let prefix = "kl_test_statements_stalled_";
    let admin = fresh_table(prefix).await;
    // A short heartbeat (the statement timeout), a lease that lasts the test.
    let config = PgLeaseConfig {
        lease: Duration::from_secs(30),
        heartbeat: Duration::from_millis(200),
        ..config(prefix)
    };
    let (store, _notices) = store(&config).await;
    let fence = acquired(&store, "k").await;
    let old_pid = backend_pid(&admin, &statements_name(&store)).await;
    let locker = lock_row(prefix, "k").await;
    let renewed = timeout(BOUND, store.renew("k", fence))
        .await
        .expect("a bounded renewal");
    assert!(
        matches!(&renewed, Err(LeaseError::Batch(error))
            if matches!(**error, LeaseError::Timeout { .. })),
        "{renewed:?}"
    );
    assert!(store.core.link.is_known_lost().await);
    locker.batch_execute("ROLLBACK").await.expect("rollback");
    assert_eq!(store.acquire("other").await.ok(), Some(Some(1)));
    let new_pid = backend_pid(&admin, &statements_name(&store)).await;
    assert!(new_pid.is_some() && new_pid != old_pid);
}

// Connecting.

#[tokio::test]
async fn a_table_prefix_that_is_not_a_plain_identifier_is_refused_before_connecting() {
    let too_long = "a".repeat(60);
    for prefix in ["bad-name; drop", "", "1kl_", &too_long] {
        // An unreachable server: the prefix must be refused without it.
        let config = PgLeaseConfig {
            url: "postgres://postgres@127.0.0.1:1/test".to_owned(),
            ..config(prefix)
        };
        let (error, _) = connect_error(&config).await;
        assert!(
            matches!(error, ClusterError::BadTablePrefix { .. }),
            "{prefix:?}: {error:?}"
        );
        assert!(error.to_string().contains("bad table prefix"), "{error}");
    }
}

#[tokio::test]
async fn an_unreachable_server_is_reported_within_the_connect_timeout() {
    let config = PgLeaseConfig {
        url: "postgres://postgres@127.0.0.1:1/test".to_owned(),
        connect_timeout: Duration::from_secs(2),
        ..config("kl_test_unreachable_")
    };
    let (error, took) = connect_error(&config).await;
    assert!(
        matches!(error, ClusterError::Unreachable { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("127.0.0.1:1"), "{error}");
    assert!(took < BOUND);
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    // Accepts connections and never says a word.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a local port");
    let address = silent.local_addr().expect("its address");
    let accepting = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let config = PgLeaseConfig {
        url: format!("postgres://postgres@{address}/test"),
        connect_timeout: Duration::from_millis(500),
        ..config("kl_test_silent_")
    };
    let (error, took) = connect_error(&config).await;
    accepting.abort();
    assert!(
        matches!(error, ClusterError::ConnectTimeout { .. }),
        "{error:?}"
    );
    assert!(
        took >= Duration::from_millis(500) && took < BOUND,
        "{took:?}"
    );
}

#[tokio::test]
async fn a_lease_too_short_for_its_heartbeat_or_too_long_is_refused() {
    let prefix = "kl_test_timing_";
    let admin = fresh_table(prefix).await;
    let ms = Duration::from_millis;
    for (lease, heartbeat) in [(ms(299), ms(100)), (ms(1000), ms(10)), (ms(0), ms(0))] {
        let (error, _) = connect_error(&PgLeaseConfig {
            lease,
            heartbeat,
            ..config(prefix)
        })
        .await;
        assert!(
            matches!(error, ClusterError::LeaseTooShort { .. }),
            "{lease:?}: {error:?}"
        );
    }
    let two_days = Duration::from_secs(2 * 24 * 60 * 60);
    let (error, _) = connect_error(&PgLeaseConfig {
        lease: two_days,
        ..config(prefix)
    })
    .await;
    assert!(
        matches!(error, ClusterError::LeaseTooLong { .. }),
        "{error:?}"
    );
    // Refused before the table was made.
    let exists = "SELECT to_regclass('\"kl_test_timing_leases\"') IS NOT NULL";
    assert!(
        !admin
            .query_one(exists, &[])
            .await
            .expect("to_regclass")
            .get::<_, bool>(0)
    );
}

#[tokio::test]
async fn a_role_without_privileges_on_the_table_gets_a_permission_error_naming_it() {
    let prefix = "kl_test_no_rights_";
    let admin = fresh_table(prefix).await;
    no_privileges_role(&admin).await;
    drop(store(&config(prefix)).await);
    // Rights on the two other tables, none on the lease table: the error names the one.
    let revoke = format!(
        "GRANT ALL ON \"{prefix}fences\", \"{prefix}run\" TO {NO_PRIVILEGES_ROLE}; \
         REVOKE ALL ON \"{prefix}leases\" FROM PUBLIC, {NO_PRIVILEGES_ROLE}"
    );
    admin.batch_execute(&revoke).await.expect("revoke");
    let config = PgLeaseConfig {
        url: url_with(&format!("user={NO_PRIVILEGES_ROLE}")),
        ..config(prefix)
    };
    let (error, _) = connect_error(&config).await;
    assert!(
        matches!(error, ClusterError::MissingPermission { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("kl_test_no_rights_leases"),
        "{error}"
    );
}

#[tokio::test]
async fn a_role_that_cannot_create_the_table_gets_a_permission_error_naming_it() {
    let prefix = "kl_test_cannot_create_";
    let admin = admin().await;
    no_privileges_role(&admin).await;
    // A schema of our own where the role may look but not create, whatever the server's
    // defaults for `public`.
    let setup = format!(
        "CREATE SCHEMA IF NOT EXISTS kl_test_locked; \
         REVOKE CREATE ON SCHEMA kl_test_locked FROM PUBLIC; \
         GRANT USAGE ON SCHEMA kl_test_locked TO {NO_PRIVILEGES_ROLE}; \
         DROP TABLE IF EXISTS kl_test_locked.\"{prefix}leases\", \
             kl_test_locked.\"{prefix}fences\", kl_test_locked.\"{prefix}run\""
    );
    admin
        .batch_execute(&setup)
        .await
        .expect("the schema can be set up");
    let url = url_with(&format!(
        "user={NO_PRIVILEGES_ROLE}&options=-c%20search_path%3Dkl_test_locked"
    ));
    let (error, _) = connect_error(&PgLeaseConfig {
        url,
        ..config(prefix)
    })
    .await;
    assert!(
        matches!(error, ClusterError::MissingPermission { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("kl_test_cannot_create_leases"),
        "{error}"
    );
}

#[tokio::test]
async fn a_table_of_another_shape_is_refused_at_connect() {
    let prefix = "kl_test_shape_";
    let admin = fresh_table(prefix).await;
    let create = format!("CREATE TABLE \"{prefix}leases\" (key text PRIMARY KEY)");
    admin.batch_execute(&create).await.expect("create");
    let (error, _) = connect_error(&config(prefix)).await;
    assert!(matches!(error, ClusterError::Database { .. }), "{error:?}");
    assert!(
        error.to_string().contains("kl_test_shape_leases"),
        "{error}"
    );
}

#[tokio::test]
async fn stores_connecting_at_once_to_a_missing_table_all_connect() {
    let prefix = "kl_test_create_race_";
    let _admin = fresh_table(prefix).await;
    let config = config(prefix);
    let connects = [(); 4].map(|()| PgLeaseStore::connect(&config));
    let [a, b, c, d] = connects;
    let (a, b, c, d) = tokio::join!(a, b, c, d);
    for connected in [a, b, c, d] {
        assert!(connected.is_ok(), "{:?}", connected.err());
    }
}

/// Calls of one store made together go to the server as one statement per kind (`batch`):
/// each still gets its own answer, a key held by another owner included, and a release under a
/// stale fence changes nothing.
#[tokio::test]
async fn calls_made_together_share_a_statement_and_keep_their_own_answers() {
    let prefix = "keyed_locks_test_batches_";
    let admin = fresh_table(prefix).await;
    let (ours, _our_notices) = store(&config(prefix)).await;
    let (theirs, _their_notices) = store(&config(prefix)).await;
    let held_elsewhere = acquired(&theirs, "k3").await;
    let keys: Vec<String> = (0..20).map(|n| format!("k{n}")).collect();

    // On this current-thread runtime all 20 are queued before the batch leaves: one statement.
    let taken = futures::future::join_all(keys.iter().map(|key| ours.acquire(key))).await;
    for (key, answer) in keys.iter().zip(&taken) {
        match answer {
            Ok(None) if key == "k3" => {}
            Ok(Some(1)) if key != "k3" => {}
            other => panic!("acquire of {key:?} in a batch: {other:?}"),
        }
    }

    let mut releases: Vec<(&str, Fence)> = keys
        .iter()
        .filter(|key| *key != "k3")
        .map(|key| (key.as_str(), 1))
        .collect();
    releases.push(("k5", 9));
    releases.push(("k3", held_elsewhere));
    let released = futures::future::join_all(
        releases
            .iter()
            .map(|&(key, fence)| ours.release(key, fence)),
    )
    .await;
    for (&(key, fence), answer) in releases.iter().zip(&released) {
        let expected = fence == 1 && key != "k3";
        assert!(
            matches!(answer, Ok(got) if *got == expected),
            "release of {key:?} under fence {fence}: {answer:?}"
        );
    }
    for key in &keys {
        let (owner, fence) = row(&admin, prefix, key).await.expect("the row is there");
        if key == "k3" {
            assert_eq!(owner.as_deref(), Some(theirs.owner()));
            assert_eq!(fence, 1);
        } else {
            assert_eq!(owner, None, "{key} is still held");
            assert_eq!(fence, 1);
        }
    }
}

#[tokio::test]
async fn acquisitions_renewals_and_releases_made_together_keep_their_own_answers() {
    let prefix = "keyed_locks_test_mixed_batch_";
    let admin = fresh_table(prefix).await;
    let (ours, _our_notices) = store(&config(prefix)).await;
    let (theirs, mut their_notices) = store(&config(prefix)).await;
    for key in ["a0", "a1", "a2", "a3"] {
        assert_eq!(acquired(&ours, key).await, 1);
    }
    assert_eq!(acquired(&theirs, "t").await, 1);
    let renewed_before = expires_at(&admin, prefix, "a0").await;

    // One poll submits them all: on this current-thread runtime they leave together.
    let (acquisitions, renewals, releases) = tokio::join!(
        futures::future::join_all([ours.acquire("new"), ours.acquire("t")]),
        futures::future::join_all([
            ours.renew("a0", 1),
            ours.renew("a1", 7),
            ours.renew("t", 1),
            ours.renew("never", 1),
        ]),
        futures::future::join_all([
            ours.release("a2", 1),
            ours.release("a3", 5),
            ours.release("nothing", 1),
        ]),
    );
    assert_eq!(answers(acquisitions), [Some(Some(1)), Some(None)]);
    assert_eq!(
        answers(renewals),
        [
            Some(Renewal::Renewed { wanted: false }),
            Some(Renewal::Lost),
            Some(Renewal::Lost),
            Some(Renewal::Lost)
        ]
    );
    assert_eq!(answers(releases), [Some(true), Some(false), Some(false)]);

    assert!(expires_at(&admin, prefix, "a0").await > renewed_before);
    assert_eq!(row(&admin, prefix, "a2").await, Some((None, 1)));
    assert_eq!(
        row(&admin, prefix, "a3").await,
        Some((Some(ours.owner().to_owned()), 1))
    );
    // Nothing is made for a key that was renewed or released but never acquired.
    assert_eq!(row(&admin, prefix, "never").await, None);
    assert_eq!(row(&admin, prefix, "nothing").await, None);
    // Our refused acquisition marked "t" wanted: its release is announced.
    assert_eq!(theirs.release("t", 1).await.ok(), Some(true));
    assert_eq!(next_notice(&mut their_notices).await, released("t"));
}

/// Part renewals made together go to the server as one statement (`renew_parts`), two parts
/// of one key among them: each gets its own answer, whether its key is wanted included, and
/// only our live parts that were named are extended.
#[tokio::test]
async fn part_renewals_made_together_keep_their_own_answers() {
    let prefix = "keyed_locks_test_part_renewals_";
    let admin = fresh_table(prefix).await;
    let lease = Duration::from_millis(900);
    let (ours, _our_notices) = store(&sharing_config(prefix, 4, lease)).await;
    let (theirs, _their_notices) = store(&sharing_config(prefix, 4, lease)).await;
    async fn part(store: &PgLeaseStore, key: &str) -> Fence {
        let taken = store.acquire_part(key, NonZeroU32::MIN).await;
        taken.ok().flatten().expect("the part fits")
    }
    let ran_out = part(&ours, "c").await;
    sleep(lease + Duration::from_millis(100)).await;
    let (a1, a2, b, theirs_a) = (
        part(&ours, "a").await,
        part(&ours, "a").await,
        part(&ours, "b").await,
        part(&theirs, "a").await,
    );
    // Their whole lease of "b" is refused beside our part, and waits: "b" is wanted.
    assert_eq!(theirs.acquire("b").await.ok(), Some(None));
    sleep(Duration::from_millis(300)).await;

    let asked = [
        ("a", a1),
        ("b", b),
        ("a", a2),
        ("c", ran_out),
        ("a", theirs_a),
        ("a", a2 + 100),
        ("never", 1),
    ];
    let answered = futures::future::join_all(
        asked
            .iter()
            .map(|&(key, fence)| ours.renew_part(key, fence)),
    )
    .await;
    let renewed = |wanted| Some(Renewal::Renewed { wanted });
    assert_eq!(
        answers(answered),
        [
            renewed(false),
            renewed(true),
            renewed(false),
            Some(Renewal::Lost),
            Some(Renewal::Lost),
            Some(Renewal::Lost),
            Some(Renewal::Lost),
        ]
    );
    // What is left of each part's lease, by the server's clock.
    let left = |key: &'static str, fence: Fence| {
        let statement = format!(
            "SELECT extract(epoch FROM part.until - clock_timestamp())::float8 \
             FROM \"{prefix}leases\" AS held, \
                  unnest(held.part_fences, held.part_until) AS part(fence, until) \
             WHERE held.key = $1 AND part.fence = $2"
        );
        let admin = &admin;
        async move {
            let fence = i64::try_from(fence).expect("a fence in the column's range");
            let row = admin.query_one(&statement, &[&key, &fence]).await;
            row.expect("the part is in its row").get::<_, f64>(0)
        }
    };
    let renewed_at_least = lease.as_secs_f64() - 0.2;
    for (key, fence) in [("a", a1), ("a", a2), ("b", b)] {
        let left = left(key, fence).await;
        assert!(left > renewed_at_least, "{key} {fence}: {left} s left");
    }
    let theirs_left = left("a", theirs_a).await;
    assert!(
        theirs_left < renewed_at_least,
        "theirs was extended: {theirs_left} s left"
    );
    assert!(
        left("c", ran_out).await < 0.0,
        "a part that ran out was extended"
    );
}

/// Each call's answer, `None` for an error.
fn answers<T>(results: Vec<Result<T, LeaseError>>) -> Vec<Option<T>> {
    results.into_iter().map(Result::ok).collect()
}

// Crashes. Crash recovery empties the unlogged `run` table and ends every connection; the tests
// do both by hand, which is what a crash does to the store's tables and links, without
// stopping the server the other tests share (`.ci/crash-test` stops it for real).

/// What crash recovery leaves of `prefix`'s tables: `run` empty, the rest as it was.
async fn empty_run(admin: &Client, prefix: &str) {
    admin
        .batch_execute(&format!("TRUNCATE \"{prefix}run\""))
        .await
        .expect("run can be emptied");
}

/// Tries to acquire `key` until it is granted, failing after `bound`: the fence, and how long
/// it took.
async fn acquired_within(store: &PgLeaseStore, key: &str, bound: Duration) -> (Fence, Duration) {
    let started = Instant::now();
    loop {
        match store.acquire(key).await {
            Ok(Some(fence)) => return (fence, started.elapsed()),
            Ok(None) => {}
            Err(error) => panic!("acquire of {key:?}: {error}"),
        }
        assert!(
            started.elapsed() < bound,
            "{key:?} not granted in {bound:?}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn after_a_crash_every_fence_is_above_any_the_crash_could_have_lost_and_keys_wait_a_lease() {
    let prefix = "kl_test_crash_floor_";
    let admin = fresh_table(prefix).await;
    let lease = Duration::from_millis(900);
    let (store, _notices) = store(&lease_config(prefix, lease)).await;
    let mut before = 0;
    for _ in 0..3 {
        before = acquired(&store, "k").await;
        assert_eq!(store.release("k", before).await.ok(), Some(true));
    }
    assert_eq!(before, 3, "a table new to the store starts at 1");

    empty_run(&admin, prefix).await;
    terminate(&admin, &statements_name(&store)).await;
    eventually("the store sees its connection lost", || {
        store.core.link.is_known_lost()
    })
    .await;
    // The crash may have lost up to `rise - 1` acquisitions of "k" after fence 3, and the
    // whole row of a key first taken just before it.
    let (after, waited) = acquired_within(&store, "k", BOUND).await;
    let (new_key, _) = acquired_within(&store, "new", BOUND).await;
    let rise = Fence::try_from(FLOOR_RISE_AFTER_CRASH).unwrap();
    assert!(after >= before + rise, "{after} after {before}");
    assert!(new_key >= before + rise, "{new_key} after {before}");
    // Nothing is granted until the longest lease has passed since the crash was found: a
    // holder whose last renewal the crash lost has given up by then.
    assert!(
        waited >= lease,
        "granted after {waited:?} of a {lease:?} lease"
    );
    assert_eq!(
        acquired(&store, "k").await,
        after + 1,
        "one by one again after the rise"
    );
}

#[tokio::test]
async fn a_crash_that_a_connection_outlived_is_found_by_the_next_acquisition() {
    let prefix = "kl_test_crash_pooler_";
    let admin = fresh_table(prefix).await;
    let lease = Duration::from_millis(900);
    let (store, _notices) = store(&lease_config(prefix, lease)).await;
    let before = acquired(&store, "k").await;
    assert_eq!(store.release("k", before).await.ok(), Some(true));
    // As behind a pooler that reconnected to the restarted server: the store's connection
    // lives on, and only the missing floor tells.
    empty_run(&admin, prefix).await;
    assert_eq!(
        store.acquire("k").await.ok(),
        Some(None),
        "quiet after a crash"
    );
    let (after, _) = acquired_within(&store, "k", BOUND).await;
    assert!(after >= before + Fence::try_from(FLOOR_RISE_AFTER_CRASH).unwrap());
}

#[tokio::test]
async fn a_try_after_a_crash_is_refused_in_the_quiet_time_and_then_fenced_above_the_floor() {
    let prefix = "kl_test_crash_try_";
    let admin = fresh_table(prefix).await;
    let lease = Duration::from_millis(900);
    let (store, _notices) = store(&lease_config(prefix, lease)).await;
    let before = acquired(&store, "k").await;
    assert_eq!(store.release("k", before).await.ok(), Some(true));
    // Found by the try itself, on a connection that outlived the crash (as behind a pooler):
    // the floor rises, and the key is quiet for the longest lease.
    empty_run(&admin, prefix).await;
    assert_eq!(
        store.try_acquire("k").await.ok(),
        Some(None),
        "quiet after a crash"
    );
    let started = Instant::now();
    let after = loop {
        match store.try_acquire("k").await {
            Ok(Some(fence)) => break fence,
            Ok(None) => assert!(started.elapsed() < BOUND, "never granted after the crash"),
            Err(error) => panic!("try_acquire after the crash: {error}"),
        }
        sleep(Duration::from_millis(20)).await;
    };
    assert!(after >= before + Fence::try_from(FLOOR_RISE_AFTER_CRASH).unwrap());
    // And on a connection made after the crash: a new key starts above the floor too.
    empty_run(&admin, prefix).await;
    terminate(&admin, &statements_name(&store)).await;
    eventually("the store sees its connection lost", || {
        store.core.link.is_known_lost()
    })
    .await;
    let started = Instant::now();
    let new_key = loop {
        if let Ok(Some(fence)) = store.try_acquire("new").await {
            break fence;
        }
        assert!(
            started.elapsed() < BOUND,
            "never granted after the second crash"
        );
        sleep(Duration::from_millis(20)).await;
    };
    assert!(new_key >= after + Fence::try_from(FLOOR_RISE_AFTER_CRASH).unwrap());
}

/// A table of `capacity` permits per key, and a store on it with `lease`.
fn sharing_config(prefix: &str, capacity: u32, lease: Duration) -> PgLeaseConfig {
    PgLeaseConfig {
        capacity: NonZeroU32::new(capacity).expect("a test's capacity is above 0"),
        ..lease_config(prefix, lease)
    }
}

#[tokio::test]
async fn part_leases_after_a_crash_wait_the_quiet_time_and_are_fenced_above_the_floor() {
    let prefix = "kl_test_crash_parts_";
    let admin = fresh_table(prefix).await;
    let lease = Duration::from_millis(900);
    let (store, _notices) = store(&sharing_config(prefix, 3, lease)).await;
    let one = NonZeroU32::MIN;
    let before = store
        .acquire_part("k", one)
        .await
        .ok()
        .flatten()
        .expect("taken");
    assert_eq!(store.release_part("k", before).await.ok(), Some(true));
    // Found by the part acquisition itself, on a connection that outlived the crash.
    empty_run(&admin, prefix).await;
    assert_eq!(store.acquire_part("k", one).await.ok(), Some(None), "quiet");
    assert_eq!(
        store.try_acquire_part("k", one).await.ok(),
        Some(None),
        "quiet"
    );
    let started = Instant::now();
    let after = loop {
        match store.acquire_part("k", one).await {
            Ok(Some(fence)) => break fence,
            Ok(None) => assert!(started.elapsed() < BOUND, "never granted after the crash"),
            Err(error) => panic!("acquire_part after the crash: {error}"),
        }
        sleep(Duration::from_millis(20)).await;
    };
    let rise = Fence::try_from(FLOOR_RISE_AFTER_CRASH).unwrap();
    assert!(after >= before + rise, "{after} after {before}");
    assert!(started.elapsed() >= lease / 2, "the quiet time was kept");
    // A try of a new key on a connection made after a second crash starts above its floor.
    empty_run(&admin, prefix).await;
    terminate(&admin, &statements_name(&store)).await;
    eventually("the store sees its connection lost", || {
        store.core.link.is_known_lost()
    })
    .await;
    let started = Instant::now();
    let new_key = loop {
        if let Ok(Some(fence)) = store.try_acquire_part("new", one).await {
            break fence;
        }
        assert!(
            started.elapsed() < BOUND,
            "never granted after the second crash"
        );
        sleep(Duration::from_millis(20)).await;
    };
    assert!(new_key >= after + rise, "{new_key} after {after}");
    // The part taken before the second crash ran out in its quiet time, and nothing took "k"
    // since: it is there to release, not to renew.
    assert_eq!(store.renew_part("k", after).await.ok(), Some(Renewal::Lost));
    assert_eq!(store.release_part("k", after).await.ok(), Some(true));
}

#[tokio::test]
async fn a_set_after_a_crash_waits_the_quiet_time_and_is_fenced_above_the_floor() {
    let prefix = "kl_test_crash_set_";
    let admin = fresh_table(prefix).await;
    let lease = Duration::from_millis(900);
    let (store, _notices) = store(&lease_config(prefix, lease)).await;
    let keys = ["a".to_owned(), "b".to_owned()];
    let before = store
        .acquire_all(&keys)
        .await
        .ok()
        .flatten()
        .expect("taken");
    for (key, fence) in keys.iter().zip(&before) {
        assert_eq!(store.release(key, *fence).await.ok(), Some(true));
    }
    empty_run(&admin, prefix).await;
    assert_eq!(store.acquire_all(&keys).await.ok(), Some(None), "quiet");
    assert_eq!(store.try_acquire_all(&keys).await.ok(), Some(None), "quiet");
    let started = Instant::now();
    let after = loop {
        match store.try_acquire_all(&keys).await {
            Ok(Some(fences)) => break fences,
            Ok(None) => assert!(started.elapsed() < BOUND, "never granted after the crash"),
            Err(error) => panic!("try_acquire_all after the crash: {error}"),
        }
        sleep(Duration::from_millis(20)).await;
    };
    let rise = Fence::try_from(FLOOR_RISE_AFTER_CRASH).unwrap();
    for (after, before) in after.iter().zip(&before) {
        assert!(*after >= before + rise, "{after} after {before}");
    }
}

#[tokio::test]
async fn a_store_with_another_capacity_than_the_table_is_refused_at_connect_naming_both() {
    let prefix = "kl_test_capacity_mismatch_";
    let _admin = fresh_table(prefix).await;
    let lease = Duration::from_secs(30);
    let (_first, _notices) = store(&sharing_config(prefix, 4, lease)).await;
    let (error, _) = connect_error(&sharing_config(prefix, 5, lease)).await;
    match &error {
        ClusterError::CapacityMismatch {
            table_capacity: 4,
            asked: 5,
            ..
        } => {}
        other => panic!("expected a capacity mismatch, got {other:?}"),
    }
    let message = error.to_string();
    assert!(message.contains('4') && message.contains('5'), "{message}");
    // The same capacity connects.
    drop(store(&sharing_config(prefix, 4, lease)).await);
}

#[tokio::test]
async fn tables_made_before_part_leases_get_their_columns_and_one_permit_per_key() {
    let prefix = "kl_test_old_parts_";
    let admin = fresh_table(prefix).await;
    // The lease table with `wanted` but no part leases, and the fences table without a
    // capacity, as the version before part leases made them.
    admin
        .batch_execute(&format!(
            "CREATE TABLE \"{prefix}leases\" (key text PRIMARY KEY, owner text, \
               fence bigint NOT NULL CHECK (fence > 0), expires_at timestamptz NOT NULL, \
               wanted boolean NOT NULL DEFAULT false); \
             INSERT INTO \"{prefix}leases\" VALUES ('k', NULL, 7, clock_timestamp(), false); \
             CREATE TABLE \"{prefix}fences\" (one_row boolean PRIMARY KEY CHECK (one_row), \
               floor bigint NOT NULL CHECK (floor > 0), longest_lease_ms bigint NOT NULL); \
             INSERT INTO \"{prefix}fences\" VALUES (true, 1, 30000); \
             CREATE UNLOGGED TABLE \"{prefix}run\" (one_row boolean PRIMARY KEY CHECK (one_row), \
               floor bigint NOT NULL, quiet_until timestamptz NOT NULL); \
             INSERT INTO \"{prefix}run\" VALUES (true, 1, clock_timestamp())"
        ))
        .await
        .expect("the old tables");
    let (error, _) = connect_error(&sharing_config(prefix, 2, Duration::from_secs(30))).await;
    assert!(
        matches!(
            error,
            ClusterError::CapacityMismatch {
                table_capacity: 1,
                asked: 2,
                ..
            }
        ),
        "{error:?}"
    );
    let (holder, _notices) = store(&config(prefix)).await;
    assert_eq!(acquired(&holder, "k").await, 8);
}

#[tokio::test]
async fn a_clean_reconnection_keeps_the_floor_and_keys_free() {
    let prefix = "kl_test_crash_none_";
    let admin = fresh_table(prefix).await;
    let (store, _notices) = store(&config(prefix)).await;
    let before = acquired(&store, "k").await;
    assert_eq!(store.release("k", before).await.ok(), Some(true));
    terminate(&admin, &statements_name(&store)).await;
    eventually("the store sees its connection lost", || {
        store.core.link.is_known_lost()
    })
    .await;
    assert_eq!(store.acquire("k").await.ok(), Some(Some(before + 1)));
}

#[tokio::test]
async fn the_quiet_time_after_a_crash_lasts_the_longest_lease_any_store_has_used() {
    let prefix = "kl_test_crash_longest_";
    let admin = fresh_table(prefix).await;
    let short = Duration::from_millis(600);
    drop(store(&lease_config(prefix, Duration::from_secs(5))).await);
    let (store, _notices) = store(&lease_config(prefix, short)).await;
    empty_run(&admin, prefix).await;
    let (_, waited) = acquired_within(&store, "k", BOUND).await;
    assert!(
        waited >= Duration::from_secs(5),
        "granted after {waited:?}, within the 5 s lease of a store before"
    );
}

#[tokio::test]
async fn only_a_release_that_someone_was_refused_is_announced() {
    let prefix = "kl_test_wanted_";
    let _admin = fresh_table(prefix).await;
    let (waiter, mut notices) = store(&config(prefix)).await;
    let (holder, _holder_notices) = store(&config(prefix)).await;
    let unwanted = acquired(&holder, "unwanted").await;
    let wanted = acquired(&holder, "wanted").await;
    assert_eq!(waiter.acquire("wanted").await.ok(), Some(None));
    assert_eq!(holder.release("unwanted", unwanted).await.ok(), Some(true));
    assert_eq!(holder.release("wanted", wanted).await.ok(), Some(true));
    // Notices come in the order of the commits: had the first release been announced, its
    // notice would come first.
    assert_eq!(next_notice(&mut notices).await, released("wanted"));
    // Taking the key clears the mark: the next holder's release is announced only if someone
    // is refused again.
    let again = acquired(&waiter, "wanted").await;
    assert_eq!(waiter.release("wanted", again).await.ok(), Some(true));
    let last = acquired(&holder, "last").await;
    release_while_wanted(&holder, &waiter, "last", last).await;
    assert_eq!(next_notice(&mut notices).await, released("last"));
}

#[tokio::test]
async fn stores_that_find_a_crash_at_once_raise_the_floor_once() {
    let prefix = "kl_test_crash_together_";
    let admin = fresh_table(prefix).await;
    let config = lease_config(prefix, Duration::from_millis(600));
    let (first, _notices) = store(&config).await;
    let before = acquired(&first, "k").await;
    assert_eq!(first.release("k", before).await.ok(), Some(true));
    empty_run(&admin, prefix).await;
    let connects = [(); 4].map(|()| PgLeaseStore::connect(&config));
    let [a, b, c, d] = connects;
    let (a, b, c, d) = tokio::join!(a, b, c, d);
    for connected in [a, b, c, d] {
        assert!(connected.is_ok(), "{:?}", connected.err());
    }
    let floor: i64 = admin
        .query_one(&format!("SELECT floor FROM \"{prefix}fences\""), &[])
        .await
        .expect("the floor")
        .get(0);
    assert_eq!(
        floor,
        i64::try_from(before).unwrap() + FLOOR_RISE_AFTER_CRASH
    );
}

/// The estimated cost of `statement`'s generic plan (the one a prepared statement settles on)
/// for parameters of `types`, as `admin` plans it.
async fn generic_plan_cost(admin: &Client, statement: &str, types: &str, args: &str) -> f64 {
    admin
        .batch_execute(&format!(
            "SET plan_cache_mode = force_generic_plan; \
             DEALLOCATE ALL; PREPARE costed({types}) AS {statement}"
        ))
        .await
        .expect("the statement prepares");
    // The simple protocol answers in text, whatever the column's type (json here).
    let answer = admin
        .simple_query(&format!("EXPLAIN (FORMAT JSON) EXECUTE costed({args})"))
        .await
        .expect("explain");
    let plan = answer
        .iter()
        .find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .expect("a plan");
    let plan: serde_json::Value = serde_json::from_str(&plan).expect("the plan is JSON");
    plan[0]["Plan"]["Total Cost"]
        .as_f64()
        .expect("the plan has a cost")
}

#[tokio::test]
async fn the_lease_statements_cost_too_little_for_the_server_to_compile_them() {
    let prefix = "kl_test_plan_cost_";
    let admin = fresh_table(prefix).await;
    drop(store(&config(prefix)).await);
    let jit_above: f64 = admin
        .query_one("SELECT current_setting('jit_above_cost')::float8", &[])
        .await
        .expect("jit_above_cost")
        .get(0);
    let table = crate::cluster::postgres::config::LeaseTable::new(prefix).unwrap();
    let statements = super::Statements::for_table(&table);
    let costs = [
        (
            "apply",
            generic_plan_cost(
                &admin,
                &statements.apply,
                "text[], text, bigint, text, bigint[], boolean[], integer",
                "ARRAY['a', 'b', 'c'], 'me', 1000, 'channel', ARRAY[NULL, 3, 4]::bigint[], \
                 ARRAY[false, true, false], 2",
            )
            .await,
        ),
        (
            "try_acquire",
            generic_plan_cost(
                &admin,
                &statements.try_acquire,
                "text, text, bigint",
                "'a', 'me', 1000",
            )
            .await,
        ),
        (
            "acquire_part",
            generic_plan_cost(
                &admin,
                &statements.acquire_part,
                "text, text, bigint, text, integer, integer, bigint",
                "'a', 'me', 1000, 'channel', 1, 2, 7",
            )
            .await,
        ),
        (
            "try_acquire_part",
            generic_plan_cost(
                &admin,
                &statements.try_acquire_part,
                "text, text, bigint, text, integer, integer",
                "'a', 'me', 1000, 'channel', 1, 2",
            )
            .await,
        ),
        (
            "acquire_all",
            generic_plan_cost(
                &admin,
                &statements.acquire_all,
                "text[], text, bigint, integer, boolean, bigint",
                "ARRAY['a', 'b'], 'me', 1000, 2, false, 7",
            )
            .await,
        ),
        (
            "renew_parts",
            generic_plan_cost(
                &admin,
                &statements.renew_parts,
                "text[], text, bigint, bigint[]",
                "ARRAY['a', 'a'], 'me', 1000, ARRAY[3, 4]",
            )
            .await,
        ),
        (
            "release_part",
            generic_plan_cost(
                &admin,
                &statements.release_part,
                "text, text, bigint, text",
                "'a', 'me', 3, 'channel'",
            )
            .await,
        ),
    ];
    // Compiling takes milliseconds at every call, more than the statements themselves.
    for (statement, cost) in costs {
        assert!(cost < jit_above / 10.0, "{statement} costs {cost}");
    }
}

#[tokio::test]
async fn a_lease_table_made_before_wanted_existed_gets_the_column_and_keeps_its_fences() {
    let prefix = "kl_test_old_table_";
    let admin = fresh_table(prefix).await;
    // A lease table without `wanted`, with a key taken seven times.
    admin
        .batch_execute(&format!(
            "CREATE TABLE \"{prefix}leases\" (key text PRIMARY KEY, owner text, \
               fence bigint NOT NULL CHECK (fence > 0), expires_at timestamptz NOT NULL); \
             INSERT INTO \"{prefix}leases\" VALUES ('k', NULL, 7, clock_timestamp())"
        ))
        .await
        .expect("the old table");
    let (waiter, mut notices) = store(&config(prefix)).await;
    let (holder, _holder_notices) = store(&config(prefix)).await;
    assert_eq!(acquired(&holder, "k").await, 8);
    release_while_wanted(&holder, &waiter, "k", 8).await;
    assert_eq!(next_notice(&mut notices).await, released("k"));
}

#[tokio::test]
async fn statements_deallocated_behind_the_store_are_prepared_again() {
    let prefix = "kl_test_deallocated_";
    let _admin = fresh_table(prefix).await;
    let (store, _notices) = store(&config(prefix)).await;
    let fence = acquired(&store, "k").await;
    store
        .core
        .link
        .run_beside("DEALLOCATE ALL")
        .await
        .expect("deallocate");
    assert_eq!(store.release("k", fence).await.ok(), Some(true));
    assert_eq!(acquired(&store, "k").await, fence + 1);
}
