//! The `spread` and `hot` workloads of the benchmarks as one program, for profilers and for
//! trying changes quickly: 512 tasks on a 2-worker runtime (`--workers N`), 600 lock/unlock
//! pairs each, a `yield_now` inside every critical section, over 10,000 keys (or one key with
//! `--hot`).
//! Prints the time per pair, and the round trip of a cache line between the two cores just
//! before and just after the run (`placement/mod.rs`): on a VM whose host moves its cores
//! about, a run with them far apart takes about twice as long, whoever runs it. `--actor`
//! builds the registry in actor mode; `--contender NAME` runs the same tasks on any contender
//! of the benchmarks (`benches/contenders/`, the registry included), so that a profile of ours
//! can be set beside one of the single-owner stand-in, say.
//!
//! ```sh
//! cargo bench --bench profile_contended                 # spread
//! cargo bench --bench profile_contended -- --hot        # one key
//! cargo bench --bench profile_contended -- --actor
//! cargo bench --bench profile_contended -- --contender single-owner-stand-in
//! cargo bench --bench profile_contended -- --workers 1   # no second core, no lock contention
//! cargo bench --no-run --bench profile_contended        # build only; prints the binary's path
//! ```

mod command_line;
// Shared with the other benchmarks, which use the rest of it.
#[allow(dead_code)]
mod contenders;
mod placement;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use contenders::Contender;
use placement::Placement;

const TASKS: u64 = 512;
const PAIRS_PER_TASK: u64 = 600;
const KEYS: u64 = 10_000;

/// The `spread` and `hot` workloads of the benchmarks as one program: 512 tasks on a runtime of
/// 2 workers (or `--workers N`), 600 lock/unlock pairs each, a `yield_now` inside every
/// critical section, over 10,000 keys. Prints the time per pair.
#[derive(Debug, Parser)]
#[command(args_override_self = true)]
struct Cli {
    /// Lock one key instead of 10,000 (the `hot` workload)
    #[arg(long)]
    hot: bool,
    /// Worker threads of the runtime; 1 takes the other core's caches and the shard's lock
    /// contention out of the figure
    #[arg(long, value_name = "N", default_value = "2")]
    workers: NonZeroUsize,
    /// Build the registry in actor mode (`Execution::ActorTask`)
    #[arg(long, conflicts_with = "contender")]
    actor: bool,
    /// Run the tasks on this contender of the benchmarks instead of the default registry
    /// (`keyed-locks-8-shards`, `single-owner-stand-in`, `single-owner-owned`, `lockable`,
    /// `keyed-lock`, `key-mutex`, `refcount-map`, `naive-actor`, `floor`, ...)
    #[arg(long, value_name = "NAME")]
    contender: Option<String>,
    #[command(flatten)]
    runner: command_line::Runner,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Cli {
        hot,
        workers,
        actor,
        contender,
        runner,
    } = command_line::parse();
    if !runner.picks_this_program() {
        return Ok(());
    }
    let name = match (contender, actor) {
        (Some(name), _) => name,
        (None, true) => contenders::OursActorMode::NAME.to_owned(),
        (None, false) => contenders::Ours::NAME.to_owned(),
    };
    let mut found = false;
    for_each_contender!(C => {
        if C::NAME == name {
            found = true;
            run::<C>(hot, workers)?;
        }
    });
    if found {
        Ok(())
    } else {
        Err(format!("no contender is named {name:?}").into())
    }
}

/// The keys one task locks in turn: xorshift, seeded by the task number, as the benchmarks'
/// `spread` does; always key 0 for `hot`.
struct Keys {
    state: u64,
    hot: bool,
}

impl Keys {
    fn for_task(task: u64, hot: bool) -> Self {
        Keys {
            state: task.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            hot,
        }
    }

    fn next_key(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        if self.hot { 0 } else { self.state % KEYS }
    }
}

/// The tasks on contender `C`, on a runtime of `workers` workers; prints the time per pair and
/// fails if the contender keeps an entry afterwards.
fn run<C: Contender>(hot: bool, workers: NonZeroUsize) -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.get())
        .enable_all()
        .build()?;
    // With the runtime's workers idle, so that the probe's two threads have the two cores.
    let before = placement::round_trip();
    let (per_pair, left) = runtime.block_on(async {
        let contender = Arc::new(C::new(KEYS as usize));
        let start = Instant::now();
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let contender = Arc::clone(&contender);
                tokio::spawn(async move {
                    let mut keys = Keys::for_task(task, hot);
                    for _ in 0..PAIRS_PER_TASK {
                        let guard = contender.lock(keys.next_key()).await;
                        tokio::task::yield_now().await;
                        drop(guard);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await?;
        }
        let per_pair = start.elapsed() / (TASKS * PAIRS_PER_TASK) as u32;
        let left = contender.entries().await;
        contender.close().await;
        Ok::<_, Box<dyn std::error::Error>>((per_pair, left))
    })?;
    let after = placement::round_trip();
    let workload = if hot { "one key" } else { "10,000 keys" };
    println!(
        "{TASKS} tasks x {PAIRS_PER_TASK} pairs over {workload}: {per_pair:?} per pair ({}, workers: {workers}); \
         the cores' round trip {} ns before, {} ns after: {}",
        C::NAME,
        before.as_nanos(),
        after.as_nanos(),
        Placement::of(before, after).name()
    );
    match left {
        Some(0) | None => Ok(()),
        Some(left) => Err(format!("{} left {left} entries behind", C::NAME).into()),
    }
}
