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
//! The `sync` workload (threads through blocking calls) has contenders of its own, so it is a
//! table of its own, measured the same way against its own peers.
//!
//! Before and after every run a probe times a cache line's round trip between the two cores
//! (`placement/mod.rs`): on the VMs this was measured on, the host moves the cores near each
//! other and far apart several times a second, and a `spread` run with them far takes about
//! twice as long, whoever runs it, so a per-round ratio depends on where each of the two runs
//! fell. A second table
//! gives each contender's median over the runs that had the cores near throughout, and over
//! those that had them far, with our ratios to the best peer's median under the same
//! placement.
//!
//! `cargo bench --bench interleaved` prints the tables and writes
//! `target/bench-report/interleaved.json`, which `bench_report.rs` reads.

mod contenders;
mod placement;
mod workloads;
// The `sync` workload and its contenders: only this benchmark runs them, so they are not in
// the modules `peers.rs` shares.
#[path = "contenders/blocking.rs"]
mod blocking_contenders;
#[path = "workloads/sync.rs"]
mod sync_workload;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use blocking_contenders::BlockingContender;
use contenders::{Contender, runtime};
use placement::Placement;
use workloads::Workload;

/// Measured rounds per workload, after one warm-up round.
const ROUNDS: usize = 15;

/// The contenders users choose between: the bar is the best of them in each round.
const PEERS: [&str; 4] = ["lockable", "keyed-lock", "key-mutex", "refcount-map"];
/// Our configurations, each held against the best peer.
const OURS: [&str; 3] = ["keyed-locks", "keyed-locks-actor", "keyed-locks-8-shards"];
/// The `sync` workload's peers: lockable's `LockPool::blocking_lock`, and a hand-written
/// std map of per-key locks.
const SYNC_PEERS: [&str; 2] = ["lockable", "std-mutex-map"];

/// One run of a workload for one contender, returning its duration; the argument numbers the
/// run, so that `distinct` uses fresh keys.
type Run = Box<dyn FnMut(u64) -> Duration>;

/// After a `sync` contender's last run: checks what it left and stops it.
type Finish = Box<dyn FnOnce(&tokio::runtime::Runtime)>;

/// Rates in M lock/unlock pairs per second, per contender (in table order) and round.
struct Measured {
    names: Vec<&'static str>,
    rates: Vec<Vec<f64>>,
    /// Where the cores were during each run, per contender and round.
    placements: Vec<Vec<Placement>>,
    /// Every probe's round trip, in order.
    probes: Vec<Duration>,
    /// The contenders ours are held against.
    peers: &'static [&'static str],
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
    let rounds = run_rounds(&mut runs, workload.ops());
    for finish in finishes {
        finish();
    }
    Measured {
        names,
        rates: rounds.rates,
        placements: rounds.placements,
        probes: rounds.probes,
        peers: &PEERS,
    }
}

/// `measure` for the `sync` workload: its contenders, run from this (plain) thread.
fn measure_sync(runtime: &tokio::runtime::Runtime) -> Measured {
    let mut names = Vec::new();
    let mut runs: Vec<Run> = Vec::new();
    let mut finishes: Vec<Finish> = Vec::new();
    for_each_blocking_contender!(C => {
        let contender = Arc::new(C::new(runtime));
        names.push(C::NAME);
        let for_run = Arc::clone(&contender);
        runs.push(Box::new(move |round| sync_workload::run(&for_run, round)));
        finishes.push(Box::new(move |runtime| {
            if let Some(entries) = contender.finish(runtime)
                && entries != 0
            {
                eprintln!("warning: {} left {entries} entries after sync", C::NAME);
            }
        }));
    });
    let rounds = run_rounds(&mut runs, sync_workload::ops());
    for finish in finishes {
        finish(runtime);
    }
    Measured {
        names,
        rates: rounds.rates,
        placements: rounds.placements,
        probes: rounds.probes,
        peers: &SYNC_PEERS,
    }
}

/// What [`run_rounds`] measured.
struct Rounds {
    rates: Vec<Vec<f64>>,
    placements: Vec<Vec<Placement>>,
    probes: Vec<Duration>,
}

/// Runs every contender once per round, a different one first each round, after one warm-up
/// round, with a placement probe between every two runs; returns the rates and placements
/// per contender and round.
fn run_rounds(runs: &mut [Run], ops: u64) -> Rounds {
    let mut rates = vec![Vec::with_capacity(ROUNDS); runs.len()];
    let mut placements = vec![Vec::with_capacity(ROUNDS); runs.len()];
    let mut probes = Vec::new();
    let mut run_number = 0;
    let mut before = placement::round_trip();
    for round in 0..=ROUNDS {
        for turn in 0..runs.len() {
            // A different contender goes first each round, so none always follows the same one.
            let index = (turn + round) % runs.len();
            run_number += 1;
            let elapsed = runs[index](run_number);
            let after = placement::round_trip();
            if round > 0 {
                rates[index].push(ops as f64 / elapsed.as_secs_f64() / 1e6);
                placements[index].push(Placement::of(before, after));
                probes.push(after);
            }
            before = after;
        }
    }
    Rounds {
        rates,
        placements,
        probes,
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
        let peers: Vec<&Vec<f64>> = self
            .peers
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

impl Measured {
    /// `name`'s rates in the runs that had the cores where `placement` says.
    fn rates_under(&self, name: &str, placement: Placement) -> Vec<f64> {
        let index = self.index_of(name);
        self.rates[index]
            .iter()
            .zip(&self.placements[index])
            .filter(|(_, under)| **under == placement)
            .map(|(rate, _)| *rate)
            .collect()
    }

    /// The best peer's median rate over its runs under `placement`, and its name; `None` if no
    /// peer had such a run.
    fn best_peer_under(&self, placement: Placement) -> Option<(f64, &'static str)> {
        self.peers
            .iter()
            .filter_map(|peer| {
                let rates = self.rates_under(peer, placement);
                (!rates.is_empty()).then(|| (median(&rates), *peer))
            })
            .max_by(|a, b| a.0.total_cmp(&b.0))
    }

    /// The share of probes that found the cores near each other.
    fn near_share(&self) -> f64 {
        let near = self
            .probes
            .iter()
            .filter(|probe| **probe < placement::NEAR_BELOW)
            .count();
        near as f64 / self.probes.len().max(1) as f64
    }

    /// Its rows of the table by placement (near and far), and their entry in
    /// `interleaved.json`: each contender's median and number of runs under each placement,
    /// and ours over the best peer's median under the same.
    fn rows_by_placement(&self, workload: &str) -> (String, serde_json::Value) {
        let mut rows = String::new();
        let mut json = serde_json::Map::new();
        for placement in [Placement::Near, Placement::Far] {
            let mut row = format!("| `{workload}`, {} |", placement.name());
            let mut contenders_json = serde_json::Map::new();
            for name in &self.names {
                let rates = self.rates_under(name, placement);
                if rates.is_empty() {
                    row.push_str(" – |");
                    continue;
                }
                row.push_str(&format!(" {:.2} ({}) |", median(&rates), rates.len()));
                contenders_json.insert(
                    (*name).to_owned(),
                    json!({ "median": median(&rates), "runs": rates.len() }),
                );
            }
            let best = self.best_peer_under(placement);
            let mut ratios_json = serde_json::Map::new();
            for name in OURS {
                let rates = self.rates_under(name, placement);
                match best {
                    Some((best, _)) if !rates.is_empty() => {
                        let ratio = median(&rates) / best;
                        row.push_str(&format!(" {ratio:.2}× |"));
                        ratios_json.insert(name.to_owned(), json!(ratio));
                    }
                    _ => row.push_str(" – |"),
                }
            }
            row.push('\n');
            rows.push_str(&row);
            json.insert(
                placement.name().to_owned(),
                json!({
                    "contenders": contenders_json,
                    "best_peer": best.map(|(_, name)| name),
                    "ratio_to_best_peer": ratios_json,
                }),
            );
        }
        let mixed = self
            .placements
            .iter()
            .flatten()
            .filter(|placement| **placement == Placement::Mixed)
            .count();
        json.insert("mixed_runs".to_owned(), json!(mixed));
        json.insert("near_share_of_probes".to_owned(), json!(self.near_share()));
        (rows, serde_json::Value::Object(json))
    }
}

fn summary(values: &[f64]) -> serde_json::Value {
    let (min, max) = min_max(values);
    json!({ "median": median(values), "min": min, "max": max })
}

impl Measured {
    /// The header of its table: the contenders, then a ratio column for each of ours.
    fn header(&self) -> String {
        let mut header = String::from("| workload |");
        for name in &self.names {
            header.push_str(&format!(" {name} |"));
        }
        for name in OURS {
            header.push_str(&format!(" {name} / best peer |"));
        }
        header.push_str("\n|---|");
        header.push_str(&"--:|".repeat(self.names.len() + OURS.len()));
        header.push('\n');
        header
    }

    /// Its row of the table, its table by placement, and its entry in `interleaved.json`.
    fn row(&self, workload: &str) -> (String, String, serde_json::Value) {
        let mut row = format!("| `{workload}` |");
        for rates in &self.rates {
            let (low, high) = min_max(rates);
            row.push_str(&format!(" {:.2} ({low:.2}–{high:.2}) |", median(rates)));
        }
        let mut ratios_json = serde_json::Map::new();
        for name in OURS {
            let ratios = self.ratios_to_best_peer(name);
            let (low, high) = min_max(&ratios);
            row.push_str(&format!(" {:.2}× ({low:.2}–{high:.2}) |", median(&ratios)));
            ratios_json.insert(name.to_owned(), summary(&ratios));
        }
        row.push('\n');
        let contenders_json: serde_json::Map<_, _> = self
            .names
            .iter()
            .zip(&self.rates)
            .map(|(name, rates)| ((*name).to_owned(), summary(rates)))
            .collect();
        let (placement_rows, by_placement) = self.rows_by_placement(workload);
        let placement_table = format!(
            "\n`{workload}` by the cores' placement: median M lock/unlock pairs per second \
             (runs) over the runs with the cores near each other throughout (round trip below \
             {} ns) and far apart throughout; the probes found them near {:.0}% of the \
             time:\n\n{}{placement_rows}",
            placement::NEAR_BELOW.as_nanos(),
            100.0 * self.near_share(),
            self.header()
        );
        let json = json!({
            "name": workload,
            "contenders": contenders_json,
            "ratio_to_best_peer": ratios_json,
            "by_placement": by_placement,
        });
        (row, placement_table, json)
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: skip the run then.
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    if !arguments.iter().any(|argument| argument == "--bench") {
        return;
    }
    // Workload names after `--` run only those (`cargo bench --bench interleaved -- sync`);
    // the other rows of `interleaved.json` are kept from the last run.
    let chosen: Vec<&str> = arguments
        .iter()
        .map(String::as_str)
        .filter(|argument| !argument.starts_with("--"))
        .collect();
    let wanted = |name: &str| chosen.is_empty() || chosen.contains(&name);
    let runtime = Arc::new(runtime());
    let mut tables = String::new();
    let mut by_placement = String::new();
    let mut workloads_json = Vec::new();
    let mut header = None;
    for workload in Workload::ALL {
        if !wanted(workload.name()) {
            continue;
        }
        eprintln!("measuring {} ({ROUNDS} rounds)", workload.name());
        let measured = measure(&runtime, workload);
        let (row, placement_table, json) = measured.row(workload.name());
        by_placement.push_str(&placement_table);
        header.get_or_insert_with(|| {
            format!(
                "Interleaved: median M lock/unlock pairs per second over {ROUNDS} rounds \
                 (min–max):\n\n{}",
                measured.header()
            )
        });
        tables.push_str(&row);
        workloads_json.push(json);
    }
    if let Some(header) = header {
        tables.insert_str(0, &header);
    }
    if wanted(sync_workload::NAME) {
        eprintln!("measuring {} ({ROUNDS} rounds)", sync_workload::NAME);
        let measured = measure_sync(&runtime);
        let (row, placement_table, json) = measured.row(sync_workload::NAME);
        by_placement.push_str(&placement_table);
        if !tables.is_empty() {
            tables.push('\n');
        }
        tables.push_str(&format!(
            "Threads through blocking calls ({}): median M lock/unlock pairs per second over \
             {ROUNDS} rounds (min–max):\n\n{}{row}",
            sync_workload::SHAPE,
            measured.header()
        ));
        workloads_json.push(json);
    }
    print!("{tables}");
    print!("{by_placement}");
    let report_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("bench-report");
    let path = report_dir.join("interleaved.json");
    // Rows of workloads not run this time stay as the last run left them.
    let kept = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|report| report["workloads"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|row| !row["name"].as_str().is_some_and(wanted));
    let mut rows: Vec<serde_json::Value> = kept.chain(workloads_json).collect();
    let order = |row: &serde_json::Value| {
        let name = row["name"].as_str().unwrap_or_default();
        Workload::ALL
            .iter()
            .position(|workload| workload.name() == name)
            .unwrap_or(Workload::ALL.len())
    };
    rows.sort_by_key(order);
    let report = json!({ "rounds": ROUNDS, "workloads": rows });
    std::fs::create_dir_all(&report_dir).expect("the report directory can be created");
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("JSON"))
        .expect("the report can be written");
    eprintln!("wrote {}", path.display());
}
