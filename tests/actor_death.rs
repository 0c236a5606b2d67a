//! If the registry dies anyway (its actor killed, or a panic in a key's own `Hash` while a
//! step runs, on the actor or on a caller), every waiter and every later call gets `Closed`
//! instead of hanging, and the registry never comes back with an empty table while guards
//! are out.

use std::hash::{Hash, Hasher};

use keyed_locks::{Execution, LockError, LockRegistry, TryLockError};
use tokio_test::{assert_pending, assert_ready, task};

#[tokio::test]
async fn a_killed_registry_closes_waiters_and_later_calls() {
    let registry = LockRegistry::spawn();
    let guard = registry.lock(1).await.unwrap();
    let mut waiter = task::spawn(registry.lock(1));
    assert_pending!(waiter.poll());
    registry.stats().await.unwrap();

    registry.actor_ref().expect("one shard").kill();
    registry
        .actor_ref()
        .expect("one shard")
        .wait_for_shutdown()
        .await;
    assert_eq!(assert_ready!(waiter.poll()).unwrap_err(), LockError::Closed);
    assert_eq!(registry.lock(2).await.unwrap_err(), LockError::Closed);
    drop(guard);
}

/// A key whose `Hash` panics for one value: user code that panics inside the actor.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fragile(u32);

impl Hash for Fragile {
    fn hash<H: Hasher>(&self, state: &mut H) {
        assert_ne!(self.0, 13, "unlucky key");
        self.0.hash(state);
    }
}

/// Asks for `Fragile(13)` on a registry that holds `Fragile(1)` and has a waiter for it, and
/// checks that the registry closes for good. Returns what the unlucky call gave.
async fn lock_the_unlucky_key(
    registry: &LockRegistry<Fragile>,
) -> Result<Result<(), LockError>, tokio::task::JoinError> {
    let guard = registry.lock(Fragile(1)).await.unwrap();
    let mut waiter = task::spawn(registry.lock(Fragile(1)));
    assert_pending!(waiter.poll());

    let unlucky = {
        let registry = registry.clone();
        tokio::spawn(async move { registry.lock(Fragile(13)).await.map(drop) }).await
    };
    registry
        .actor_ref()
        .expect("one shard")
        .wait_for_shutdown()
        .await;
    assert_eq!(assert_ready!(waiter.poll()).unwrap_err(), LockError::Closed);
    // Not restarted: a fresh table would hand out Fragile(1) while `guard` holds it.
    assert_eq!(
        registry.try_lock(Fragile(1)).await.unwrap_err(),
        TryLockError::Closed
    );
    assert_eq!(registry.stats().await.unwrap_err(), LockError::Closed);
    drop(guard);
    unlucky
}

#[tokio::test]
async fn a_panic_in_a_step_run_by_the_caller_reaches_the_caller_and_closes_the_registry() {
    let registry = LockRegistry::builder()
        .execution(Execution::RunOnCaller)
        .spawn();
    let unlucky = lock_the_unlucky_key(&registry).await;
    // As with a `HashMap`: the caller's own key panicked, on the caller's thread.
    assert!(unlucky.unwrap_err().is_panic());
}

#[tokio::test]
async fn a_panic_in_a_step_run_by_the_actor_closes_the_registry() {
    let registry = LockRegistry::builder()
        .execution(Execution::ActorTask)
        .spawn();
    let unlucky = lock_the_unlucky_key(&registry).await;
    assert_eq!(unlucky.unwrap(), Err(LockError::Closed));
}
