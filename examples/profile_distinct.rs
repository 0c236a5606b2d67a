//! The `distinct` workload on a current-thread runtime, for profilers: one task locks and
//! unlocks 300,000 new keys in turn and prints the time per pair.
//!
//! ```sh
//! cargo build --release --example profile_distinct
//! valgrind --tool=callgrind target/release/examples/profile_distinct   # instructions
//! ```

use std::time::Instant;

use keyed_locks::{LockError, LockRegistry};

const PAIRS: u64 = 300_000;

fn main() -> Result<(), LockError> {
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
