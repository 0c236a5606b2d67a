//! Dropping a waiting `lock`, `try_lock` or `ask(Acquire)` future at any moment leaves no
//! entry behind and no key stuck.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use keyed_locks::messages::{Acquire, GetStats};
use keyed_locks::{Execution, LockRegistry};
use tokio_test::{assert_pending, assert_ready, task};

use crate::configurations::builders;
use crate::reference_model::trace_lines;

#[tokio::test]
async fn a_queued_waiter_dropped_leaves_the_queue_at_once() {
    let registry = LockRegistry::spawn();
    let holder = registry.lock("k").await.unwrap();
    let mut waiter = task::spawn(registry.lock("k"));
    assert_pending!(waiter.poll());
    assert_eq!(registry.stats().await.unwrap().waiting, 1);

    drop(waiter);
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.held, stats.waiting), (1, 1, 0));
    drop(holder);
    let stats = registry.stats().await.unwrap();
    assert_eq!(
        (stats.keys, stats.grants),
        (0, 1),
        "the dropped waiter was never granted"
    );
}

/// Step by step, in both modes (`registry.stats().await` is the point where every request
/// sent before has been handled, by the actor task in actor mode): a waiter dropped while
/// queued is withdrawn, is never granted, and the waiter behind it gets the key with the next
/// token.
#[tokio::test]
async fn a_queued_waiter_dropped_is_withdrawn_and_the_next_one_gets_the_key_in_either_mode() {
    for execution in [Execution::RunOnCaller, Execution::ActorTask] {
        let registry = LockRegistry::builder()
            .execution(execution)
            .journal(1_000)
            .spawn();
        let holder = registry.lock(7u64).await.unwrap();
        let mut gives_up = task::spawn(registry.lock(7));
        let mut next = task::spawn(registry.lock(7));
        assert_pending!(gives_up.poll());
        assert_pending!(next.poll());
        registry.stats().await.unwrap();

        drop(gives_up);
        let stats = registry.stats().await.unwrap();
        assert_eq!(
            (stats.keys, stats.held, stats.waiting),
            (1, 1, 1),
            "{execution:?}"
        );
        drop(holder);
        registry.stats().await.unwrap();
        assert!(next.is_woken(), "{execution:?}");
        assert_eq!(
            assert_ready!(next.poll()).unwrap().fencing_token(),
            2,
            "{execution:?}"
        );
        assert_eq!(registry.stats().await.unwrap().keys, 0, "{execution:?}");
        let journal = registry.journal().await.unwrap();
        assert_eq!(
            trace_lines(journal.entries.iter().map(|entry| &entry.event)),
            "acquire w1 1 7; grant w1 1; acquire w2 1 7; acquire w3 1 7; cancel w2; \
             release w1; grant w3 2; release w3",
            "{execution:?}"
        );
    }
}

/// In actor mode every request is on its way to the actor for a while; with the default mode
/// that happens only while another caller runs a step (`tests/run_on_caller.rs`).
fn actor_mode<K: keyed_locks::LockKey>() -> LockRegistry<K> {
    LockRegistry::builder()
        .execution(Execution::ActorTask)
        .spawn()
}

#[tokio::test]
async fn a_request_dropped_before_the_registry_saw_it_touches_nothing() {
    let registry = actor_mode();
    let holder = registry.lock("k").await.unwrap();
    let mut waiter = task::spawn(registry.lock("k"));
    assert_pending!(waiter.poll()); // the request is sent, not yet handled
    drop(waiter);
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.waiting), (1, 0));

    // Same on a free key: the request is skipped, nothing is granted.
    drop(holder);
    let mut on_free_key = task::spawn(registry.lock("free"));
    assert_pending!(on_free_key.poll());
    drop(on_free_key);
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.grants), (0, 1));
}

/// A future of `lock`, `lock_shared`, `acquire` or `try_lock` dropped before its first poll
/// never reached its shard: no entry, no waiter, no grant, in every configuration.
#[tokio::test]
async fn a_lock_future_never_polled_sends_nothing() {
    for builder in builders::<u8>() {
        let registry = builder
            .capacity(std::num::NonZeroU32::new(2).unwrap())
            .spawn();
        drop(registry.lock(1));
        drop(registry.lock_shared(1));
        drop(registry.acquire(1, 2));
        drop(registry.try_lock(1));
        assert_eq!(registry.stats().await.unwrap(), Default::default());
    }
}

#[tokio::test]
async fn a_dropped_try_lock_with_its_guard_in_flight_releases() {
    let registry = actor_mode();
    let mut attempt = task::spawn(registry.try_lock("k"));
    assert_pending!(attempt.poll());
    registry.stats().await.unwrap(); // granted; the guard sits in the reply
    drop(attempt);
    assert_eq!(registry.stats().await.unwrap().keys, 0);
    assert!(registry.try_lock("k").await.is_ok());
}

#[tokio::test]
async fn a_dropped_ask_acquire_passes_the_key_on_when_its_turn_comes() {
    let registry = LockRegistry::spawn();
    let holder = registry.lock(9).await.unwrap();
    let actor = registry.actor_ref().expect("one shard").clone();
    let mut asking = task::spawn(async move { actor.ask(Acquire { key: 9 }).await });
    assert_pending!(asking.poll());
    // Through the mailbox, so that the `Acquire` before it has been handled.
    registry
        .actor_ref()
        .expect("one shard")
        .ask(GetStats)
        .await
        .unwrap();
    drop(asking);

    let mut next = task::spawn(registry.lock(9));
    assert_pending!(next.poll());
    drop(holder);
    // The grant to the vanished asker is dropped unreceived, releases, and `next` gets the key.
    let guard = next.await.unwrap();
    assert_eq!(guard.fencing_token(), 3);
    drop(guard);
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}

/// Thousands of `lock` calls under `timeout` over a few keys whose holders sleep: exclusion
/// never breaks and nothing is left.
#[tokio::test(start_paused = true)]
async fn timeout_storm_keeps_exclusion_and_leaves_nothing() {
    const KEYS: usize = 3;
    let registry = LockRegistry::spawn();
    let inside: Arc<Vec<AtomicBool>> =
        Arc::new((0..KEYS).map(|_| AtomicBool::new(false)).collect());
    let (granted, timed_out) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));

    let tasks: Vec<_> = (0..3_000u64)
        .map(|n| {
            let (registry, inside) = (registry.clone(), inside.clone());
            let (granted, timed_out) = (granted.clone(), timed_out.clone());
            tokio::spawn(async move {
                let key = (n as usize * 7) % KEYS;
                let patience = Duration::from_millis(1 + n * 13 % 40);
                match tokio::time::timeout(patience, registry.lock(key)).await {
                    Ok(guard) => {
                        let _guard = guard.unwrap();
                        assert!(!inside[key].swap(true, Ordering::SeqCst), "two holders");
                        tokio::time::sleep(Duration::from_millis(n % 3)).await;
                        inside[key].store(false, Ordering::SeqCst);
                        granted.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        timed_out.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let (granted, timed_out) = (
        granted.load(Ordering::Relaxed),
        timed_out.load(Ordering::Relaxed),
    );
    assert_eq!(granted + timed_out, 3_000);
    assert!(
        granted > 0 && timed_out > 0,
        "{granted} granted, {timed_out} timed out"
    );
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.held, stats.waiting), (0, 0, 0));
}

/// The same storm on a multi-thread runtime with real time, where cancellations race with
/// grants on another thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_storm_across_threads_leaves_nothing() {
    timeout_storm_across_threads(LockRegistry::spawn()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_storm_across_threads_leaves_nothing_in_any_shard() {
    timeout_storm_across_threads(sharded(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_storm_across_threads_leaves_nothing_in_either_execution_mode() {
    timeout_storm_across_threads(in_mode(Execution::RunOnCaller)).await;
    timeout_storm_across_threads(in_mode(Execution::ActorTask)).await;
}

fn in_mode(execution: Execution) -> LockRegistry<u64> {
    LockRegistry::builder().execution(execution).spawn()
}

fn sharded(shards: usize) -> LockRegistry<u64> {
    LockRegistry::builder()
        .shards(NonZeroUsize::new(shards).unwrap())
        .spawn()
}

async fn timeout_storm_across_threads(registry: LockRegistry<u64>) {
    let tasks: Vec<_> = (0..2_000u64)
        .map(|n| {
            let registry = registry.clone();
            tokio::spawn(async move {
                let patience = Duration::from_micros(50 + n * 37 % 500);
                if let Ok(guard) = tokio::time::timeout(patience, registry.lock(n % 4)).await {
                    let _guard = guard.unwrap();
                    tokio::time::sleep(Duration::from_micros(100)).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.held, stats.waiting), (0, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn losing_select_branches_leave_nothing() {
    let registry = LockRegistry::spawn();
    let holder = registry.lock("k").await.unwrap();
    for _ in 0..100 {
        tokio::select! {
            biased;
            _ = tokio::time::sleep(Duration::from_millis(1)) => {}
            _ = registry.lock("k") => panic!("the key is held"),
        }
    }
    assert_eq!(registry.stats().await.unwrap().waiting, 0);
    drop(holder);
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}

/// Tasks aborted at every point of their life: before sending, while queued, with a grant in
/// flight, and while holding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_tasks_at_any_point_leave_nothing() {
    aborted_tasks_at_any_point(LockRegistry::spawn()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_tasks_at_any_point_leave_nothing_in_any_shard() {
    aborted_tasks_at_any_point(sharded(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_tasks_at_any_point_leave_nothing_in_either_execution_mode() {
    aborted_tasks_at_any_point(in_mode(Execution::RunOnCaller)).await;
    aborted_tasks_at_any_point(in_mode(Execution::ActorTask)).await;
}

async fn aborted_tasks_at_any_point(registry: LockRegistry<u64>) {
    for round in 0..200u64 {
        let tasks: Vec<_> = (0..20u64)
            .map(|n| {
                let registry = registry.clone();
                tokio::spawn(async move {
                    let _guard = registry.lock((round + n) % 3).await.unwrap();
                    tokio::task::yield_now().await;
                })
            })
            .collect();
        for _ in 0..round % 5 {
            tokio::task::yield_now().await;
        }
        for (n, task) in tasks.iter().enumerate() {
            if n % 2 == round as usize % 2 {
                task.abort();
            }
        }
        for task in tasks {
            let _ = task.await;
        }
    }
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.held, stats.waiting), (0, 0, 0));
}

/// A `lock` future polled again after it gave its guard answers `Closed` instead of panicking,
/// and takes nothing: the guard it gave still holds the key, and its drop frees it.
#[tokio::test]
async fn a_lock_future_polled_after_it_resolved_takes_nothing() {
    for builder in builders::<u64>() {
        let registry = builder.spawn();
        let mut lock = Box::pin(registry.lock(5));
        let guard = lock.as_mut().await.unwrap();
        assert!(matches!(
            futures::poll!(lock.as_mut()),
            std::task::Poll::Ready(Err(keyed_locks::LockError::Closed))
        ));
        drop(lock);
        let stats = registry.stats().await.unwrap();
        assert_eq!((stats.keys, stats.held, stats.grants), (1, 1, 1));
        drop(guard);
        assert_eq!(registry.stats().await.unwrap().keys, 0);
    }
}
