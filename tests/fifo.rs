//! Waiters of one key are granted in the order they arrived, and a newcomer never overtakes
//! a queued waiter.

use keyed_locks::LockRegistry;
use tokio_test::{assert_pending, assert_ready, task};

#[tokio::test]
async fn waiters_are_granted_in_arrival_order() {
    let registry = LockRegistry::spawn();
    let mut holder = Some(registry.lock(7).await.unwrap());

    // Each first poll sends the request, so this is the order of arrival.
    let mut waiters: Vec<_> = (0..5).map(|_| task::spawn(registry.lock(7))).collect();
    for waiter in &mut waiters {
        assert_pending!(waiter.poll());
    }
    registry.stats().await.unwrap();

    for turn in 0..waiters.len() {
        drop(holder.take());
        registry.stats().await.unwrap(); // the release and its grant are done
        for (position, waiter) in waiters.iter_mut().enumerate().skip(turn + 1) {
            assert_pending!(waiter.poll(), "waiter {position} overtook waiter {turn}");
        }
        holder = Some(assert_ready!(waiters[turn].poll()).unwrap());
    }
    drop(holder);
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}

#[tokio::test]
async fn try_lock_does_not_overtake_a_queued_waiter() {
    let registry = LockRegistry::spawn();
    let holder = registry.lock(1).await.unwrap();
    let mut waiter = task::spawn(registry.lock(1));
    assert_pending!(waiter.poll());

    // Release and a newcomer's try_lock in one breath: the queued waiter still goes first.
    drop(holder);
    assert!(registry.try_lock(1).await.is_err());
    let _granted = assert_ready!(waiter.poll()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_follow_arrival_order_under_load() {
    let registry = LockRegistry::spawn();
    let holder = registry.lock(0).await.unwrap();
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();

    // Enqueue 100 waiters one at a time: each is queued before the next is spawned.
    let mut tasks = Vec::new();
    for arrival in 0..100 {
        let (waiter, order_tx) = (registry.clone(), order_tx.clone());
        tasks.push(tokio::spawn(async move {
            let _guard = waiter.lock(0).await.unwrap();
            order_tx.send(arrival).unwrap();
        }));
        while registry.stats().await.unwrap().waiting < arrival + 1 {
            tokio::task::yield_now().await;
        }
    }
    drop(holder);
    for task in tasks {
        task.await.unwrap();
    }
    drop(order_tx);
    let mut order = Vec::new();
    while let Some(arrival) = order_rx.recv().await {
        order.push(arrival);
    }
    assert_eq!(order, (0..100).collect::<Vec<_>>());
}
