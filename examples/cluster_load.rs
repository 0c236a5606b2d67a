//! Load for cluster mode: many tasks of one process lock one key over and over, so that the
//! process's lease is handed from local holder to local holder (lock cohorting). Run it in
//! several terminals at once to see the processes share the key.
//!
//! ```text
//! cargo run --features postgres --example cluster_load -- --key hot --tasks 8 --locks 50
//! ```
//!
//! Prints one line at the end:
//! `load key=K grants=G longest_wait_ms=W`: the grants this process got and the longest any
//! of its `lock` calls waited. On a new table, with no server crash since (a crash raises
//! fences past any it may have lost), the lease table's `fence` for the key counts the
//! acquisitions of every process, so `grants` summed over the processes divided by `fence` is
//! how many grants each round trip to the database served.
//!
//! Options (`--help` lists them): `--database-url URL` (default `DATABASE_URL`, else
//! `postgres://postgres@127.0.0.1:5432/test`), `--prefix P` (default `keyed_locks_demo_`),
//! `--key K`, `--tasks T` (default 8), `--locks N` per task (default 50), `--hold-ms H`
//! (default 1), `--lease-ms L` (default 2000), `--max-local-handoffs M` (default 15; 0 sends
//! every lock to the database, for comparison).

use std::time::Duration;

use clap::Parser;
use keyed_locks::ClusterRegistry;
use tokio::time::Instant;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Load for cluster mode: many tasks of one process lock one key over and over.
#[derive(Debug, Parser)]
#[command(args_override_self = true)]
struct Options {
    /// The PostgreSQL server (the `DATABASE_URL` environment variable, if set)
    #[arg(long, value_name = "URL", default_value_t = default_database_url())]
    database_url: String,
    /// The lease table's prefix
    #[arg(long, value_name = "P", default_value = "keyed_locks_demo_")]
    prefix: String,
    /// The key every task locks
    #[arg(long, value_name = "K")]
    key: String,
    /// Tasks in this process
    #[arg(long, value_name = "T", default_value_t = 8)]
    tasks: u64,
    /// Locks per task
    #[arg(long, value_name = "N", default_value_t = 50)]
    locks: u64,
    /// How long each lock is held, in milliseconds
    #[arg(long, value_name = "H", default_value_t = 1)]
    hold_ms: u64,
    /// The lease time, in milliseconds
    #[arg(long, value_name = "L", default_value_t = 2000)]
    lease_ms: u64,
    /// Local hand-offs per lease before it goes back to the database (0: every lock goes to
    /// the database)
    #[arg(long, value_name = "M", default_value_t = 15)]
    max_local_handoffs: u32,
}

fn default_database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Parses the command line. A usage error exits 1, as every other error of this program does
/// (clap's own code is 2); `--help` exits 0.
fn options() -> Options {
    Options::try_parse().unwrap_or_else(|error| {
        let _ = error.print();
        std::process::exit(if error.use_stderr() { 1 } else { 0 })
    })
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let Options {
        database_url,
        prefix,
        key,
        tasks,
        locks,
        hold_ms,
        lease_ms,
        max_local_handoffs,
    } = options();
    let registry = ClusterRegistry::<String>::builder(&database_url)
        .table_prefix(&prefix)
        .lease(Duration::from_millis(lease_ms))
        .max_local_handoffs(max_local_handoffs)
        .connect()
        .await?;
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let (registry, key) = (registry.clone(), key.clone());
            tokio::spawn(async move {
                let mut longest = Duration::ZERO;
                for _ in 0..locks {
                    let asked = Instant::now();
                    let guard = registry.lock(key.clone()).await?;
                    longest = longest.max(asked.elapsed());
                    // Not even a zero sleep at 0: a tokio timer waits for the next tick of
                    // the timer wheel, which counts milliseconds.
                    if hold_ms > 0 {
                        tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                    }
                    drop(guard);
                }
                Ok::<_, keyed_locks::LockError>(longest)
            })
        })
        .collect();
    let mut longest = Duration::ZERO;
    for worker in workers {
        longest = longest.max(worker.await??);
    }
    registry.shutdown().await;
    println!(
        "load key={key} grants={} longest_wait_ms={}",
        tasks * locks,
        longest.as_millis()
    );
    Ok(())
}
