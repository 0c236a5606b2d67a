//! The `hot` workload for profilers: 512 tasks take one key 200 times each, with a
//! `yield_now` inside, on a multi-thread runtime of 2 workers (as `cargo bench --bench
//! interleaved` runs it), 10 runs; prints the time per pair. `--actor` builds the registry in
//! actor mode (`Execution::ActorTask`).
//!
//! ```sh
//! cargo build --release --example profile_hot
//! perf record -e cpu-clock -g target/release/examples/profile_hot   # where the time goes
//! strace -f -c -e trace=futex target/release/examples/profile_hot   # threads parked and woken
//! ```

use std::time::{Duration, Instant};

use keyed_locks::{Execution, LockRegistry};

const TASKS: u64 = 512;
const PAIRS_PER_TASK: u64 = 200;
const RUNS: u32 = 10;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let execution = match std::env::args().nth(1).as_deref() {
        None => Execution::RunOnCaller,
        Some("--actor") => Execution::ActorTask,
        Some(_) => return Err("usage: profile_hot [--actor]".into()),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
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
