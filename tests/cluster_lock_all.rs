//! `ClusterRegistry::lock_all` takes a set of keys across processes, all of them or none:
//! processes naming the keys in opposite orders never deadlock, a set holds none of its keys
//! while it waits, each key has a token of its own, and a dropped or tried set leaves nothing
//! behind. Several registries on one table stand for several processes, against the real
//! server; three `cluster_transfer` examples run as processes.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use keyed_locks::{ClusterRegistry, TryLockError};
use tokio::process::Command;
use tokio::time::{Instant, sleep, timeout};

use crate::cluster_registry::{database_url, fresh_prefix};
use crate::example_binary::example_binary;

/// Generous: the machine is small and shared, and the server is real.
const BOUND: Duration = Duration::from_secs(20);

async fn registry(prefix: &str) -> ClusterRegistry<String> {
    ClusterRegistry::builder(database_url())
        .table_prefix(prefix)
        .lease(Duration::from_secs(30))
        .connect()
        .await
        .expect("connects to the test server")
}

fn keys(names: &[&str]) -> Vec<String> {
    names.iter().map(|&name| name.to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_naming_keys_in_opposite_orders_never_deadlock() {
    let prefix = fresh_prefix("kl_test_all_orders_").await;
    // A balance per key, moved under lock_all; the sum must stay 0.
    let balances: Arc<[AtomicI64; 2]> = Arc::new([AtomicI64::new(0), AtomicI64::new(0)]);
    let mut tasks = Vec::new();
    for process in 0..3 {
        let registry = registry(&prefix).await;
        for task in 0..2 {
            let (registry, balances) = (registry.clone(), Arc::clone(&balances));
            let order = if (process + task) % 2 == 0 {
                ["a", "b"]
            } else {
                ["b", "a"]
            };
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let both = registry.lock_all(keys(&order)).await.unwrap();
                    assert_eq!(both.len(), 2);
                    let a = balances[0].load(Ordering::SeqCst);
                    sleep(Duration::from_millis(1)).await;
                    balances[0].store(a - 1, Ordering::SeqCst);
                    let b = balances[1].load(Ordering::SeqCst);
                    balances[1].store(b + 1, Ordering::SeqCst);
                    drop(both);
                }
            }));
        }
    }
    for task in tasks {
        timeout(BOUND * 3, task)
            .await
            .expect("no deadlock")
            .expect("no task panicked");
    }
    let moved: i64 = balances.iter().map(|b| b.load(Ordering::SeqCst)).sum();
    assert_eq!(moved, 0, "every move was made under both keys");
    assert_eq!(balances[1].load(Ordering::SeqCst), 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_set_holds_none_of_its_keys() {
    let prefix = fresh_prefix("kl_test_all_none_").await;
    let (holder, sets, other) = (
        registry(&prefix).await,
        registry(&prefix).await,
        registry(&prefix).await,
    );
    let b = holder.lock("b".to_owned()).await.unwrap();
    let waiting = tokio::spawn({
        let sets = sets.clone();
        async move {
            sets.lock_all(keys(&["a", "b"]))
                .await
                .map(|both| both.len())
        }
    });
    sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "b is held");
    assert_eq!(sets.leases_held(), 0, "the waiting set holds no lease");
    // "a" is free for another process: the set holds none of it while it waits.
    drop(
        timeout(BOUND, other.lock("a".to_owned()))
            .await
            .expect("a is free")
            .unwrap(),
    );
    let first = b.fencing_token();
    drop(b);
    assert_eq!(
        timeout(BOUND, waiting).await.expect("granted").unwrap(),
        Ok(2)
    );
    let both = sets.lock_all(keys(&["b", "a"])).await.unwrap();
    assert!(both.fencing_token(&"b".to_owned()) > Some(first));
    assert_ne!(
        both.fencing_token(&"a".to_owned()),
        both.fencing_token(&"b".to_owned())
    );
    assert_eq!(both.fencing_token(&"c".to_owned()), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tried_or_dropped_set_leaves_nothing_behind() {
    let prefix = fresh_prefix("kl_test_all_try_").await;
    let (holder, sets) = (registry(&prefix).await, registry(&prefix).await);
    let b = holder.lock("b".to_owned()).await.unwrap();
    assert_eq!(
        sets.try_lock_all(keys(&["a", "b"])).await.unwrap_err(),
        TryLockError::WouldBlock
    );
    for limit in [0, 1, 20] {
        let gave_up = timeout(
            Duration::from_millis(limit),
            sets.lock_all(keys(&["a", "b"])),
        )
        .await;
        assert!(gave_up.is_err(), "b is held");
    }
    let started = Instant::now();
    while sets.leases_held() > 0 {
        assert!(started.elapsed() < BOUND, "a lease is still held");
        sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(sets.stats().await.unwrap().keys, 0, "no local entry left");
    drop(b);
    let both = timeout(BOUND, sets.lock_all(keys(&["a", "b"])))
        .await
        .expect("granted once b is released")
        .unwrap();
    assert_eq!(both.len(), 2);
    drop(both);
    let started = Instant::now();
    let both = loop {
        match sets.try_lock_all(keys(&["b", "a", "b"])).await {
            Ok(both) => break both,
            Err(TryLockError::WouldBlock) => {
                assert!(started.elapsed() < BOUND, "never free for a try");
                sleep(Duration::from_millis(10)).await;
            }
            Err(closed) => panic!("{closed}"),
        }
    };
    assert_eq!(both.len(), 2, "duplicates count once");
    assert!(
        sets.lock_all(Vec::<String>::new())
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_transfer_processes_conserve_the_total() {
    let url = database_url();
    let prefix = fresh_prefix("kl_test_transfer_").await;
    let binary = example_binary("cluster_transfer", " --features postgres");
    let processes: Vec<_> = (0..3)
        .map(|_| {
            Command::new(&binary)
                .args(["--database-url", &url, "--prefix", &prefix])
                .args(["--accounts", "4", "--transfers", "25"])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .expect("the transfer example starts")
        })
        .collect();
    let mut totals = Vec::new();
    for process in processes {
        let output = timeout(Duration::from_secs(90), process.wait_with_output())
            .await
            .expect("the run finishes in time")
            .unwrap();
        let printed = String::from_utf8(output.stdout).unwrap();
        assert!(output.status.success(), "{}: {printed}", output.status);
        let mut lines = printed.lines();
        assert_eq!(lines.next(), Some("transfers: 25"), "{printed}");
        totals.extend(lines.map(str::to_owned));
    }
    assert_eq!(totals, ["total conserved: 400"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_learns_its_leases_are_lost_when_the_registry_shuts_down() {
    let prefix = fresh_prefix("kl_test_all_lost_").await;
    let registry = registry(&prefix).await;
    let both = registry.lock_all(keys(&["a", "b"])).await.unwrap();
    assert!(!both.is_lost());
    let still_held = timeout(Duration::from_millis(100), both.lost()).await;
    assert!(
        still_held.is_err(),
        "lost() completed while every lease was live"
    );
    registry.shutdown().await;
    assert!(both.is_lost());
    timeout(BOUND, both.lost())
        .await
        .expect("lost() completes once the leases are given back");
}
