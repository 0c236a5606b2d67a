//! The `distinct` workload for profilers: one task locks and unlocks 300,000 new keys in turn
//! and prints the time per pair. On a current-thread runtime by default (repeatable
//! instruction counts); `--workers N` runs it on a multi-thread runtime with N workers, as the
//! benchmarks do, where the idle worker also wakes up to steal. `--actor` builds the registry
//! in actor mode (`Execution::ActorTask`). `--contender NAME` runs the same loop on another
//! contender of the benchmarks (`benches/contenders/`), so that, for instance, the single-owner
//! stand-in's instructions per pair can be set beside ours from one command.
//!
//! ```sh
//! cargo bench --bench profile_distinct                  # run by cargo, built with `--release`
//! cargo bench --bench profile_distinct -- --workers 2 --actor
//! cargo bench --no-run --bench profile_distinct         # build only; prints the binary's path
//! binary="$(cargo bench --no-run --bench profile_distinct --message-format=json |
//!   sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')"
//! valgrind --tool=callgrind "$binary"                   # instructions
//! valgrind --tool=callgrind "$binary" --actor
//! perf stat "$binary" --workers 2                       # CPU, kernel share
//! valgrind --tool=callgrind "$binary" --contender single-owner-stand-in
//! "$binary" --workers 2 --contender single-owner-stand-in --budget   # as if it took the budget
//! "$binary" --workers 2 --contender single-owner-owned   # owned guard and budget
//! ```

mod command_line;
// Shared with the other benchmarks, which use the rest of it (their runtime, for one).
#[allow(dead_code)]
mod contenders;

use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use contenders::Contender;
use keyed_locks::{Execution, LockError, LockRegistry};

const PAIRS: u64 = 300_000;

/// The `distinct` workload for profilers: one task locks and unlocks 300,000 new keys in turn
/// and prints the time per pair.
#[derive(Debug, Parser)]
#[command(args_override_self = true)]
struct Cli {
    /// Run on a multi-thread runtime with N workers, as the benchmarks do [default: a
    /// current-thread runtime, for repeatable instruction counts]
    #[arg(long, value_name = "N", value_parser = positive)]
    workers: Option<usize>,
    /// Build the registry in actor mode (`Execution::ActorTask`)
    #[arg(long, conflicts_with = "contender")]
    actor: bool,
    /// Run the loop on this contender of the benchmarks instead of the registry
    /// (`single-owner-stand-in`, `single-owner-owned`, `lockable`, `keyed-lock`, `key-mutex`,
    /// `refcount-map`, `naive-actor`, `floor`)
    #[arg(long, value_name = "NAME")]
    contender: Option<String>,
    /// With `--contender`: take one unit of the task's tokio budget after each lock, as our
    /// registry and tokio's `Mutex` do (a contender that takes none never yields in this loop;
    /// `single-owner-owned` takes its own, so with this flag it takes two)
    #[arg(long, requires = "contender")]
    budget: bool,
    #[command(flatten)]
    runner: command_line::Runner,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli: Cli = command_line::parse();
    if !cli.runner.picks_this_program() {
        return Ok(());
    }
    if let Some(name) = &cli.contender {
        return on_contender(name, cli.workers, cli.budget);
    }
    let execution = if cli.actor {
        Execution::ActorTask
    } else {
        Execution::RunOnCaller
    };
    match cli.workers {
        None => on_current_thread(execution)?,
        Some(workers) => on_workers(workers, execution)?,
    }
    Ok(())
}

fn registry(execution: Execution) -> LockRegistry<u64> {
    LockRegistry::builder().execution(execution).spawn()
}

/// The loop in `block_on` itself, for repeatable instruction counts. Every runtime here enables
/// tokio's drivers, as the contenders' (`run_contender`) and the benchmarks' do: without them a
/// worker parks on a condition variable instead of the driver, and the budget's yields cost
/// something else, so ours would not be measured under the same conditions as the others.
fn on_current_thread(execution: Execution) -> Result<(), LockError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
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
        .enable_all()
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

/// The same loop on the contender named `name`: on a current-thread runtime, or in a task of
/// its own on `workers` workers.
fn on_contender(
    name: &str,
    workers: Option<usize>,
    budget: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut found = false;
    // Every contender but ours, which run through the code above: a second caller of the
    // registry's lock in this program would change how it is inlined, and so the instruction
    // counts that earlier measurements are compared with.
    for_each_contender!(@each C => {
        if C::NAME == name {
            found = true;
            run_contender::<C>(workers, budget)?;
        }
    }; LockablePeer, KeyedLockPeer, KeyMutexPeer, RefCountMap, NaiveActor, SingleOwner, SingleOwnerOwned, Floor);
    if found {
        Ok(())
    } else {
        Err(format!("no contender is named {name:?}").into())
    }
}

fn run_contender<C: Contender>(
    workers: Option<usize>,
    budget: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let runtime = match workers {
        None => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        Some(workers) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()?,
    };
    runtime.block_on(async {
        let contender = Arc::new(C::new(PAIRS as usize));
        let pairs = {
            let contender = Arc::clone(&contender);
            async move {
                let start = Instant::now();
                for key in 0..PAIRS {
                    drop(contender.lock(key).await);
                    if budget {
                        tokio::task::coop::consume_budget().await;
                    }
                }
                start.elapsed() / PAIRS as u32
            }
        };
        // On workers, the loop runs in a task of its own, as in the benchmarks.
        let per_pair = match workers {
            None => pairs.await,
            Some(_) => tokio::spawn(pairs).await?,
        };
        let left = contender.entries().await;
        contender.close().await;
        let mut on = workers.map_or(String::new(), |workers| format!(", {workers} workers"));
        if budget {
            on.push_str(", a unit of budget per lock");
        }
        println!(
            "{PAIRS} lock/unlock pairs on new keys: {per_pair:?} per pair ({name}{on})",
            name = C::NAME
        );
        match left {
            Some(0) | None => Ok(()),
            Some(left) => Err(format!("{} left {left} entries behind", C::NAME).into()),
        }
    })
}

fn positive(text: &str) -> Result<usize, String> {
    match text.parse() {
        Ok(workers) if workers > 0 => Ok(workers),
        _ => Err("not a positive number".to_owned()),
    }
}
