//! Cluster mode in one test process: two `ClusterRegistry`s on one lease table stand for two
//! processes (each has its own connections and owner id). Against the real PostgreSQL server
//! at `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`); each test has a
//! table prefix of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use keyed_locks::{ClusterError, ClusterRegistry, LockError};
use tokio::time::{Instant, timeout};

pub(crate) fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Drops the tables of `prefix`, so a test starts from nothing whatever ran before.
pub(crate) async fn fresh_prefix(prefix: &str) -> String {
    let (client, connection) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
        .await
        .expect("PostgreSQL must be up for the cluster tests (see .ci/run)");
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS \"{prefix}leases\", \"{prefix}fences\", \"{prefix}run\", \
             \"{prefix}counters\", \"{prefix}job_schedule\", \"{prefix}job_workers\", \
             \"{prefix}job_runs\", \"{prefix}provider_runs\", \"{prefix}provider_workers\", \
             \"{prefix}provider_calls\", \"{prefix}accounts\", \"{prefix}transfer_runs\", \
             \"{prefix}transfer_workers\";"
        ))
        .await
        .expect("dropping the test's tables");
    prefix.to_owned()
}

async fn registry(prefix: &str, lease: Duration) -> ClusterRegistry<String> {
    ClusterRegistry::builder(database_url())
        .table_prefix(prefix)
        .lease(lease)
        .connect()
        .await
        .expect("connects to the test server")
}

/// Generous: the machine is small and shared, and the server is real.
const BOUND: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_exclude_each_other_and_tokens_increase_across_them() {
    let prefix = fresh_prefix("kl_test_exclusion_").await;
    let first = registry(&prefix, Duration::from_secs(5)).await;
    let second = registry(&prefix, Duration::from_secs(5)).await;
    let inside = Arc::new(AtomicBool::new(false));
    let last_token = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (index, registry) in [first.clone(), second.clone()]
        .into_iter()
        .cycle()
        .take(8)
        .enumerate()
    {
        let (inside, last_token) = (Arc::clone(&inside), Arc::clone(&last_token));
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let guard = registry.lock("k".to_owned()).await?;
                assert!(
                    !inside.swap(true, Ordering::SeqCst),
                    "task {index}: two holders"
                );
                let previous = last_token.swap(guard.fencing_token(), Ordering::SeqCst);
                assert!(guard.fencing_token() > previous, "tokens must increase");
                tokio::time::sleep(Duration::from_millis(1)).await;
                inside.store(false, Ordering::SeqCst);
            }
            Ok::<_, LockError>(())
        }));
    }
    for task in tasks {
        timeout(BOUND, task)
            .await
            .expect("no deadlock")
            .unwrap()
            .unwrap();
    }
    for registry in [&first, &second] {
        assert_eq!(registry.stats().await.unwrap().keys, 0);
    }
}

/// Locks `key` once in each of `tasks` tasks of `registry`, holding each guard `hold`; the
/// tokens in the order granted.
fn lock_in_turn(
    registry: &ClusterRegistry<String>,
    key: &str,
    tasks: usize,
    hold: Duration,
    tokens: &Arc<std::sync::Mutex<Vec<u64>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..tasks)
        .map(|_| {
            let (registry, tokens, key) = (registry.clone(), Arc::clone(tokens), key.to_owned());
            tokio::spawn(async move {
                let guard = registry.lock(key).await.unwrap();
                tokens.lock().unwrap().push(guard.fencing_token());
                tokio::time::sleep(hold).await;
                drop(guard);
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_alone_on_its_key_keeps_its_lease_past_the_bound() {
    let prefix = fresh_prefix("kl_test_cohort_").await;
    let registry = ClusterRegistry::<String>::builder(database_url())
        .table_prefix(&prefix)
        .lease(Duration::from_secs(5))
        .max_local_handoffs(3)
        .connect()
        .await
        .unwrap();
    // Eight local tasks queue on the key while the first holds it.
    let first = registry.lock("k".to_owned()).await.unwrap();
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let waiters = lock_in_turn(&registry, "k", 8, Duration::ZERO, &tokens);
    while registry.stats().await.unwrap().waiting < 8 {
        tokio::task::yield_now().await;
    }
    let first_token = first.fencing_token();
    drop(first);
    for waiter in waiters {
        timeout(BOUND, waiter).await.unwrap().unwrap();
    }
    let mut all = vec![first_token];
    all.extend(tokens.lock().unwrap().iter().copied());
    // Nine guards, past the bound of four per round (the first holder and three hand-offs):
    // no other process wants the key, so the renewal at each bound says so and the process
    // keeps its lease. One fence, hand-offs counting up in the low bits.
    let expected: Vec<u64> = (first_token..first_token + 9).collect();
    assert_eq!(all, expected, "one lease for every guard");
    registry.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_another_process_waits_for_goes_back_within_two_rounds() {
    let prefix = fresh_prefix("kl_test_cohort_wanted_").await;
    let builder = || {
        ClusterRegistry::<String>::builder(database_url())
            .table_prefix(&prefix)
            .lease(Duration::from_secs(5))
            .max_local_handoffs(3)
    };
    let (ours, theirs) = (
        builder().connect().await.unwrap(),
        builder().connect().await.unwrap(),
    );
    let (admin, connection) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let first = ours.lock("k".to_owned()).await.unwrap();
    let fence = first.fencing_token() >> 20;
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    // Forty guards of 10 ms each: ten rounds of the bound, if the process kept its lease.
    let our_tasks = lock_in_turn(&ours, "k", 40, Duration::from_millis(10), &tokens);
    while ours.stats().await.unwrap().waiting < 40 {
        tokio::task::yield_now().await;
    }
    drop(first);
    let waiter = tokio::spawn(async move {
        let guard = theirs.lock("k".to_owned()).await.unwrap();
        (guard.fencing_token(), theirs)
    });
    // The other process's refusal marks the row wanted; from then on, two rounds at most.
    let wanted = format!("SELECT wanted FROM \"{prefix}leases\" WHERE key = 'k'");
    let guards_before = timeout(BOUND, async {
        loop {
            let guards = tokens.lock().unwrap().len();
            if admin
                .query_one(&wanted, &[])
                .await
                .unwrap()
                .get::<_, bool>(0)
            {
                return guards;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the waiting process marks the key wanted");
    let (their_token, theirs) = timeout(BOUND, waiter).await.unwrap().unwrap();
    assert!(their_token >> 20 > fence);
    for task in our_tasks {
        timeout(BOUND, task).await.unwrap().unwrap();
    }
    let tokens = tokens.lock().unwrap().clone();
    let under_first = tokens.iter().filter(|token| *token >> 20 == fence).count();
    // Rounds of four guards; the first lease served its first guard before these tasks.
    assert!(
        under_first < guards_before + 2 * 4,
        "{under_first} guards of the first lease, {guards_before} of them before the key was \
         wanted: tokens {tokens:?}"
    );
    ours.shutdown().await;
    theirs.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_released_when_the_last_local_user_goes() {
    let prefix = fresh_prefix("kl_test_release_").await;
    let first = registry(&prefix, Duration::from_secs(30)).await;
    let second = registry(&prefix, Duration::from_secs(30)).await;
    drop(first.lock("k".to_owned()).await.unwrap());
    // With a 30 s lease, only a release lets the other process in within the bound.
    let started = Instant::now();
    let guard = timeout(Duration::from_secs(10), second.lock("k".to_owned()))
        .await
        .expect("the lease was released, not left to run out")
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    drop(guard);
    assert_eq!(first.leases_held(), 0);
}

/// A task that takes a key again as soon as its guard drops, alone in its process, finds the
/// lease kept: its locks and tries hand it on without a statement, under one fence, round
/// after round while no other process wants the key. Once it stops, the lease goes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_task_locking_a_key_again_and_again_keeps_one_lease() {
    let prefix = fresh_prefix("kl_test_linger_").await;
    let ours = registry(&prefix, Duration::from_secs(30)).await;
    let theirs = registry(&prefix, Duration::from_secs(30)).await;
    let mut tokens = Vec::new();
    for round in 0..40 {
        let guard = if round % 2 == 0 {
            ours.lock("k".to_owned()).await.unwrap()
        } else {
            ours.try_lock("k".to_owned())
                .await
                .expect("nobody else wants the key")
        };
        tokens.push(guard.fencing_token());
    }
    let fences: std::collections::BTreeSet<u64> = tokens.iter().map(|token| token >> 20).collect();
    assert_eq!(fences.len(), 1, "a lease per lock: tokens {tokens:?}");
    assert!(tokens.is_sorted() && tokens.windows(2).all(|pair| pair[0] < pair[1]));
    // Not kept for nobody: with a 30 s lease, only its release lets the other process in.
    let guard = timeout(Duration::from_secs(10), theirs.lock("k".to_owned()))
        .await
        .expect("the lease was given back once the task stopped")
        .unwrap();
    assert!(guard.fencing_token() >> 20 > tokens[0] >> 20);
    drop(guard);
    assert_eq!(ours.leases_held(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_cancelled_while_waiting_for_the_lease_leaves_nothing_behind() {
    let prefix = fresh_prefix("kl_test_cancel_").await;
    let holder = registry(&prefix, Duration::from_secs(30)).await;
    let waiter = registry(&prefix, Duration::from_secs(30)).await;
    let held = holder.lock("k".to_owned()).await.unwrap();
    // The other process waits for the lease (held elsewhere), and gives up.
    let gave_up = timeout(Duration::from_millis(300), waiter.lock("k".to_owned())).await;
    assert!(gave_up.is_err(), "the lease is held elsewhere");
    assert_eq!(waiter.stats().await.unwrap().keys, 0, "no local entry left");
    assert_eq!(waiter.leases_held(), 0);
    drop(held);
    // Nothing wedged: the key can be taken at once, by either side.
    let again = timeout(BOUND, waiter.lock("k".to_owned()))
        .await
        .unwrap()
        .unwrap();
    drop(again);
    let _guard = timeout(BOUND, holder.lock("k".to_owned()))
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_dropped_at_every_moment_leave_no_lease_behind() {
    let prefix = fresh_prefix("kl_test_cancel_storm_").await;
    let registry = registry(&prefix, Duration::from_secs(30)).await;
    let other = self::registry(&prefix, Duration::from_secs(30)).await;
    // Give up after 0, 1, 2, ... ms: some while queued locally, some while the acquire
    // statement runs, some just after it took the lease.
    for micros in (0..40u64).map(|step| step * 250) {
        let _ = timeout(Duration::from_micros(micros), registry.lock("k".to_owned())).await;
    }
    // A lease taken for a caller that went away is released, not left to run out in 30 s.
    let _guard = timeout(Duration::from_secs(10), other.lock("k".to_owned()))
        .await
        .expect("no lease left behind")
        .unwrap();
    assert_eq!(registry.stats().await.unwrap().keys, 0);
    let deadline = Instant::now() + BOUND;
    while registry.leases_held() > 0 {
        assert!(
            Instant::now() < deadline,
            "the cancelled acquisitions' leases were dropped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_the_leases_and_marks_the_guards_lost() {
    let prefix = fresh_prefix("kl_test_shutdown_").await;
    let stopping = registry(&prefix, Duration::from_secs(30)).await;
    let other = registry(&prefix, Duration::from_secs(30)).await;
    let guard = stopping.lock("k".to_owned()).await.unwrap();
    assert!(!guard.is_lost());
    stopping.shutdown().await;
    assert!(guard.is_lost());
    timeout(Duration::from_secs(1), guard.lost())
        .await
        .expect("lost() completes");
    assert_eq!(
        stopping.lock("j".to_owned()).await.unwrap_err(),
        LockError::Closed
    );
    // Released, not left to run out: the other process gets it well within the 30 s lease.
    let taken = timeout(Duration::from_secs(10), other.lock("k".to_owned()))
        .await
        .unwrap()
        .unwrap();
    assert!(taken.fencing_token() > guard.fencing_token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_keeps_a_lease_past_its_length() {
    let prefix = fresh_prefix("kl_test_heartbeat_").await;
    let lease = Duration::from_millis(900);
    let holder = registry(&prefix, lease).await;
    let other = registry(&prefix, lease).await;
    let guard = holder.lock("k".to_owned()).await.unwrap();
    let token = guard.fencing_token();
    // While the holder's heartbeat runs, the lease stays ours past its length.
    tokio::time::sleep(lease * 2).await;
    assert!(!guard.is_lost(), "renewed by the heartbeat");
    let blocked = timeout(lease / 2, other.lock("k".to_owned())).await;
    assert!(blocked.is_err(), "held elsewhere, and renewed");
    assert_eq!(token, guard.fencing_token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_fail_at_connect_with_a_clear_error() {
    let bad_prefix = ClusterRegistry::<String>::builder(database_url())
        .table_prefix("bad-name; drop table x")
        .connect()
        .await
        .unwrap_err();
    assert!(bad_prefix.to_string().contains("prefix"), "{bad_prefix}");

    let started = Instant::now();
    let unreachable = ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1:1/test")
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "no hang");
    assert!(!unreachable.to_string().is_empty());

    let heartbeat_too_slow = ClusterRegistry::<String>::builder(database_url())
        .table_prefix("kl_test_settings_")
        .lease(Duration::from_secs(1))
        .heartbeat(Duration::from_secs(1))
        .connect()
        .await
        .unwrap_err();
    assert!(
        heartbeat_too_slow.to_string().contains("heartbeat"),
        "{heartbeat_too_slow}"
    );

    let too_many_handoffs = ClusterRegistry::<String>::builder(database_url())
        .table_prefix("kl_test_settings_")
        .max_local_handoffs(u32::MAX)
        .connect()
        .await
        .unwrap_err();
    assert!(
        too_many_handoffs.to_string().contains("max_local_handoffs"),
        "{too_many_handoffs}"
    );
    let _: &ClusterError = &too_many_handoffs;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_records_the_leases_as_notes_and_still_replays() {
    use keyed_locks::journal::JournalEvent;
    let prefix = fresh_prefix("kl_test_journal_").await;
    let registry = ClusterRegistry::<String>::builder(database_url())
        .table_prefix(&prefix)
        .lease(Duration::from_secs(30))
        .local(|local| local.journal(1_000))
        .connect()
        .await
        .unwrap();
    let guard = registry.lock("k".to_owned()).await.unwrap();
    let fence = guard.fencing_token() >> 20;
    drop(guard);
    let deadline = Instant::now() + BOUND;
    while registry.leases_held() > 0 {
        assert!(Instant::now() < deadline, "the lease goes back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let journal = registry.journal().await.unwrap();
    let notes: Vec<&str> = journal
        .entries
        .iter()
        .filter_map(|entry| match &entry.event {
            JournalEvent::Note { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        notes,
        [
            r#"lease "k" requested"#.to_owned(),
            format!(r#"lease "k" granted under fence {fence}"#),
            format!(r#"lease "k" released under fence {fence}"#),
        ]
    );
    keyed_locks::replay::verify(&journal).unwrap();
}
