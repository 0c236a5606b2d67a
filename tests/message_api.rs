//! The message-passing API: `ask(Acquire)` yields the guard once granted, in FIFO order with
//! `lock` by the moment the registry takes each request; whatever happened before a message
//! (a dropped guard) is visible to it; messages sent with `tell` cannot wedge a key or stop
//! the registry; messages are taken even when several arrive at once or the request traffic is
//! heavy.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use keyed_locks::LockRegistry;
use keyed_locks::messages::{Acquire, GetStats, TryAcquire};
use tokio_test::{assert_pending, task};

#[tokio::test]
async fn ask_acquire_yields_the_guard_once_granted() {
    let registry = LockRegistry::spawn();
    let actor = registry.actor_ref().expect("one shard").clone();
    let guard = actor.ask(Acquire { key: "k" }).await.unwrap();
    assert_eq!((*guard.key(), guard.fencing_token()), ("k", 1));

    let mut second = task::spawn(actor.ask(Acquire { key: "k" }).into_future());
    assert_pending!(second.poll());
    // The mailbox is FIFO: once this answers, the second request has been taken and queued.
    actor.ask(GetStats).await.unwrap();
    let mut third = task::spawn(registry.lock("k"));
    assert_pending!(third.poll());
    drop(guard);
    let second = second.await.unwrap();
    assert_eq!(second.fencing_token(), 2);
    drop(second);
    assert_eq!(third.await.unwrap().fencing_token(), 3);
}

#[tokio::test]
async fn tell_acquire_and_tell_try_acquire_leave_nothing_and_keep_the_registry_up() {
    let registry = LockRegistry::spawn();
    let actor = registry.actor_ref().expect("one shard");
    actor.tell(Acquire { key: 1 }).await.unwrap();
    actor.tell(TryAcquire { key: 2 }).await.unwrap();
    let held = registry.lock(3).await.unwrap();
    actor.tell(TryAcquire { key: 3 }).await.unwrap(); // would block: must not stop the actor
    let stats = actor.ask(GetStats).await.unwrap();
    assert_eq!((stats.keys, stats.held), (1, 1));
    drop(held);
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}

#[tokio::test]
async fn a_release_before_a_message_is_visible_to_it() {
    let registry = LockRegistry::spawn();
    for key in 0..100 {
        let guard = registry.lock(key).await.unwrap();
        drop(guard);
        let stats = registry
            .actor_ref()
            .expect("one shard")
            .ask(GetStats)
            .await
            .unwrap();
        assert_eq!(stats.keys, 0);
        drop(
            registry
                .actor_ref()
                .expect("one shard")
                .ask(TryAcquire { key })
                .await
                .unwrap(),
        );
    }
}

#[tokio::test]
async fn ask_try_acquire_reports_would_block_as_a_handler_error() {
    let registry = LockRegistry::spawn();
    let _held = registry.lock(5).await.unwrap();
    let error = registry
        .actor_ref()
        .expect("one shard")
        .ask(TryAcquire { key: 5 })
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            kameo::error::SendError::HandlerError(keyed_locks::TryAcquireError::WouldBlock)
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn messages_sent_back_to_back_are_all_handled() {
    // The actor looks at its mailbox only after the mailbox rang; several messages queued
    // behind one ring must still all be taken.
    let registry = LockRegistry::spawn();
    let actor = registry.actor_ref().expect("one shard");
    for round in 0..20 {
        actor.tell(TryAcquire { key: round }).await.unwrap();
        actor.tell(TryAcquire { key: round + 100 }).await.unwrap();
        let stats = tokio::time::timeout(Duration::from_secs(10), actor.ask(GetStats))
            .await
            .expect("a message queued behind others was never taken")
            .unwrap();
        assert_eq!(stats.held, 0, "the tells' guards were dropped at once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_registry_still_answers_messages_and_stops() {
    let registry = LockRegistry::spawn();
    let busy = Arc::new(AtomicBool::new(true));
    let lockers: Vec<_> = (0..4u64)
        .map(|task| {
            let (registry, busy) = (registry.clone(), busy.clone());
            tokio::spawn(async move {
                let mut key = task;
                while busy.load(Ordering::Relaxed) {
                    key = (key * 31 + 7) % 64;
                    drop(registry.lock(key).await);
                }
            })
        })
        .collect();
    // One generous bound for all of them, so that a starved mailbox fails in seconds.
    tokio::time::timeout(Duration::from_secs(20), async {
        for _ in 0..200 {
            registry
                .actor_ref()
                .expect("one shard")
                .ask(GetStats)
                .await
                .unwrap();
        }
    })
    .await
    .expect("messages were starved by the request traffic");
    tokio::time::timeout(Duration::from_secs(10), registry.shutdown())
        .await
        .expect("the stop was starved by the request traffic");
    busy.store(false, Ordering::Relaxed);
    for locker in lockers {
        locker.await.unwrap();
    }
    assert!(registry.is_closed());
}
