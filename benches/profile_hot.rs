//! The `hot` workload for profilers: 512 tasks take one key 200 times each, with a
//! `yield_now` inside, on a multi-thread runtime of 2 workers (as `cargo bench --bench
//! interleaved` runs it), 10 runs; prints the time per pair. `--actor` builds the registry in
//! actor mode (`Execution::ActorTask`).
//!
//! ```sh
//! cargo bench --bench profile_hot -- --actor      # run by cargo, built with `--release`
//! cargo bench --no-run --bench profile_hot        # build only; prints the binary's path
//! binary="$(cargo bench --no-run --bench profile_hot --message-format=json |
//!   sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')"
//! perf record -e cpu-clock -g "$binary"           # where the time goes
//! strace -f -c -e trace=futex "$binary"           # threads parked and woken
//! ```

mod command_line;

use std::time::{Duration, Instant};

use clap::Parser;
use keyed_locks::{Execution, LockRegistry};

const TASKS: u64 = 512;
const PAIRS_PER_TASK: u64 = 200;
const RUNS: u32 = 10;

/// The `hot` workload for profilers: 512 tasks take one key 200 times each, with a `yield_now`
/// inside, on a multi-thread runtime of 2 workers, 10 runs; prints the time per pair.
#[derive(Debug, Parser)]
#[command(args_override_self = true)]
struct Cli {
    /// Build the registry in actor mode (`Execution::ActorTask`)
    #[arg(long)]
    actor: bool,
    #[command(flatten)]
    runner: command_line::Runner,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli: Cli = command_line::parse();
    if !cli.runner.picks_this_program() {
        return Ok(());
    }
    let execution = if cli.actor {
        Execution::ActorTask
    } else {
        Execution::RunOnCaller
    };
    // With tokio's drivers, as the benchmarks' runtime has them: a worker with nothing to do
    // parks on the driver, and `yield_now` polls it.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let per_pair = runtime.block_on(async {
        let registry = LockRegistry::<u64>::builder().execution(execution).spawn();
        let mut total = Duration::ZERO;
        for _ in 0..RUNS {
            let start = Instant::now();
            let tasks: Vec<_> = (0..TASKS)
                .map(|_| {
                    let registry = registry.clone();
                    tokio::spawn(async move {
                        for _ in 0..PAIRS_PER_TASK {
                            let guard = registry.lock(0).await?;
                            tokio::task::yield_now().await;
                            drop(guard);
                        }
                        Ok::<_, keyed_locks::LockError>(())
                    })
                })
                .collect();
            for task in tasks {
                task.await??;
            }
            total += start.elapsed();
        }
        Ok::<_, Box<dyn std::error::Error>>(total / (RUNS * (TASKS * PAIRS_PER_TASK) as u32))
    })?;
    println!(
        "{} lock/unlock pairs on one key, {TASKS} tasks: {per_pair:?} per pair",
        u64::from(RUNS) * TASKS * PAIRS_PER_TASK
    );
    Ok(())
}
