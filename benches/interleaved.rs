//! Throughput with the contenders taking turns, round after round: the comparison the README
//! leads with.
//!
//! `peers.rs` (criterion) measures one contender after the other, a few seconds each. On the
//! shared 2-core machines this was measured on, the whole machine's speed shifts by up to 2×
//! for a minute at a time, the bare-mutex floor included, so whichever contender is measured
//! during a slow spell looks slow. Here each round runs the workload once for every contender,
//! starting with a different one each round. A contender's figure is its median over the
//! rounds, and its ratio to the best peer is the median of the per-round ratios (ours against
//! the best peer of the same round), which a slow spell cannot tilt towards anyone.
//!
//! `cargo bench --bench interleaved` prints the table and writes
//! `target/bench-report/interleaved.json`, which `examples/bench_report.rs` reads.

mod contenders;
mod workloads;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use contenders::{Contender, runtime};
use workloads::Workload;

/// Measured rounds per workload, after one warm-up round.
const ROUNDS: usize = 15;

/// The contenders users choose between: the bar is the best of them in each round.
const PEERS: [&str; 4] = ["lockable", "keyed-lock", "key-mutex", "seed"];
/// Our configurations, each held against the best peer.
const OURS: [&str; 3] = ["keyed-locks", "keyed-locks-actor", "keyed-locks-8-shards"];

/// One run of a workload for one contender, returning its duration; the argument numbers the
/// run, so that `distinct` uses fresh keys.
type Run = Box<dyn FnMut(u64) -> Duration>;

/// Rates in M lock/unlock pairs per second, per contender (in table order) and round.
struct Measured {
    names: Vec<&'static str>,
    rates: Vec<Vec<f64>>,
}

fn measure(runtime: &Arc<tokio::runtime::Runtime>, workload: Workload) -> Measured {
    let mut names = Vec::new();
    let mut runs: Vec<Run> = Vec::new();
    let mut finishes: Vec<Box<dyn FnOnce()>> = Vec::new();
    for_each_contender!(C => {
        let contender = Arc::new(runtime.block_on(async { C::new(workload.keys()) }));
        names.push(C::NAME);
        let (for_run, for_finish) = (Arc::clone(&contender), contender);
        let (runtime_for_run, runtime_for_finish) = (Arc::clone(runtime), Arc::clone(runtime));
        runs.push(Box::new(move |round| {
            runtime_for_run.block_on(workload.run(&for_run, round))
        }));
        finishes.push(Box::new(move || workload.finish(&runtime_for_finish, &*for_finish)));
    });
    let mut rates = vec![Vec::with_capacity(ROUNDS); runs.len()];
    let mut run_number = 0;
    for round in 0..=ROUNDS {
        for turn in 0..runs.len() {
            // A different contender goes first each round, so none always follows the same one.
            let index = (turn + round) % runs.len();
            run_number += 1;
            let elapsed = runs[index](run_number);
            if round > 0 {
                rates[index].push(workload.ops() as f64 / elapsed.as_secs_f64() / 1e6);
            }
        }
    }
    for finish in finishes {
        finish();
    }
    Measured { names, rates }
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

fn min_max(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(low, high), &value| {
            (low.min(value), high.max(value))
        })
}

impl Measured {
    fn index_of(&self, name: &str) -> usize {
        self.names
            .iter()
            .position(|candidate| *candidate == name)
            .unwrap_or_else(|| panic!("no contender named {name}"))
    }

    /// Per round: `name`'s rate over the best peer's rate in that round.
    fn ratios_to_best_peer(&self, name: &str) -> Vec<f64> {
        let ours = &self.rates[self.index_of(name)];
        let peers: Vec<&Vec<f64>> = PEERS
            .iter()
            .map(|peer| &self.rates[self.index_of(peer)])
            .collect();
        (0..ours.len())
            .map(|round| {
                let best = peers
                    .iter()
                    .map(|rates| rates[round])
                    .fold(f64::NEG_INFINITY, f64::max);
                ours[round] / best
            })
            .collect()
    }
}

fn summary(values: &[f64]) -> serde_json::Value {
    let (min, max) = min_max(values);
    json!({ "median": median(values), "min": min, "max": max })
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: skip the run then.
    if !std::env::args().any(|argument| argument == "--bench") {
        return;
    }
    let runtime = Arc::new(runtime());
    let mut table = format!(
        "Interleaved: median M lock/unlock pairs per second over {ROUNDS} rounds (min–max):\n\n| workload |"
    );
    let mut workloads_json = Vec::new();
    let mut header_written = false;
    for workload in Workload::ALL {
        eprintln!("measuring {} ({ROUNDS} rounds)", workload.name());
        let measured = measure(&runtime, workload);
        if !header_written {
            for name in &measured.names {
                table.push_str(&format!(" {name} |"));
            }
            for name in OURS {
                table.push_str(&format!(" {name} / best peer |"));
            }
            table.push_str("\n|---|");
            table.push_str(&"--:|".repeat(measured.names.len() + OURS.len()));
            table.push('\n');
            header_written = true;
        }
        table.push_str(&format!("| `{}` |", workload.name()));
        for rates in &measured.rates {
            let (low, high) = min_max(rates);
            table.push_str(&format!(" {:.2} ({low:.2}–{high:.2}) |", median(rates)));
        }
        let mut ratios_json = serde_json::Map::new();
        for name in OURS {
            let ratios = measured.ratios_to_best_peer(name);
            let (low, high) = min_max(&ratios);
            table.push_str(&format!(" {:.2}× ({low:.2}–{high:.2}) |", median(&ratios)));
            ratios_json.insert(name.to_owned(), summary(&ratios));
        }
        table.push('\n');
        let contenders_json: serde_json::Map<_, _> = measured
            .names
            .iter()
            .zip(&measured.rates)
            .map(|(name, rates)| ((*name).to_owned(), summary(rates)))
            .collect();
        workloads_json.push(json!({
            "name": workload.name(),
            "contenders": contenders_json,
            "ratio_to_best_peer": ratios_json,
        }));
    }
    print!("{table}");
    let report_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("bench-report");
    let report = json!({ "rounds": ROUNDS, "workloads": workloads_json });
    std::fs::create_dir_all(&report_dir).expect("the report directory can be created");
    let path = report_dir.join("interleaved.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("JSON"))
        .expect("the report can be written");
    eprintln!("wrote {}", path.display());
}
