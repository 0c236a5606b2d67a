//! The `distinct` workload for profilers: one task locks and unlocks 300,000 new keys in turn
//! and prints the time per pair. On a current-thread runtime by default (repeatable
//! instruction counts); `--workers N` runs it on a multi-thread runtime with N workers, as the
//! benchmarks do, where the idle worker also wakes up to steal. `--actor` builds the registry
//! in actor mode (`Execution::ActorTask`).
//!
//! ```sh
//! cargo build --release --example profile_distinct
//! valgrind --tool=callgrind target/release/examples/profile_distinct   # instructions
//! valgrind --tool=callgrind target/release/examples/profile_distinct --actor
//! perf stat target/release/examples/profile_distinct --workers 2       # CPU, kernel share
//! ```

use std::time::Instant;

use keyed_locks::{Execution, LockError, LockRegistry};

const PAIRS: u64 = 300_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Options { workers, execution } = options_from_args()?;
    match workers {
        None => on_current_thread(execution)?,
        Some(workers) => on_workers(workers, execution)?,
    }
    Ok(())
}

fn registry(execution: Execution) -> LockRegistry<u64> {
    LockRegistry::builder().execution(execution).spawn()
}

/// The loop in `block_on` itself, as the instruction counts in `docs/performance-log.md` were
/// taken.
fn on_current_thread(execution: Execution) -> Result<(), LockError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime builds");
    runtime.block_on(async {
        let registry = registry(execution);
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
fn on_workers(workers: usize, execution: Execution) -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .build()?;
    runtime.block_on(async {
        let registry = registry(execution);
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

struct Options {
    /// `--workers N`: a multi-thread runtime with N workers; a current-thread one if `None`.
    workers: Option<usize>,
    /// `--actor`: actor mode.
    execution: Execution,
}

fn options_from_args() -> Result<Options, String> {
    const USAGE: &str = "usage: profile_distinct [--workers N] [--actor]";
    let mut options = Options {
        workers: None,
        execution: Execution::RunOnCaller,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--actor" => options.execution = Execution::ActorTask,
            "--workers" => match args.next().map(|workers| workers.parse()) {
                Some(Ok(workers)) if workers > 0 => options.workers = Some(workers),
                _ => return Err(format!("--workers takes a positive number; {USAGE}")),
            },
            _ => return Err(USAGE.to_owned()),
        }
    }
    Ok(options)
}
