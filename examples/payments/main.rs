//! A payments service: credits and debits of accounts over HTTP, one read-modify-write per
//! account at a time, serialized by a `LockRegistry<u64>` keyed by the account id.
//!
//! The balances live in memory, but every read is a simulated database call (a 5 ms sleep
//! between reading a balance and writing the new one back), so concurrent requests for one
//! account really do overlap: without the lock, two credits read the same balance and one of
//! them is lost. Requests for different accounts never wait for each other.
//!
//! ```sh
//! cargo run --example payments                            # listening on http://127.0.0.1:3000
//! cargo run --example payments -- --addr 127.0.0.1:0      # any free port, printed first
//! cargo run --example payments -- --unsafe-no-lock        # no lock: updates get lost
//! cargo run --example payments -- --work-ms 50            # each change holds its lock 50 ms more
//! cargo run --example payments -- --journal 2000          # keeps 2,000 events, drawn at /locks/page
//! cargo run --example payments --features metrics         # adds GET /metrics (Prometheus)
//! ```
//!
//! The first line on stdout is always `listening on http://<ip>:<port>`. Then:
//!
//! ```sh
//! curl -X POST localhost:3000/accounts/7/credit -H 'content-type: application/json' -d '{"amount": 100}'
//! # {"id":7,"balance":100}
//! curl -X POST localhost:3000/accounts/7/debit -H 'content-type: application/json' -d '{"amount": 30}'
//! # {"id":7,"balance":70}
//! curl -i -X POST localhost:3000/accounts/7/debit -H 'content-type: application/json' -d '{"amount": 500}'
//! # HTTP/1.1 409 Conflict ... {"error":"insufficient funds: balance 70, debit 500"}
//! curl localhost:3000/accounts/7
//! # {"id":7,"balance":70}
//! curl localhost:3000/stats
//! # {"keys":0,"held":0,"holders":0,"permits":0,"waiting":0,"grants":3}
//! curl localhost:3000/metrics    # Prometheus text with --features metrics; else a JSON 404
//! curl localhost:3000/locks       # the most contended accounts (50; ?top=n for n, 1 to 1000)
//! # with --work-ms 50 and twenty credits of account 7 in flight:
//! # [{"key":7,"hold":"Exclusive","holders":[{"fencing_token":8,"permits":1,
//! #   "held_for":{"at_least":{"secs":0,"nanos":0},"at_most":{"secs":0,"nanos":553285695}}}],
//! #   "waiters":12,"first_waiter_permits":1,
//! #   "oldest_waited":{"at_least":{"secs":0,"nanos":0},"at_most":{"secs":0,"nanos":553285695}}}]
//! curl -i 'localhost:3000/locks?top=abc'
//! # HTTP/1.1 400 Bad Request ... {"error":"top must be a whole number from 1 to 1000, not \"abc\""}
//! ```
//!
//! `/locks` is empty (`[]`) unless a request holds or waits for an account at that moment:
//! with `--work-ms 50`, a few concurrent credits of one account make a queue. Open
//! `http://localhost:3000/locks/page` in a browser for the same view as a page that reloads
//! every second: the contended accounts with their holders' fencing tokens, how long each has
//! held and how many wait, and, with `--journal`, the lock timeline of the last seconds.
//!
//! Warnings go to stderr, among them the registry's stall warnings: a request that holds its
//! account for more than a second, or a grant that no request picks up within one.
//!
//! `--work-ms MS` stands for a call to a payment provider inside each credit and debit, made
//! while the account's lock is held (0, the default, makes none).
//!
//! Amounts are whole numbers of minor units (cents), from 1 to 1,000,000,000 per request;
//! balances are `u64` and never go below 0. Every error is JSON, `{"error": "..."}`, with a
//! 4xx status (`api.rs` lists them). Ctrl-C stops the service once the requests in flight
//! are answered. `tests/payments_load.rs` runs 2,000 concurrent requests against it, with and
//! without the lock.

mod accounts;
mod api;
mod cli;
mod locks;
mod metrics;

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use keyed_locks::LockRegistry;

use crate::accounts::Accounts;
use crate::api::AppState;
use crate::cli::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    // Warnings on stderr (the registry's stall warnings among them); stdout stays the
    // address line alone.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::WARN)
        .init();
    // A usage error exits 2 (clap's code); `--help` exits 0.
    let cli = Cli::parse();
    match serve(&cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("payments: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(cli: &Cli) -> Result<(), String> {
    let addr = cli.addr;
    let lock_accounts = !cli.unsafe_no_lock;
    // First: the registry takes its counters and gauges from the recorder installed when it
    // is built.
    let metrics_routes = metrics::routes()?;
    let mut builder = LockRegistry::builder()
        // A hold this long means a request is stuck inside its read-modify-write.
        .warn_held_longer_than(Duration::from_secs(1))
        // A grant nobody takes means a lock future that is no longer polled (a futurelock).
        .warn_ungranted_pickup_after(Duration::from_secs(1));
    if let Some(events) = cli.journal {
        builder = builder.journal(events);
    }
    let state = AppState {
        registry: builder.spawn(),
        accounts: Arc::new(Accounts::default()),
        lock_accounts,
        work: Duration::from_millis(cli.work_ms),
        journal: cli.journal.is_some(),
    };
    let app = api::routes(state.clone())
        .merge(locks::routes(state))
        .merge(metrics_routes);
    let app = api::with_fallbacks(app);

    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|error| format!("cannot listen on {addr}: {error}"))?;
    let local = listener
        .local_addr()
        .map_err(|error| format!("no local address: {error}"))?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on http://{local}")
        .and_then(|()| stdout.flush())
        .map_err(|error| format!("cannot write to stdout: {error}"))?;
    drop(stdout);
    if !lock_accounts {
        eprintln!("payments: --unsafe-no-lock: accounts are not locked, updates will be lost");
    }

    axum::serve(listener, app)
        .with_graceful_shutdown(ctrl_c())
        .await
        .map_err(|error| format!("serving on {local}: {error}"))
}

/// Resolves on Ctrl-C; never, if the signal cannot be listened for.
async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}
