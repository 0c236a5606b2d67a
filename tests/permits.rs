//! Keys with several permits: shared locks, permit guards and exclusive locks share a key in
//! strict FIFO, never more permits are held than a key has, and every cancel-safety promise
//! holds in every mode (multi-key locks included), in both execution modes and with shards.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use futures::future::join_all;
use keyed_locks::{JournalError, LockRegistry, PermitsError, TryPermitsError};
use tokio::time::timeout;
use tokio_test::{assert_pending, task};

use crate::configurations::builders;

/// Generous: two cores, shared with the rest of the suite.
const BOUND: Duration = Duration::from_secs(60);

fn capacity(permits: u32) -> NonZeroU32 {
    NonZeroU32::new(permits).expect("a capacity above 0")
}

/// Every execution mode, with one shard and with three.
fn registries(permits: u32) -> Vec<LockRegistry<u32>> {
    builders()
        .into_iter()
        .map(|builder| builder.capacity(capacity(permits)).spawn())
        .collect()
}

#[tokio::test]
async fn permits_out_of_range_are_refused_and_change_nothing() {
    let registry = LockRegistry::builder().capacity(capacity(3)).spawn();
    for requested in [0, 4] {
        assert_eq!(
            registry.acquire("k", requested).await.unwrap_err(),
            PermitsError::OutOfRange {
                requested,
                capacity: 3
            }
        );
        assert_eq!(
            registry.try_acquire("k", requested).await.unwrap_err(),
            TryPermitsError::OutOfRange {
                requested,
                capacity: 3
            }
        );
    }
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.grants), (0, 0));
    let error = registry.acquire("k", 9).await.unwrap_err().to_string();
    assert!(error.contains("9") && error.contains("3"), "{error}");
}

#[tokio::test]
async fn with_one_permit_per_key_a_shared_lock_is_exclusive() {
    let registry = LockRegistry::spawn();
    let reader = registry.lock_shared("k").await.unwrap();
    assert!(registry.try_lock_shared("k").await.is_err());
    assert!(registry.try_lock("k").await.is_err());
    drop(reader);
    assert!(registry.try_lock("k").await.is_ok());
}

/// Ported from moby/locker's RWMutex test: one task takes the shared lock twice, then asks for
/// the exclusive lock, which stays blocked after the first shared release and goes through
/// after the second.
#[tokio::test]
async fn exclusive_after_two_shared_holds_waits_for_both_releases_in_every_mode() {
    for registry in registries(2) {
        let first = registry.lock_shared(1).await.unwrap();
        let second = registry.lock_shared(1).await.unwrap();
        let mut exclusive = task::spawn(registry.lock(1));
        assert_pending!(exclusive.poll());
        drop(first);
        registry.stats().await.unwrap();
        assert_pending!(exclusive.poll(), "blocked after the first shared release");
        drop(second);
        let guard = timeout(BOUND, exclusive).await.unwrap().unwrap();
        assert_eq!(registry.stats().await.unwrap().holders, 1);
        drop(guard);
        assert_eq!(registry.stats().await.unwrap().keys, 0);
    }
}

/// Permits are never summed past `u32::MAX`: with a capacity of `u32::MAX`, one permit more
/// than is free is refused (and waits), and the journal of the run replays, in every mode.
#[tokio::test]
async fn permits_near_u32_max_never_exceed_the_capacity_in_every_mode() {
    for builder in builders::<u32>() {
        let registry = builder.capacity(capacity(u32::MAX)).journal(100).spawn();
        let most = registry.acquire(1, u32::MAX - 1).await.unwrap();
        assert_eq!(
            registry.try_acquire(1, 2).await.unwrap_err(),
            TryPermitsError::WouldBlock
        );
        let mut two = task::spawn(registry.acquire(1, 2));
        assert_pending!(two.poll());
        assert_eq!(
            registry.stats().await.unwrap().permits,
            (u32::MAX - 1) as usize
        );
        drop(most);
        let two = timeout(BOUND, two).await.unwrap().unwrap();
        assert_eq!(registry.stats().await.unwrap().permits, 2);
        drop(two);
        // A sharded registry keeps no single journal; one shard replays what it did.
        match registry.journal().await {
            Ok(journal) => keyed_locks::replay::verify(&journal).unwrap(),
            Err(error) => assert_eq!(error, JournalError::Sharded),
        }
        assert_eq!(registry.stats().await.unwrap().keys, 0);
    }
}

/// With a capacity above 2^31 two exclusive locks sum past `u32::MAX`; the second still waits.
#[tokio::test]
async fn exclusive_locks_exclude_each_other_with_a_capacity_above_half_of_u32_in_every_mode() {
    for builder in builders::<u32>() {
        let registry = builder.capacity(capacity((1 << 31) + 1)).spawn();
        let first = registry.lock(1).await.unwrap();
        assert!(registry.try_lock(1).await.is_err());
        assert!(registry.try_lock_all([1, 2]).await.is_err());
        let mut second = task::spawn(registry.lock(1));
        assert_pending!(second.poll());
        drop(first);
        drop(timeout(BOUND, second).await.unwrap().unwrap());
        assert_eq!(registry.stats().await.unwrap().keys, 0);
    }
}

/// Ported from moby/locker: 10,001 tasks each take the exclusive lock and then the shared lock
/// of one key, and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_and_one_tasks_exclusive_then_shared_leave_no_entry() {
    let registry = LockRegistry::builder().capacity(capacity(4)).spawn();
    let inside = Arc::new(AtomicBool::new(false));
    let tasks = (0..10_001).map(|_| {
        let (registry, inside) = (registry.clone(), Arc::clone(&inside));
        tokio::spawn(async move {
            let writer = registry.lock("k").await.unwrap();
            assert!(
                !inside.swap(true, Ordering::SeqCst),
                "two exclusive holders"
            );
            tokio::task::yield_now().await;
            inside.store(false, Ordering::SeqCst);
            drop(writer);
            let reader = registry.lock_shared("k").await.unwrap();
            assert!(!inside.load(Ordering::SeqCst), "a reader beside a writer");
            drop(reader);
        })
    });
    for outcome in timeout(BOUND, join_all(tasks)).await.unwrap() {
        outcome.unwrap();
    }
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.holders, stats.permits), (0, 0, 0));
}

/// A steady stream of readers cannot hold off a queued writer beyond the readers already
/// admitted: every reader that asks after the writer is granted after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_readers_cannot_starve_a_queued_writer() {
    for registry in registries(16) {
        let admitted: Vec<_> = join_all((0..4).map(|_| registry.lock_shared(7)))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let writer_done = Arc::new(AtomicBool::new(false));
        let writer = tokio::spawn({
            let (registry, writer_done) = (registry.clone(), Arc::clone(&writer_done));
            async move {
                let guard = registry.lock(7).await.unwrap();
                writer_done.store(true, Ordering::SeqCst);
                guard.fencing_token()
            }
        });
        while registry.stats().await.unwrap().waiting == 0 {
            tokio::task::yield_now().await;
        }
        // Readers keep coming while the writer waits; all of them must come after it.
        let late_readers: Vec<_> = (0..50)
            .map(|_| {
                let (registry, writer_done) = (registry.clone(), Arc::clone(&writer_done));
                tokio::spawn(async move {
                    let reader = registry.lock_shared(7).await.unwrap();
                    assert!(
                        writer_done.load(Ordering::SeqCst),
                        "a late reader went first"
                    );
                    reader.fencing_token()
                })
            })
            .collect();
        tokio::task::yield_now().await;
        drop(admitted);
        let writer_token = timeout(BOUND, writer).await.unwrap().unwrap();
        for reader in late_readers {
            let token = timeout(BOUND, reader).await.unwrap().unwrap();
            assert!(token > writer_token);
        }
        assert_eq!(registry.stats().await.unwrap().keys, 0);
    }
}

/// Many tasks ask for random numbers of permits of a few keys: never more than the capacity
/// is in use on any key, and everything ends released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_permits_in_use_than_a_key_has() {
    const CAPACITY: u32 = 5;
    for registry in registries(CAPACITY) {
        let in_use: Arc<[AtomicU32; 3]> = Arc::new(Default::default());
        let tasks = (0..300u32).map(|task| {
            let (registry, in_use) = (registry.clone(), Arc::clone(&in_use));
            tokio::spawn(async move {
                let key = task % 3;
                let permits = 1 + task * 7 % CAPACITY;
                let guard = registry.acquire(key, permits).await.unwrap();
                let now = in_use[key as usize].fetch_add(permits, Ordering::SeqCst) + permits;
                assert!(now <= CAPACITY, "{now} permits of key {key} in use");
                tokio::task::yield_now().await;
                in_use[key as usize].fetch_sub(permits, Ordering::SeqCst);
                drop(guard);
            })
        });
        for outcome in timeout(BOUND, join_all(tasks)).await.unwrap() {
            outcome.unwrap();
        }
        let stats = registry.stats().await.unwrap();
        assert_eq!((stats.keys, stats.permits), (0, 0));
    }
}

#[tokio::test]
async fn a_big_request_is_not_overtaken_and_giving_up_lets_the_smaller_ones_through() {
    for registry in registries(3) {
        let holder = registry.acquire(1, 1).await.unwrap();
        let mut big = task::spawn(registry.acquire(1, 3));
        assert_pending!(big.poll());
        let mut small = task::spawn(registry.acquire(1, 1));
        assert_pending!(
            small.poll(),
            "two permits are free, but the big request came first"
        );
        drop(big);
        let small = timeout(BOUND, small).await.unwrap().unwrap();
        assert_eq!(registry.stats().await.unwrap().permits, 2);
        drop((holder, small));
        assert_eq!(registry.stats().await.unwrap().keys, 0);
    }
}

/// Timeouts at every moment on every kind of request, in every mode: nothing is left, and no
/// key is stuck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_on_every_kind_of_request_leave_no_entry() {
    for registry in registries(3) {
        let tasks = (0..600u32).map(|task| {
            let registry = registry.clone();
            tokio::spawn(async move {
                let key = task % 4;
                let patience = Duration::from_micros(u64::from(task % 7) * 50);
                match task % 4 {
                    0 => hold_briefly(timeout(patience, registry.lock(key)).await).await,
                    1 => hold_briefly(timeout(patience, registry.lock_shared(key)).await).await,
                    2 => {
                        let permits = 1 + task % 3;
                        hold_briefly(timeout(patience, registry.acquire(key, permits)).await).await
                    }
                    _ => {
                        let keys = [key, (key + 1) % 4, (key + 2) % 4];
                        hold_briefly(timeout(patience, registry.lock_all(keys)).await).await
                    }
                }
            })
        });
        for outcome in timeout(BOUND, join_all(tasks)).await.unwrap() {
            outcome.unwrap();
        }
        let stats = registry.stats().await.unwrap();
        assert_eq!((stats.keys, stats.holders, stats.waiting), (0, 0, 0));
        // Not stuck: every key can be taken exclusively at once.
        for key in 0..4 {
            drop(registry.try_lock(key).await.unwrap());
        }
    }
}

/// Holds a guard that came in time across a yield, then drops it; nothing if it came late.
async fn hold_briefly<G, E: std::fmt::Debug>(
    attempt: Result<Result<G, E>, tokio::time::error::Elapsed>,
) {
    if let Ok(guard) = attempt {
        let guard = guard.unwrap();
        tokio::task::yield_now().await;
        drop(guard);
    }
}

/// Tasks aborted at any point of any kind of request, and `select!` branches that lose to a
/// timer, in every mode: nothing is left, and no key is stuck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_tasks_and_losing_select_branches_leave_no_entry() {
    for registry in registries(3) {
        let tasks: Vec<_> = (0..600u32)
            .map(|task| {
                let registry = registry.clone();
                tokio::spawn(async move {
                    let key = task % 3;
                    let request = async {
                        match task % 4 {
                            0 => registry.lock(key).await.map(drop).map_err(drop),
                            1 => registry.lock_shared(key).await.map(drop).map_err(drop),
                            2 => registry.acquire(key, 2).await.map(drop).map_err(drop),
                            _ => registry
                                .lock_all([(key + 1) % 3, key])
                                .await
                                .map(drop)
                                .map_err(drop),
                        }
                    };
                    tokio::select! {
                        outcome = request => outcome.unwrap(),
                        () = tokio::time::sleep(Duration::from_micros(u64::from(task % 5) * 40)) => {}
                    }
                })
            })
            .collect();
        // Abort every other task wherever it is.
        for (index, task) in tasks.iter().enumerate() {
            if index % 2 == 0 {
                task.abort();
            }
            if index % 50 == 0 {
                tokio::task::yield_now().await;
            }
        }
        for task in tasks {
            match timeout(BOUND, task).await.unwrap() {
                Ok(()) => {}
                Err(error) => assert!(error.is_cancelled(), "{error}"),
            }
        }
        let stats = registry.stats().await.unwrap();
        assert_eq!((stats.keys, stats.holders, stats.waiting), (0, 0, 0));
        for key in 0..3 {
            drop(registry.try_lock(key).await.unwrap());
        }
    }
}
