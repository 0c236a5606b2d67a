//! Compile-time checks: the handle and the guard are `Send + Sync + 'static`, and the futures
//! of `lock` and `try_lock` are `Send`, so they work in `tokio::spawn` and across `.await`.

use std::fmt::Debug;

use keyed_locks::{KeyGuard, LockError, LockRegistry, RegistryStats, TryLockError};

fn send_sync_static<T: Send + Sync + 'static>() {}
fn send<T: Send>(_: &T) {}
fn debug_error<T: Debug + std::error::Error + Send + Sync + 'static>() {}

#[test]
fn handle_guard_and_errors_have_the_bounds_services_need() {
    send_sync_static::<LockRegistry<String>>();
    send_sync_static::<KeyGuard<String>>();
    send_sync_static::<RegistryStats>();
    debug_error::<LockError>();
    debug_error::<TryLockError>();
}

#[tokio::test]
async fn lock_and_try_lock_futures_are_send() {
    let registry = LockRegistry::<String>::spawn();
    let lock = registry.lock("k".into());
    send(&lock);
    drop(lock.await.unwrap());
    let try_lock = registry.try_lock("k".into());
    send(&try_lock);
    let stats = registry.stats();
    send(&stats);
    let shutdown = registry.shutdown();
    send(&shutdown);
    drop(try_lock.await.unwrap());
}
