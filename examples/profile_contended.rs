//! The `spread` and `hot` workloads of the benchmarks as one program, for profilers and for
//! trying changes quickly: 512 tasks on a 2-worker runtime, 600 lock/unlock pairs each, a
//! `yield_now` inside every critical section, over 10,000 keys (or one key with `--hot`).
//! Prints the time per pair. `--actor` builds the registry in actor mode.
//!
//! ```sh
//! cargo run --release --example profile_contended            # spread
//! cargo run --release --example profile_contended -- --hot   # one key
//! cargo run --release --example profile_contended -- --actor
//! ```

use std::sync::Arc;
use std::time::Instant;

use keyed_locks::{Execution, LockError, LockRegistry};

const TASKS: u64 = 512;
const PAIRS_PER_TASK: u64 = 600;
const KEYS: u64 = 10_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut hot, mut execution) = (false, Execution::RunOnCaller);
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--hot" => hot = true,
            "--actor" => execution = Execution::ActorTask,
            _ => return Err("usage: profile_contended [--hot] [--actor]".into()),
        }
    }
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
