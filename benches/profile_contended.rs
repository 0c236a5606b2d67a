//! The `spread` and `hot` workloads of the benchmarks as one program, for profilers and for
//! trying changes quickly: 512 tasks on a 2-worker runtime, 600 lock/unlock pairs each, a
//! `yield_now` inside every critical section, over 10,000 keys (or one key with `--hot`).
//! Prints the time per pair. `--actor` builds the registry in actor mode.
//!
//! ```sh
//! cargo bench --bench profile_contended                 # spread
//! cargo bench --bench profile_contended -- --hot        # one key
//! cargo bench --bench profile_contended -- --actor
//! cargo bench --no-run --bench profile_contended        # build only; prints the binary's path
//! ```

mod command_line;

use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use keyed_locks::{Execution, LockError, LockRegistry};

const TASKS: u64 = 512;
const PAIRS_PER_TASK: u64 = 600;
const KEYS: u64 = 10_000;

/// The `spread` and `hot` workloads of the benchmarks as one program: 512 tasks on a 2-worker
/// runtime, 600 lock/unlock pairs each, a `yield_now` inside every critical section, over
/// 10,000 keys. Prints the time per pair.
#[derive(Debug, Parser)]
#[command(args_override_self = true)]
struct Cli {
    /// Lock one key instead of 10,000 (the `hot` workload)
    #[arg(long)]
    hot: bool,
    /// Build the registry in actor mode (`Execution::ActorTask`)
    #[arg(long)]
    actor: bool,
    #[command(flatten)]
    runner: command_line::Runner,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Cli { hot, actor, runner } = command_line::parse();
    if !runner.picks_this_program() {
        return Ok(());
    }
    let execution = if actor {
        Execution::ActorTask
    } else {
        Execution::RunOnCaller
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()?;
    let per_pair = runtime.block_on(async {
        let registry = Arc::new(LockRegistry::<u64>::builder().execution(execution).spawn());
        let start = Instant::now();
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let registry = Arc::clone(&registry);
                tokio::spawn(async move {
                    // xorshift, seeded by the task number, as the benchmarks' `spread` does.
                    let mut state = task.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                    for _ in 0..PAIRS_PER_TASK {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        let key = if hot { 0 } else { state % KEYS };
                        let guard = registry.lock(key).await?;
                        tokio::task::yield_now().await;
                        drop(guard);
                    }
                    Ok::<_, LockError>(())
                })
            })
            .collect();
        for task in tasks {
            task.await??;
        }
        Ok::<_, Box<dyn std::error::Error>>(start.elapsed() / (TASKS * PAIRS_PER_TASK) as u32)
    })?;
    let workload = if hot { "one key" } else { "10,000 keys" };
    println!("{TASKS} tasks x {PAIRS_PER_TASK} pairs over {workload}: {per_pair:?} per pair");
    Ok(())
}
