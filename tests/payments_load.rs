//! The payments example serializes each account's read-modify-write: 2,000 concurrent credits
//! and debits over 20 accounts leave every balance exact and nothing in the registry, and the
//! same load with `--unsafe-no-lock` loses updates. Bad input gets a 4xx with a JSON error.
//!
//! The tests run the example binary next to this one (`target/<profile>/examples/payments`).
//! `cargo test` builds it; with a test-name filter or `--test main`, cargo builds no example,
//! so run `cargo build --example payments` first (the tests refuse a binary older than the
//! example's sources).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use tokio::sync::{Mutex, Semaphore};
use tokio::task::JoinSet;

use crate::example_binary::example_binary;

/// Accounts 0 to 19 take the load.
const ACCOUNTS: u64 = 20;
/// Credits and debits fired at once: 100 per account.
const REQUESTS: u64 = 2_000;
/// Each account's credit before the load: more than all of its debits, so that no debit can
/// be refused whatever order the requests run in, and every final balance is known.
const OPENING: u64 = 1_000_000;

/// The two loads take their turns, so that at most one load's connections are open at once.
static ONE_LOAD_AT_A_TIME: Mutex<()> = Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_lock_every_balance_is_exact_and_nothing_is_left() {
    let _turn = ONE_LOAD_AT_A_TIME.lock().await;
    let service = Service::start(&[]).await;
    let client = client();

    let balances = run_load(&service, &client).await;

    assert_eq!(balances, expected_balances(), "balances after the load");
    let stats = service.get(&client, "/stats").await;
    for count in ["keys", "held", "holders", "permits", "waiting"] {
        assert_eq!(stats[count], 0, "{count} after the load: {stats}");
    }
    // Every credit and debit took its account's lock once.
    assert_eq!(stats["grants"], ACCOUNTS + REQUESTS, "grants: {stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_lock_updates_are_lost() {
    let _turn = ONE_LOAD_AT_A_TIME.lock().await;
    let service = Service::start(&["--unsafe-no-lock"]).await;
    let client = client();

    let balances = run_load(&service, &client).await;

    let expected = expected_balances();
    let wrong = (0..ACCOUNTS as usize)
        .filter(|&account| balances[account] != expected[account])
        .count();
    assert!(
        wrong > 0,
        "without the lock, every balance still came out exact: {balances:?}"
    );
    eprintln!("without the lock: {wrong} of {ACCOUNTS} balances wrong");
    assert_eq!(service.get(&client, "/stats").await["grants"], 0);
}

/// With the `metrics` feature, `/metrics` serves the registry's counters and gauges in
/// Prometheus text: here after two credits and an overdraft, all through the lock.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn metrics_count_the_grants_and_show_nothing_held_afterwards() {
    let service = Service::start(&[]).await;
    let client = client();
    for _ in 0..2 {
        let credited = service.post(&client, "/accounts/3/credit", json!({"amount": 5}));
        assert!(credited.await.status().is_success());
    }
    let overdraft = service.post(&client, "/accounts/3/debit", json!({"amount": 11}));
    expect_error(overdraft.await, StatusCode::CONFLICT).await;
    let text = client
        .get(service.url("/metrics"))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("Prometheus text");
    for line in [
        "keyed_locks_grants_total 3",
        "keyed_locks_keys 0",
        "keyed_locks_held 0",
        "keyed_locks_wait_seconds_count 3",
        "keyed_locks_hold_seconds_count 3",
    ] {
        assert!(
            text.lines().any(|shown| shown == line),
            "no `{line}` in\n{text}"
        );
    }
}

#[tokio::test]
async fn bad_input_gets_a_json_error_and_an_unknown_account_has_balance_0() {
    let service = Service::start(&[]).await;
    let client = client();

    let malformed = service.post_raw(&client, "/accounts/1/credit", "{\"amount\": ");
    expect_error(malformed.await, StatusCode::BAD_REQUEST).await;
    let missing = service.post(&client, "/accounts/1/credit", json!({"sum": 5}));
    expect_error(missing.await, StatusCode::UNPROCESSABLE_ENTITY).await;
    for amount in [
        json!(-5),
        json!(0),
        json!(2.5),
        json!(1_000_000_001u64),
        json!(1e30),
    ] {
        let response = service.post(&client, "/accounts/1/credit", json!({ "amount": amount }));
        expect_error(response.await, StatusCode::UNPROCESSABLE_ENTITY).await;
    }
    let not_a_number = service.post(&client, "/accounts/abc/credit", json!({"amount": 5}));
    expect_error(not_a_number.await, StatusCode::BAD_REQUEST).await;
    let not_a_number = client.get(service.url("/accounts/abc")).send();
    expect_error(not_a_number.await.expect("GET"), StatusCode::BAD_REQUEST).await;
    let untyped = client
        .post(service.url("/accounts/1/credit"))
        .body("{\"amount\": 5}");
    let untyped = untyped.send().await.expect("POST");
    expect_error(untyped, StatusCode::UNSUPPORTED_MEDIA_TYPE).await;

    let credited = service.post(&client, "/accounts/9/credit", json!({"amount": 100}));
    assert_eq!(
        credited.await.json::<Value>().await.expect("JSON"),
        json!({"id": 9, "balance": 100})
    );
    let overdraft = service.post(&client, "/accounts/9/debit", json!({"amount": 101}));
    let error = expect_error(overdraft.await, StatusCode::CONFLICT).await;
    assert!(error.contains("insufficient funds"), "{error}");
    assert_eq!(
        service.get(&client, "/accounts/9").await,
        json!({"id": 9, "balance": 100})
    );

    assert_eq!(
        service.get(&client, "/accounts/7").await,
        json!({"id": 7, "balance": 0})
    );
    let stats = service.get(&client, "/stats").await;
    for count in ["keys", "held", "waiting"] {
        assert_eq!(stats[count], 0, "{count}: {stats}");
    }
}

#[test]
fn a_bad_command_line_is_refused_with_a_message() {
    for args in [&["--bogus"][..], &["--addr"], &["--addr", "localhost:3000"]] {
        let output = Command::new(example_binary("payments", ""))
            .args(args)
            .output()
            .expect("the example runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        // clap's message: what is wrong, then where to read the options.
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
        assert!(stderr.contains("--help"), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}

/// One credit or debit of the load.
struct Order {
    account: u64,
    credit: bool,
    amount: u64,
}

/// Per account: 100 orders, about two credits for each debit, of 1 to 50.
fn load() -> Vec<Order> {
    (0..REQUESTS)
        .map(|request| Order {
            account: request % ACCOUNTS,
            credit: request % 3 != 0,
            amount: 1 + request % 50,
        })
        .collect()
}

/// Each account's balance after the opening credit and its orders, in any order.
fn expected_balances() -> Vec<u64> {
    let mut balances = vec![OPENING; ACCOUNTS as usize];
    for order in load() {
        let balance = &mut balances[order.account as usize];
        *balance = if order.credit {
            *balance + order.amount
        } else {
            *balance - order.amount
        };
    }
    balances
}

/// Opens every account with [`OPENING`], then sends the whole load at once and returns the
/// balances of accounts 0 to 19 after it.
async fn run_load(service: &Service, client: &Client) -> Vec<u64> {
    for account in 0..ACCOUNTS {
        let path = format!("/accounts/{account}/credit");
        let response = service.post(client, &path, json!({ "amount": OPENING }));
        assert_eq!(response.await.status(), StatusCode::OK);
    }

    let in_flight = std::sync::Arc::new(Semaphore::new(in_flight_limit()));
    let started = Instant::now();
    let mut requests = JoinSet::new();
    for order in load() {
        let kind = if order.credit { "credit" } else { "debit" };
        let request = client
            .post(service.url(&format!("/accounts/{}/{kind}", order.account)))
            .json(&json!({ "amount": order.amount }));
        let in_flight = std::sync::Arc::clone(&in_flight);
        requests.spawn(async move {
            let _slot = in_flight.acquire_owned().await.expect("never closed");
            let response = request.send().await.expect("the request is answered");
            let status = response.status();
            let body = response.json::<Value>().await.expect("a JSON body");
            (order.account, status, body)
        });
    }
    while let Some(answered) = requests.join_next().await {
        let (account, status, body) = answered.expect("the request task finishes");
        assert_eq!(status, StatusCode::OK, "account {account}: {body}");
        assert_eq!(body["id"], account, "{body}");
    }
    eprintln!("{REQUESTS} requests answered in {:?}", started.elapsed());

    let mut balances = Vec::new();
    for account in 0..ACCOUNTS {
        let body = service.get(client, &format!("/accounts/{account}")).await;
        balances.push(body["balance"].as_u64().expect("a balance"));
    }
    balances
}

/// How many requests may be in flight at once: all of them, unless this process may not
/// open that many sockets (each connection takes one descriptor here and one in the
/// service, which inherits our limit, and a closed connection's descriptor is given back a
/// little after its response). Linux says in /proc; elsewhere, all of them.
fn in_flight_limit() -> usize {
    let soft_limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            let line = limits
                .lines()
                .find(|line| line.starts_with("Max open files"))?;
            line.split_whitespace().nth(3)?.parse::<usize>().ok()
        });
    match soft_limit {
        // Half: room for connections still closing, and for the rest of the suite, which
        // runs in this process meanwhile.
        Some(limit) => (limit / 2).clamp(64, REQUESTS as usize),
        None => REQUESTS as usize,
    }
}

/// A client that opens a connection per request and closes it with the response, so that
/// the connections open at any moment are the requests in flight.
pub(crate) fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(0)
        .no_proxy()
        .build()
        .expect("an HTTP client")
}

/// Checks a refusal: its status, a JSON body, and a message in `error`, which it returns.
pub(crate) async fn expect_error(response: reqwest::Response, status: StatusCode) -> String {
    assert_eq!(response.status(), status, "{}", response.url());
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .cloned();
    assert_eq!(
        content_type.as_ref().and_then(|value| value.to_str().ok()),
        Some("application/json"),
        "{}",
        response.url()
    );
    let body = response.json::<Value>().await.expect("a JSON body");
    let error = body["error"].as_str().expect("an error message");
    assert!(!error.is_empty());
    error.to_string()
}

/// A running `payments` process on a free port, killed and waited for when dropped, on every
/// exit path of a test. What it wrote to stderr is shown if the test fails.
pub(crate) struct Service {
    child: Child,
    base: String,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Service {
    pub(crate) async fn start(args: &[&str]) -> Service {
        let mut child = Command::new(example_binary("payments", ""))
            .args(["--addr", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the example starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let mut service = Service {
            child,
            base: String::new(),
            stderr: Some(std::thread::spawn(move || {
                let mut text = String::new();
                let _ = stderr.read_to_string(&mut text);
                text
            })),
        };
        // A thread reads the first line, then drains the pipe until the process ends.
        let (first_line, printed) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = first_line.send(lines.next());
            lines.for_each(drop);
        });
        let line = tokio::time::timeout(Duration::from_secs(60), printed)
            .await
            .expect("the example prints its address within 60 s")
            .expect("the reader thread sends the first line")
            .expect("the example prints a line before it exits")
            .expect("stdout is readable");
        let base = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("the first line is {line:?}"));
        service.base = base.to_string();
        service
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub(crate) async fn get(&self, client: &Client, path: &str) -> Value {
        let response = client.get(self.url(path)).send().await.expect("GET");
        assert_eq!(response.status(), StatusCode::OK, "GET {path}");
        response.json().await.expect("a JSON body")
    }

    pub(crate) async fn post(&self, client: &Client, path: &str, body: Value) -> reqwest::Response {
        client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("POST")
    }

    async fn post_raw(&self, client: &Client, path: &str, body: &'static str) -> reqwest::Response {
        client
            .post(self.url(path))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .expect("POST")
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let stderr = self.stderr.take().and_then(|reader| reader.join().ok());
        if std::thread::panicking() {
            eprintln!(
                "the payments process's stderr:\n{}",
                stderr.unwrap_or_default()
            );
        }
    }
}
