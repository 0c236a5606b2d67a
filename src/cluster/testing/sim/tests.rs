//! The simulator's tests: every seed keeps every promise, one seed gives one log, the
//! committed regression seeds pass, and each planted bug is found.
//!
//! - `SIM_SEEDS=N` runs seeds `0..N` instead of the default [`DEFAULT_SEEDS`];
//! - `SIM_SEED=S` runs seed `S` alone, as the failure message's rerun command does;
//!   `SIM_LOG=path` with it writes that run's event log to `path`, failed or not.
//!
//! A failing seed writes its event log to the system's temporary directory and names it.

use std::fmt::Write as _;
use std::ops::Range;
use std::path::PathBuf;

use super::{PlantedBug, Report, run};

/// Seeds run by `cargo test`: a few seconds in a release build, about ten in a debug one.
const DEFAULT_SEEDS: u64 = 300;

/// Seeds that once failed, with what they found. Each still runs with every test run. (A
/// change to what the simulator draws from a seed changes the run a seed gives; the finding
/// each stands for is also pinned by a test of its own, named here.)
const REGRESSIONS: &[(u64, &str)] = &[
    (
        3,
        "a lock whose lease statement was in flight during shutdown got a guard on a lease that \
         shutdown had given back, while another process held the key \
         (`leases::tests::a_lease_taken_during_shutdown_is_given_back`)",
    ),
    (
        476,
        "an acquisition's reply, late past its caller's timeout, was recorded after a newer \
         lease of the key, and its older fence granted \
         (`leases::tests::a_late_reply_for_an_older_fence_is_not_recorded`)",
    ),
    (
        874,
        "shutdown told its guards their leases were lost only once the release returned, so a \
         guard believed its lease live while another process held the key \
         (`leases::tests::guards_learn_of_shutdown_before_the_release_is_sent`)",
    ),
    (
        66,
        "a lock_all waiting in its process's queue of one key kept the process's idle lease of \
         the other, closing a cycle of waits across processes (`lock_all` registers its \
         interest once it holds its keys locally)",
    ),
    (
        3637,
        "a lock_all statement of a caller that had gone took the rows over from a newer set of \
         the same process and gave them back, while that set believed it held them \
         (`leases_in_flight::a_late_set_of_ours_that_takes_the_rows_over_marks_the_older_set_lost`)",
    ),
    (
        1356,
        "a lock_all reply that came back after a newer statement of the same process had taken \
         one of its rows over was granted, below the newer fence \
         (`leases_in_flight::a_late_reply_to_a_set_below_a_newer_fence_of_ours_is_not_granted`)",
    ),
    (
        12261,
        "a process kept an idle whole lease that another process's lock_all was refused, \
         because a caller of its own wanted the key but waited locally behind a lock_all of its \
         own, which waited for the other process: a cycle of waits \
         (`leases_in_flight::an_idle_lease_another_process_wants_goes_back_at_the_heartbeat`)",
    ),
    (
        6493,
        "the check that no lease is kept for nobody failed on a linger whose end had not run \
         yet after a jump of the clock woke many tasks at once (an overdue linger fails only if \
         it still is at the next check)",
    ),
];

/// How many seeds each planted bug may need before one finds it. The first finding seeds, on
/// the seeds from 0, are printed by `planted_bugs_are_found`; these bounds leave room above them.
const PLANTED: &[(PlantedBug, u64)] = &[
    (PlantedBug::NoFenceCheck, 40),
    (PlantedBug::RenewIgnoresFence, 60),
    (PlantedBug::HandoffPastBound, 10),
    (PlantedBug::TrySnatchesFromWaiter, 40),
    (PlantedBug::TryWaits, 10),
    (PlantedBug::PartOverCapacity, 20),
    (PlantedBug::WholeOverParts, 20),
    (PlantedBug::PartOvertakesWaiter, 20),
    (PlantedBug::LockAllOneByOne, 20),
    (PlantedBug::KeepsWantedLease, 20),
    (PlantedBug::KeepsWantedPart, 100),
    (PlantedBug::KeepsUnwantedLease, 20),
];

fn seeds() -> Range<u64> {
    let number = |name: &str| {
        std::env::var(name).ok().map(|value| {
            value
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{name} must be a number of seeds, not {value:?}"))
        })
    };
    match (number("SIM_SEED"), number("SIM_SEEDS")) {
        (Some(seed), _) => seed..seed + 1,
        (None, Some(count)) => 0..count,
        (None, None) => 0..DEFAULT_SEEDS,
    }
}

/// Writes a failed run's log and says how to rerun it.
fn explain(report: &Report) -> String {
    let path: PathBuf = std::env::temp_dir().join(format!("keyed-locks-sim-{}.log", report.seed));
    let written = match std::fs::write(&path, &report.log) {
        Ok(()) => format!("event log: {}", path.display()),
        Err(error) => format!(
            "could not write the event log to {}: {error}",
            path.display()
        ),
    };
    format!(
        "seed {} failed: {}\n  rerun: SIM_SEED={} cargo test --lib cluster::testing::sim -- --nocapture\n  {written}",
        report.seed,
        report.failure.as_deref().unwrap_or("(no failure)"),
        report.seed,
    )
}

#[test]
fn every_seed_keeps_every_promise() {
    let seeds = seeds();
    let count = seeds.end - seeds.start;
    let mut failures = String::new();
    let mut simulated = std::time::Duration::ZERO;
    let mut faults = 0;
    let mut grants = 0;
    let mut longest_call = std::time::Duration::ZERO;
    let log_to = std::env::var_os("SIM_LOG").filter(|_| seeds.end - seeds.start == 1);
    for seed in seeds {
        let report = run(seed, None);
        if let Some(path) = &log_to {
            std::fs::write(path, &report.log).expect("SIM_LOG names a writable file");
        }
        simulated += report.simulated;
        faults += report.stats.faults;
        grants += report.stats.grants;
        longest_call = longest_call.max(report.longest_call);
        if report.failure.is_some() {
            let _ = writeln!(failures, "{}", explain(&report));
        }
    }
    println!(
        "{count} seeds, {:.1} simulated hours, {grants} grants, {faults} faults injected, \
         longest lock call {longest_call:?}, failures: {}",
        simulated.as_secs_f64() / 3600.0,
        failures
            .lines()
            .filter(|line| line.starts_with("seed"))
            .count()
    );
    assert!(failures.is_empty(), "{failures}");
}

/// The same seed gives the same log, byte for byte: twice in this process, and in another
/// process, run from its start.
#[test]
fn one_seed_gives_one_log() {
    for seed in 0..40 {
        let first = run(seed, None);
        let second = run(seed, None);
        assert!(
            first.log.lines().count() > 100,
            "seed {seed} logged only {} lines",
            first.log.lines().count()
        );
        assert_same_log(
            seed,
            &first.log,
            &second.log,
            "a second run in this process",
        );
    }
    assert_ne!(run(0, None).log, run(1, None).log);

    let test_binary = std::env::current_exe().expect("the test binary's path");
    for seed in [0, 1, 209] {
        let path =
            std::env::temp_dir().join(format!("keyed-locks-sim-{seed}-{}.log", std::process::id()));
        let status = std::process::Command::new(&test_binary)
            .args([
                "--exact",
                "cluster::testing::sim::tests::every_seed_keeps_every_promise",
            ])
            .env("SIM_SEED", seed.to_string())
            .env("SIM_LOG", &path)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("the test binary runs");
        assert!(status.success(), "seed {seed} failed in another process");
        let other = std::fs::read_to_string(&path).expect("the other process wrote its log");
        let _ = std::fs::remove_file(&path);
        assert_same_log(seed, &run(seed, None).log, &other, "another process");
    }
}

fn assert_same_log(seed: u64, one: &str, other: &str, where_: &str) {
    assert!(
        one == other,
        "seed {seed} gave a different log in {where_}; the first difference is at line {}",
        one.lines()
            .zip(other.lines())
            .position(|(a, b)| a != b)
            .map_or("(one is a prefix of the other)".to_owned(), |line| (line
                + 1)
            .to_string())
    );
}

#[test]
fn regression_seeds_pass() {
    for &(seed, found) in REGRESSIONS {
        let report = run(seed, None);
        assert!(
            report.failure.is_none(),
            "regression ({found}):\n{}",
            explain(&report)
        );
    }
}

/// Each planted bug is found within its bound of seeds. With `SIM_SEEDS=N` it also counts how
/// many of the seeds `0..N` find each one (the rates in ARCHITECTURE.md).
#[test]
fn planted_bugs_are_found() {
    let count_over = std::env::var("SIM_SEEDS").is_ok().then(seeds);
    for &(bug, within) in PLANTED {
        let found = (0..within).find_map(|seed| {
            let report = run(seed, Some(bug));
            report.failure.map(|failure| (seed, failure))
        });
        let Some((seed, failure)) = found else {
            panic!("planted bug {bug:?} was not found in {within} seeds");
        };
        println!(
            "planted bug {bug:?}: first found by seed {seed} ({} seeds run): {failure}",
            seed + 1
        );
        if let Some(seeds) = count_over.clone() {
            let total = seeds.end - seeds.start;
            let finding = seeds
                .filter(|&seed| run(seed, Some(bug)).failure.is_some())
                .count();
            println!("planted bug {bug:?}: found by {finding} of {total} seeds");
        }
    }
}
