//! `ClusterRegistry::try_lock` takes a key only if it is free in every process: `WouldBlock`
//! while another process holds it or waits for it (a released key goes to its waiter, not to
//! a try), without waiting, and a refused try leaves nothing behind. Two registries on one
//! table stand for two processes, against the real server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use keyed_locks::{ClusterRegistry, TryLockError};
use tokio::time::{Instant, sleep, timeout};

use crate::cluster_registry::{database_url, fresh_prefix};

/// Generous: the machine is small and shared, and the server is real.
const BOUND: Duration = Duration::from_secs(20);

async fn registry(prefix: &str) -> ClusterRegistry<String> {
    ClusterRegistry::builder(database_url())
        .table_prefix(prefix)
        .lease(Duration::from_secs(30))
        .connect()
        .await
        .expect("connects to the test server")
}

/// Tries `key` until it is taken, failing after [`BOUND`].
async fn taken_within_bound(
    registry: &ClusterRegistry<String>,
    key: &str,
) -> keyed_locks::ClusterGuard<String> {
    let started = Instant::now();
    loop {
        match registry.try_lock(key.to_owned()).await {
            Ok(guard) => return guard,
            Err(TryLockError::WouldBlock) => {
                assert!(started.elapsed() < BOUND, "{key:?} never free for a try");
                sleep(Duration::from_millis(10)).await;
            }
            Err(closed) => panic!("try_lock: {closed}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_in_another_process_is_refused_at_once_and_taken_once_released() {
    let prefix = fresh_prefix("kl_test_try_held_").await;
    let (first, second) = (registry(&prefix).await, registry(&prefix).await);
    let held = first.try_lock("job".to_owned()).await.expect("a free key");
    // Within one statement, far below the 30 s lease a wait would take.
    let refused = timeout(Duration::from_secs(5), second.try_lock("job".to_owned()))
        .await
        .expect("a try does not wait");
    assert_eq!(refused.unwrap_err(), TryLockError::WouldBlock);
    assert_eq!(second.leases_held(), 0);
    assert_eq!(second.stats().await.unwrap().keys, 0, "no local entry left");
    let first_token = held.fencing_token();
    drop(held);
    // The release goes out without waiting; once it is in, the other process takes the key.
    let taken = taken_within_bound(&second, "job").await;
    assert!(taken.fencing_token() > first_token);
    // And the refused try marked nothing: back in the first process, a try takes it at once
    // after this release.
    drop(taken);
    drop(taken_within_bound(&first, "job").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_or_waited_for_in_this_process_is_refused_without_a_statement() {
    let prefix = fresh_prefix("kl_test_try_local_").await;
    let registry = registry(&prefix).await;
    let held = registry.lock("k".to_owned()).await.unwrap();
    assert_eq!(
        registry.try_lock("k".to_owned()).await.unwrap_err(),
        TryLockError::WouldBlock
    );
    let waiter = tokio::spawn({
        let registry = registry.clone();
        async move {
            registry
                .lock("k".to_owned())
                .await
                .map(|guard| guard.fencing_token())
        }
    });
    while registry.stats().await.unwrap().waiting == 0 {
        tokio::task::yield_now().await;
    }
    drop(held);
    // Waited for here: the waiter comes first, whatever the lease says.
    let token = timeout(BOUND, waiter).await.unwrap().unwrap().unwrap();
    let next = taken_within_bound(&registry, "k").await;
    assert!(next.fencing_token() > token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_key_goes_to_the_process_that_waited_not_to_a_try() {
    let prefix = fresh_prefix("kl_test_try_waiter_").await;
    let (holder, waiter, tryer) = (
        registry(&prefix).await,
        registry(&prefix).await,
        registry(&prefix).await,
    );
    let held = holder.lock("k".to_owned()).await.unwrap();
    let waiter_got_it = Arc::new(AtomicBool::new(false));
    let waiting = tokio::spawn({
        let (waiter, got_it) = (waiter.clone(), Arc::clone(&waiter_got_it));
        async move {
            let guard = waiter.lock("k".to_owned()).await.unwrap();
            got_it.store(true, Ordering::SeqCst);
            // Held a moment, so that the tries below see it held too.
            sleep(Duration::from_millis(200)).await;
            drop(guard);
        }
    });
    // The waiter asks for the lease and is refused (it is held): from then on it waits.
    sleep(Duration::from_millis(300)).await;
    drop(held);
    // Until the waiter has had the key, no try in a third process gets it.
    let started = Instant::now();
    while !waiter_got_it.load(Ordering::SeqCst) {
        if let Ok(guard) = tryer.try_lock("k".to_owned()).await {
            panic!(
                "a try took the key (token {}) from the process waiting for it",
                guard.fencing_token()
            );
        }
        assert!(started.elapsed() < BOUND, "the waiter never got the key");
    }
    timeout(BOUND, waiting).await.unwrap().unwrap();
    // The waiter took the key, which cleared its mark: once it let go, a try takes the key.
    drop(taken_within_bound(&tryer, "k").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_after_shutdown_is_closed() {
    let prefix = fresh_prefix("kl_test_try_closed_").await;
    let registry = registry(&prefix).await;
    registry.shutdown().await;
    assert_eq!(
        registry.try_lock("k".to_owned()).await.unwrap_err(),
        TryLockError::Closed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_trying_again_at_once_does_not_keep_the_key_from_another() {
    let prefix = fresh_prefix("kl_test_try_fair_").await;
    let (first, second) = (registry(&prefix).await, registry(&prefix).await);
    // Four tasks per process try one key as fast as they can, letting go at once. Each
    // release is still on its way when a task of its process tries again: that try must not
    // take the row over (it is still ours), or the other process would never find it free.
    let tries = |registry: &ClusterRegistry<String>| {
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let registry = registry.clone();
                tokio::spawn(async move {
                    let mut granted = 0u32;
                    for _ in 0..200 {
                        if let Ok(guard) = registry.try_lock("hot".to_owned()).await {
                            granted += 1;
                            drop(guard);
                        }
                    }
                    granted
                })
            })
            .collect();
        async move {
            let mut granted = 0;
            for task in tasks {
                granted += timeout(BOUND, task).await.unwrap().unwrap();
            }
            granted
        }
    };
    let (first, second) = tokio::join!(tries(&first), tries(&second));
    assert!(first > 0 && second > 0, "grants {first} and {second}");
}
