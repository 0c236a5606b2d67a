//! A guard releases its key on every way out of its holder: a normal drop, a panic's
//! unwinding and an aborted task. None of them awaits.

use std::time::Duration;

use keyed_locks::LockRegistry;

#[tokio::test]
async fn dropping_the_guard_releases() {
    let registry = LockRegistry::spawn();
    let guard = registry.lock("k").await.unwrap();
    drop(guard);
    assert!(registry.try_lock("k").await.is_ok());
}

#[tokio::test]
async fn a_holder_that_panics_releases() {
    let registry = LockRegistry::spawn();
    let holder = tokio::spawn({
        let registry = registry.clone();
        async move {
            let _guard = registry.lock("k").await.unwrap();
            panic!("the work failed");
        }
    });
    assert!(holder.await.unwrap_err().is_panic());
    let _next = registry.lock("k").await.unwrap();
    assert_eq!(registry.stats().await.unwrap().held, 1);
}

#[tokio::test(start_paused = true)]
async fn an_aborted_holder_releases() {
    let registry = LockRegistry::spawn();
    let holder = tokio::spawn({
        let registry = registry.clone();
        async move {
            let _guard = registry.lock("k").await.unwrap();
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    });
    while registry.stats().await.unwrap().held == 0 {
        tokio::task::yield_now().await;
    }
    holder.abort();
    assert!(holder.await.unwrap_err().is_cancelled());
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}

#[test]
fn a_guard_dropped_outside_any_runtime_releases() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let registry = {
        let _entered = runtime.enter();
        LockRegistry::spawn()
    };
    let guard = runtime.block_on(registry.lock("k")).unwrap();
    drop(guard); // plain thread, no runtime entered: must not panic nor wait
    assert_eq!(runtime.block_on(registry.stats()).unwrap().keys, 0);
}
