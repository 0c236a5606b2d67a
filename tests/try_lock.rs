//! `try_lock` takes a free key at once, answers `WouldBlock` for a held one, and leaves no
//! entry behind either way.

use keyed_locks::{LockRegistry, TryLockError};
use tokio_test::{assert_pending, task};

#[tokio::test]
async fn a_free_key_is_taken_and_a_held_key_would_block() {
    let registry = LockRegistry::spawn();
    let guard = registry.try_lock("k").await.unwrap();
    assert_eq!(*guard.key(), "k");
    assert_eq!(
        registry.try_lock("k").await.unwrap_err(),
        TryLockError::WouldBlock
    );
    let stats = registry.stats().await.unwrap();
    assert_eq!(
        (stats.keys, stats.held, stats.waiting, stats.grants),
        (1, 1, 0, 1)
    );
    drop(guard);
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}

#[tokio::test]
async fn a_key_with_waiters_would_block() {
    let registry = LockRegistry::spawn();
    let holder = registry.lock("k").await.unwrap();
    let mut waiter = task::spawn(registry.lock("k"));
    assert_pending!(waiter.poll());
    assert_eq!(
        registry.try_lock("k").await.unwrap_err(),
        TryLockError::WouldBlock
    );
    assert_eq!(registry.stats().await.unwrap().waiting, 1);
    drop(holder);
    drop(waiter.await.unwrap());
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}

#[tokio::test]
async fn many_would_block_answers_leave_nothing_behind() {
    let registry = LockRegistry::spawn();
    let holder = registry.lock(0u32).await.unwrap();
    for _ in 0..1_000 {
        assert_eq!(
            registry.try_lock(0).await.unwrap_err(),
            TryLockError::WouldBlock
        );
    }
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.held, stats.waiting), (1, 1, 0));
    drop(holder);
    for key in 0..1_000 {
        drop(registry.try_lock(key).await.unwrap());
    }
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}
