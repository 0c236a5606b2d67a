//! With one shard (the default), fencing tokens increase strictly across every grant of a
//! registry, whatever the key, and start at 1. (With several, per key: `tests/shards.rs`.)

use std::collections::HashSet;

use keyed_locks::LockRegistry;

#[tokio::test]
async fn tokens_start_at_one_and_increase_across_keys_and_kinds_of_grant() {
    let registry = LockRegistry::spawn();
    let mut tokens = Vec::new();
    for round in 0..10u32 {
        tokens.push(registry.lock(round % 3).await.unwrap().fencing_token());
        tokens.push(registry.try_lock(round % 2).await.unwrap().fencing_token());
    }
    assert_eq!(tokens, (1..=20).collect::<Vec<u64>>());
    assert_eq!(registry.stats().await.unwrap().grants, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_holders_of_one_key_see_strictly_increasing_tokens() {
    let registry = LockRegistry::spawn();
    let last_seen = std::sync::Arc::new(std::sync::Mutex::new(0u64));
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let (registry, last_seen) = (registry.clone(), last_seen.clone());
            tokio::spawn(async move {
                let mut tokens = Vec::new();
                for _ in 0..20 {
                    let guard = registry.lock("resource").await.unwrap();
                    // The resource's check: a token below the highest seen is refused.
                    let mut last = last_seen.lock().unwrap();
                    assert!(guard.fencing_token() > *last, "stale token accepted");
                    *last = guard.fencing_token();
                    tokens.push(guard.fencing_token());
                }
                tokens
            })
        })
        .collect();
    let mut all = HashSet::new();
    for task in tasks {
        for token in task.await.unwrap() {
            assert!(all.insert(token), "token {token} granted twice");
        }
    }
    assert_eq!(all.len(), 2_000);
}
