//! `ClusterRegistry::lock_shared` and `acquire` share a key's permits across processes: never
//! more than the capacity at once, a writer is not starved by readers of other processes, each
//! holder has a fencing token of its own, and a dropped request leaves no lease behind. Several
//! registries on one table stand for several processes, against the real server.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use keyed_locks::{ClusterError, ClusterRegistry, PermitsError, TryLockError, TryPermitsError};
use tokio::time::{Instant, sleep, timeout};

use crate::cluster_registry::{database_url, fresh_prefix};

/// Generous: the machine is small and shared, and the server is real.
const BOUND: Duration = Duration::from_secs(20);

async fn registry(prefix: &str, capacity: u32) -> ClusterRegistry<String> {
    ClusterRegistry::builder(database_url())
        .table_prefix(prefix)
        .lease(Duration::from_secs(30))
        .capacity(NonZeroU32::new(capacity).expect("a test's capacity is above 0"))
        .connect()
        .await
        .expect("connects to the test server")
}

/// Waits until `registry` holds no lease, failing after [`BOUND`]: releases go out in tasks
/// of their own.
async fn no_lease_within_bound(registry: &ClusterRegistry<String>) {
    let started = Instant::now();
    while registry.leases_held() > 0 {
        assert!(started.elapsed() < BOUND, "a lease is still held");
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_held_across_processes_never_exceed_the_capacity() {
    let prefix = fresh_prefix("kl_test_permits_capacity_").await;
    let capacity = 3;
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _process in 0..3 {
        let registry = registry(&prefix, capacity).await;
        for _task in 0..3 {
            let (registry, in_flight, peak) =
                (registry.clone(), Arc::clone(&in_flight), Arc::clone(&peak));
            tasks.push(tokio::spawn(async move {
                for _call in 0..8 {
                    let permit = registry.acquire("provider".to_owned(), 1).await.unwrap();
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    assert!(!permit.is_lost());
                    sleep(Duration::from_millis(3)).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    drop(permit);
                }
            }));
        }
    }
    for task in tasks {
        timeout(BOUND * 3, task)
            .await
            .expect("every call is served")
            .expect("no task panicked");
    }
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= capacity as usize, "{peak} calls in flight at once");
    assert!(peak >= 2, "the permits were never shared: peak {peak}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_of_other_processes_do_not_starve_a_writer() {
    let prefix = fresh_prefix("kl_test_permits_writer_").await;
    let capacity = 4;
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let mut readers = Vec::new();
    // Two processes of readers, each always holding the key: without a bound on overtaking,
    // some reader holds it at every moment and a writer never finds it free.
    for _process in 0..2 {
        let registry = registry(&prefix, capacity).await;
        for _task in 0..3 {
            let (registry, stop, reads) = (registry.clone(), Arc::clone(&stop), Arc::clone(&reads));
            readers.push(tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let read = registry.lock_shared("report".to_owned()).await.unwrap();
                    sleep(Duration::from_millis(5)).await;
                    drop(read);
                    reads.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
    }
    let writer = registry(&prefix, capacity).await;
    // The readers are going.
    let started = Instant::now();
    while reads.load(Ordering::SeqCst) < 20 {
        assert!(started.elapsed() < BOUND, "the readers never ran");
        sleep(Duration::from_millis(5)).await;
    }
    let mut longest = Duration::ZERO;
    for _write in 0..3 {
        let asked = Instant::now();
        let write = timeout(BOUND, writer.lock("report".to_owned()))
            .await
            .expect("the writer was starved by the readers")
            .unwrap();
        longest = longest.max(asked.elapsed());
        drop(write);
        sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for reader in readers {
        timeout(BOUND, reader).await.expect("readers end").unwrap();
    }
    println!("longest wait of a writer among readers of two other processes: {longest:?}");
}

/// A process's readers of a key hand their part leases on among themselves, as writers hand
/// on the whole lease: a statement per round of a part, not one per shared lock. With every
/// shared lock taking a part lease of its own, each grant would carry a fence of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processs_readers_hand_their_part_leases_on_among_themselves() {
    let prefix = fresh_prefix("kl_test_permits_handoff_").await;
    let registry = registry(&prefix, 8).await;
    let (tasks, reads) = (4, 40);
    let mut readers = Vec::new();
    for _task in 0..tasks {
        let registry = registry.clone();
        readers.push(tokio::spawn(async move {
            let mut tokens = Vec::new();
            for _read in 0..reads {
                let read = registry.lock_shared("report".to_owned()).await.unwrap();
                assert!(!read.is_lost());
                tokens.push(read.fencing_token());
                sleep(Duration::from_millis(1)).await;
                drop(read);
            }
            tokens
        }));
    }
    let mut tokens = Vec::new();
    for reader in readers {
        tokens.extend(timeout(BOUND, reader).await.expect("readers end").unwrap());
    }
    let grants = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), grants, "two shared guards had one token");
    let mut fences: Vec<u64> = tokens.iter().map(|token| token >> 20).collect();
    fences.dedup();
    println!(
        "{grants} shared locks of one process under {} part leases",
        fences.len()
    );
    assert!(
        fences.len() <= grants / tasks,
        "{} part leases for {grants} shared locks: not handed on",
        fences.len()
    );
    no_lease_within_bound(&registry).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shared_holder_has_a_token_of_its_own_above_the_writer_before_it() {
    let prefix = fresh_prefix("kl_test_permits_tokens_").await;
    let (first, second) = (registry(&prefix, 2).await, registry(&prefix, 2).await);
    let write = first.lock("k".to_owned()).await.unwrap();
    let written = write.fencing_token();
    drop(write);
    let one = first.lock_shared("k".to_owned()).await.unwrap();
    let other = second.lock_shared("k".to_owned()).await.unwrap();
    assert_ne!(one.fencing_token(), other.fencing_token());
    assert!(one.fencing_token() > written && other.fencing_token() > written);
    // The capacity is 2: a third reader anywhere waits, and a try is refused.
    assert_eq!(
        second.try_lock_shared("k".to_owned()).await.unwrap_err(),
        TryLockError::WouldBlock
    );
    let highest = one.fencing_token().max(other.fencing_token());
    drop((one, other));
    let write = timeout(BOUND, second.lock("k".to_owned()))
        .await
        .expect("the readers' leases went back")
        .unwrap();
    assert!(write.fencing_token() > highest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_of_the_permits_is_the_whole_key() {
    let prefix = fresh_prefix("kl_test_permits_all_").await;
    let (first, second) = (registry(&prefix, 3).await, registry(&prefix, 3).await);
    let all = first.acquire("k".to_owned(), 3).await.unwrap();
    assert_eq!(
        second.try_acquire("k".to_owned(), 1).await.unwrap_err(),
        TryPermitsError::WouldBlock
    );
    let refused = timeout(
        Duration::from_millis(300),
        second.lock_shared("k".to_owned()),
    )
    .await;
    assert!(
        refused.is_err(),
        "a reader waits while all the permits are held"
    );
    drop(all);
    drop(
        timeout(BOUND, second.acquire("k".to_owned(), 2))
            .await
            .expect("granted once all of them went back")
            .unwrap(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_acquire_leaves_no_lease_and_no_entry() {
    let prefix = fresh_prefix("kl_test_permits_dropped_").await;
    let (holder, waiter) = (registry(&prefix, 2).await, registry(&prefix, 2).await);
    let both = holder.acquire("k".to_owned(), 2).await.unwrap();
    for limit in [0, 1, 5, 50] {
        let gave_up = timeout(
            Duration::from_millis(limit),
            waiter.acquire("k".to_owned(), 1),
        )
        .await;
        assert!(gave_up.is_err(), "the key is held");
    }
    no_lease_within_bound(&waiter).await;
    assert_eq!(waiter.stats().await.unwrap().keys, 0, "no local entry left");
    drop(both);
    // The waiter's refusals wanted the key: its permits come back to it at once.
    drop(
        timeout(BOUND, waiter.acquire("k".to_owned(), 1))
            .await
            .expect("granted after the release")
            .unwrap(),
    );
    no_lease_within_bound(&waiter).await;
    no_lease_within_bound(&holder).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_out_of_range_are_refused_before_anything_is_asked() {
    let prefix = fresh_prefix("kl_test_permits_range_").await;
    let registry = registry(&prefix, 3).await;
    for requested in [0, 4] {
        assert_eq!(
            registry
                .acquire("k".to_owned(), requested)
                .await
                .unwrap_err(),
            PermitsError::OutOfRange {
                requested,
                capacity: 3
            }
        );
        assert_eq!(
            registry
                .try_acquire("k".to_owned(), requested)
                .await
                .unwrap_err(),
            TryPermitsError::OutOfRange {
                requested,
                capacity: 3
            }
        );
    }
    assert_eq!(registry.leases_held(), 0);
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_with_another_capacity_than_the_table_is_refused_at_connect() {
    let prefix = fresh_prefix("kl_test_permits_mismatch_").await;
    let _first = registry(&prefix, 2).await;
    let refused = ClusterRegistry::<String>::builder(database_url())
        .table_prefix(&prefix)
        .capacity(NonZeroU32::new(3).unwrap())
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            ClusterError::CapacityMismatch {
                table_capacity: 2,
                asked: 3,
                ..
            }
        ),
        "{refused:?}"
    );
    let message = refused.to_string();
    assert!(
        message.contains("is 3") && message.contains("has 2"),
        "{message}"
    );
}

#[test]
fn the_blocking_calls_share_permits_from_threads_outside_the_runtime() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let prefix = runtime.block_on(fresh_prefix("kl_test_permits_blocking_"));
    let registry = runtime.block_on(registry(&prefix, 2));
    let threads: Vec<_> = (0..3)
        .map(|thread| {
            let registry = registry.clone();
            std::thread::spawn(move || {
                let guard = if thread == 0 {
                    registry.blocking_lock_shared("k".to_owned()).unwrap()
                } else {
                    registry.blocking_acquire("k".to_owned(), 1).unwrap()
                };
                std::thread::sleep(Duration::from_millis(5));
                guard.fencing_token()
            })
        })
        .collect();
    let mut tokens: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "each holder has its own token");
    let held = registry.blocking_acquire("k".to_owned(), 2).unwrap();
    let tried = std::thread::spawn({
        let registry = registry.clone();
        move || {
            (
                registry.blocking_try_lock_shared("k".to_owned()).map(drop),
                registry.blocking_try_acquire("k".to_owned(), 1).map(drop),
            )
        }
    })
    .join()
    .unwrap();
    assert_eq!(
        tried,
        (
            Err(TryLockError::WouldBlock),
            Err(TryPermitsError::WouldBlock)
        )
    );
    drop(held);
}
