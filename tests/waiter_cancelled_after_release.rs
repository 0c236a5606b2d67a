//! The case where lockable, keyed-lock and key-mutex leak (their cleanup counts `Arc`
//! references in the guard's drop, which a cancelled waiter's dropped future does not show:
//! keyed-lock `src/async.rs`, key-mutex `src/inner.rs`, lockable `src/lockable_map_impl.rs`):
//! task A holds key k, task B waits for k, A releases, and B is cancelled before it runs
//! again. The grant to B is then in flight; it must pass on, and the entry for k must go.
//! The multi-thread cases run in both execution modes.

use std::time::Duration;

use keyed_locks::{Execution, LockRegistry};
use tokio_test::{assert_pending, task};

#[tokio::test]
async fn waiter_dropped_after_the_holder_released_leaves_no_entry_a_thousand_times() {
    let registry = LockRegistry::spawn();
    for key in 0..1_000u32 {
        let holder = registry.lock(key).await.unwrap();
        let mut waiter = task::spawn(registry.lock(key));
        assert_pending!(waiter.poll());
        registry.stats().await.unwrap(); // B is queued

        drop(holder);
        registry.stats().await.unwrap(); // the key is granted to B, who has not run since
        drop(waiter);
    }
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.held, stats.waiting), (0, 0, 0));
    // Every waiter was granted (the grant was in flight each time), and each such grant
    // passed on: 1,000 holders and 1,000 in-flight grants.
    assert_eq!(stats.grants, 2_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_waiter_after_release_leaves_no_entry_for_a_thousand_distinct_keys() {
    for execution in [Execution::RunOnCaller, Execution::ActorTask] {
        aborted_waiter_after_release(LockRegistry::builder().execution(execution).spawn()).await;
    }
}

async fn aborted_waiter_after_release(registry: LockRegistry<u32>) {
    for key in 0..1_000u32 {
        let holder = registry.lock(key).await.unwrap();
        let waiter = tokio::spawn({
            let registry = registry.clone();
            async move { registry.lock(key).await.map(drop) }
        });
        while registry.stats().await.unwrap().waiting == 0 {
            tokio::task::yield_now().await;
        }
        drop(holder);
        waiter.abort();
        let _ = waiter.await;
    }
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.held, stats.waiting), (0, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn timed_out_waiter_after_release_leaves_no_entry_for_a_thousand_distinct_keys() {
    let registry = LockRegistry::spawn();
    for key in 0..1_000u32 {
        let holder = registry.lock(key).await.unwrap();
        let waiter = tokio::spawn({
            let registry = registry.clone();
            async move { tokio::time::timeout(Duration::from_millis(5), registry.lock(key)).await }
        });
        while registry.stats().await.unwrap().waiting == 0 {
            tokio::task::yield_now().await;
        }
        // Release, then let the waiter's timer fire before it can take the grant.
        drop(holder);
        tokio::time::advance(Duration::from_millis(5)).await;
        let _ = waiter.await.unwrap();
    }
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.held, stats.waiting), (0, 0, 0));
}

#[tokio::test]
async fn the_next_waiter_gets_a_grant_refused_in_flight() {
    let registry = LockRegistry::spawn();
    let holder = registry.lock("k").await.unwrap();
    let mut gives_up = task::spawn(registry.lock("k"));
    let mut stays = task::spawn(registry.lock("k"));
    assert_pending!(gives_up.poll());
    assert_pending!(stays.poll());
    registry.stats().await.unwrap();

    drop(holder);
    registry.stats().await.unwrap(); // granted to `gives_up`, in flight
    drop(gives_up);
    registry.stats().await.unwrap(); // its release was handled: granted to `stays`
    assert!(stays.is_woken());
    let guard = stays.await.unwrap();
    assert_eq!(guard.fencing_token(), 3);
    drop(guard);
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}

#[tokio::test]
async fn a_waiter_giving_up_while_its_grant_is_being_made_passes_the_key_on() {
    let registry = LockRegistry::spawn();
    for key in 0..100u32 {
        let holder = registry.lock(key).await.unwrap();
        let mut waiter = task::spawn(registry.lock(key));
        assert_pending!(waiter.poll());
        registry.stats().await.unwrap(); // queued

        // The release and the waiter's cancel are both in the mailbox, release first: the
        // registry grants to a waiter that has already given up, and must pass the key on.
        drop(holder);
        drop(waiter);
        let stats = registry.stats().await.unwrap();
        assert_eq!(
            (stats.keys, stats.held, stats.waiting),
            (0, 0, 0),
            "key {key}"
        );
    }
}
