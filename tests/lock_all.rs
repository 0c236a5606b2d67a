//! Several keys at once: `lock_all` holds every key or none, never deadlocks whatever order
//! callers list the keys in, keeps FIFO on each key, and leaves nothing behind when given up,
//! in both execution modes and with shards.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::join_all;
use keyed_locks::replay::verify;
use keyed_locks::{LockError, LockRegistry, RegistryBuilder, TryLockError};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::time::timeout;
use tokio_test::{assert_pending, task};

use crate::configurations::builders;

/// Generous: two cores, shared with the rest of the suite.
const BOUND: Duration = Duration::from_secs(60);

/// Both execution modes, with one shard and with three.
fn registries() -> Vec<LockRegistry<u32>> {
    builders().into_iter().map(RegistryBuilder::spawn).collect()
}

/// One flag per key, set while a task holds the key, so that a second holder is caught.
struct HeldFlags(Vec<AtomicBool>);

impl HeldFlags {
    fn new(keys: u32) -> Arc<Self> {
        Arc::new(HeldFlags(
            (0..keys).map(|_| AtomicBool::new(false)).collect(),
        ))
    }

    /// Marks `keys` held (failing if one already is), lets other tasks run, and marks them
    /// free again: what a task does while its guard holds them.
    async fn hold_briefly(&self, keys: &[u32]) {
        for &key in keys {
            let was_held = self.0[key as usize].swap(true, Ordering::SeqCst);
            assert!(!was_held, "key {key} held twice");
        }
        tokio::task::yield_now().await;
        for &key in keys {
            self.0[key as usize].store(false, Ordering::SeqCst);
        }
    }
}

/// 1,000 tasks lock random pairs of 20 keys, half listing each pair in one order and half in
/// the other: all finish, and no key is ever held by two of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_tasks_on_random_pairs_in_both_orders_all_finish_with_exclusion() {
    const KEYS: u32 = 20;
    for registry in registries() {
        let held = HeldFlags::new(KEYS);
        // Seeded, so that a failure can be rerun as is.
        let mut numbers = StdRng::seed_from_u64(20);
        let tasks = (0..1_000).map(|task| {
            let (registry, held) = (registry.clone(), Arc::clone(&held));
            let first = numbers.random_range(0..KEYS);
            let second = (first + numbers.random_range(1..KEYS)) % KEYS;
            let pair = if task % 2 == 0 {
                [first, second]
            } else {
                [second, first]
            };
            tokio::spawn(async move {
                let guard = registry.lock_all(pair).await.unwrap();
                assert_eq!(guard.len(), 2);
                held.hold_briefly(&pair).await;
                drop(guard);
            })
        });
        for outcome in timeout(BOUND, join_all(tasks)).await.expect("deadlocked") {
            outcome.unwrap();
        }
        let stats = registry.stats().await.unwrap();
        assert_eq!((stats.keys, stats.holders, stats.waiting), (0, 0, 0));
        if registry.shards() == 1 {
            assert_eq!(stats.grants, 1_000, "one grant per request");
        }
    }
}

/// Single-key locks and multi-key locks on the same keys: exclusion holds between the two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_and_multi_key_locks_exclude_each_other() {
    const KEYS: u32 = 6;
    for registry in registries() {
        let held = HeldFlags::new(KEYS);
        let tasks = (0..600u32).map(|task| {
            let (registry, held) = (registry.clone(), Arc::clone(&held));
            tokio::spawn(async move {
                let keys: Vec<u32> = match task % 3 {
                    0 => vec![task % KEYS],
                    1 => vec![task % KEYS, (task + 2) % KEYS],
                    _ => vec![(task + 4) % KEYS, (task + 1) % KEYS, task % KEYS],
                };
                let guard: Box<dyn Send> = if keys.len() == 1 {
                    Box::new(registry.lock(keys[0]).await.unwrap())
                } else {
                    Box::new(registry.lock_all(keys.clone()).await.unwrap())
                };
                held.hold_briefly(&keys).await;
                drop(guard);
            })
        });
        for outcome in timeout(BOUND, join_all(tasks)).await.expect("deadlocked") {
            outcome.unwrap();
        }
        assert_eq!(registry.stats().await.unwrap().keys, 0);
    }
}

#[tokio::test]
async fn duplicates_count_once_and_an_empty_set_is_granted_at_once() {
    for registry in registries() {
        let guard = registry.lock_all([4, 4, 9, 4]).await.unwrap();
        let mut keys: Vec<u32> = guard.keys().copied().collect();
        keys.sort_unstable();
        assert_eq!(keys, [4, 9]);
        let stats = registry.stats().await.unwrap();
        assert_eq!((stats.keys, stats.held), (2, 2));
        let nothing = registry.lock_all([]).await.unwrap();
        assert!(nothing.is_empty());
        assert_eq!(nothing.len(), 0);
        assert!(registry.try_lock_all(Vec::new()).await.unwrap().is_empty());
        drop(guard);
        assert_eq!(registry.stats().await.unwrap().keys, 0);
    }
}

/// A multi-key request waits in every queue of its keys at once: it is not granted while any
/// key is held, and a later request for one of its free keys waits behind it.
#[tokio::test]
async fn a_waiting_multi_key_request_holds_back_later_requests_for_its_keys() {
    let registry = LockRegistry::<u32>::spawn();
    let holder = registry.lock(1).await.unwrap();
    let mut both = task::spawn(registry.lock_all([1, 2]));
    assert_pending!(both.poll());
    let mut later = task::spawn(registry.lock(2));
    assert_pending!(later.poll());
    assert_eq!(
        registry.try_lock(2).await.unwrap_err(),
        TryLockError::WouldBlock
    );
    drop(holder);
    // With the actor task as the owner, the grants come at its next steps: wait for them.
    let both_guard = timeout(BOUND, &mut both).await.unwrap().unwrap();
    assert_pending!(later.poll());
    drop(both_guard);
    let later_guard = timeout(BOUND, &mut later).await.unwrap().unwrap();
    drop(later_guard);
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}

/// Dropping a waiting `lock_all` takes it out of every queue in one step: the requests
/// behind it on each of its keys go through.
#[tokio::test]
async fn a_dropped_waiting_request_leaves_every_queue() {
    for registry in registries() {
        let holder = registry.lock(3).await.unwrap();
        let mut all = task::spawn(registry.lock_all([1, 2, 3]));
        assert_pending!(all.poll());
        let mut on_one = task::spawn(registry.lock(1));
        let mut on_two = task::spawn(registry.lock(2));
        if registry.shards() == 1 {
            // In one shard the request waits in all three queues. (Across shards it waits on
            // one shard at a time, and asks the later shards only once it holds the earlier.)
            assert_pending!(on_one.poll());
            assert_pending!(on_two.poll());
        }
        drop(all);
        // With the actor task as the owner, the withdrawal is its next step: wait for it.
        let one = timeout(BOUND, on_one).await.unwrap().unwrap();
        let two = timeout(BOUND, on_two).await.unwrap().unwrap();
        drop((one, two, holder));
        let stats = registry.stats().await.unwrap();
        assert_eq!((stats.keys, stats.waiting), (0, 0));
    }
}

/// `try_lock_all` takes all or nothing: if one key is taken, the others are left free, also
/// when they live in other shards.
#[tokio::test]
async fn try_lock_all_takes_every_key_or_none() {
    for registry in registries() {
        let taken = registry.lock(7).await.unwrap();
        for _ in 0..3 {
            assert_eq!(
                registry.try_lock_all(0..10).await.unwrap_err(),
                TryLockError::WouldBlock
            );
            let stats = registry.stats().await.unwrap();
            assert_eq!((stats.keys, stats.held), (1, 1), "only the key held before");
        }
        drop(taken);
        let all = registry.try_lock_all(0..10).await.unwrap();
        assert_eq!(all.len(), 10);
        assert_eq!(registry.stats().await.unwrap().held, 10);
    }
}

/// Tokens: every key gets a token above its earlier grants'; with one shard, all keys of a
/// request share one.
#[tokio::test]
async fn every_key_gets_a_token_above_its_earlier_grants() {
    for registry in registries() {
        let mut last = [0u64; 5];
        for round in 0..20u32 {
            let keys = [round % 5, (round + 2) % 5];
            let guard = registry.lock_all(keys).await.unwrap();
            for key in keys {
                let token = guard.fencing_token(&key).expect("a held key has a token");
                assert!(token > last[key as usize], "key {key}: {token}");
                last[key as usize] = token;
            }
            if registry.shards() == 1 {
                assert_eq!(guard.fencing_token(&keys[0]), guard.fencing_token(&keys[1]));
            }
            drop(guard);
            let single = registry.lock(keys[0]).await.unwrap();
            assert!(single.fencing_token() > last[keys[0] as usize]);
            last[keys[0] as usize] = single.fencing_token();
        }
    }
}

#[tokio::test]
async fn a_closed_registry_refuses_and_a_shutdown_ends_a_waiting_request() {
    for registry in registries() {
        let holder = registry.lock(1).await.unwrap();
        let mut waiting = task::spawn(registry.lock_all([1, 2]));
        assert_pending!(waiting.poll());
        registry.shutdown().await;
        assert_eq!(
            timeout(BOUND, waiting).await.unwrap().unwrap_err(),
            LockError::Closed
        );
        assert_eq!(
            registry.lock_all([5, 6]).await.unwrap_err(),
            LockError::Closed
        );
        assert_eq!(
            registry.try_lock_all([5, 6]).await.unwrap_err(),
            TryLockError::Closed
        );
        drop(holder);
    }
}

/// A journaled run with multi-key requests, given up ones included, replays exactly.
#[tokio::test(start_paused = true)]
async fn a_journal_with_multi_key_requests_replays_exactly() {
    let registry = LockRegistry::<u32>::builder().journal(10_000).spawn();
    let tasks = (0..60u32).map(|task| {
        let registry = registry.clone();
        tokio::spawn(async move {
            let keys = [task % 4, (task + 1) % 4, (task * 7) % 5];
            let patience = Duration::from_millis(u64::from(task % 4));
            if let Ok(guard) = timeout(patience, registry.lock_all(keys)).await {
                tokio::time::sleep(Duration::from_millis(1)).await;
                drop(guard);
            }
            if let Ok(guard) = registry.try_lock_all([task % 3, 3]).await {
                drop(guard);
            }
        })
    });
    for outcome in join_all(tasks).await {
        outcome.unwrap();
    }
    let journal = registry.journal().await.unwrap();
    assert!(journal.entries.iter().any(|entry| matches!(
        entry.event,
        keyed_locks::journal::JournalEvent::AcquireAll { .. }
    )));
    verify(&journal).unwrap();
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}
