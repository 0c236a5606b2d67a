//! A concurrency limit shared by every replica: at most `C` calls in flight to a pretend
//! payment provider, whichever process makes them, with `acquire("provider", 1)` on a
//! `ClusterRegistry` of capacity `C`.
//!
//! ```text
//! cluster_rate_limit [--database-url URL] [--prefix P] --capacity C --tasks T --calls N --hold-ms MS
//! ```
//!
//! Run it in three terminals, started within a second of each other, against the same
//! PostgreSQL (it needs `--features postgres`):
//!
//! ```text
//! cargo run --features postgres --example cluster_rate_limit -- --prefix limit1_ --capacity 4 --tasks 3 --calls 10 --hold-ms 20
//! ```
//!
//! Each of the `T` tasks of a process makes `N` calls, each under one permit. A call records
//! its start and its end in `{P}provider_calls` with the server's clock (`clock_timestamp()`),
//! the start after the permit is granted and the end before it is given back. Each process
//! prints how many calls it made, and the one that finishes last reads every call of the run
//! and prints the most that were in flight at one moment, across processes (then exits 1 if
//! that is above `C`):
//!
//! ```text
//! calls: 30
//! peak in flight across processes: 4
//! ```
//!
//! With more tasks in all than permits (`3 * T > C`), calls queue for permits and the peak is
//! `C`: the limit is reached, and never passed.
//!
//! **The run.** Processes join one run, so that their calls overlap and the last one knows it
//! is last: the first process to start records a run in `{P}provider_runs` that begins a second
//! ahead; every process that starts before that run is over joins it (registering in
//! `{P}provider_workers`), waits for its start, makes its calls, and marks itself done. Joining
//! and finishing each hold the lock of the run's row, so the process that finds no worker of
//! the run left is the last. One that starts once every worker of the run is done starts a
//! new run.
//!
//! The database URL defaults to the `DATABASE_URL` environment variable, else
//! `postgres://postgres@127.0.0.1:5432/test`. The tables are `{prefix}leases` (the registry's;
//! its capacity is the table's, and a process with another `--capacity` is refused, naming
//! both) and the demo's `{prefix}provider_runs`, `{prefix}provider_workers` and
//! `{prefix}provider_calls`, created if missing; `--prefix` defaults to
//! `keyed_locks_limit_demo_`. TLS: the URL's `sslmode` works as in the `cluster` example.

use std::io::Write as _;
use std::num::NonZeroU32;
use std::time::Duration;

use clap::Parser;
use keyed_locks::ClusterRegistry;

#[path = "shared/database.rs"]
mod database;
#[path = "shared/run.rs"]
mod run;

use database::{Error, default_database_url, open};
use run::{Run, Runs};

/// A concurrency limit shared by every replica.
#[derive(Debug, Parser)]
#[command(args_override_self = true)]
struct Options {
    /// The PostgreSQL server (the `DATABASE_URL` environment variable, if set)
    #[arg(long, value_name = "URL", default_value_t = default_database_url())]
    database_url: String,
    /// The tables' prefix: `{P}leases` (the registry's), `{P}provider_runs`,
    /// `{P}provider_workers` and `{P}provider_calls` (the demo's)
    #[arg(long, value_name = "P", default_value = "keyed_locks_limit_demo_")]
    prefix: String,
    /// Calls in flight at once to the provider, across every process
    #[arg(long, value_name = "C")]
    capacity: NonZeroU32,
    /// Tasks of this process that call the provider
    #[arg(long, value_name = "T", value_parser = clap::value_parser!(u32).range(1..))]
    tasks: u32,
    /// Calls each task makes
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    calls: u32,
    /// How long a call lasts, in milliseconds
    #[arg(long, value_name = "MS")]
    hold_ms: u64,
}

/// The demo's tables, on a connection of their own.
struct Provider {
    client: tokio_postgres::Client,
    runs: Runs,
    calls: String,
}

impl Provider {
    async fn connect(options: &Options) -> Result<Provider, Error> {
        let client = open(&options.database_url).await?;
        let prefix = &options.prefix;
        let runs = Runs::create(&client, prefix, "provider").await?;
        let calls = format!("\"{prefix}provider_calls\"");
        database::create(
            &client,
            &format!(
                "CREATE TABLE IF NOT EXISTS {calls} \
                 (call bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, run bigint NOT NULL, \
                  pid bigint NOT NULL, started timestamptz NOT NULL, ended timestamptz)"
            ),
        )
        .await?;
        Ok(Provider {
            client,
            runs,
            calls,
        })
    }

    /// Records a call's start, by the server's clock: its id.
    async fn started(&self, run: &Run) -> Result<i64, Error> {
        let statement = format!(
            "INSERT INTO {} (run, pid, started) VALUES ($1, $2, clock_timestamp()) RETURNING call",
            self.calls
        );
        let row = self
            .client
            .query_one(&statement, &[&run.run, &i64::from(std::process::id())])
            .await?;
        Ok(row.get(0))
    }

    /// Records a call's end, by the server's clock.
    async fn ended(&self, call: i64) -> Result<(), Error> {
        let statement = format!(
            "UPDATE {} SET ended = clock_timestamp() WHERE call = $1",
            self.calls
        );
        self.client.execute(&statement, &[&call]).await?;
        Ok(())
    }

    /// The most calls of the run in flight at one moment: every start counts one up and every
    /// end one down, in the order of the server's clock, ends first at the same instant.
    async fn peak(&self, run: &Run) -> Result<i64, Error> {
        let statement = format!(
            "SELECT coalesce(max(in_flight), 0)::bigint FROM ( \
               SELECT sum(delta) OVER (ORDER BY at, delta ROWS UNBOUNDED PRECEDING) AS in_flight \
               FROM (SELECT started AS at, 1 AS delta FROM {calls} WHERE run = $1 \
                     UNION ALL \
                     SELECT ended, -1 FROM {calls} WHERE run = $1) AS events) AS running",
            calls = self.calls
        );
        Ok(self.client.query_one(&statement, &[&run.run]).await?.get(0))
    }
}

/// Prints one line and flushes it, so that a reader of a pipe sees it at once.
fn say(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    // A usage error exits 2 (clap's code); `--help` exits 0.
    let options = Options::parse();
    let registry = ClusterRegistry::<String>::builder(&options.database_url)
        .table_prefix(&options.prefix)
        .lease(Duration::from_secs(10))
        .capacity(options.capacity)
        .connect()
        .await?;
    let mut provider = Provider::connect(&options).await?;
    let run = provider.runs.join(&mut provider.client).await?;
    tokio::time::sleep(run.starts_in).await;

    let provider = std::sync::Arc::new(provider);
    let run = std::sync::Arc::new(run);
    let mut tasks = tokio::task::JoinSet::new();
    for _task in 0..options.tasks {
        let (registry, provider, run) = (
            registry.clone(),
            std::sync::Arc::clone(&provider),
            std::sync::Arc::clone(&run),
        );
        let (calls, hold) = (options.calls, Duration::from_millis(options.hold_ms));
        tasks.spawn(async move {
            for _call in 0..calls {
                let permit = registry.acquire("provider".to_owned(), 1).await?;
                let call = provider.started(&run).await?;
                tokio::time::sleep(hold).await;
                provider.ended(call).await?;
                drop(permit);
            }
            Ok::<u32, Error>(calls)
        });
    }
    let mut made = 0u64;
    while let Some(task) = tasks.join_next().await {
        made += u64::from(task??);
    }
    registry.shutdown().await;
    say(format_args!("calls: {made}"));

    let mut provider =
        std::sync::Arc::into_inner(provider).ok_or("the tasks still hold the provider")?;
    let run = std::sync::Arc::into_inner(run).ok_or("the tasks still hold the run")?;
    if provider.runs.finish(&mut provider.client, &run).await? {
        let peak = provider.peak(&run).await?;
        say(format_args!("peak in flight across processes: {peak}"));
        if peak > i64::from(options.capacity.get()) {
            std::process::exit(1);
        }
    }
    Ok(())
}
