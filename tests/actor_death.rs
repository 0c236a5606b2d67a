//! If the registry actor dies anyway (killed, or a panic in a key's own `Hash`), every waiter
//! and every later call gets `Closed` instead of hanging, and the registry never comes back
//! with an empty table while guards are out.

use std::hash::{Hash, Hasher};

use keyed_locks::{LockError, LockRegistry, TryLockError};
use tokio_test::{assert_pending, assert_ready, task};

#[tokio::test]
async fn a_killed_registry_closes_waiters_and_later_calls() {
    let registry = LockRegistry::spawn();
    let guard = registry.lock(1).await.unwrap();
    let mut waiter = task::spawn(registry.lock(1));
    assert_pending!(waiter.poll());
    registry.stats().await.unwrap();

    registry.actor_ref().kill();
    registry.actor_ref().wait_for_shutdown().await;
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

#[tokio::test]
async fn a_panic_inside_the_registry_closes_it_and_it_does_not_restart() {
    let registry = LockRegistry::spawn();
    let guard = registry.lock(Fragile(1)).await.unwrap();
    let mut waiter = task::spawn(registry.lock(Fragile(1)));
    assert_pending!(waiter.poll());

    assert_eq!(
        registry.lock(Fragile(13)).await.unwrap_err(),
        LockError::Closed
    );
    registry.actor_ref().wait_for_shutdown().await;
    assert_eq!(assert_ready!(waiter.poll()).unwrap_err(), LockError::Closed);
    // Not restarted: a fresh table would hand out Fragile(1) while `guard` holds it.
    assert_eq!(
        registry.try_lock(Fragile(1)).await.unwrap_err(),
        TryLockError::Closed
    );
    assert_eq!(registry.stats().await.unwrap_err(), LockError::Closed);
    drop(guard);
}
