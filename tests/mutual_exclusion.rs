//! One holder per key at a time; distinct keys never wait for each other.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use keyed_locks::LockRegistry;
use tokio_test::{assert_pending, assert_ready, task};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_one_task_is_inside_each_key_at_a_time() {
    const KEYS: usize = 4;
    let registry = LockRegistry::spawn();
    let inside: Arc<Vec<AtomicUsize>> = Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let entries = Arc::new(AtomicUsize::new(0));

    let tasks: Vec<_> = (0..200)
        .map(|task_number| {
            let (registry, inside, entries) = (registry.clone(), inside.clone(), entries.clone());
            tokio::spawn(async move {
                for round in 0..50 {
                    let key = (task_number + round) % KEYS;
                    let _guard = registry.lock(key).await.unwrap();
                    let others = inside[key].fetch_add(1, Ordering::SeqCst);
                    assert_eq!(others, 0, "two holders of key {key}");
                    entries.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                    inside[key].fetch_sub(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(entries.load(Ordering::Relaxed), 200 * 50);
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}

#[tokio::test]
async fn a_second_locker_of_a_held_key_waits_until_the_first_releases() {
    let registry = LockRegistry::spawn();
    let first = registry.lock("k").await.unwrap();
    let mut second = task::spawn(registry.lock("k"));
    assert_pending!(second.poll());
    registry.stats().await.unwrap(); // the registry has seen the second request
    assert_pending!(second.poll());

    drop(first);
    registry.stats().await.unwrap();
    assert!(second.is_woken());
    let _second = assert_ready!(second.poll()).unwrap();
}

#[tokio::test]
async fn a_held_key_does_not_delay_another_key() {
    let registry = LockRegistry::spawn();
    let _a = registry.lock("a").await.unwrap();
    // Would hang (and the test time out) if "b" waited for "a".
    let b = registry.lock("b").await.unwrap();
    assert_eq!(*b.key(), "b");
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.held, stats.waiting), (2, 2, 0));
}
