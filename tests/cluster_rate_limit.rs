//! A concurrency limit holds across processes: three `cluster_rate_limit` examples (built by
//! `cargo test --features postgres` with the other examples) share 4 permits of one key
//! against the real server, and the most calls in flight at one moment, by the server's
//! clock, is the capacity: reached, never passed.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;
use tokio::time::timeout;

use crate::cluster_registry::{database_url, fresh_prefix};
use crate::example_binary::example_binary;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_never_have_more_calls_in_flight_than_the_capacity() {
    let url = database_url();
    let prefix = fresh_prefix("kl_test_rate_limit_").await;
    let binary = example_binary("cluster_rate_limit", " --features postgres");
    let processes: Vec<_> = (0..3)
        .map(|_| {
            Command::new(&binary)
                .args(["--database-url", &url, "--prefix", &prefix])
                .args(["--capacity", "3", "--tasks", "2", "--calls", "8"])
                .args(["--hold-ms", "15"])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .expect("the rate-limit example starts")
        })
        .collect();
    let mut peaks = Vec::new();
    for process in processes {
        let output = timeout(Duration::from_secs(60), process.wait_with_output())
            .await
            .expect("the run finishes in time")
            .unwrap();
        let printed = String::from_utf8(output.stdout).unwrap();
        assert!(output.status.success(), "{}: {printed}", output.status);
        let mut lines = printed.lines();
        assert_eq!(lines.next(), Some("calls: 16"), "{printed}");
        peaks.extend(lines.map(str::to_owned));
    }
    assert_eq!(
        peaks,
        ["peak in flight across processes: 3"],
        "the last process, and it alone, prints the peak, which is the capacity"
    );
}
