//! Cluster mode across real OS processes: the `cluster` example (built by `cargo test
//! --features postgres` with the other examples), run several times at once against the real
//! PostgreSQL server, stopped, killed and cut off from the database.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Notify;
use tokio::time::{Instant, timeout};

use crate::cluster_registry::{database_url, fresh_prefix};
use crate::cluster_tls::with_parameters;
use crate::example_binary::example_binary;

/// One running `cluster` process and the lines it printed, each with when it was read.
struct Demo {
    child: Child,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
    printed: Arc<Notify>,
}

impl Demo {
    fn start(args: &[&str]) -> Demo {
        let mut child = Command::new(example_binary("cluster", " --features postgres"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("the example starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let printed = Arc::new(Notify::new());
        let (sink, notify) = (Arc::clone(&lines), Arc::clone(&printed));
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                sink.lock().unwrap().push((Instant::now(), line));
                notify.notify_waiters();
            }
            notify.notify_waiters();
        });
        Demo {
            child,
            lines,
            printed,
        }
    }

    fn pid(&self) -> String {
        self.child.id().expect("still running").to_string()
    }

    fn lines(&self) -> Vec<(Instant, String)> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits until a line starting with `prefix` is printed; returns it and when it came.
    async fn wait_for(&self, prefix: &str, bound: Duration) -> (Instant, String) {
        let deadline = Instant::now() + bound;
        loop {
            let printed = self.printed.notified();
            if let Some(found) = self
                .lines()
                .into_iter()
                .find(|(_, line)| line.starts_with(prefix))
            {
                return found;
            }
            if timeout(deadline - Instant::now().min(deadline), printed)
                .await
                .is_err()
            {
                panic!(
                    "no line starting with {prefix:?} within {bound:?}: {:?}",
                    self.lines()
                );
            }
        }
    }

    /// Waits for the process to exit successfully and returns its lines.
    async fn finish(mut self, bound: Duration) -> Vec<String> {
        let status = timeout(bound, self.child.wait())
            .await
            .expect("the example finishes in time")
            .expect("waiting for the example");
        // The reader may still be draining the pipe.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let lines: Vec<String> = self.lines().into_iter().map(|(_, line)| line).collect();
        assert!(
            status.success(),
            "the example failed: {status}, printed {lines:?}"
        );
        lines
    }
}

fn signal(pid: &str, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, pid])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {signal} {pid}");
}

/// `key=... token=T` -> T.
fn token_of(line: &str) -> u64 {
    line.split(' ')
        .find_map(|field| field.strip_prefix("token="))
        .and_then(|token| token.parse().ok())
        .unwrap_or_else(|| panic!("no token in {line:?}"))
}

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split(' ')
        .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))
}

/// The lines of a holder whose lease ran out before its one write: it learnt it had lost the
/// lease, wrote all the same, and the fence turned the write away.
#[track_caller]
fn assert_played_the_stale_holder(lines: &[String], token: u64) {
    assert_eq!(
        lines,
        [
            format!("granted key=k token={token}"),
            format!("lost key=k token={token}"),
            format!("fenced key=k token={token}"),
            "done key=k wrote=0 fenced=1".to_owned(),
        ]
    );
}

fn args<'a>(url: &'a str, prefix: &'a str, key: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--database-url", url, "--prefix", prefix, "--key", key];
    args.extend_from_slice(rest);
    args
}

/// One increment of key `k` that holds it for `hold_ms` under leases of `lease`.
fn start_holder(url: &str, prefix: &str, lease: Duration, hold_ms: &str) -> Demo {
    let lease_ms = lease.as_millis().to_string();
    Demo::start(&args(
        url,
        prefix,
        "k",
        &[
            "--increments",
            "1",
            "--hold-ms",
            hold_ms,
            "--lease-ms",
            &lease_ms,
        ],
    ))
}

/// One increment of key `k` by a second process, started once the holder that got `granted`
/// is gone at `gone_at`: checks that it was granted only once the holder's lease could have
/// run out (its last renewal was at most a heartbeat, a quarter of the lease, before), with a
/// higher token.
async fn start_successor(
    url: &str,
    prefix: &str,
    lease: Duration,
    gone_at: Instant,
    granted: &str,
) -> Demo {
    let lease_ms = lease.as_millis().to_string();
    let next = Demo::start(&args(
        url,
        prefix,
        "k",
        &["--increments", "1", "--lease-ms", &lease_ms],
    ));
    let (taken_at, taken) = next.wait_for("granted ", Duration::from_secs(30)).await;
    assert!(
        taken_at >= gone_at + lease * 3 / 4 - Duration::from_millis(100),
        "taken {:?} after the holder was gone, before its lease could run out",
        taken_at - gone_at
    );
    assert!(token_of(&taken) > token_of(granted));
    next
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_per_key_lose_no_update_and_tokens_increase_in_write_order() {
    three_processes_per_key(&database_url(), "kl_test_procs_").await;
}

/// The same over TLS: the demo, its command line and its lines unchanged, with
/// `?sslmode=require` in its URL (the registry's connections and its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_with_sslmode_require_three_processes_per_key_lose_no_update() {
    let url = with_parameters(&database_url(), "sslmode=require");
    three_processes_per_key(&url, "kl_test_procs_tls_").await;
}

async fn three_processes_per_key(url: &str, prefix: &str) {
    let url = url.to_owned();
    let prefix = fresh_prefix(prefix).await;
    let increments = 25;
    let count = increments.to_string();
    let mut demos = Vec::new();
    for key in ["a", "b"] {
        for _ in 0..3 {
            demos.push((
                key,
                Demo::start(&args(
                    &url,
                    &prefix,
                    key,
                    &["--increments", &count, "--hold-ms", "2"],
                )),
            ));
        }
    }
    let mut writes: Vec<(String, u64, u64)> = Vec::new();
    for (key, demo) in demos {
        let lines = demo.finish(Duration::from_secs(120)).await;
        assert_eq!(
            lines.last().map(String::as_str),
            Some(format!("done key={key} wrote={increments} fenced=0").as_str()),
            "{lines:?}"
        );
        for line in lines.iter().filter(|line| line.starts_with("wrote ")) {
            let value = field(line, "value").unwrap().parse().unwrap();
            writes.push((key.to_owned(), value, token_of(line)));
        }
    }
    for key in ["a", "b"] {
        let mut of_key: Vec<(u64, u64)> = writes
            .iter()
            .filter(|(k, ..)| k == key)
            .map(|(_, value, token)| (*value, *token))
            .collect();
        of_key.sort_unstable();
        let values: Vec<u64> = of_key.iter().map(|(value, _)| *value).collect();
        assert_eq!(
            values,
            (1..=3 * increments).collect::<Vec<_>>(),
            "no lost update on {key}"
        );
        assert!(
            of_key.windows(2).all(|pair| pair[0].1 < pair[1].1),
            "tokens of {key} increase in write order: {of_key:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_is_overtaken_after_its_lease() {
    let url = database_url();
    let prefix = fresh_prefix("kl_test_kill_").await;
    let lease = Duration::from_millis(1500);
    let mut holder = start_holder(&url, &prefix, lease, "60000");
    let (_, granted) = holder.wait_for("granted ", Duration::from_secs(30)).await;
    holder.child.kill().await.expect("kill -9");
    let next = start_successor(&url, &prefix, lease, Instant::now(), &granted).await;
    let lines = next.finish(Duration::from_secs(30)).await;
    assert_eq!(lines.last().unwrap(), "done key=k wrote=1 fenced=0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holder_is_overtaken_after_its_lease_and_fenced_off_when_it_resumes() {
    let url = database_url();
    let prefix = fresh_prefix("kl_test_stop_").await;
    let lease = Duration::from_millis(1500);
    let stale = start_holder(&url, &prefix, lease, "1000");
    let (_, granted) = stale.wait_for("granted ", Duration::from_secs(30)).await;
    signal(&stale.pid(), "-STOP");
    let next = start_successor(&url, &prefix, lease, Instant::now(), &granted).await;
    next.wait_for("wrote ", Duration::from_secs(30)).await;

    signal(&stale.pid(), "-CONT");
    let lines = stale.finish(Duration::from_secs(30)).await;
    assert_played_the_stale_holder(&lines, token_of(&granted));
    next.finish(Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_from_the_database_reports_lost_and_is_fenced_off() {
    let url = database_url();
    let prefix = fresh_prefix("kl_test_cut_off_").await;
    let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    // A role of its own, so that its connections can be cut and kept from coming back.
    let role = "kl_test_cut_off_role";
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN CREATE ROLE {role} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             ALTER ROLE {role} LOGIN;
             GRANT CREATE, USAGE ON SCHEMA public TO {role};"
        ))
        .await
        .unwrap();
    let role_url = url.replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    assert_ne!(
        role_url, url,
        "DATABASE_URL must name the postgres user for this test"
    );

    let lease = Duration::from_millis(1500);
    let cut_off = start_holder(&role_url, &prefix, lease, "4000");
    let (_, granted) = cut_off.wait_for("granted ", Duration::from_secs(30)).await;
    // Cut the registry's connections (not the demo's own) and keep them from coming back.
    admin
        .batch_execute(&format!(
            "ALTER ROLE {role} NOLOGIN;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE usename = '{role}' AND application_name LIKE 'keyed-locks %';"
        ))
        .await
        .unwrap();
    let next = start_successor(&url, &prefix, lease, Instant::now(), &granted).await;
    next.wait_for("wrote ", Duration::from_secs(30)).await;

    let lines = cut_off.finish(Duration::from_secs(30)).await;
    admin
        .batch_execute(&format!("ALTER ROLE {role} LOGIN"))
        .await
        .unwrap();
    assert_played_the_stale_holder(&lines, token_of(&granted));
    next.finish(Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_local_contention_on_one_key_is_served_mostly_locally_and_fairly() {
    let url = database_url();
    let prefix = fresh_prefix("kl_test_contention_").await;
    let binary = example_binary("cluster_load", " --features postgres");
    let (tasks, locks) = (8u64, 25u64);
    let processes: Vec<_> = (0..3)
        .map(|_| {
            Command::new(&binary)
                .args(["--database-url", &url, "--prefix", &prefix, "--key", "hot"])
                .args(["--tasks", &tasks.to_string(), "--locks", &locks.to_string()])
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("the load example starts")
        })
        .collect();
    let (mut grants, mut longest_wait_ms) = (0u64, 0u64);
    for process in processes {
        let output = timeout(Duration::from_secs(120), process.wait_with_output())
            .await
            .expect("the load finishes in time")
            .unwrap();
        let line = String::from_utf8(output.stdout).unwrap();
        assert!(output.status.success(), "{line}");
        grants += field(line.trim(), "grants")
            .unwrap()
            .parse::<u64>()
            .unwrap();
        let waited: u64 = field(line.trim(), "longest_wait_ms")
            .unwrap()
            .parse()
            .unwrap();
        longest_wait_ms = longest_wait_ms.max(waited);
    }
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let acquisitions: i64 = client
        .query_one(
            &format!("SELECT fence FROM \"{prefix}leases\" WHERE key = 'hot'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let per_acquisition = grants as f64 / acquisitions as f64;
    println!(
        "3 processes x {tasks} tasks x {locks} locks: {grants} grants, {acquisitions} lease \
         acquisitions ({per_acquisition:.1} grants per round trip), longest wait of any lock \
         {longest_wait_ms} ms"
    );
    assert_eq!(grants, 3 * tasks * locks);
    assert!(
        per_acquisition >= 4.0,
        "cohorting serves several grants per acquisition"
    );
    assert!(longest_wait_ms < 15_000, "no process starves");
}
