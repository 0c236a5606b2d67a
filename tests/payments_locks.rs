//! The payments example shows its contended locks: with a slow provider call (`--work-ms`) and
//! concurrent credits of one account, `GET /locks` shows that account held, by one holder
//! with a fencing token, and waited for, and `GET /locks/page` shows it in a table above the
//! journal's timeline (`--journal`). With nothing contended both say so; a bad `top` gets a
//! 400 with a JSON error, and bad values of the new flags are refused.
//!
//! Like `payments_load`, these run the example binary: `cargo build --example payments` first
//! when running them alone.

use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use serde_json::json;
use tokio::task::JoinSet;

use crate::example_binary::example_binary;
use crate::payments_load::{Service, client, expect_error};

/// The account every credit goes to.
const ACCOUNT: u64 = 42;
/// Credits sent at once: one holds the account, the others queue behind it.
const CREDITS: u64 = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contended_account_shows_its_holder_token_waiters_and_timeline() {
    let service = Service::start(&["--work-ms", "100", "--journal", "2000"]).await;
    let client = client();

    assert_eq!(service.get(&client, "/locks").await, json!([]));
    let idle = page(&service, &client, "/locks/page").await;
    assert!(idle.contains("Nothing is contended"), "{idle}");

    let mut credits = JoinSet::new();
    for _ in 0..CREDITS {
        let credit = client
            .post(service.url(&format!("/accounts/{ACCOUNT}/credit")))
            .json(&json!({"amount": 1}));
        credits.spawn(async move { credit.send().await.expect("POST").status() });
    }

    // Each credit holds the account for its 5 ms read and its 100 ms provider call, so the
    // queue lasts over a second: long enough to be seen, however slowly the requests start.
    let deadline = Instant::now() + Duration::from_secs(30);
    let shown = loop {
        let view = service.get(&client, "/locks").await;
        let contended = view
            .as_array()
            .expect("an array of keys")
            .iter()
            .find(|key| key["key"] == ACCOUNT && key["waiters"].as_u64() > Some(0));
        if let Some(key) = contended {
            break key.clone();
        }
        assert!(
            Instant::now() < deadline,
            "account {ACCOUNT} never showed waiters: {view}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(shown["hold"], "Exclusive", "{shown}");
    let holders = shown["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), 1, "{shown}");
    let token = holders[0]["fencing_token"].as_u64().expect("a token");
    assert!(token >= 1, "{shown}");
    for bounds in [&holders[0]["held_for"], &shown["oldest_waited"]] {
        assert!(bounds["at_least"]["secs"].is_u64(), "{shown}");
        assert!(bounds["at_most"]["nanos"].is_u64(), "{shown}");
    }
    assert_eq!(shown["first_waiter_permits"], 1, "{shown}");
    let limited = service.get(&client, "/locks?top=1").await;
    assert!(
        limited.as_array().expect("an array").len() <= 1,
        "{limited}"
    );

    // The queue is still there: most of its second is left.
    let contended = page(&service, &client, "/locks/page").await;
    assert!(contended.contains("<table"), "{contended}");
    let row = format!("<tr class=\"waited\"><td class=\"key\">{ACCOUNT}</td><td>1</td>");
    assert!(
        contended.contains(&row),
        "no waited-for row {row} in\n{contended}"
    );
    assert!(contended.contains("<svg"), "{contended}");
    // The holder's token and how long it has held, in a unit, e.g. `≤ 12.3 ms`.
    let row = &contended[contended.find(&row).expect("the row")..];
    let row = &row[..row.find("</tr>").expect("the row's end")];
    let shown_token = row
        .split_once("<td class=\"tokens\">")
        .and_then(|(_, cell)| cell.split_once("</td>"))
        .and_then(|(text, _)| text.parse::<u64>().ok());
    // A later holder than the one `/locks` showed, or the same.
    assert!(shown_token >= Some(token), "{row}");
    let held_for = row
        .split("<span title=\"at least ")
        .nth(1)
        .and_then(|cell| cell.split_once("\">"))
        .and_then(|(_, text)| text.split_once("</span>"))
        .map(|(text, _)| text)
        .unwrap_or_else(|| panic!("no held-for bounds in {row}"));
    assert!(
        [" ns", " µs", " ms", " s"]
            .iter()
            .any(|unit| held_for.ends_with(unit)),
        "held for {held_for:?} in {row}"
    );

    while let Some(status) = credits.join_next().await {
        assert_eq!(status.expect("the credit task finishes"), StatusCode::OK);
    }
    assert_eq!(
        service
            .get(&client, &format!("/accounts/{ACCOUNT}"))
            .await
            .get("balance"),
        Some(&json!(CREDITS)),
        "every credit counted once"
    );
    assert_eq!(service.get(&client, "/locks").await, json!([]));
}

#[tokio::test]
async fn a_bad_top_gets_a_json_error_and_no_journal_draws_no_timeline() {
    let service = Service::start(&[]).await;
    let client = client();
    for path in [
        "/locks?top=abc",
        "/locks?top=0",
        "/locks?top=1001",
        "/locks?top=",
        "/locks?tpo=5",
        "/locks/page?top=abc",
    ] {
        let response = client.get(service.url(path)).send().await.expect("GET");
        let error = expect_error(response, StatusCode::BAD_REQUEST).await;
        assert!(error.contains("top"), "{path}: {error}");
    }
    let without_journal = page(&service, &client, "/locks/page?top=5").await;
    assert!(!without_journal.contains("<svg"), "{without_journal}");
    assert!(without_journal.contains("--journal"), "{without_journal}");
}

#[test]
fn bad_values_of_the_new_flags_are_refused() {
    for args in [
        &["--work-ms", "abc"][..],
        &["--work-ms", "-1"],
        &["--work-ms", "60001"],
        &["--journal", "0"],
        &["--journal", "many"],
    ] {
        let output = Command::new(example_binary("payments", ""))
            .args(args)
            .output()
            .expect("the example runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}

/// `path` as HTML, checked to be served as HTML and never cached.
async fn page(service: &Service, client: &Client, path: &str) -> String {
    let response = client.get(service.url(path)).send().await.expect("GET");
    assert_eq!(response.status(), StatusCode::OK, "GET {path}");
    let header = |name| {
        response
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(
        header(reqwest::header::CONTENT_TYPE).as_deref(),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(
        header(reqwest::header::CACHE_CONTROL).as_deref(),
        Some("no-store")
    );
    response.text().await.expect("an HTML body")
}
