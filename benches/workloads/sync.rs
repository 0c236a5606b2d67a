//! The `sync` workload: 4 std threads, no async anywhere, each taking keys of its own and
//! keys the threads share, through blocking calls. Only `interleaved.rs` runs it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::blocking_contenders::BlockingContender;

/// The workload's name in tables and in `interleaved.json`.
pub const NAME: &str = "sync";
/// What it does, for tables.
pub const SHAPE: &str = "4 threads × 50,000, half on 4 shared keys, half a new key each";
/// Threads taking keys at once.
pub const THREADS: usize = 4;
/// Lock/unlock pairs per thread.
pub const OPS_PER_THREAD: usize = 50_000;
/// The keys every thread takes now and then.
pub const SHARED_KEYS: u64 = 4;

/// Lock/unlock pairs per run.
pub fn ops() -> u64 {
    (THREADS * OPS_PER_THREAD) as u64
}

/// Runs the workload once from plain threads and returns how long it took. `round` numbers
/// the run so that the threads' own keys are never used before.
pub fn run<C: BlockingContender>(contender: &Arc<C>, round: u64) -> Duration {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let contender = Arc::clone(contender);
            scope.spawn(move || {
                // The first of this thread's fresh keys, above every shared key.
                let mut fresh = SHARED_KEYS + (round * THREADS as u64 + thread as u64) * ops();
                let mut xorshift =
                    0x9E37_79B9_7F4A_7C15 ^ (thread as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                for _ in 0..OPS_PER_THREAD {
                    xorshift ^= xorshift << 13;
                    xorshift ^= xorshift >> 7;
                    xorshift ^= xorshift << 17;
                    let key = if xorshift & 1 == 0 {
                        (xorshift >> 1) % SHARED_KEYS
                    } else {
                        fresh += 1;
                        fresh
                    };
                    drop(std::hint::black_box(contender.lock(key)));
                }
            });
        }
    });
    start.elapsed()
}
