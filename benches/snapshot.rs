//! What a snapshot costs, and what it costs the locks it watches.
//!
//! - `snapshot`: a registry (one shard, the default mode) with 10,000 or 1,000,000 keys held,
//!   one snapshot of every key (`snapshot()`) and of the 10 most contended
//!   (`snapshot_top(10)`). In the default mode the call runs the shard's step itself, so its
//!   time is the time the shard is held, plus the merge of one shard's list after it lets go.
//! - `table`: the same views built by the shard's table alone (`LockTable::snapshot`, what the
//!   step runs while it holds the shard), without the runtime around it.
//! - `contended`: two tasks on two workers take turns at one key (lock, yield, unlock), with
//!   10,000 other keys held; alone, and while a third task takes `snapshot_top(10)` in a loop.
//!   The time per lock/unlock pair shows what the snapshots' pauses cost a lock under
//!   contention.
//!
//! Run with `cargo bench --bench snapshot`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use keyed_locks::table::{Acquired, LockTable};
use keyed_locks::{KeyGuard, LockRegistry};

/// Lock/unlock pairs of each task per measured iteration of `contended`.
const PAIRS: u64 = 2_000;
/// Keys held beside the contended one.
const BYSTANDERS: u64 = 10_000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A registry with keys `0..held` held, and their guards.
fn holding(
    runtime: &tokio::runtime::Runtime,
    held: u64,
) -> (LockRegistry<u64>, Vec<KeyGuard<u64>>) {
    runtime.block_on(async {
        let registry = LockRegistry::spawn();
        let mut guards = Vec::with_capacity(held as usize);
        for key in 0..held {
            guards.push(registry.lock(key).await.expect("a fresh registry"));
        }
        (registry, guards)
    })
}

/// A lock table with keys `0..held` held.
fn table_holding(held: u64) -> LockTable<u64, ()> {
    let mut table = LockTable::new();
    for key in 0..held {
        assert!(matches!(table.acquire(key, ()), Acquired::Granted(_)));
    }
    table
}

fn tables(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("table");
    group.sample_size(10).warm_up_time(Duration::from_secs(1));
    for held in [10_000u64, 1_000_000] {
        let mut table = table_holding(held);
        let mut now = Duration::ZERO;
        let mut view = |limit| {
            now += Duration::from_millis(1);
            table.snapshot(now, limit)
        };
        group.throughput(Throughput::Elements(held));
        group.bench_with_input(BenchmarkId::new("all", held), &held, |bench, _| {
            bench.iter(|| view(None));
        });
        group.bench_with_input(BenchmarkId::new("top 10", held), &held, |bench, _| {
            bench.iter(|| view(Some(10)));
        });
    }
    group.finish();
}

fn snapshots(criterion: &mut Criterion, runtime: &tokio::runtime::Runtime) {
    let mut group = criterion.benchmark_group("snapshot");
    group.sample_size(10).warm_up_time(Duration::from_secs(1));
    for held in [10_000u64, 1_000_000] {
        let (registry, guards) = holding(runtime, held);
        group.throughput(Throughput::Elements(held));
        group.bench_with_input(BenchmarkId::new("all", held), &held, |bench, _| {
            bench.iter(|| runtime.block_on(registry.snapshot()).expect("open"));
        });
        group.bench_with_input(BenchmarkId::new("top 10", held), &held, |bench, _| {
            bench.iter(|| runtime.block_on(registry.snapshot_top(10)).expect("open"));
        });
        drop(guards);
        runtime.block_on(registry.shutdown());
    }
    group.finish();
}

/// Two tasks take turns at key `u64::MAX` for `PAIRS` pairs each; returns the time taken.
async fn two_tasks_on_one_key(registry: &LockRegistry<u64>) -> Duration {
    let started = Instant::now();
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let registry = registry.clone();
            tokio::spawn(async move {
                for _ in 0..PAIRS {
                    let guard = registry.lock(u64::MAX).await.expect("open");
                    tokio::task::yield_now().await;
                    drop(guard);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a task of the benchmark panicked");
    }
    started.elapsed()
}

fn contended(criterion: &mut Criterion, runtime: &tokio::runtime::Runtime) {
    let mut group = criterion.benchmark_group("contended");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(2 * PAIRS));
    let (registry, guards) = holding(runtime, BYSTANDERS);
    group.bench_function("alone", |bench| {
        bench.iter_custom(|iterations| {
            let mut total = Duration::ZERO;
            for _ in 0..iterations {
                total += runtime.block_on(two_tasks_on_one_key(&registry));
            }
            total
        });
    });
    group.bench_function("while snapshot_top(10) loops", |bench| {
        bench.iter_custom(|iterations| {
            let stop = Arc::new(AtomicBool::new(false));
            let watcher = {
                let (registry, stop) = (registry.clone(), Arc::clone(&stop));
                runtime.spawn(async move {
                    let mut taken = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        registry.snapshot_top(10).await.expect("open");
                        taken += 1;
                        tokio::task::yield_now().await;
                    }
                    taken
                })
            };
            let mut total = Duration::ZERO;
            for _ in 0..iterations {
                total += runtime.block_on(two_tasks_on_one_key(&registry));
            }
            stop.store(true, Ordering::Relaxed);
            let taken = runtime.block_on(watcher).expect("the watcher panicked");
            assert!(taken > 0, "no snapshot was taken");
            total
        });
    });
    group.finish();
    drop(guards);
    runtime.block_on(registry.shutdown());
}

fn main() {
    let runtime = runtime();
    let mut criterion = Criterion::default().configure_from_args();
    tables(&mut criterion);
    snapshots(&mut criterion, &runtime);
    contended(&mut criterion, &runtime);
    criterion.final_summary();
}
