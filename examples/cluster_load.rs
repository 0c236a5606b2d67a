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
//! Options: `--database-url URL` (default `DATABASE_URL`, else
//! `postgres://postgres@127.0.0.1:5432/test`), `--prefix P` (default `keyed_locks_demo_`),
//! `--key K`, `--tasks T` (default 8), `--locks N` per task (default 50), `--hold-ms H`
//! (default 1), `--lease-ms L` (default 2000), `--max-local-handoffs M` (default 15; 0 sends
//! every lock to the database, for comparison).

use std::time::Duration;

use keyed_locks::ClusterRegistry;
use tokio::time::Instant;

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let mut prefix = "keyed_locks_demo_".to_owned();
    let mut key = None;
    let (mut tasks, mut locks, mut hold_ms, mut lease_ms) = (8u64, 50u64, 1u64, 2000u64);
    let mut max_local_handoffs = 15u32;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag} takes a number"))
        };
        match flag.as_str() {
            "--database-url" => database_url = value.clone(),
            "--prefix" => prefix = value.clone(),
            "--key" => key = Some(value.clone()),
            "--tasks" => tasks = number()?,
            "--locks" => locks = number()?,
            "--hold-ms" => hold_ms = number()?,
            "--lease-ms" => lease_ms = number()?,
            "--max-local-handoffs" => {
                max_local_handoffs = value
                    .parse()
                    .map_err(|_| format!("{flag} takes a number"))?;
            }
            _ => return Err(format!("unknown argument {flag:?}").into()),
        }
    }
    let key = key.ok_or("--key is required")?;
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
