//! Turns the benchmark results into the tables and the chart of the README.
//!
//! Reads `target/bench-report/interleaved.json` (written by `cargo bench --bench interleaved`,
//! the contenders taking turns round after round; its `sync` row, threads through blocking
//! calls, is a table of its own), criterion's estimates
//! (`target/criterion/<workload>/<implementation>/new/`, written by `cargo bench --bench
//! peers`) and `target/bench-report/memory.json` (written by `cargo bench --bench memory`),
//! prints the tables as Markdown with the machine they ran on, saves them to
//! `target/bench-report/report.md` and draws `docs/bench.svg` (throughput from the
//! interleaved run when there is one, else from criterion).
//!
//! ```text
//! cargo bench --bench interleaved && cargo bench --bench peers && cargo bench --bench memory
//! cargo bench --bench bench_report
//! ```
//!
//! It runs only under `cargo bench`, which passes `--bench`: `cargo test --benches` runs it
//! without, and then it leaves the report and the chart alone. Plain `cargo bench` runs it
//! first (cargo runs the benchmarks in the order of their names), on the results of the run
//! before; with no results at all it leaves `docs/bench.svg` as it is.

mod command_line;

use std::error::Error;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Parser;
use serde_json::Value;

/// This crate, as the benchmarks name it: the default registry, then in actor mode (every
/// request goes through the registry's actor task), then with 8 shards.
const OURS: &str = "keyed-locks";
const OURS_ACTOR: &str = "keyed-locks-actor";
const OURS_SHARDED: &str = "keyed-locks-8-shards";
/// Our configurations, first in [`ALL`] and in its order, each held against the best peer,
/// with the label of its ratio column.
const OUR_CONFIGURATIONS: [(&str, &str); 3] = [
    (OURS, "ours"),
    (OURS_ACTOR, "actor mode"),
    (OURS_SHARDED, "8 shards"),
];
/// The implementations users choose between; the best of them is the bar to meet.
const PEERS: [&str; 4] = ["lockable", "keyed-lock", "key-mutex", "refcount-map"];
/// Where the peers sit in [`ALL`]: right after our configurations.
const PEER_INDICES: std::ops::Range<usize> =
    OUR_CONFIGURATIONS.len()..OUR_CONFIGURATIONS.len() + PEERS.len();
/// An actor with a tokio channel, a oneshot per lock and no cancel handling: what the round
/// trip to an actor costs by itself.
const NAIVE_ACTOR: &str = "naive-actor";
/// The smallest single-owner keyed lock (`benches/contenders/single_owner.rs`): our design
/// without our promises, the ceiling our default mode is held to.
const STAND_IN: &str = "single-owner-stand-in";
/// A bare `tokio::sync::Mutex` per key, no map: what no registry can beat.
const FLOOR: &str = "floor";
const ALL: [&str; 10] = [
    OURS,
    OURS_ACTOR,
    OURS_SHARDED,
    PEERS[0],
    PEERS[1],
    PEERS[2],
    PEERS[3],
    NAIVE_ACTOR,
    STAND_IN,
    FLOOR,
];

/// Bar colours, in the order of [`ALL`]: reds for our configurations (the actor mode darkest).
const COLOURS: [&str; 10] = [
    "#d62728", "#67000d", "#ff9896", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
    "#17becf", "#7f7f7f",
];

/// A throughput workload: criterion group, what it does, and the target ratio of ours to the
/// best peer.
struct Workload {
    name: &'static str,
    shape: &'static str,
    target: f64,
}

const WORKLOADS: [Workload; 3] = [
    Workload {
        name: "distinct",
        shape: "1 task × 300,000, a new key each",
        target: 1.5,
    },
    Workload {
        name: "spread",
        shape: "512 tasks × 600 over 10,000 keys, yield inside",
        target: 1.0,
    },
    Workload {
        name: "hot",
        shape: "512 tasks × 200 on one key, yield inside",
        target: 1.0,
    },
];

/// The `sync` workload of the interleaved run: threads through blocking calls, against peers
/// of its own (lockable's `LockPool::blocking_lock`, a std map of per-key locks).
/// It has no target yet: this is its first figure.
const SYNC: (&str, &str) = (
    "sync",
    "4 threads × 50,000, half on 4 shared keys, half a new key each",
);
/// The contenders of [`SYNC`], in table order: ours, then its peers.
const SYNC_CONTENDERS: [&str; 5] = [OURS, OURS_ACTOR, OURS_SHARDED, "lockable", "std-mutex-map"];

/// A memory measurement: its label and how to read it from a row of `memory.json`.
struct Measure {
    label: &'static str,
    /// Whether ours is held against the best peer (not for counts of retained blocks).
    compared: bool,
    read: fn(&Value) -> Option<f64>,
}

const MEASURES: [Measure; 7] = [
    Measure {
        label: "bytes per waiting task (100,000 waiters)",
        compared: true,
        read: |row| row["waiter_bytes"].as_f64(),
    },
    Measure {
        label: "bytes per waiting future, no task (100,000 waiters)",
        compared: true,
        read: |row| row["future_bytes"].as_f64(),
    },
    Measure {
        label: "bytes per held key (500,000 held)",
        compared: true,
        read: |row| row["held_key_bytes"].as_f64(),
    },
    Measure {
        label: "entries left, timeout storm (10,000)",
        compared: true,
        read: |row| row["timeout_storm"]["entries_left"].as_f64(),
    },
    Measure {
        label: "entries left, release-then-abort storm (10,000)",
        compared: true,
        read: |row| row["abort_storm"]["entries_left"].as_f64(),
    },
    Measure {
        label: "allocations left, timeout storm",
        compared: false,
        read: |row| row["timeout_storm"]["allocations_left"].as_f64(),
    },
    Measure {
        label: "allocations left, release-then-abort storm",
        compared: false,
        read: |row| row["abort_storm"]["allocations_left"].as_f64(),
    },
];

/// Turns the results of `cargo bench --bench interleaved`, `--bench peers` and `--bench memory`
/// into the README's tables (`target/bench-report/report.md`) and chart (`docs/bench.svg`).
#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    runner: command_line::Runner,
}

fn main() -> Result<(), Box<dyn Error>> {
    let cli: Cli = command_line::parse();
    if !cli.runner.bench || !cli.runner.picks_this_program() {
        return Ok(());
    }
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate_dir.join("target"));

    let throughput = read_throughput(&target_dir.join("criterion"));
    let interleaved = read_json(&target_dir.join("bench-report").join("interleaved.json"));
    let memory = read_memory(&target_dir.join("bench-report").join("memory.json"));
    let machine = machine();

    let mut report = String::new();
    writeln!(report, "Machine: {machine}\n")?;
    if let Some(interleaved) = &interleaved {
        writeln!(report, "{}", interleaved_table(interleaved))?;
        if let Some(table) = sync_table(interleaved) {
            writeln!(report, "{table}")?;
        }
    }
    writeln!(report, "{}", throughput_table(&throughput))?;
    match &memory {
        Some(memory) => writeln!(report, "{}", memory_table(memory))?,
        None => writeln!(
            report,
            "No memory results: run `cargo bench --bench memory` first.\n"
        )?,
    }
    print!("{report}");

    let report_dir = target_dir.join("bench-report");
    std::fs::create_dir_all(&report_dir)?;
    std::fs::write(report_dir.join("report.md"), &report)?;
    let chart = crate_dir.join("docs").join("bench.svg");
    // Plain `cargo bench` runs this first, before any benchmark on a fresh checkout: a chart
    // of nothing would replace the committed one.
    let measured = interleaved.is_some()
        || memory.is_some()
        || throughput.iter().flatten().any(Option::is_some);
    if !measured {
        eprintln!(
            "wrote {}; no results, so {} is left as it is",
            report_dir.join("report.md").display(),
            chart.display()
        );
        return Ok(());
    }
    std::fs::create_dir_all(crate_dir.join("docs"))?;
    let charted = interleaved
        .as_ref()
        .map_or_else(|| throughput.clone(), interleaved_medians);
    std::fs::write(&chart, svg(&charted, memory.as_ref(), &machine))?;
    eprintln!(
        "wrote {} and {}",
        report_dir.join("report.md").display(),
        chart.display()
    );
    Ok(())
}

/// Million lock/unlock pairs per second, indexed like `WORKLOADS` then `ALL`; `None` where
/// criterion has no estimate.
type Throughput = Vec<Vec<Option<f64>>>;

fn read_throughput(criterion_dir: &Path) -> Throughput {
    WORKLOADS
        .iter()
        .map(|workload| {
            ALL.iter()
                .map(|name| {
                    let dir = criterion_dir.join(workload.name).join(name).join("new");
                    let estimates = read_json(&dir.join("estimates.json"))?;
                    let benchmark = read_json(&dir.join("benchmark.json"))?;
                    let nanos_per_run = estimates["mean"]["point_estimate"].as_f64()?;
                    let pairs_per_run = benchmark["throughput"]["Elements"].as_f64()?;
                    Some(pairs_per_run / nanos_per_run * 1e3)
                })
                .collect()
        })
        .collect()
}

/// The medians of the interleaved run, indexed like [`read_throughput`]'s result.
fn interleaved_medians(interleaved: &Value) -> Throughput {
    WORKLOADS
        .iter()
        .map(|workload| {
            let row = interleaved_row(interleaved, workload.name);
            ALL.iter()
                .map(|name| row?["contenders"][name]["median"].as_f64())
                .collect()
        })
        .collect()
}

fn interleaved_row<'a>(interleaved: &'a Value, workload: &str) -> Option<&'a Value> {
    interleaved["workloads"]
        .as_array()?
        .iter()
        .find(|row| row["name"] == workload)
}

/// "median (min–max)" of a summary in the interleaved JSON, with a unit suffix.
fn spread_cell(summary: &Value, suffix: &str) -> String {
    match (
        summary["median"].as_f64(),
        summary["min"].as_f64(),
        summary["max"].as_f64(),
    ) {
        (Some(median), Some(min), Some(max)) => {
            format!("{median:.2}{suffix} ({min:.2}–{max:.2})")
        }
        _ => "–".to_owned(),
    }
}

fn interleaved_table(interleaved: &Value) -> String {
    let rounds = interleaved["rounds"].as_u64().unwrap_or(0);
    let mut table = format!(
        "Throughput, the contenders taking turns: median million lock/unlock pairs per second \
         over {rounds} rounds (min–max; higher is better). The ratio is the median of each \
         round's ratio to that round's best peer:\n\n| workload |"
    );
    push_throughput_header(&mut table);
    for workload in &WORKLOADS {
        let Some(row) = interleaved_row(interleaved, workload.name) else {
            continue;
        };
        let _ = write!(table, "| `{}`: {} |", workload.name, workload.shape);
        for name in ALL {
            let _ = write!(table, " {} |", spread_cell(&row["contenders"][name], ""));
        }
        for (name, _) in OUR_CONFIGURATIONS {
            let _ = write!(
                table,
                " {} |",
                spread_cell(&row["ratio_to_best_peer"][name], "×")
            );
        }
        let _ = writeln!(table, " ≥ {:.1}× |", workload.target);
    }
    table
}

/// The `sync` row of the interleaved run as a table of its own, if it was measured.
fn sync_table(interleaved: &Value) -> Option<String> {
    let (workload, shape) = SYNC;
    let row = interleaved_row(interleaved, workload)?;
    let rounds = interleaved["rounds"].as_u64().unwrap_or(0);
    let mut table = format!(
        "Threads through blocking calls, the contenders taking turns: median million \
         lock/unlock pairs per second over {rounds} rounds (min–max; higher is better):\n\n\
         | workload |"
    );
    for name in SYNC_CONTENDERS {
        let _ = write!(table, " {name} |");
    }
    for (_, label) in OUR_CONFIGURATIONS {
        let _ = write!(table, " {label} / best peer |");
    }
    table.push_str("\n|---|");
    table.push_str(&"--:|".repeat(SYNC_CONTENDERS.len() + OUR_CONFIGURATIONS.len()));
    let _ = write!(table, "\n| `{workload}`: {shape} |");
    for name in SYNC_CONTENDERS {
        let _ = write!(table, " {} |", spread_cell(&row["contenders"][name], ""));
    }
    for (name, _) in OUR_CONFIGURATIONS {
        let _ = write!(
            table,
            " {} |",
            spread_cell(&row["ratio_to_best_peer"][name], "×")
        );
    }
    table.push('\n');
    Some(table)
}

/// The header of a throughput table: the contenders, a ratio to the best peer for each of our
/// configurations, and the target.
fn push_throughput_header(table: &mut String) {
    for name in ALL {
        let _ = write!(table, " {name} |");
    }
    for (_, label) in OUR_CONFIGURATIONS {
        let _ = write!(table, " {label} / best peer |");
    }
    table.push_str(" target |\n|---|");
    table.push_str(&"--:|".repeat(ALL.len() + OUR_CONFIGURATIONS.len() + 1));
    table.push('\n');
}

fn read_memory(path: &Path) -> Option<Value> {
    read_json(path)
}

fn read_json(path: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

/// "model name × N cores" from /proc/cpuinfo and the available parallelism.
fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|cpuinfo| {
            cpuinfo
                .lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cores = std::thread::available_parallelism().map_or(0, |cores| cores.get());
    format!(
        "{model}, nproc {cores}, {} {}",
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// The best peer's value: the highest throughput, or the lowest memory or leftover count.
fn best_peer(values: &[Option<f64>], higher_is_better: bool) -> Option<(usize, f64)> {
    PEER_INDICES
        .filter_map(|index| values[index].map(|value| (index, value)))
        .reduce(|best, next| {
            let better = if higher_is_better {
                next.1 > best.1
            } else {
                next.1 < best.1
            };
            if better { next } else { best }
        })
}

fn cell(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "–".to_owned(), |value| format!("{value:.decimals$}"))
}

fn throughput_table(throughput: &Throughput) -> String {
    let mut table = String::from(
        "Throughput, criterion (`cargo bench --bench peers`, one contender after the other): \
         million lock/unlock pairs per second (higher is better):\n\n| workload |",
    );
    push_throughput_header(&mut table);
    for (workload, values) in WORKLOADS.iter().zip(throughput) {
        let _ = write!(table, "| `{}`: {} |", workload.name, workload.shape);
        for value in values {
            let _ = write!(table, " {} |", cell(*value, 2));
        }
        let best = best_peer(values, true);
        for ours in values.iter().take(OUR_CONFIGURATIONS.len()) {
            let ratio = match (*ours, best) {
                (Some(ours), Some((index, best))) => {
                    format!("{:.2}× (vs {})", ours / best, ALL[index])
                }
                _ => "–".to_owned(),
            };
            let _ = write!(table, " {ratio} |");
        }
        let _ = writeln!(table, " ≥ {:.1}× |", workload.target);
    }
    table
}

fn memory_values(memory: &Value, measure: &Measure) -> Vec<Option<f64>> {
    let rows = memory["contenders"].as_array().cloned().unwrap_or_default();
    ALL.iter()
        .map(|name| {
            rows.iter()
                .find(|row| row["name"] == *name)
                .and_then(|row| (measure.read)(row))
        })
        .collect()
}

fn memory_table(memory: &Value) -> String {
    let mut table = String::from("Memory and leftovers (lower is better):\n\n| measure |");
    for name in ALL {
        let _ = write!(table, " {name} |");
    }
    table.push_str(" ours / best peer |\n|---|");
    table.push_str(&"--:|".repeat(ALL.len() + 1));
    table.push('\n');
    for measure in &MEASURES {
        let values = memory_values(memory, measure);
        let _ = write!(table, "| {} |", measure.label);
        for value in &values {
            let _ = write!(table, " {} |", cell(*value, 0));
        }
        let ratio = match (values[0], best_peer(&values, false)) {
            _ if !measure.compared => "–".to_owned(),
            (Some(ours), Some((index, best))) if best > 0.0 => {
                format!("{:.2}× (vs {})", ours / best, ALL[index])
            }
            (Some(0.0), Some(_)) => "equal (0)".to_owned(),
            (Some(ours), Some((index, _))) => format!("{ours:.0} vs 0 ({})", ALL[index]),
            _ => "–".to_owned(),
        };
        let _ = writeln!(table, " {ratio} |");
    }
    table.push_str(
        "\n`–`: no count exposed (keyed-lock keeps its map private; the floor has no map). \
         Allocations left: heap blocks still live after the storm and its cleanup, against \
         before it; a leaked entry keeps at least one, so they stand in for keyed-lock's \
         missing count. A few are a map's retained capacity (keyed-locks: each shard's table, \
         pending grants and queue keep theirs, so 8 shards leave more). The naive \
         actor loses a grant whose waiter is aborted after the grant was sent: that key stays \
         held for ever.\n",
    );
    table
}

/// One bar chart panel.
struct Panel<'a> {
    title: String,
    unit: &'a str,
    values: Vec<Option<f64>>,
}

const PANEL_WIDTH: f64 = 330.0;
const PANEL_HEIGHT: f64 = 250.0;
const COLUMNS: usize = 3;
const LEGEND_COLUMNS: usize = 4;

fn svg(throughput: &Throughput, memory: Option<&Value>, machine: &str) -> String {
    let mut panels: Vec<Panel<'_>> = WORKLOADS
        .iter()
        .zip(throughput)
        .map(|(workload, values)| Panel {
            title: format!("{}: M ops/s (higher is better)", workload.name),
            unit: "",
            values: values.clone(),
        })
        .collect();
    if let Some(memory) = memory {
        for (measure, title) in [
            (&MEASURES[0], "bytes per waiting task"),
            (&MEASURES[2], "bytes per held key"),
            (&MEASURES[6], "allocations left, abort storm"),
        ] {
            panels.push(Panel {
                title: format!("{title} (lower is better)"),
                unit: "",
                values: memory_values(memory, measure),
            });
        }
    }
    let rows = panels.len().div_ceil(COLUMNS);
    let width = PANEL_WIDTH * COLUMNS as f64;
    let legend_rows = ALL.len().div_ceil(LEGEND_COLUMNS);
    let legend_height = 20.0 * legend_rows as f64 + 10.0;
    let height = 40.0 + PANEL_HEIGHT * rows as f64 + legend_height;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        svg,
        r##"<rect width="100%" height="100%" fill="white"/><text x="10" y="18" font-size="14" font-weight="bold">keyed-locks vs peers</text><text x="10" y="33" fill="#555">{}</text>"##,
        escape(machine)
    );
    for (index, panel) in panels.iter().enumerate() {
        let x = PANEL_WIDTH * (index % COLUMNS) as f64;
        let y = 40.0 + PANEL_HEIGHT * (index / COLUMNS) as f64;
        draw_panel(&mut svg, panel, x, y);
    }
    for (index, name) in ALL.iter().enumerate() {
        let x = 10.0 + 240.0 * (index % LEGEND_COLUMNS) as f64;
        let legend_y = height - legend_height + 15.0 + 20.0 * (index / LEGEND_COLUMNS) as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="{x}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            legend_y - 10.0,
            COLOURS[index],
            x + 16.0,
            legend_y,
            escape(name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn draw_panel(svg: &mut String, panel: &Panel<'_>, x: f64, y: f64) {
    let plot_left = x + 15.0;
    let plot_top = y + 40.0;
    let plot_width = PANEL_WIDTH - 30.0;
    let plot_height = PANEL_HEIGHT - 80.0;
    let max = panel
        .values
        .iter()
        .flatten()
        .copied()
        .fold(0.0_f64, f64::max);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" font-weight="bold">{}</text>"#,
        x + 15.0,
        y + 20.0,
        escape(&panel.title)
    );
    let _ = writeln!(
        svg,
        r##"<line x1="{plot_left}" y1="{0}" x2="{1}" y2="{0}" stroke="#333"/>"##,
        plot_top + plot_height,
        plot_left + plot_width
    );
    let slot = plot_width / panel.values.len() as f64;
    for (index, value) in panel.values.iter().enumerate() {
        let bar_x = plot_left + slot * index as f64 + slot * 0.15;
        let bar_width = slot * 0.7;
        let label_x = bar_x + bar_width / 2.0;
        let Some(value) = value else {
            let _ = writeln!(
                svg,
                r##"<text x="{label_x}" y="{}" text-anchor="middle" fill="#777">n/a</text>"##,
                plot_top + plot_height - 4.0
            );
            continue;
        };
        let bar_height = if max > 0.0 {
            value / max * plot_height
        } else {
            0.0
        };
        let bar_y = plot_top + plot_height - bar_height;
        let _ = writeln!(
            svg,
            r#"<rect x="{bar_x:.1}" y="{bar_y:.1}" width="{bar_width:.1}" height="{bar_height:.1}" fill="{}"/><text x="{label_x:.1}" y="{:.1}" text-anchor="middle">{}{}</text>"#,
            COLOURS[index],
            bar_y - 3.0,
            short(*value),
            panel.unit
        );
    }
}

/// A bar label: two decimals below 10, none above or for whole numbers.
fn short(value: f64) -> String {
    if value < 10.0 && value.fract() != 0.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.0}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
