//! `shutdown` answers every waiter with `Closed`, closes the registry for later calls, lets
//! guards still out drop quietly, and returns once the actor has stopped. Without it, the
//! registry stops by itself when the last handle and the last guard are gone.

use keyed_locks::{LockError, LockRegistry, TryLockError};
use tokio_test::{assert_pending, assert_ready, task};

#[tokio::test]
async fn waiters_get_closed_and_later_calls_fail() {
    let registry = LockRegistry::spawn();
    let guard = registry.lock("k").await.unwrap();
    let mut waiters: Vec<_> = (0..3).map(|_| task::spawn(registry.lock("k"))).collect();
    for waiter in &mut waiters {
        assert_pending!(waiter.poll());
    }

    registry.shutdown().await;
    assert!(registry.is_closed());
    for waiter in &mut waiters {
        assert!(waiter.is_woken());
        assert_eq!(assert_ready!(waiter.poll()).unwrap_err(), LockError::Closed);
    }
    assert_eq!(registry.lock("other").await.unwrap_err(), LockError::Closed);
    assert_eq!(
        registry.try_lock("other").await.unwrap_err(),
        TryLockError::Closed
    );
    assert_eq!(registry.stats().await.unwrap_err(), LockError::Closed);
    drop(guard); // no panic, nothing to release into
    registry.shutdown().await; // a second shutdown is harmless
}

#[tokio::test]
async fn requests_sent_before_shutdown_are_handled_first() {
    let registry = LockRegistry::spawn();
    let guard = registry.lock(1).await.unwrap();
    let mut queued = task::spawn(registry.lock(1));
    assert_pending!(queued.poll()); // sent, not yet handled
    let clone = registry.clone();
    clone.shutdown().await;
    assert_eq!(assert_ready!(queued.poll()).unwrap_err(), LockError::Closed);
    drop(guard);
}

#[tokio::test]
async fn the_registry_stops_by_itself_when_the_last_handle_and_guard_are_gone() {
    let registry = LockRegistry::spawn();
    let actor = registry.actor_ref().expect("one shard").downgrade();
    let guard = registry.lock("k").await.unwrap();

    drop(registry);
    tokio::task::yield_now().await;
    assert!(actor.is_alive(), "a guard keeps the registry alive");

    drop(guard);
    actor.wait_for_shutdown().await;
    assert!(!actor.is_alive());
}

/// An empty key set asks no shard, and still gets `Closed` once the registry has shut down,
/// from every form of `lock_all`, in every mode.
#[tokio::test]
async fn lock_all_of_no_keys_after_shutdown_is_closed_in_every_mode() {
    for builder in crate::configurations::builders::<u32>() {
        let registry = builder.spawn();
        assert!(registry.lock_all([]).await.unwrap().is_empty());
        registry.shutdown().await;
        assert_eq!(registry.lock_all([]).await.unwrap_err(), LockError::Closed);
        assert_eq!(
            registry.try_lock_all([]).await.unwrap_err(),
            TryLockError::Closed
        );
        let (blocking, blocking_try) = tokio::task::spawn_blocking(move || {
            (
                registry.blocking_lock_all([]).map(|guard| guard.len()),
                registry.blocking_try_lock_all([]).map(|guard| guard.len()),
            )
        })
        .await
        .unwrap();
        assert_eq!(blocking, Err(LockError::Closed));
        assert_eq!(blocking_try, Err(TryLockError::Closed));
    }
}
