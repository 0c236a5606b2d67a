//! Every tick of a scheduled job runs exactly once across processes: three `cluster_jobs`
//! examples (built by `cargo test --features postgres` with the other examples) try each
//! tick's key with `try_lock` against the real server, one runs the tick, and the last to
//! finish finds every tick recorded once.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;
use tokio::time::timeout;

use crate::cluster_registry::{database_url, fresh_prefix};
use crate::example_binary::example_binary;

/// `ran R of 8 ticks` -> R.
fn ticks_ran(line: &str, ticks: u64) -> Option<u64> {
    line.strip_prefix("ran ")?
        .strip_suffix(&format!(" of {ticks} ticks"))?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_run_every_tick_of_a_job_exactly_once() {
    let url = database_url();
    let prefix = fresh_prefix("kl_test_jobs_").await;
    let binary = example_binary("cluster_jobs", " --features postgres");
    let ticks = 8;
    let processes: Vec<_> = (0..3)
        .map(|_| {
            Command::new(&binary)
                .args(["--database-url", &url, "--prefix", &prefix])
                .args(["--job", "nightly", "--ticks", &ticks.to_string()])
                // Long enough for three processes to wake and ask within each tick on a
                // loaded two-core machine.
                .args(["--tick-ms", "300"])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .expect("the jobs example starts")
        })
        .collect();
    let (mut ran, mut summaries) = (0, Vec::new());
    for process in processes {
        let output = timeout(Duration::from_secs(60), process.wait_with_output())
            .await
            .expect("the run finishes in time")
            .unwrap();
        let printed = String::from_utf8(output.stdout).unwrap();
        assert!(output.status.success(), "{}: {printed}", output.status);
        let lines: Vec<&str> = printed.lines().collect();
        let own = lines
            .first()
            .and_then(|line| ticks_ran(line, ticks))
            .unwrap_or_else(|| panic!("no `ran R of {ticks} ticks` first: {lines:?}"));
        ran += own;
        match &lines[1..] {
            [] => {}
            [summary] => summaries.push(summary.to_string()),
            more => panic!("lines after `ran`: {more:?}"),
        }
    }
    assert_eq!(ran, ticks, "each tick was run by one process");
    assert_eq!(
        summaries,
        [format!("ticks run exactly once: {ticks} of {ticks}")],
        "the last process, and it alone, finds every tick recorded once"
    );
}
