//! A registry split into shards keeps every rule per key: one holder at a time, FIFO, no
//! entry left behind by cancelled waiters, fencing tokens increasing per key and unique across
//! shards; kameo messages sent to the wrong shard are refused, not served.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keyed_locks::messages::{Acquire, TryAcquire};
use keyed_locks::{
    AcquireError, JournalError, LockError, LockRegistry, TryAcquireError, TryLockError,
};
use tokio_test::{assert_pending, task};

fn sharded<K: keyed_locks::LockKey>(shards: usize) -> LockRegistry<K> {
    LockRegistry::builder()
        .shards(NonZeroUsize::new(shards).unwrap())
        .spawn()
}

/// A key that shard 0 does not own.
fn key_outside_the_first_shard(registry: &LockRegistry<u64>) -> u64 {
    let first = registry.actor_refs().next().unwrap().id();
    (0..)
        .find(|key| registry.actor_ref_for(key).id() != first)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_holder_per_key_and_tokens_increase_per_key_and_never_repeat() {
    const KEYS: usize = 16;
    let registry = sharded::<usize>(4);
    let inside: Arc<Vec<AtomicUsize>> = Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    // Per key, the tokens in the order the holders got in.
    let tokens: Arc<Mutex<HashMap<usize, Vec<u64>>>> = Arc::default();

    let tasks: Vec<_> = (0..128)
        .map(|task_number| {
            let (registry, inside, tokens) = (registry.clone(), inside.clone(), tokens.clone());
            tokio::spawn(async move {
                for round in 0..40 {
                    let key = (task_number * 7 + round) % KEYS;
                    let guard = registry.lock(key).await.unwrap();
                    let others = inside[key].fetch_add(1, Ordering::SeqCst);
                    assert_eq!(others, 0, "two holders of key {key}");
                    tokens
                        .lock()
                        .unwrap()
                        .entry(key)
                        .or_default()
                        .push(guard.fencing_token());
                    tokio::task::yield_now().await;
                    inside[key].fetch_sub(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }

    let tokens = std::mem::take(&mut *tokens.lock().unwrap());
    let mut every_token = HashSet::new();
    for (key, key_tokens) in tokens.iter() {
        assert!(
            key_tokens.windows(2).all(|pair| pair[0] < pair[1]),
            "key {key}: {key_tokens:?}"
        );
        for token in key_tokens {
            assert!(every_token.insert(*token), "token {token} given twice");
        }
    }
    assert_eq!(every_token.len(), 128 * 40);
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.grants), (0, 128 * 40));
}

#[tokio::test]
async fn keys_spread_over_every_shard() {
    let registry = sharded::<u64>(4);
    let actors: HashSet<_> = (0..100)
        .map(|key| registry.actor_ref_for(&key).id())
        .collect();
    assert_eq!(actors.len(), 4);
    assert_eq!(registry.shards(), 4);
}

#[tokio::test]
async fn waiters_of_one_key_are_granted_in_arrival_order() {
    let registry = sharded::<&str>(3);
    let holder = registry.lock("k").await.unwrap();
    let granted: Arc<Mutex<Vec<usize>>> = Arc::default();
    let mut waiters = Vec::new();
    for waiter_number in 0..5 {
        let (waiter_registry, granted) = (registry.clone(), granted.clone());
        waiters.push(tokio::spawn(async move {
            let _guard = waiter_registry.lock("k").await.unwrap();
            granted.lock().unwrap().push(waiter_number);
        }));
        // Queued before the next one is spawned, so arrival order is spawn order.
        while registry.stats().await.unwrap().waiting < waiter_number + 1 {
            tokio::task::yield_now().await;
        }
    }
    drop(holder);
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert_eq!(*granted.lock().unwrap(), [0, 1, 2, 3, 4]);
}

#[tokio::test(start_paused = true)]
async fn timed_out_waiters_leave_no_entry_in_any_shard() {
    let registry = sharded::<u64>(3);
    let holders: Vec<_> = lock_each(&registry, 0..30).await;
    let waiters: Vec<_> = (0..3_000u64)
        .map(|n| {
            let registry = registry.clone();
            tokio::spawn(async move {
                tokio::time::timeout(Duration::from_millis(1 + n % 7), registry.lock(n % 30)).await
            })
        })
        .collect();
    for waiter in waiters {
        assert!(waiter.await.unwrap().is_err(), "every key stayed held");
    }
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.held, stats.waiting), (30, 30, 0));
    drop(holders);
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}

/// Locks each key in turn; the guards, in key order.
async fn lock_each(
    registry: &LockRegistry<u64>,
    keys: std::ops::Range<u64>,
) -> Vec<keyed_locks::KeyGuard<u64>> {
    let mut guards = Vec::new();
    for key in keys {
        guards.push(registry.lock(key).await.unwrap());
    }
    guards
}

#[tokio::test]
async fn each_shard_keeps_a_journal_that_replays_on_its_own() {
    let registry = LockRegistry::builder()
        .shards(NonZeroUsize::new(2).unwrap())
        .journal(10_000)
        .spawn();
    let first = registry.lock(1u64).await.unwrap();
    let mut second = task::spawn(registry.lock(1));
    assert_pending!(second.poll());
    for key in 2..40 {
        drop(registry.lock(key).await.unwrap());
    }
    drop(first);
    drop(second.await.unwrap());

    assert_eq!(registry.journal().await.unwrap_err(), JournalError::Sharded);
    let journals = registry.journals().await.unwrap();
    assert_eq!(journals.len(), 2);
    let mut events = 0;
    for journal in &journals {
        assert!(!journal.entries.is_empty(), "keys went to both shards");
        keyed_locks::replay::verify(journal).unwrap();
        events += journal.entries.len();
    }
    // 39 keys locked once (acquire, grant, release) and key 1 once more (acquire, grant, release).
    assert_eq!(events, 40 * 3);
}

#[tokio::test]
async fn a_message_sent_to_the_owning_shard_excludes_the_handle() {
    let registry = sharded::<u64>(4);
    let key = key_outside_the_first_shard(&registry);
    let guard = registry
        .actor_ref_for(&key)
        .ask(Acquire { key })
        .await
        .unwrap();
    assert_eq!(
        registry.try_lock(key).await.unwrap_err(),
        TryLockError::WouldBlock
    );
    drop(guard);
    assert!(registry.try_lock(key).await.is_ok());
}

#[tokio::test]
async fn a_message_sent_to_the_wrong_shard_is_refused_and_changes_nothing() {
    let registry = sharded::<u64>(4);
    let key = key_outside_the_first_shard(&registry);
    let held = registry.lock(key).await.unwrap();

    let first_shard = registry.actor_refs().next().unwrap();
    let acquire = first_shard.ask(Acquire { key }).await.unwrap_err();
    assert!(
        matches!(
            acquire,
            kameo::error::SendError::HandlerError(AcquireError::WrongShard)
        ),
        "{acquire:?}"
    );
    let try_acquire = first_shard.ask(TryAcquire { key }).await.unwrap_err();
    assert!(
        matches!(
            try_acquire,
            kameo::error::SendError::HandlerError(TryAcquireError::WrongShard)
        ),
        "{try_acquire:?}"
    );
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.held, stats.grants), (1, 1, 1));
    drop(held);
}

#[tokio::test]
async fn shutdown_closes_every_shard_and_answers_every_waiter() {
    let registry = sharded::<u64>(3);
    let holders = lock_each(&registry, 0..12).await;
    let mut waiters: Vec<_> = (0..12).map(|key| task::spawn(registry.lock(key))).collect();
    for waiter in &mut waiters {
        assert_pending!(waiter.poll());
    }
    registry.shutdown().await;
    assert!(registry.is_closed());
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap_err(), LockError::Closed);
    }
    for key in 0..12 {
        assert_eq!(registry.lock(key).await.unwrap_err(), LockError::Closed);
    }
    drop(holders);
}

#[tokio::test]
async fn a_dead_shard_closes_its_keys_and_the_others_keep_working() {
    let registry = sharded::<u64>(2);
    let dead_key = key_outside_the_first_shard(&registry);
    let live_key = (0..)
        .find(|key| registry.actor_ref_for(key).id() == registry.actor_refs().next().unwrap().id())
        .unwrap();
    let dying = registry.actor_ref_for(&dead_key).clone();
    dying.kill();
    dying.wait_for_shutdown().await;

    assert!(registry.is_closed());
    assert_eq!(
        registry.lock(dead_key).await.unwrap_err(),
        LockError::Closed
    );
    let guard = registry.lock(live_key).await.unwrap();
    assert_eq!(*guard.key(), live_key);
}

#[tokio::test]
async fn a_sharded_registry_has_no_single_actor_ref_but_one_per_shard() {
    let registry = sharded::<u64>(3);
    assert!(registry.actor_ref().is_none());
    let actors: Vec<_> = registry.actor_refs().map(|actor| actor.id()).collect();
    assert_eq!(actors.len(), 3);
    for key in 0..30 {
        assert!(actors.contains(&registry.actor_ref_for(&key).id()));
    }
    let unsharded = LockRegistry::<u64>::spawn();
    assert_eq!(
        unsharded.actor_ref().map(|actor| actor.id()),
        Some(unsharded.actor_ref_for(&7).id())
    );
}
