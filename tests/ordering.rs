//! A task's requests take effect in program order, and whatever happened before a request
//! (a dropped guard, a joined task) is visible to it.

use keyed_locks::{LockRegistry, TryLockError};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_is_released_for_the_next_request() {
    let registry = LockRegistry::spawn();
    for key in 0..1_000 {
        let guard = registry.lock(key).await.unwrap();
        drop(guard);
        assert_eq!(registry.stats().await.unwrap().keys, 0);
        // No retry, no sleep: the release is already in.
        drop(registry.try_lock(key).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_joined_task_did_is_visible_after_the_join() {
    let registry = LockRegistry::spawn();
    for key in 0..200 {
        let held = tokio::spawn({
            let registry = registry.clone();
            async move { registry.lock(key).await.unwrap() }
        })
        .await
        .unwrap();
        assert_eq!(
            registry.try_lock(key).await.unwrap_err(),
            TryLockError::WouldBlock
        );
        tokio::spawn(async move { drop(held) }).await.unwrap();
        assert!(registry.try_lock(key).await.is_ok());
    }
}

#[tokio::test]
async fn requests_of_one_task_take_effect_in_program_order() {
    let registry = LockRegistry::spawn();
    let a = registry.lock("a").await.unwrap();
    let b = registry.try_lock("b").await.unwrap();
    assert!(a.fencing_token() < b.fencing_token());
    drop(b);
    drop(a);
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.grants), (0, 2));
}
