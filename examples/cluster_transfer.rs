//! Transfers between accounts served by different replicas, with `lock_all([from, to])` on a
//! `ClusterRegistry`: no deadlock whatever order processes name the accounts in, and the total
//! of the balances conserved.
//!
//! ```text
//! cluster_transfer [--database-url URL] [--prefix P] --accounts A --transfers N
//! ```
//!
//! Run it in three terminals, started within a second of each other, against the same
//! PostgreSQL (it needs `--features postgres`):
//!
//! ```text
//! cargo run --features postgres --example cluster_transfer -- --prefix transfer1_ --accounts 5 --transfers 40
//! ```
//!
//! Each process makes `N` transfers between random pairs of the `A` accounts, naming the pair
//! in either order, each under `lock_all` of both accounts' keys. A transfer reads both
//! balances and writes both in one transaction with fenced writes: each account's row keeps
//! the highest fencing token written to it, and a write under a lower one is refused (then the
//! transfer is rolled back and said on stderr). Each process prints how many transfers it made,
//! and the one that finishes last sums the balances and prints the starting total if it is
//! conserved (else the sum it found, and it exits 1):
//!
//! ```text
//! transfers: 40
//! total conserved: 500
//! ```
//!
//! No `lock_all` may wait past a bound (ten leases): a deadlock would show as an error there.
//! The processes join one run as `cluster_rate_limit`'s do (`{P}transfer_runs`,
//! `{P}transfer_workers`); the accounts are `{P}accounts`, made with 100 in each on first use.
//! The database URL defaults to the `DATABASE_URL` environment variable, else
//! `postgres://postgres@127.0.0.1:5432/test`; `--prefix` defaults to
//! `keyed_locks_transfer_demo_`. TLS: the URL's `sslmode` works as in the `cluster` example.

use std::io::Write as _;
use std::time::Duration;

use clap::Parser;
use keyed_locks::ClusterRegistry;
use rand::{RngExt as _, SeedableRng as _};

#[path = "shared/database.rs"]
mod database;
#[path = "shared/run.rs"]
mod run;

use database::{Error, default_database_url, open};
use run::Runs;

/// Transfers between accounts, across processes, under `lock_all`.
#[derive(Debug, Parser)]
#[command(args_override_self = true)]
struct Options {
    /// The PostgreSQL server (the `DATABASE_URL` environment variable, if set)
    #[arg(long, value_name = "URL", default_value_t = default_database_url())]
    database_url: String,
    /// The tables' prefix: `{P}leases` (the registry's), `{P}accounts`, `{P}transfer_runs`
    /// and `{P}transfer_workers` (the demo's)
    #[arg(long, value_name = "P", default_value = "keyed_locks_transfer_demo_")]
    prefix: String,
    /// How many accounts, each starting with 100
    #[arg(long, value_name = "A", value_parser = clap::value_parser!(i32).range(2..))]
    accounts: i32,
    /// How many transfers this process makes
    #[arg(long, value_name = "N")]
    transfers: u32,
}

/// What each account starts with.
const OPENING_BALANCE: i64 = 100;

/// The registry's lease: a transfer holds its keys for milliseconds.
const LEASE: Duration = Duration::from_secs(5);

/// Prints one line and flushes it, so that a reader of a pipe sees it at once.
fn say(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn account_key(account: i32) -> String {
    format!("account:{account}")
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    // A usage error exits 2 (clap's code); `--help` exits 0.
    let options = Options::parse();
    let registry = ClusterRegistry::<String>::builder(&options.database_url)
        .table_prefix(&options.prefix)
        .lease(LEASE)
        .connect()
        .await?;
    let mut client = open(&options.database_url).await?;
    let accounts = format!("\"{}accounts\"", options.prefix);
    database::create(
        &client,
        &format!(
            "CREATE TABLE IF NOT EXISTS {accounts} (account integer PRIMARY KEY, \
             balance bigint NOT NULL, fence bigint NOT NULL DEFAULT 0)"
        ),
    )
    .await?;
    client
        .execute(
            &format!(
                "INSERT INTO {accounts} (account, balance) \
                 SELECT account, $2 FROM generate_series(1, $1) AS account \
                 ON CONFLICT (account) DO NOTHING"
            ),
            &[&options.accounts, &OPENING_BALANCE],
        )
        .await?;
    let runs = Runs::create(&client, &options.prefix, "transfer").await?;
    let run = runs.join(&mut client).await?;
    tokio::time::sleep(run.starts_in).await;

    let mut random = rand::rngs::StdRng::seed_from_u64(u64::from(std::process::id()));
    let bound = LEASE * 10;
    let write = format!(
        "UPDATE {accounts} SET balance = balance + $2, fence = $3 \
         WHERE account = $1 AND fence < $3"
    );
    let mut made = 0u32;
    for _ in 0..options.transfers {
        let from = random.random_range(1..=options.accounts);
        let to = (from + random.random_range(1..options.accounts) - 1) % options.accounts + 1;
        let amount = random.random_range(1..=10i64);
        let (from_key, to_key) = (account_key(from), account_key(to));
        let both =
            tokio::time::timeout(bound, registry.lock_all([from_key.clone(), to_key.clone()]))
                .await
                .map_err(|_| {
                    format!("lock_all of accounts {from} and {to} waited past {bound:?}")
                })??;
        let (Some(from_token), Some(to_token)) =
            (both.fencing_token(&from_key), both.fencing_token(&to_key))
        else {
            return Err("the guard holds both accounts".into());
        };
        let transaction = client.transaction().await?;
        let balance: i64 = transaction
            .query_one(
                &format!("SELECT balance FROM {accounts} WHERE account = $1"),
                &[&from],
            )
            .await?
            .get(0);
        let amount = amount.min(balance);
        let debited = transaction
            .execute(&write, &[&from, &-amount, &i64::try_from(from_token)?])
            .await?;
        let credited = transaction
            .execute(&write, &[&to, &amount, &i64::try_from(to_token)?])
            .await?;
        if debited == 1 && credited == 1 {
            transaction.commit().await?;
            made += 1;
        } else {
            transaction.rollback().await?;
            eprintln!("transfer {from} -> {to}: a write was fenced off; rolled back");
        }
        drop(both);
    }
    registry.shutdown().await;
    say(format_args!("transfers: {made}"));

    if runs.finish(&mut client, &run).await? {
        let total: i64 = client
            .query_one(
                &format!("SELECT coalesce(sum(balance), 0)::bigint FROM {accounts}"),
                &[],
            )
            .await?
            .get(0);
        let opening = OPENING_BALANCE * i64::from(options.accounts);
        if total == opening {
            say(format_args!("total conserved: {total}"));
        } else {
            say(format_args!(
                "total not conserved: {total}, where {opening} was"
            ));
            std::process::exit(1);
        }
    }
    Ok(())
}
