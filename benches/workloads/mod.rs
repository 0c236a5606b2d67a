//! The throughput workloads, shared by `peers.rs` (criterion, one contender after
//! the other) and `interleaved.rs` (every contender in turn, round after round).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::contenders::Contender;

/// The throughput workloads, with their shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// One task, sequential lock/unlock pairs, each on a new key.
    Distinct,
    /// Many tasks over many keys, a `yield_now` inside the critical section.
    Spread,
    /// Many tasks on one key, a `yield_now` inside the critical section.
    Hot,
}

impl Workload {
    pub const ALL: [Workload; 3] = [Workload::Distinct, Workload::Spread, Workload::Hot];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Distinct => "distinct",
            Workload::Spread => "spread",
            Workload::Hot => "hot",
        }
    }

    pub fn tasks(self) -> usize {
        match self {
            Workload::Distinct => 1,
            Workload::Spread | Workload::Hot => 512,
        }
    }

    pub fn ops_per_task(self) -> usize {
        match self {
            Workload::Distinct => 300_000,
            Workload::Spread => 600,
            Workload::Hot => 200,
        }
    }

    /// Distinct keys touched per run.
    pub fn keys(self) -> usize {
        match self {
            Workload::Distinct => 300_000,
            Workload::Spread => 10_000,
            Workload::Hot => 1,
        }
    }

    /// Lock/unlock pairs per run: criterion's elements.
    pub fn ops(self) -> u64 {
        (self.tasks() * self.ops_per_task()) as u64
    }

    /// Runs the workload once on the current runtime and returns how long it took. `round`
    /// numbers the run so that `distinct` uses keys never used before.
    pub async fn run<C: Contender>(self, contender: &Arc<C>, round: u64) -> Duration {
        let start = Instant::now();
        let tasks: Vec<_> = (0..self.tasks())
            .map(|task| {
                let contender = Arc::clone(contender);
                tokio::spawn(async move {
                    let mut key_source = KeySource::new(self, round, task);
                    for _ in 0..self.ops_per_task() {
                        let guard = contender.lock(key_source.next_key()).await;
                        if self != Workload::Distinct {
                            tokio::task::yield_now().await;
                        }
                        drop(guard);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("workload task panicked");
        }
        start.elapsed()
    }

    /// After a contender's last run of this workload: warns if it kept any entry (not a
    /// measurement, a sanity check: every contender must be empty after clean runs), then
    /// stops whatever it runs in the background.
    pub fn finish<C: Contender>(self, runtime: &tokio::runtime::Runtime, contender: &C) {
        if let Some(entries) = runtime.block_on(contender.entries())
            && entries != 0
        {
            eprintln!(
                "warning: {} left {entries} entries after {}",
                C::NAME,
                self.name()
            );
        }
        runtime.block_on(contender.close());
    }
}

/// The key sequence of one task: sequential and fresh for `distinct`, a fixed pseudo-random
/// sequence (xorshift, seeded by the task number) for `spread`, always 0 for `hot`.
struct KeySource {
    workload: Workload,
    next_distinct: u64,
    xorshift: u64,
}

impl KeySource {
    fn new(workload: Workload, round: u64, task: usize) -> Self {
        KeySource {
            workload,
            next_distinct: round * workload.ops(),
            xorshift: 0x9E37_79B9_7F4A_7C15 ^ (task as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9),
        }
    }

    fn next_key(&mut self) -> u64 {
        match self.workload {
            Workload::Distinct => {
                self.next_distinct += 1;
                self.next_distinct
            }
            Workload::Spread => {
                self.xorshift ^= self.xorshift << 13;
                self.xorshift ^= self.xorshift >> 7;
                self.xorshift ^= self.xorshift << 17;
                self.xorshift % self.workload.keys() as u64
            }
            Workload::Hot => 0,
        }
    }
}
