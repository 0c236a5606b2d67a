//! Memory and leftovers against the peers: `waiters`, `held` and two cancel storms,
//! measured with a counting global allocator. Every measurement starts once the heap has
//! stopped changing, after the previous contender's memory was freed.
//!
//! Run with `cargo bench --bench memory`. It prints a Markdown table and writes
//! `target/bench-report/memory.json` for `bench_report.rs`.
//!
//! - `waiters`: 100,000 waiters on one held key, measured twice: as 100,000 tokio tasks (heap
//!   bytes per waiting task, the task included; tokio rounds task cells to 128 bytes, and the
//!   floor shows what the task alone costs), and as 100,000 boxed `lock` futures polled once by
//!   one task (heap bytes per waiting future: the future's size plus what the registry keeps
//!   per waiter, without the task's rounding).
//! - `held`: one task holds 500,000 keys at once; heap bytes per held key. The guards sit in a
//!   vector allocated before the count starts; their inline size is reported apart.
//! - `timeout storm`: 10,000 keys are held; one `lock` per key under `tokio::time::timeout`
//!   expires while waiting; then the holders release. Entries left behind.
//! - `abort storm`: the sequence that makes the mutex maps leak (see
//!   `tests/waiter_cancelled_after_release.rs`): 10,000 keys are held, one task per key
//!   queues for it, then for each key the holder releases and the
//!   waiting task is aborted before it runs again. Run on a current-thread runtime so that
//!   "before it runs again" holds for every key.
//!
//! Entries are read with each contender's own count (`stats().keys` for keyed-locks, the map's
//! length for the reference-counted map); keyed-lock has no count, so the allocations still live afterwards are
//! reported for everyone: a leaked entry keeps at least one allocation. keyed-locks' figure
//! includes the grant slots it keeps for reuse (at most 256 per thread, tied to no key).

mod contenders;

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Waker};
use std::time::Duration;

use contenders::{Contender, runtime};

/// Counts the bytes and blocks currently allocated, across all threads.
struct CountingAllocator;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static LIVE_BLOCKS: AtomicUsize = AtomicUsize::new(0);

// Safety: every call is passed unchanged to `System`, which upholds `GlobalAlloc`'s contract;
// the wrapper only updates two atomic counters, which neither allocates nor panics.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // Safety: same layout, same contract as the caller's.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // Safety: same layout, same contract as the caller's.
        let block = unsafe { System.alloc_zeroed(layout) };
        if !block.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // Safety: `block` came from this allocator (so from `System`) with this layout.
        unsafe { System.dealloc(block, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        LIVE_BLOCKS.fetch_sub(1, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Safety: `block` came from this allocator with this layout, as the caller guarantees.
        let moved = unsafe { System.realloc(block, layout, new_size) };
        if !moved.is_null() {
            LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Live heap at one instant.
#[derive(Debug, Clone, Copy)]
struct Heap {
    bytes: usize,
    blocks: usize,
}

impl Heap {
    fn now() -> Self {
        Heap {
            bytes: LIVE_BYTES.load(Ordering::Relaxed),
            blocks: LIVE_BLOCKS.load(Ordering::Relaxed),
        }
    }

    /// Bytes and blocks allocated since `earlier` (negative if freed).
    fn since(self, earlier: Heap) -> (i64, i64) {
        (
            self.bytes as i64 - earlier.bytes as i64,
            self.blocks as i64 - earlier.blocks as i64,
        )
    }
}

const WAITERS: usize = 100_000;
const HELD_KEYS: usize = 500_000;
const STORM_KEYS: usize = 10_000;
const STORM_TIMEOUT: Duration = Duration::from_millis(20);

/// Waits until the live heap stops changing, so that what earlier measurements freed in the
/// background (a registry actor tearing down its table) does not count in the next one.
async fn quiesce() {
    let mut last = Heap::now().bytes;
    let mut stable_samples = 0;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = Heap::now().bytes;
        stable_samples = if now == last { stable_samples + 1 } else { 0 };
        if stable_samples == 5 {
            return;
        }
        last = now;
    }
    eprintln!("note: the heap did not settle before a measurement");
}

/// Lets every task spawned so far run to its first await, then reads the entries, which for
/// keyed-locks also waits until the actor has handled every request sent before.
async fn settle<C: Contender>(contender: &C, polled: &AtomicUsize, expected: usize) {
    while polled.load(Ordering::Acquire) < expected {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    contender.entries().await;
}

/// Warns if a contender that counts its entries kept any after a phase that should leave none.
async fn expect_empty<C: Contender>(contender: &C, phase: &str) {
    if let Some(entries) = contender.entries().await
        && entries != 0
    {
        eprintln!("warning: {} kept {entries} entries after {phase}", C::NAME);
    }
}

/// Heap bytes per task waiting on one held key, the task included.
fn waiting_tasks<C: Contender>(runtime: &tokio::runtime::Runtime) -> f64 {
    runtime.block_on(async {
        let mut tasks = Vec::with_capacity(WAITERS);
        let polled = Arc::new(AtomicUsize::new(0));
        quiesce().await;
        let before = Heap::now();
        let contender = Arc::new(C::new(1));
        let holder = contender.lock(0).await;
        for _ in 0..WAITERS {
            let contender = Arc::clone(&contender);
            let polled = Arc::clone(&polled);
            tasks.push(tokio::spawn(async move {
                // Counted in the same poll that queues the request.
                polled.fetch_add(1, Ordering::Release);
                drop(contender.lock(0).await);
            }));
        }
        settle(&*contender, &polled, WAITERS).await;
        let (bytes, _) = Heap::now().since(before);
        drop(holder);
        for task in tasks {
            task.await.expect("waiter panicked");
        }
        expect_empty(&*contender, "waiting tasks").await;
        contender.close().await;
        bytes as f64 / WAITERS as f64
    })
}

/// Heap bytes per `lock` future waiting on one held key, each boxed and polled once by one
/// task: the future's own size plus what the registry keeps per waiter, without a tokio task.
fn waiting_futures<C: Contender>(runtime: &tokio::runtime::Runtime) -> (f64, usize) {
    runtime.block_on(async {
        // Declared first so that it outlives the futures borrowing it; made after the baseline.
        let contender;
        let mut futures = Vec::with_capacity(WAITERS);
        quiesce().await;
        let before = Heap::now();
        contender = C::new(1);
        let holder = contender.lock(0).await;
        let mut context = Context::from_waker(Waker::noop());
        let future_size = std::mem::size_of_val(&contender.lock(0));
        for _ in 0..WAITERS {
            let mut future = Box::pin(contender.lock(0));
            assert!(future.as_mut().poll(&mut context).is_pending());
            futures.push(future);
        }
        contender.entries().await;
        let (bytes, _) = Heap::now().since(before);
        drop(holder);
        drop(futures);
        expect_empty(&contender, "waiting futures").await;
        contender.close().await;
        (bytes as f64 / WAITERS as f64, future_size)
    })
}

/// Heap bytes per key held, and the guard's inline size.
fn held<C: Contender>(runtime: &tokio::runtime::Runtime) -> (f64, usize) {
    runtime.block_on(async {
        // Declared first so that it outlives the guards borrowing it; made after the baseline.
        let contender;
        let mut guards = Vec::with_capacity(HELD_KEYS);
        quiesce().await;
        let before = Heap::now();
        contender = C::new(HELD_KEYS);
        for key in 0..HELD_KEYS as u64 {
            guards.push(contender.lock(key).await);
        }
        contender.entries().await;
        let (bytes, _) = Heap::now().since(before);
        drop(guards);
        expect_empty(&contender, "held keys").await;
        contender.close().await;
        (
            bytes as f64 / HELD_KEYS as f64,
            std::mem::size_of::<C::Guard<'static>>(),
        )
    })
}

/// What a cancel storm left behind.
#[derive(Debug, Clone, Copy)]
struct Leftovers {
    cancelled: usize,
    entries: Option<usize>,
    blocks: i64,
    bytes: i64,
}

/// What a storm left behind once it is over: entries the contender still counts, and heap
/// since `before`. Closes the contender afterwards.
async fn leftovers<C: Contender>(contender: &C, before: Heap, cancelled: usize) -> Leftovers {
    let entries = contender.entries().await;
    // Give background frees (timer entries, actor work) a moment, as before the baseline.
    quiesce().await;
    let (bytes, blocks) = Heap::now().since(before);
    contender.close().await;
    Leftovers {
        cancelled,
        entries,
        blocks,
        bytes,
    }
}

/// Every key held, one `lock` per key under a timeout that expires while the key is held,
/// then every holder releases.
fn timeout_storm<C: Contender>(runtime: &tokio::runtime::Runtime) -> Leftovers {
    runtime.block_on(async {
        let contender = Arc::new(C::new(STORM_KEYS));
        quiesce().await;
        let before = Heap::now();
        let mut holders = Vec::with_capacity(STORM_KEYS);
        for key in 0..STORM_KEYS as u64 {
            holders.push(contender.lock(key).await);
        }
        let tasks: Vec<_> = (0..STORM_KEYS as u64)
            .map(|key| {
                let contender = Arc::clone(&contender);
                tokio::spawn(async move {
                    tokio::time::timeout(STORM_TIMEOUT, contender.lock(key))
                        .await
                        .is_err()
                })
            })
            .collect();
        let mut cancelled = 0;
        for task in tasks {
            cancelled += usize::from(task.await.expect("storm task panicked"));
        }
        drop(holders);
        leftovers(&*contender, before, cancelled).await
    })
}

/// Every key held and one task queued per key; then, key by key, the holder releases and the
/// queued task is aborted before it can run.
fn abort_storm<C: Contender>() -> Leftovers {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let contender = Arc::new(C::new(STORM_KEYS));
        let polled = Arc::new(AtomicUsize::new(0));
        quiesce().await;
        let before = Heap::now();
        let mut holders = Vec::with_capacity(STORM_KEYS);
        for key in 0..STORM_KEYS as u64 {
            holders.push(contender.lock(key).await);
        }
        let tasks: Vec<_> = (0..STORM_KEYS as u64)
            .map(|key| {
                let contender = Arc::clone(&contender);
                let polled = Arc::clone(&polled);
                tokio::spawn(async move {
                    polled.fetch_add(1, Ordering::Release);
                    drop(contender.lock(key).await);
                })
            })
            .collect();
        settle(&*contender, &polled, STORM_KEYS).await;
        // Nothing else runs on this thread between a release and the abort that follows it.
        for (holder, task) in holders.into_iter().zip(&tasks) {
            drop(holder);
            task.abort();
        }
        let mut cancelled = 0;
        for task in tasks {
            cancelled += usize::from(task.await.is_err_and(|error| error.is_cancelled()));
        }
        leftovers(&*contender, before, cancelled).await
    })
}

/// One contender's results.
#[derive(Debug)]
struct Row {
    name: &'static str,
    waiter_bytes: f64,
    future_bytes: f64,
    /// Inline size of a `lock` future, part of `future_bytes` and `waiter_bytes`.
    future_size: usize,
    held_key_bytes: f64,
    guard_size: usize,
    timeout_storm: Leftovers,
    abort_storm: Leftovers,
}

fn measure<C: Contender>(runtime: &tokio::runtime::Runtime) -> Row {
    eprintln!("measuring {}", C::NAME);
    let waiter_bytes = waiting_tasks::<C>(runtime);
    let (future_bytes, future_size) = waiting_futures::<C>(runtime);
    let (held_key_bytes, guard_size) = held::<C>(runtime);
    Row {
        name: C::NAME,
        waiter_bytes,
        future_bytes,
        future_size,
        held_key_bytes,
        guard_size,
        timeout_storm: timeout_storm::<C>(runtime),
        abort_storm: abort_storm::<C>(),
    }
}

fn entries_cell(entries: Option<usize>) -> String {
    entries.map_or_else(|| "n/a".to_owned(), |entries| entries.to_string())
}

fn markdown(rows: &[Row]) -> String {
    let mut table = String::new();
    table.push_str(
        "| implementation | bytes per waiting task | bytes per waiting future | \
         lock future size | bytes per held key | guard size | timeout storm: entries left | \
         timeout storm: allocations left | abort storm: entries left | \
         abort storm: allocations left |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for row in rows {
        let _ = writeln!(
            table,
            "| {} | {:.0} | {:.0} | {} | {:.0} | {} | {} | {} | {} | {} |",
            row.name,
            row.waiter_bytes,
            row.future_bytes,
            row.future_size,
            row.held_key_bytes,
            row.guard_size,
            entries_cell(row.timeout_storm.entries),
            row.timeout_storm.blocks,
            entries_cell(row.abort_storm.entries),
            row.abort_storm.blocks,
        );
    }
    table
}

fn leftovers_json(leftovers: Leftovers) -> serde_json::Value {
    serde_json::json!({
        "attempts": STORM_KEYS,
        "cancelled": leftovers.cancelled,
        "entries_left": leftovers.entries,
        "allocations_left": leftovers.blocks,
        "bytes_left": leftovers.bytes,
    })
}

fn json(rows: &[Row]) -> serde_json::Value {
    let contenders: Vec<_> = rows
        .iter()
        .map(|row| {
            serde_json::json!({
                "name": row.name,
                "waiter_bytes": row.waiter_bytes,
                "future_bytes": row.future_bytes,
                "future_size": row.future_size,
                "held_key_bytes": row.held_key_bytes,
                "guard_size": row.guard_size,
                "timeout_storm": leftovers_json(row.timeout_storm),
                "abort_storm": leftovers_json(row.abort_storm),
            })
        })
        .collect();
    serde_json::json!({
        "waiters": WAITERS,
        "held_keys": HELD_KEYS,
        "storm_keys": STORM_KEYS,
        "contenders": contenders,
    })
}

/// `$CARGO_TARGET_DIR/bench-report`, or `target/bench-report` in the crate.
fn report_dir() -> std::path::PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("bench-report")
}

fn main() -> std::io::Result<()> {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: skip the run then.
    if !std::env::args().any(|arg| arg == "--bench") {
        return Ok(());
    }
    let runtime = runtime();
    let mut rows = Vec::new();
    for_each_contender!(C => rows.push(measure::<C>(&runtime)));
    let table = markdown(&rows);
    println!("{table}");
    for row in &rows {
        for (storm, leftovers) in [("timeout", row.timeout_storm), ("abort", row.abort_storm)] {
            if leftovers.cancelled != STORM_KEYS {
                eprintln!(
                    "note: {} {storm} storm cancelled {} of {STORM_KEYS} attempts",
                    row.name, leftovers.cancelled
                );
            }
        }
    }
    let dir = report_dir();
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("memory.md"), &table)?;
    let path = dir.join("memory.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json(&rows))?)?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
