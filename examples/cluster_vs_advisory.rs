//! Cluster mode against PostgreSQL's advisory locks, on the same server with the same processes
//! and tasks: the comparison a team that already runs PostgreSQL would make.
//!
//! ```text
//! cargo run --release --features postgres --example cluster_vs_advisory -- --workload hot
//! cargo run --release --features postgres --example cluster_vs_advisory -- --workload keys
//! cargo run --release --features postgres --example cluster_vs_advisory -- --workload try
//! cargo run --release --features postgres --example cluster_vs_advisory -- --workload shared
//! cargo run --release --features postgres --example cluster_vs_advisory -- --workload own
//! ```
//!
//! It starts `--processes` child processes (default 3) of itself for each contender, each with
//! `--tasks` tasks (default 8) that take and release `--locks` locks each (default 200), with
//! nothing done while holding. `hot` locks one key; `keys` a key drawn at random from
//! `--keys` (default 10,000). Cluster mode uses one `ClusterRegistry` per process (lease
//! `--lease-ms`, default 2000); advisory locks one connection per task, each lock
//! `SELECT pg_advisory_lock($1)` then `SELECT pg_advisory_unlock($1)`, as `pgbench` would run
//! them. `try` makes `--locks` attempts per task on the one hot key of `hot`, each
//! `try_lock` or `SELECT pg_try_advisory_lock($1)`, released at once when granted
//! (`pg_advisory_unlock`), never waiting: every task contends for the key at every attempt, as
//! replicas trying one job do, and a refused attempt goes on to the next. In cluster mode an
//! attempt refused in its own process (another task of it holds the key, or is asking the
//! server for it) costs no statement and returns at once; an advisory attempt is always a round
//! trip. `shared` takes and releases `--locks` shared locks per task of the one hot key,
//! `lock_shared` or `SELECT pg_advisory_lock_shared($1)` then `pg_advisory_unlock_shared`:
//! readers only, so no one ever waits for the key. `own` gives each process a key of its own,
//! which its tasks lock in turn (`k1000`, `k1001`, ...; advisory keys 1000, 1001, ...): no
//! process ever wants another's key, so in cluster mode each keeps its lease for its tasks. Cluster mode's keys then have
//! `--processes` x `--tasks` permits ([`ClusterBuilder::capacity`]), so every task of every
//! process can hold the key at once; the capacity is the lease table's, so `shared` uses a
//! table of its own per capacity (`keyed_locks_compare_shared24_leases` for 3 x 8). Each
//! shared grant there is a part lease of its own, a statement to take it and one to give it
//! back, both on the key's one row. The processes connect first, then start together; each
//! contender prints one line:
//!
//! ```text
//! cluster  workload=hot processes=3 tasks=8 grants=4800 grants_per_s=5120 longest_wait_ms=31
//! advisory workload=hot processes=3 tasks=8 grants=4800 grants_per_s=7010 longest_wait_ms=12
//! ```
//!
//! `grants_per_s` is every process's grants over the slowest process's time, from the start
//! signal to its last release. `longest_wait_ms` is the longest call: a lock's wait, or for
//! `try` an attempt's answer. `try` adds `attempts=` at the end of the line (every task's
//! attempts; the grants are those taken), so attempts per second are `attempts` over
//! `grants / grants_per_s`. `--only cluster` or `--only advisory` runs one of them.
//! `--runtime current-thread` runs each process on tokio's current-thread runtime instead of
//! the multi-thread one `#[tokio::main]` gives (`multi-thread`, the default). The
//! database URL defaults to `DATABASE_URL`, else `postgres://postgres@127.0.0.1:5432/test`;
//! the lease table is `keyed_locks_compare_leases` (for `shared`, as above).
//!
//! [`ClusterBuilder::capacity`]: keyed_locks::ClusterBuilder::capacity

use std::io::{BufRead as _, BufReader, Write as _};
use std::num::NonZeroU32;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use clap::Parser;
use keyed_locks::{ClusterRegistry, TryLockError};
use tokio::time::Instant;
use tokio_postgres::NoTls;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Cluster mode against PostgreSQL's advisory locks, on the same server with the same
/// processes and tasks.
#[derive(Debug, Clone, Parser)]
#[command(args_override_self = true)]
struct Options {
    /// One hot key, a key drawn at random from `--keys`, tries of the hot key, shared locks
    /// of the hot key, or a key per process
    #[arg(long, default_value = "hot", value_parser = ["hot", "keys", "try", "shared", "own"])]
    workload: String,
    /// Processes per contender
    #[arg(long, value_name = "P", default_value_t = 3)]
    processes: u64,
    /// Tasks per process
    #[arg(long, value_name = "T", default_value_t = 8)]
    tasks: u64,
    /// Locks per task (attempts, for `try`)
    #[arg(long, value_name = "N", default_value_t = 200)]
    locks: u64,
    /// Keys of the `keys` workload (at least 1)
    #[arg(long, value_name = "K", default_value_t = 10_000)]
    keys: u64,
    /// Cluster mode's lease time, in milliseconds
    #[arg(long, value_name = "L", default_value_t = 2000)]
    lease_ms: u64,
    /// Run one contender only
    #[arg(long, value_parser = ["cluster", "advisory"])]
    only: Option<String>,
    /// Each process's tokio runtime
    #[arg(long, default_value = "multi-thread", value_parser = ["multi-thread", "current-thread"])]
    runtime: String,
    /// The PostgreSQL server (the `DATABASE_URL` environment variable, if set)
    #[arg(long, value_name = "URL", default_value_t = default_database_url())]
    database_url: String,
    /// Set in a child: which contender it runs, and its number (`cluster:0`).
    #[arg(long, hide = true, value_name = "CONTENDER:INDEX", value_parser = contender_and_index)]
    child: Option<(String, u64)>,
}

fn default_database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

fn contender_and_index(value: &str) -> Result<(String, u64), String> {
    let expected = || "expected a contender and a number, e.g. cluster:0".to_owned();
    let (contender, index) = value.split_once(':').ok_or_else(expected)?;
    let index = index.parse().map_err(|_| expected())?;
    Ok((contender.to_owned(), index))
}

/// Parses the command line. A usage error exits 1, as every other error of this program does
/// (clap's own code is 2); `--help` exits 0.
fn options() -> Options {
    let mut options = Options::try_parse().unwrap_or_else(|error| {
        let _ = error.print();
        std::process::exit(if error.use_stderr() { 1 } else { 0 })
    });
    options.keys = options.keys.max(1);
    options
}

fn main() -> Result<(), Error> {
    let options = options();
    match options.child.clone() {
        Some((contender, index)) => child(&options, &contender, index),
        None => {
            for contender in ["cluster", "advisory"] {
                if options.only.as_deref().is_none_or(|only| only == contender) {
                    compare(&options, contender)?;
                }
            }
            Ok(())
        }
    }
}

/// What one child reports.
struct ChildResult {
    grants: u64,
    attempts: u64,
    elapsed: Duration,
    longest_wait: Duration,
}

/// Runs one contender in `processes` children started together, and prints its line.
fn compare(options: &Options, contender: &str) -> Result<(), Error> {
    let exe = std::env::current_exe()?;
    let mut children: Vec<(Child, ChildStdin, BufReader<ChildStdout>)> = Vec::new();
    for index in 0..options.processes {
        let mut child = Command::new(&exe)
            .args(["--workload", &options.workload])
            .args(["--processes", &options.processes.to_string()])
            .args(["--tasks", &options.tasks.to_string()])
            .args(["--locks", &options.locks.to_string()])
            .args(["--keys", &options.keys.to_string()])
            .args(["--lease-ms", &options.lease_ms.to_string()])
            .args(["--runtime", &options.runtime])
            .args(["--database-url", &options.database_url])
            .args(["--child", &format!("{contender}:{index}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        children.push((child, stdin, stdout));
    }
    for (_, _, stdout) in &mut children {
        expect_line(stdout, "ready")?;
    }
    for (_, stdin, _) in &mut children {
        writeln!(stdin, "go")?;
        stdin.flush()?;
    }
    let mut results = Vec::new();
    for (child, _, stdout) in &mut children {
        let line = expect_line(stdout, "done")?;
        let field = |name: &str| -> Result<u64, Error> {
            line.split_whitespace()
                .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
                .and_then(|value| value.parse().ok())
                .ok_or_else(|| format!("no {name} in {line:?}").into())
        };
        results.push(ChildResult {
            grants: field("grants")?,
            attempts: field("attempts")?,
            elapsed: Duration::from_micros(field("elapsed_us")?),
            longest_wait: Duration::from_micros(field("longest_wait_us")?),
        });
        let status = child.wait()?;
        if !status.success() {
            return Err(format!("a {contender} process failed: {status}").into());
        }
    }
    let grants: u64 = results.iter().map(|result| result.grants).sum();
    let attempts: u64 = results.iter().map(|result| result.attempts).sum();
    let slowest = results
        .iter()
        .map(|result| result.elapsed)
        .max()
        .unwrap_or_default();
    let longest_wait = results
        .iter()
        .map(|result| result.longest_wait)
        .max()
        .unwrap_or_default();
    // `hot` and `keys` keep their line as it was; every attempt of theirs is a grant.
    let attempts = if options.workload == "try" {
        format!(" attempts={attempts}")
    } else {
        String::new()
    };
    println!(
        "{contender:<8} workload={} processes={} tasks={} grants={grants} grants_per_s={:.0} longest_wait_ms={}{attempts}",
        options.workload,
        options.processes,
        options.tasks,
        grants as f64 / slowest.as_secs_f64().max(1e-9),
        longest_wait.as_millis()
    );
    Ok(())
}

/// Reads lines until one starts with `word` (a child's other output passes through).
fn expect_line(stdout: &mut BufReader<ChildStdout>, word: &str) -> Result<String, Error> {
    let mut line = String::new();
    loop {
        line.clear();
        if stdout.read_line(&mut line)? == 0 {
            return Err(format!("a child ended before saying {word:?}").into());
        }
        if line.starts_with(word) {
            return Ok(line.trim_end().to_owned());
        }
        print!("{line}");
    }
}

/// A child: connects, says `ready`, waits for `go`, runs its tasks, says `done ...`.
fn child(options: &Options, contender: &str, index: u64) -> Result<(), Error> {
    let runtime = if options.runtime == "current-thread" {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Runtime::new()?
    };
    runtime.block_on(async {
        let mut registry = None;
        let mut tasks = Vec::new();
        for _ in 0..options.tasks {
            let task = if contender == "cluster" {
                if registry.is_none() {
                    let builder = ClusterRegistry::<String>::builder(&options.database_url)
                        .lease(Duration::from_millis(options.lease_ms));
                    let builder = if options.workload == "shared" {
                        // Room for every task of every process at once. The capacity is the
                        // table's, fixed by its first process, so each capacity has a table.
                        let capacity = u32::try_from(options.processes * options.tasks)?;
                        builder
                            .table_prefix(format!("keyed_locks_compare_shared{capacity}_"))
                            .capacity(NonZeroU32::new(capacity).ok_or("no tasks")?)
                    } else {
                        builder.table_prefix("keyed_locks_compare_")
                    };
                    let connected = builder.connect().await?;
                    registry = Some(connected);
                }
                Task::Cluster(registry.clone().ok_or("connected above")?)
            } else {
                let (client, connection) =
                    tokio_postgres::connect(&options.database_url, NoTls).await?;
                tokio::spawn(connection);
                let lock = client.prepare("SELECT pg_advisory_lock($1)").await?;
                let try_lock = client.prepare("SELECT pg_try_advisory_lock($1)").await?;
                let unlock = client.prepare("SELECT pg_advisory_unlock($1)").await?;
                let lock_shared = client.prepare("SELECT pg_advisory_lock_shared($1)").await?;
                let unlock_shared = client
                    .prepare("SELECT pg_advisory_unlock_shared($1)")
                    .await?;
                Task::Advisory {
                    client,
                    lock,
                    try_lock,
                    unlock,
                    lock_shared,
                    unlock_shared,
                }
            };
            tasks.push(task);
        }
        println!("ready");
        std::io::stdout().flush()?;
        let mut go = String::new();
        std::io::stdin().read_line(&mut go)?;

        let started = Instant::now();
        let workers: Vec<_> = tasks
            .into_iter()
            .enumerate()
            .map(|(number, task)| {
                let options = options.clone();
                let seed = (index << 32) | number as u64;
                tokio::spawn(async move { task.run(&options, seed).await })
            })
            .collect();
        let mut longest_wait = Duration::ZERO;
        let (mut grants, mut attempts) = (0, 0);
        for worker in workers {
            let done = worker.await??;
            grants += done.grants;
            attempts += done.attempts;
            longest_wait = longest_wait.max(done.longest);
        }
        let elapsed = started.elapsed();
        if let Some(registry) = registry {
            registry.shutdown().await;
        }
        println!(
            "done grants={grants} attempts={attempts} elapsed_us={} longest_wait_us={}",
            elapsed.as_micros(),
            longest_wait.as_micros()
        );
        Ok::<_, Error>(())
    })
}

/// One task's way of locking.
enum Task {
    Cluster(ClusterRegistry<String>),
    /// A connection of its own, and its statements, prepared.
    Advisory {
        client: tokio_postgres::Client,
        lock: tokio_postgres::Statement,
        try_lock: tokio_postgres::Statement,
        unlock: tokio_postgres::Statement,
        lock_shared: tokio_postgres::Statement,
        unlock_shared: tokio_postgres::Statement,
    },
}

/// What one task did.
struct TaskResult {
    grants: u64,
    attempts: u64,
    longest: Duration,
}

impl Task {
    /// Takes and releases `options.locks` locks (shared ones for `shared`), or for `try`
    /// makes as many attempts and releases what it takes; returns how many it took, how many
    /// attempts, and the longest call.
    async fn run(self, options: &Options, seed: u64) -> Result<TaskResult, Error> {
        let tries = options.workload == "try";
        let shared = options.workload == "shared";
        let mut keys = KeyDraw::new(seed);
        let (mut grants, mut longest) = (0, Duration::ZERO);
        for _ in 0..options.locks {
            let key = match options.workload.as_str() {
                "keys" => keys.next() % options.keys,
                // The process's number is the seed's high half.
                "own" => 1000 + (seed >> 32),
                _ => 0,
            };
            let asked = Instant::now();
            match &self {
                Task::Cluster(registry) if tries => {
                    let answer = registry.try_lock(format!("k{key}")).await;
                    longest = longest.max(asked.elapsed());
                    match answer {
                        Ok(guard) => {
                            grants += 1;
                            drop(guard);
                        }
                        Err(TryLockError::WouldBlock) => {}
                        Err(closed) => return Err(closed.into()),
                    }
                }
                Task::Cluster(registry) if shared => {
                    let guard = registry.lock_shared(format!("k{key}")).await?;
                    longest = longest.max(asked.elapsed());
                    grants += 1;
                    drop(guard);
                }
                Task::Cluster(registry) => {
                    let guard = registry.lock(format!("k{key}")).await?;
                    longest = longest.max(asked.elapsed());
                    grants += 1;
                    drop(guard);
                }
                Task::Advisory {
                    client,
                    lock,
                    try_lock,
                    unlock,
                    lock_shared,
                    unlock_shared,
                } => {
                    // Advisory keys are `bigint`; ours fit.
                    let key = i64::try_from(key)?;
                    let taken = if tries {
                        client.query_one(try_lock, &[&key]).await?.get(0)
                    } else if shared {
                        client.execute(lock_shared, &[&key]).await?;
                        true
                    } else {
                        client.execute(lock, &[&key]).await?;
                        true
                    };
                    longest = longest.max(asked.elapsed());
                    if taken {
                        grants += 1;
                        let unlock = if shared { unlock_shared } else { unlock };
                        client.execute(unlock, &[&key]).await?;
                    }
                }
            }
        }
        Ok(TaskResult {
            grants,
            attempts: options.locks,
            longest,
        })
    }
}

/// Keys at random without a crate: xorshift64*, seeded per task.
struct KeyDraw(u64);

impl KeyDraw {
    fn new(seed: u64) -> Self {
        KeyDraw(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}
