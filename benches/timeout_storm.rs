//! A timeout storm: goodput when most waiters give up, every contender taking turns run after
//! run. Measures whether a registry keeps granting while its queues fill with waiters that
//! time out, some of them after their grant was made and before they saw it.
//!
//! Each run, on a multi-thread runtime of 2 workers (as every benchmark here): 4 keys; per key
//! a holder task takes it 100 times and holds it 2 ms each time; meanwhile 2,000 storm tasks
//! loop `tokio::time::timeout(0.2 to 3 ms, lock(key))` on a random key of the 4, with a
//! `yield_now` while holding, until the holders are done. A run's figure is its goodput: the
//! successful acquisitions (the storm's and the holders') over the run's time. The random
//! choices are seeded by run and task, so every contender of a run meets the same storm.
//!
//! Run `r` runs every contender once, a different one first each run (as `interleaved.rs`
//! does, so that a slow spell of the shared machine falls on all of them); each contender is
//! made once and kept for every run, so state that builds up across runs shows. Every run is
//! counted: a collapse in the first is as real as one in the last. The `naive-actor`
//! contender is left out: a grant sent to a waiter that timed out is lost with it, the key
//! stays held for ever, and the run would never end.
//!
//! ```sh
//! cargo bench --bench timeout_storm -- --runs 100
//! cargo bench --bench timeout_storm -- --runs 20 --only keyed-locks   # one contender, to profile
//! ```
//!
//! It prints one line per run (goodput per contender, ours over the best peer of the run),
//! then per contender the min, median and max, two signs of a run that collapsed (the share
//! of the storm's successes that came only when their timeout was due, and how long a storm
//! task held its key across its `yield_now` and the guard's drop, which is how long the
//! workers' run queues are plus the release), the process's CPU time per lock call that ended
//! (granted or timed out: the storm is a closed loop, and a contender whose call costs more
//! CPU fills the run queues sooner), and for ours the ratios to the best peer of the same run:
//! their distribution and the worst run; then every contender's ratios in one table, with the
//! runs in which it fell below half of its own median goodput (slow spells). Before and after
//! every run a probe times a cache line's round trip between the two cores
//! (`placement/mod.rs`), so each run is marked `n` (the cores near each other throughout), `f`
//! (far apart) or `m` (they moved); the summary gives each contender's median goodput over its
//! near runs and over its far runs, and says how many of our runs below half ran with the
//! cores far while the best peer ran with them near. It writes
//! everything, every run's rates and every contender's ratios included, to
//! `target/bench-report/timeout_storm.json`.

mod command_line;
mod contenders;
mod placement;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;

use contenders::{Contender, runtime};
use placement::Placement;

/// The keys the storm and the holders share.
const KEYS: u64 = 4;
/// Times each key's holder takes its key.
const HOLDS_PER_KEY: u32 = 100;
/// How long a holder keeps its key each time.
const HOLD: Duration = Duration::from_millis(2);
/// Tasks that lock under a timeout until the holders are done, unless `--tasks` says.
const STORM_TASKS: u64 = 2_000;
/// The storm's timeouts, drawn uniformly from this range of microseconds.
const TIMEOUT_MICROS: std::ops::Range<u64> = 200..3_000;

/// The contenders users choose between: the bar is the best of them in each run.
const PEERS: [&str; 4] = ["lockable", "keyed-lock", "key-mutex", "refcount-map"];
/// Our configurations, each held against the best peer.
const OURS: [&str; 3] = ["keyed-locks", "keyed-locks-actor", "keyed-locks-8-shards"];
/// Loses grants to waiters that time out, so the storm never ends for it.
const LEFT_OUT: &str = "naive-actor";

/// Ratios to the best peer at or above each bound fall in its bucket of the distribution.
const RATIO_BUCKETS: [f64; 7] = [0.0, 0.5, 0.8, 0.9, 1.0, 1.1, 1.25];

/// A timeout storm on 4 keys: every contender once per run, goodput per run and a summary.
#[derive(Debug, Parser)]
#[command(args_override_self = true)]
struct Cli {
    /// Runs (each runs every contender once)
    #[arg(long, default_value_t = 20)]
    runs: u64,
    /// Storm tasks (how long the workers' run queues get)
    #[arg(long, default_value_t = STORM_TASKS)]
    tasks: u64,
    /// Only these contenders (by name, repeatable); all but naive-actor if none is given
    #[arg(long)]
    only: Vec<String>,
    #[command(flatten)]
    runner: command_line::Runner,
}

/// What one run of one contender did.
#[derive(Debug, Clone, Copy)]
struct RunResult {
    acquisitions: u64,
    timeouts: u64,
    /// The storm's successful acquisitions (not the holders') and, of them, those answered
    /// when their timeout was already due (mostly the timeout's own last poll of the lock
    /// finding the grant there).
    storm_acquisitions: u64,
    at_deadline: u64,
    /// The time the storm's successful tasks held their key across the `yield_now` and the
    /// guard's drop, summed.
    held: Duration,
    elapsed: Duration,
    /// The context switches and CPU time of this process's threads during the run (Linux
    /// only).
    threads: Option<ThreadCounts>,
}

/// Context switches and CPU time of every thread of this process, as
/// `/proc/self/task/*/status` and `/proc/self/task/*/schedstat` count them.
#[derive(Debug, Clone, Copy)]
struct ThreadCounts {
    /// A thread gave up its core: parked (an idle worker, or one waiting for a lock), slept.
    voluntary: u64,
    /// The kernel took a thread off its core while it could still run: a busy machine's
    /// preemptions.
    preempted: u64,
    /// Time on a core, in nanoseconds (the first field of `schedstat`).
    cpu_nanos: u64,
}

impl ThreadCounts {
    /// The counts so far; `None` where there is no such file.
    fn now() -> Option<Self> {
        let mut total = ThreadCounts {
            voluntary: 0,
            preempted: 0,
            cpu_nanos: 0,
        };
        for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
            let task = task.path();
            // A thread that ends while it is read (the placement probe's, say) is skipped: its
            // files go with it, and it ran no lock call.
            let (Ok(schedstat), Ok(status)) = (
                std::fs::read_to_string(task.join("schedstat")),
                std::fs::read_to_string(task.join("status")),
            ) else {
                continue;
            };
            let count = |field: &str| {
                status
                    .lines()
                    .find_map(|line| line.strip_prefix(field))?
                    .trim()
                    .parse::<u64>()
                    .ok()
            };
            total.cpu_nanos += schedstat.split_whitespace().next()?.parse::<u64>().ok()?;
            total.voluntary += count("voluntary_ctxt_switches:")?;
            total.preempted += count("nonvoluntary_ctxt_switches:")?;
        }
        Some(total)
    }

    /// The counts since `before` (a thread that ended meanwhile takes its counts with it).
    fn since(self, before: ThreadCounts) -> ThreadCounts {
        ThreadCounts {
            voluntary: self.voluntary.saturating_sub(before.voluntary),
            preempted: self.preempted.saturating_sub(before.preempted),
            cpu_nanos: self.cpu_nanos.saturating_sub(before.cpu_nanos),
        }
    }
}

impl RunResult {
    /// Successful acquisitions per second.
    fn goodput(&self) -> f64 {
        self.acquisitions as f64 / self.elapsed.as_secs_f64()
    }

    /// The share of the storm's successes that came when their timeout was due.
    fn at_deadline_share(&self) -> f64 {
        self.at_deadline as f64 / self.storm_acquisitions.max(1) as f64
    }

    /// How long a storm task held its key across its `yield_now`, on average, in µs.
    fn mean_hold_micros(&self) -> f64 {
        self.held.as_secs_f64() * 1e6 / self.storm_acquisitions.max(1) as f64
    }

    /// The process's CPU time per lock call that ended (granted or timed out), in ns: what a
    /// call costs all told, the runtime's timers and scheduling included.
    fn cpu_nanos_per_call(&self) -> Option<f64> {
        let calls = (self.acquisitions + self.timeouts).max(1);
        Some(self.threads?.cpu_nanos as f64 / calls as f64)
    }
}

/// What the storm's tasks counted, summed over them.
#[derive(Debug, Default)]
struct StormCounts {
    acquisitions: AtomicU64,
    timeouts: AtomicU64,
    at_deadline: AtomicU64,
    held_nanos: AtomicU64,
}

/// One run of a contender, numbered by its argument.
type Run = Box<dyn FnMut(u64) -> RunResult>;

/// After a contender's last run: warns if it kept an entry, then stops it.
type Finish = Box<dyn FnOnce()>;

/// Runs the storm once on the current runtime.
async fn storm<C: Contender>(contender: &Arc<C>, run: u64, storm_tasks: u64) -> RunResult {
    let holders_done = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(StormCounts::default());
    let threads_before = ThreadCounts::now();
    let start = Instant::now();
    let storm_tasks: Vec<_> = (0..storm_tasks)
        .map(|task| {
            let contender = Arc::clone(contender);
            let holders_done = Arc::clone(&holders_done);
            let counts = Arc::clone(&counts);
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(run << 32 | task);
                let (mut acquired, mut timed_out, mut at_deadline) = (0, 0, 0);
                let mut held = Duration::ZERO;
                while !holders_done.load(Ordering::Relaxed) {
                    let key = rng.random_range(0..KEYS);
                    let limit = Duration::from_micros(rng.random_range(TIMEOUT_MICROS));
                    let asked = Instant::now();
                    match tokio::time::timeout(limit, contender.lock(key)).await {
                        Ok(guard) => {
                            let answered = Instant::now();
                            if answered - asked >= limit {
                                at_deadline += 1;
                            }
                            tokio::task::yield_now().await;
                            drop(guard);
                            held += answered.elapsed();
                            acquired += 1;
                        }
                        Err(_elapsed) => timed_out += 1,
                    }
                }
                counts.acquisitions.fetch_add(acquired, Ordering::Relaxed);
                counts.timeouts.fetch_add(timed_out, Ordering::Relaxed);
                counts.at_deadline.fetch_add(at_deadline, Ordering::Relaxed);
                let held_nanos = u64::try_from(held.as_nanos()).unwrap_or(u64::MAX);
                counts.held_nanos.fetch_add(held_nanos, Ordering::Relaxed);
            })
        })
        .collect();
    let holders: Vec<_> = (0..KEYS)
        .map(|key| {
            let contender = Arc::clone(contender);
            tokio::spawn(async move {
                for _ in 0..HOLDS_PER_KEY {
                    let guard = contender.lock(key).await;
                    tokio::time::sleep(HOLD).await;
                    drop(guard);
                }
            })
        })
        .collect();
    for holder in holders {
        holder.await.expect("holder task panicked");
    }
    holders_done.store(true, Ordering::Relaxed);
    for task in storm_tasks {
        task.await.expect("storm task panicked");
    }
    let storm_acquisitions = counts.acquisitions.load(Ordering::Relaxed);
    RunResult {
        acquisitions: storm_acquisitions + KEYS * u64::from(HOLDS_PER_KEY),
        timeouts: counts.timeouts.load(Ordering::Relaxed),
        storm_acquisitions,
        at_deadline: counts.at_deadline.load(Ordering::Relaxed),
        held: Duration::from_nanos(counts.held_nanos.load(Ordering::Relaxed)),
        elapsed: start.elapsed(),
        threads: ThreadCounts::now()
            .zip(threads_before)
            .map(|(after, before)| after.since(before)),
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    }
}

/// The median of `values` with `unit` after it, or "-" if there are none (a figure that only
/// Linux gives).
fn median_or_dash(values: &[f64], decimals: usize, unit: &str) -> String {
    if values.is_empty() {
        "-".to_owned()
    } else {
        format!("{:.decimals$}{unit}", median(values))
    }
}

fn min_max(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(low, high), &value| {
            (low.min(value), high.max(value))
        })
}

/// Every contender's results, per run.
struct Measured {
    names: Vec<&'static str>,
    /// Per contender (in `names`' order), per run.
    results: Vec<Vec<RunResult>>,
    /// Where the cores were during each of those runs.
    placements: Vec<Vec<Placement>>,
}

impl Measured {
    fn index_of(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|candidate| *candidate == name)
    }

    fn goodputs(&self, index: usize) -> Vec<f64> {
        self.results[index].iter().map(RunResult::goodput).collect()
    }

    /// The best peer of run `run`, and its goodput; `None` if no peer ran.
    fn best_peer(&self, run: usize) -> Option<(&'static str, f64)> {
        PEERS
            .iter()
            .filter_map(|peer| {
                let index = self.index_of(peer)?;
                Some((*peer, self.results[index][run].goodput()))
            })
            .max_by(|(_, a), (_, b)| a.total_cmp(b))
    }

    /// Per run: `name`'s goodput over the best peer's of that run, if both ran.
    fn ratios_to_best_peer(&self, name: &str) -> Option<Vec<f64>> {
        let index = self.index_of(name)?;
        (0..self.results[index].len())
            .map(|run| {
                let (_, best) = self.best_peer(run)?;
                Some(self.results[index][run].goodput() / best)
            })
            .collect()
    }
}

/// One of ours against the best peer of each run, by where the cores were during the two runs.
struct ByPlacement {
    /// Runs below half of the best peer's goodput in which ours had the cores far apart and
    /// the best peer had them near.
    below_half_far_against_near: usize,
    /// The ratios of the runs in which both had the cores near each other throughout.
    both_near: Vec<f64>,
    /// The ratios of the runs in which both had them far apart throughout.
    both_far: Vec<f64>,
}

impl Measured {
    /// `name`'s ratios to the best peer of each run, by placement; `None` if it or no peer ran.
    fn by_placement(&self, name: &str) -> Option<ByPlacement> {
        let index = self.index_of(name)?;
        let mut placed = ByPlacement {
            below_half_far_against_near: 0,
            both_near: Vec::new(),
            both_far: Vec::new(),
        };
        for (run, (result, &ours)) in self.results[index]
            .iter()
            .zip(&self.placements[index])
            .enumerate()
        {
            let (peer, best) = self.best_peer(run)?;
            let theirs = self.placements[self.index_of(peer)?][run];
            let ratio = result.goodput() / best;
            if ratio < 0.5 && ours == Placement::Far && theirs == Placement::Near {
                placed.below_half_far_against_near += 1;
            }
            match (ours, theirs) {
                (Placement::Near, Placement::Near) => placed.both_near.push(ratio),
                (Placement::Far, Placement::Far) => placed.both_far.push(ratio),
                _ => {}
            }
        }
        Some(placed)
    }
}

/// How many of `ratios` fall in each bucket of [`RATIO_BUCKETS`], with its label.
fn distribution(ratios: &[f64]) -> Vec<(String, usize)> {
    RATIO_BUCKETS
        .iter()
        .enumerate()
        .map(|(bucket, &low)| {
            let high = RATIO_BUCKETS.get(bucket + 1).copied();
            let count = ratios
                .iter()
                .filter(|&&ratio| ratio >= low && high.is_none_or(|high| ratio < high))
                .count();
            let label = match high {
                Some(high) => format!("{low:.2}-{high:.2}"),
                None => format!(">={low:.2}"),
            };
            (label, count)
        })
        .collect()
}

fn main() {
    let cli: Cli = command_line::parse();
    // `cargo test --benches` runs benchmarks without `--bench`: a storm of many runs is no
    // test, so it does nothing then.
    if !cli.runner.bench || !cli.runner.picks_this_program() {
        return;
    }
    let wanted = |name: &str| {
        name != LEFT_OUT && (cli.only.is_empty() || cli.only.iter().any(|only| only == name))
    };
    let runtime = Arc::new(runtime());
    let mut names = Vec::new();
    let mut runs: Vec<Run> = Vec::new();
    let mut finishes: Vec<Finish> = Vec::new();
    for_each_contender!(C => {
        if wanted(C::NAME) {
            let contender = Arc::new(runtime.block_on(async { C::new(KEYS as usize) }));
            names.push(C::NAME);
            let (for_run, for_finish) = (Arc::clone(&contender), contender);
            let (runtime_for_run, runtime_for_finish) =
                (Arc::clone(&runtime), Arc::clone(&runtime));
            let tasks = cli.tasks;
            runs.push(Box::new(move |run| {
                runtime_for_run.block_on(storm(&for_run, run, tasks))
            }));
            finishes.push(Box::new(move || {
                if let Some(entries) = runtime_for_finish.block_on(for_finish.entries())
                    && entries != 0
                {
                    eprintln!("warning: {} left {entries} entries after the storm", C::NAME);
                }
                runtime_for_finish.block_on(for_finish.close());
            }));
        }
    });
    if runs.is_empty() {
        eprintln!("no contender picked; the names are those of the table's columns");
        std::process::exit(1);
    }
    eprintln!(
        "timeout storm: {} runs of {} contenders; {KEYS} keys, {} tasks under 0.2-3 ms \
         timeouts, holders {HOLDS_PER_KEY} x {HOLD:?}",
        cli.runs,
        runs.len(),
        cli.tasks
    );
    let mut measured = Measured {
        results: vec![Vec::with_capacity(cli.runs as usize); runs.len()],
        placements: vec![Vec::with_capacity(cli.runs as usize); runs.len()],
        names,
    };
    println!(
        "| run | {} | ours / best peer |",
        measured.names.join(" | ")
    );
    println!("|--:|{}---|", "--:|".repeat(measured.names.len()));
    let mut before = placement::round_trip();
    for run in 0..cli.runs {
        for turn in 0..runs.len() {
            // A different contender goes first each run, so none always follows the same one.
            let index = (turn + run as usize) % runs.len();
            let result = runs[index](run);
            let after = placement::round_trip();
            measured.results[index].push(result);
            measured.placements[index].push(Placement::of(before, after));
            before = after;
        }
        let run_index = run as usize;
        let mut line = format!("| {} |", run + 1);
        for (results, placements) in measured.results.iter().zip(&measured.placements) {
            line.push_str(&format!(
                " {:.0} {} |",
                results[run_index].goodput(),
                placements[run_index].letter()
            ));
        }
        if let Some((peer, best)) = measured.best_peer(run_index) {
            line.push_str(&format!(" best {peer}:"));
            for name in OURS {
                if let Some(index) = measured.index_of(name) {
                    let ratio = measured.results[index][run_index].goodput() / best;
                    let mark = if ratio < 0.5 { " (below half)" } else { "" };
                    line.push_str(&format!(" {name} {ratio:.2}{mark};"));
                }
            }
        }
        line.push_str(" |");
        println!("{line}");
    }
    for finish in finishes {
        finish();
    }
    print_summary(&measured, cli.runs);
    write_json(&measured, cli.runs);
}

fn print_summary(measured: &Measured, runs: u64) {
    println!(
        "\nGoodput, successful acquisitions per second over {runs} runs:\n\n\
         | contender | min | median | max | timeouts per run (median) | successes at the deadline \
         (median share) | held across the yield (median of means) | preempted per run (median) \
         | CPU per call (median) | median with the cores near (runs) | median with them far (runs) \
         |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
    );
    for (index, name) in measured.names.iter().enumerate() {
        let goodputs = measured.goodputs(index);
        let (low, high) = min_max(&goodputs);
        let timeouts: Vec<f64> = measured.results[index]
            .iter()
            .map(|result| result.timeouts as f64)
            .collect();
        let preempted: Vec<f64> = measured.results[index]
            .iter()
            .filter_map(|result| result.threads)
            .map(|threads| threads.preempted as f64)
            .collect();
        let cpu_per_call: Vec<f64> = measured.results[index]
            .iter()
            .filter_map(RunResult::cpu_nanos_per_call)
            .collect();
        let cpu_per_call = median_or_dash(&cpu_per_call, 0, " ns");
        let preempted = median_or_dash(&preempted, 0, "");
        let at_deadline: Vec<f64> = measured.results[index]
            .iter()
            .map(RunResult::at_deadline_share)
            .collect();
        let held: Vec<f64> = measured.results[index]
            .iter()
            .map(RunResult::mean_hold_micros)
            .collect();
        let under = |wanted: Placement| {
            let goodputs: Vec<f64> = goodputs
                .iter()
                .zip(&measured.placements[index])
                .filter(|(_, placement)| **placement == wanted)
                .map(|(goodput, _)| *goodput)
                .collect();
            format!("{} ({})", median_or_dash(&goodputs, 0, ""), goodputs.len())
        };
        println!(
            "| {name} | {low:.0} | {:.0} | {high:.0} | {:.0} | {:.2} | {:.0} µs | {preempted} \
             | {cpu_per_call} | {} | {} |",
            median(&goodputs),
            median(&timeouts),
            median(&at_deadline),
            median(&held),
            under(Placement::Near),
            under(Placement::Far)
        );
    }
    for name in OURS {
        let Some(ratios) = measured.ratios_to_best_peer(name) else {
            continue;
        };
        let (low, high) = min_max(&ratios);
        let below_half = ratios.iter().filter(|&&ratio| ratio < 0.5).count();
        let worst = ratios
            .iter()
            .enumerate()
            .min_by(|(_, a), (_, b)| a.total_cmp(b))
            .map_or(0, |(run, _)| run);
        let buckets: Vec<String> = distribution(&ratios)
            .into_iter()
            .map(|(label, count)| format!("{label}: {count}"))
            .collect();
        println!(
            "\n{name} / best peer of the same run: min {low:.2} (run {}), median {:.2}, max \
             {high:.2}; runs below half: {}\n  distribution: {}",
            worst + 1,
            median(&ratios),
            below_half,
            buckets.join(", ")
        );
        if let Some(placed) = measured.by_placement(name) {
            println!(
                "  by the cores' placement: runs below half with ours far and the best peer \
                 near: {} of {}; median over the runs where both had the cores near: {} ({} \
                 runs), both far: {} ({} runs)",
                placed.below_half_far_against_near,
                below_half,
                median_or_dash(&placed.both_near, 2, ""),
                placed.both_near.len(),
                median_or_dash(&placed.both_far, 2, ""),
                placed.both_far.len(),
            );
        }
    }
    // Every contender against the same yardstick: whether the stand-ins and the peers
    // themselves fall below half of the run's best peer, and how often. The last column
    // measures each against itself: a run below half its own median goodput is a slow spell
    // that took this contender down whoever else it took, the machine's share of the collapses.
    println!(
        "\nEvery contender over the best peer of the same run (a peer's best peer may be itself):\n\n\
         | contender | min | median | max | runs below half | runs below half its own median (which) |\n\
         |---|--:|--:|--:|--:|---|"
    );
    for (index, name) in measured.names.iter().enumerate() {
        let Some(ratios) = measured.ratios_to_best_peer(name) else {
            continue;
        };
        let (low, high) = min_max(&ratios);
        let slow_runs = runs_below_half_own_median(&measured.goodputs(index));
        let which = if slow_runs.is_empty() {
            "0".to_owned()
        } else {
            let runs: Vec<String> = slow_runs.iter().map(u64::to_string).collect();
            format!("{} ({})", slow_runs.len(), runs.join(", "))
        };
        println!(
            "| {name} | {low:.2} | {:.2} | {high:.2} | {} | {which} |",
            median(&ratios),
            ratios.iter().filter(|&&ratio| ratio < 0.5).count(),
        );
    }
}

/// The runs whose goodput fell below half of the median of `goodputs`, numbered from 1 as the
/// per-run lines number them.
fn runs_below_half_own_median(goodputs: &[f64]) -> Vec<u64> {
    let half = median(goodputs) / 2.0;
    (1..)
        .zip(goodputs)
        .filter(|&(_, &goodput)| goodput < half)
        .map(|(run, _)| run)
        .collect()
}

fn write_json(measured: &Measured, runs: u64) {
    let contenders: serde_json::Map<_, _> = measured
        .names
        .iter()
        .enumerate()
        .map(|(index, name)| {
            let goodputs = measured.goodputs(index);
            let (min, max) = min_max(&goodputs);
            let per_run: Vec<_> = measured.results[index]
                .iter()
                .zip(&measured.placements[index])
                .map(|(result, placement)| {
                    json!({
                        "goodput": result.goodput(),
                        "acquisitions": result.acquisitions,
                        "timeouts": result.timeouts,
                        "storm_acquisitions": result.storm_acquisitions,
                        "at_deadline": result.at_deadline,
                        "mean_hold_micros": result.mean_hold_micros(),
                        "seconds": result.elapsed.as_secs_f64(),
                        "voluntary_switches": result.threads.map(|threads| threads.voluntary),
                        "preempted": result.threads.map(|threads| threads.preempted),
                        "cpu_nanos_per_call": result.cpu_nanos_per_call(),
                        "placement": placement.name(),
                    })
                })
                .collect();
            let summary = json!({
                "min": min,
                "median": median(&goodputs),
                "max": max,
                "runs_below_half_own_median": runs_below_half_own_median(&goodputs),
                "runs": per_run,
            });
            ((*name).to_owned(), summary)
        })
        .collect();
    let ratios: serde_json::Map<_, _> = measured
        .names
        .iter()
        .filter_map(|name| Some(((*name).to_owned(), measured.ratios_to_best_peer(name)?)))
        .map(|(name, ratios)| {
            let (min, max) = min_max(&ratios);
            let placed = measured.by_placement(&name).map(|placed| {
                json!({
                    "below_half_far_against_near": placed.below_half_far_against_near,
                    "both_near": placed.both_near,
                    "both_far": placed.both_far,
                })
            });
            let summary = json!({
                "min": min,
                "median": median(&ratios),
                "max": max,
                "runs": ratios,
                "by_placement": placed,
            });
            (name, summary)
        })
        .collect();
    let report = json!({
        "runs": runs,
        "contenders": contenders,
        "ratio_to_best_peer": ratios,
    });
    let report_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("bench-report");
    let path = report_dir.join("timeout_storm.json");
    std::fs::create_dir_all(&report_dir).expect("the report directory can be created");
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("JSON"))
        .expect("the report can be written");
    eprintln!("wrote {}", path.display());
}
