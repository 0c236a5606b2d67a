//! `ClusterRegistry`'s blocking calls work on a thread with no tokio context, with the same
//! leases and tokens as the async calls, and refuse to block a runtime's own thread (a panic
//! that names the call). A guard dropped on such a thread releases its lease. Against the real
//! server.

use std::time::Duration;

use keyed_locks::{ClusterRegistry, TryLockError};

use crate::cluster_registry::{database_url, fresh_prefix};

async fn registry(prefix: &str) -> ClusterRegistry<String> {
    ClusterRegistry::builder(database_url())
        .table_prefix(prefix)
        .lease(Duration::from_secs(30))
        .connect()
        .await
        .expect("connects to the test server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_thread_locks_and_tries_across_processes() {
    let prefix = fresh_prefix("kl_test_blocking_").await;
    let (here, there) = (registry(&prefix).await, registry(&prefix).await);
    let held = here.lock("k".to_owned()).await.unwrap();
    let token = held.fencing_token();
    // A std thread: no tokio context of its own.
    let thread = std::thread::spawn(move || {
        let refused = there.blocking_try_lock("k".to_owned()).map(drop);
        let guard = there.blocking_lock("k".to_owned()).expect("open");
        (refused, guard.fencing_token())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(held);
    let (refused, later) = tokio::task::spawn_blocking(move || thread.join().expect("no panic"))
        .await
        .unwrap();
    assert_eq!(
        refused,
        Err(TryLockError::WouldBlock),
        "held in the other process"
    );
    assert!(later > token, "{later} after {token}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_on_a_runtime_thread_panics_naming_the_call() {
    let prefix = fresh_prefix("kl_test_blocking_refused_").await;
    let registry = registry(&prefix).await;
    let refused = tokio::spawn(async move { registry.blocking_try_lock("k".to_owned()).is_ok() })
        .await
        .expect_err("blocking a worker panics");
    let payload = refused.into_panic();
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(
        message.contains("ClusterRegistry::blocking_try_lock") && message.contains("try_lock(..)"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_on_a_thread_without_tokio_releases_its_lease() {
    let prefix = fresh_prefix("kl_test_blocking_drop_").await;
    let (here, there) = (registry(&prefix).await, registry(&prefix).await);
    let guard = here.lock("k".to_owned()).await.unwrap();
    // The release's statement runs on the registry's runtime, not on the dropping thread.
    std::thread::spawn(move || drop(guard))
        .join()
        .expect("dropping a guard does not panic");
    // Released, not left to run out its 30 s: the other process gets it at once.
    let taken = tokio::time::timeout(Duration::from_secs(10), there.lock("k".to_owned()))
        .await
        .expect("the lease was released")
        .unwrap();
    drop(taken);
}
