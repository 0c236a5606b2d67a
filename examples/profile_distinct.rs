//! The `distinct` workload for profilers: one task locks and unlocks 300,000 new keys in turn
//! and prints the time per pair. On a current-thread runtime by default (repeatable
//! instruction counts); `--workers N` runs it on a multi-thread runtime with N workers, as the
//! benchmarks do, where the idle worker also wakes up to steal.
//!
//! ```sh
//! cargo build --release --example profile_distinct
//! valgrind --tool=callgrind target/release/examples/profile_distinct   # instructions
//! perf stat target/release/examples/profile_distinct --workers 2       # CPU, kernel share
//! ```

use std::time::Instant;

use keyed_locks::{LockError, LockRegistry};

const PAIRS: u64 = 300_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    match workers_from_args()? {
        None => on_current_thread()?,
        Some(workers) => on_workers(workers)?,
    }
    Ok(())
}

/// The loop in `block_on` itself, as the instruction counts in ARCHITECTURE.md were taken.
fn on_current_thread() -> Result<(), LockError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime builds");
    runtime.block_on(async {
        let registry = LockRegistry::<u64>::spawn();
        let start = Instant::now();
        for key in 0..PAIRS {
            drop(registry.lock(key).await?);
        }
        let per_pair = start.elapsed() / PAIRS as u32;
        println!("{PAIRS} lock/unlock pairs on new keys: {per_pair:?} per pair");
        Ok(())
    })
}

/// The loop in a task of its own, as in the benchmarks (`block_on`'s future is not a worker).
fn on_workers(workers: usize) -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .build()?;
    runtime.block_on(async {
        let registry = LockRegistry::<u64>::spawn();
        let per_pair = tokio::spawn(async move {
            let start = Instant::now();
            for key in 0..PAIRS {
                drop(registry.lock(key).await?);
            }
            Ok::<_, LockError>(start.elapsed() / PAIRS as u32)
        })
        .await??;
        println!(
            "{PAIRS} lock/unlock pairs on new keys: {per_pair:?} per pair ({workers} workers)"
        );
        Ok(())
    })
}

/// `--workers N` as `Some(N)`; no arguments as `None`.
fn workers_from_args() -> Result<Option<usize>, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => Ok(None),
        [flag, workers] if flag == "--workers" => match workers.parse() {
            Ok(workers) if workers > 0 => Ok(Some(workers)),
            _ => Err(format!(
                "--workers takes a positive number, not {workers:?}"
            )),
        },
        _ => Err("usage: profile_distinct [--workers N]".to_owned()),
    }
}
