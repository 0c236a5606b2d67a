//! The map holds an entry only while someone holds or waits for its key: after any mix of
//! requests it is empty again.

use keyed_locks::LockRegistry;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_and_one_tasks_on_one_key_leave_no_entry() {
    let registry = LockRegistry::spawn();
    let tasks: Vec<_> = (0..10_001)
        .map(|_| {
            let registry = registry.clone();
            tokio::spawn(async move { drop(registry.lock("hot").await.unwrap()) })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let stats = registry.stats().await.unwrap();
    assert_eq!(
        (stats.keys, stats.held, stats.waiting, stats.grants),
        (0, 0, 0, 10_001)
    );
}

#[tokio::test]
async fn fifty_thousand_keys_held_at_once_then_released_leave_no_entry() {
    let registry = LockRegistry::spawn();
    let mut guards = Vec::with_capacity(50_000);
    for key in 0..50_000u32 {
        guards.push(registry.lock(key).await.unwrap());
    }
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.held), (50_000, 50_000));
    drop(guards);
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mix_of_lock_try_lock_and_holds_leaves_no_entry() {
    let registry = LockRegistry::spawn();
    let tasks: Vec<_> = (0..500u64)
        .map(|n| {
            let registry = registry.clone();
            tokio::spawn(async move {
                for round in 0..20 {
                    let key = format!("user:{}", (n * 31 + round) % 50);
                    if (n + round) % 3 == 0 {
                        let _ = registry.try_lock(key).await;
                    } else {
                        let _guard = registry.lock(key).await.unwrap();
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}
