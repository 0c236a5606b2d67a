//! A scheduled job run by every replica, each tick by exactly one of them: at each tick of the
//! wall clock every process tries the tick's key with `try_lock`; the one that gets it runs the
//! job, the others skip the tick (the ShedLock pattern).
//!
//! ```text
//! cluster_jobs [--database-url URL] [--prefix P] --job NAME --ticks N --tick-ms MS
//! ```
//!
//! Run it in three terminals, started within a second of each other, against the same
//! PostgreSQL (it needs `--features postgres`):
//!
//! ```text
//! cargo run --features postgres --example cluster_jobs -- --prefix jobs1_ --job report --ticks 8 --tick-ms 300
//! ```
//!
//! Each process prints how many of the run's ticks it ran, and the one that finishes last reads
//! the job's table and prints how many ticks ran exactly once (then exits 1 if not all):
//!
//! ```text
//! ran 3 of 8 ticks
//! ticks run exactly once: 8 of 8
//! ```
//!
//! **Ticks.** Tick `t` lasts from `t * MS` to `(t + 1) * MS` milliseconds of Unix time, so the
//! processes agree on the tick without talking, as long as their clocks agree within a fraction
//! of a tick (NTP keeps them within milliseconds).
//!
//! **Which `N` ticks.** The first process to start records the run in `{P}job_schedule`: its
//! first tick is the first boundary at least a second (and two ticks) ahead, time for the others
//! to start. Every other process reads that row (the same `INSERT ... ON CONFLICT DO NOTHING`
//! and a read of the row, in one transaction) and joins the run, so processes started apart
//! still run the same ticks: one that joins late tries the ticks left. One that starts once the
//! run's last tick has begun starts a new run. A process whose `--ticks` or `--tick-ms` differ
//! from the run under way stops with an error.
//!
//! **The key.** Each tick has its own key, `{job}:{tick}`, tried only while its tick lasts. The
//! winner holds it until the end of the next tick (ShedLock's `lockAtLeastFor`), so that a
//! replica whose clock runs behind, or whose try reaches the server late, is refused for up to a
//! tick more rather than run the tick a second time; released at once, the key would go to the
//! first late try. A key per tick is what lets the hold outlast the tick: one key per job, held
//! that long, would keep the next tick's winner out too. Each key leaves a row in `{P}leases`
//! (the registry keeps a key's row, and with it its fence): fine for a demo on a fresh prefix;
//! a scheduler that runs for years makes a row per tick.
//!
//! **The job** records `(job, tick, pid, token)` in `{P}job_runs` with a fenced write: a row
//! already written for the tick under a lower token is replaced and its `runs` counted up, one
//! written under a higher token turns this write away (a holder whose lease ran out while it was
//! paused). When every tick runs once, the conflict path never runs. A process counts the ticks
//! whose write it made; a write turned away is said on stderr.
//!
//! **The last process.** A process joining the run registers in `{P}job_workers`; after the
//! run it marks itself done and counts the run's workers not done, in one transaction that, as
//! joining does, holds the lock of the run's row in `{P}job_schedule`: the one that counts none
//! is the last (a process that starts after it finds the run over and starts a new one). A
//! process that joins and dies never marks itself done, and then nobody prints the last line.
//!
//! The database URL defaults to the `DATABASE_URL` environment variable, else
//! `postgres://postgres@127.0.0.1:5432/test`. The tables are `{prefix}leases` (the registry's,
//! lease four ticks and at least 2 s) and the demo's `{prefix}job_schedule`,
//! `{prefix}job_workers` and `{prefix}job_runs`, all created if missing; `--prefix` defaults to
//! `keyed_locks_demo_`. TLS: the URL's `sslmode` works as in the `cluster` example.

use std::collections::VecDeque;
use std::io::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use keyed_locks::{ClusterGuard, ClusterRegistry, TryLockError};

#[path = "shared/database.rs"]
mod database;

use database::{Error, default_database_url, open};

/// A scheduled job run by every replica, each tick by exactly one of them.
#[derive(Debug, Parser)]
#[command(args_override_self = true)]
struct Options {
    /// The PostgreSQL server (the `DATABASE_URL` environment variable, if set)
    #[arg(long, value_name = "URL", default_value_t = default_database_url())]
    database_url: String,
    /// The tables' prefix: `{P}leases` (the registry's), `{P}job_schedule`, `{P}job_workers`
    /// and `{P}job_runs` (the demo's)
    #[arg(long, value_name = "P", default_value = "keyed_locks_demo_")]
    prefix: String,
    /// The job's name: its keys are `{NAME}:{tick}`
    #[arg(long, value_name = "NAME")]
    job: String,
    /// How many ticks the run lasts
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    ticks: u64,
    /// How long a tick lasts, in milliseconds
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    tick_ms: u64,
}

/// How far ahead of the first process's start a run begins, at least: time for the other
/// processes to start and join before its first tick.
const JOIN_MARGIN: Duration = Duration::from_secs(1);

fn unix_millis() -> u64 {
    // A clock before 1970 reads as 1970: every tick then lies ahead.
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX)
}

/// Sleeps until tick `tick` begins (at once if it has).
async fn sleep_until_tick(tick: u64, tick_ms: u64) {
    let start = tick.saturating_mul(tick_ms);
    let now = unix_millis();
    if start > now {
        tokio::time::sleep(Duration::from_millis(start - now)).await;
    }
}

/// The run this process joined: ticks `first_tick..first_tick + ticks`.
struct Run {
    first_tick: i64,
    worker: i64,
}

/// The demo's tables, on a connection of its own.
struct Jobs {
    client: tokio_postgres::Client,
    schedule: String,
    workers: String,
    runs: String,
}

impl Jobs {
    async fn connect(options: &Options) -> Result<Jobs, Error> {
        let client = open(&options.database_url).await?;
        let prefix = &options.prefix;
        let jobs = Jobs {
            client,
            schedule: format!("\"{prefix}job_schedule\""),
            workers: format!("\"{prefix}job_workers\""),
            runs: format!("\"{prefix}job_runs\""),
        };
        jobs.create(&format!(
            "CREATE TABLE IF NOT EXISTS {} (job text PRIMARY KEY, first_tick bigint NOT NULL, \
             ticks bigint NOT NULL, tick_ms bigint NOT NULL)",
            jobs.schedule
        ))
        .await?;
        jobs.create(&format!(
            "CREATE TABLE IF NOT EXISTS {} (worker bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
             job text NOT NULL, first_tick bigint NOT NULL, pid bigint NOT NULL, \
             done boolean NOT NULL DEFAULT false)",
            jobs.workers
        ))
        .await?;
        jobs.create(&format!(
            "CREATE TABLE IF NOT EXISTS {} (job text NOT NULL, tick bigint NOT NULL, \
             pid bigint NOT NULL, token bigint NOT NULL, runs integer NOT NULL, \
             PRIMARY KEY (job, tick))",
            jobs.runs
        ))
        .await?;
        Ok(jobs)
    }

    async fn create(&self, statement: &str) -> Result<(), Error> {
        database::create(&self.client, statement).await
    }

    /// Joins the job's run under way, or records a new one if there is none or its last tick
    /// has begun, and registers this process as one of its workers.
    async fn join(&mut self, options: &Options) -> Result<Run, Error> {
        let (ticks, tick_ms) = (
            i64::try_from(options.ticks)?,
            i64::try_from(options.tick_ms)?,
        );
        let margin = JOIN_MARGIN.max(Duration::from_millis(options.tick_ms.saturating_mul(2)));
        let ahead = unix_millis() + u64::try_from(margin.as_millis())?;
        let proposed = i64::try_from(ahead / options.tick_ms + 1)?;
        let transaction = self.client.transaction().await?;
        transaction
            .execute(
                &format!(
                    "INSERT INTO {} (job, first_tick, ticks, tick_ms) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (job) DO NOTHING",
                    self.schedule
                ),
                &[&options.job, &proposed, &ticks, &tick_ms],
            )
            .await?;
        // The row's lock, held to the commit, orders this join against every other process's
        // join and its count of the workers not done (`finish`).
        let row = transaction
            .query_one(
                &format!(
                    "SELECT first_tick, ticks, tick_ms FROM {} WHERE job = $1 FOR UPDATE",
                    self.schedule
                ),
                &[&options.job],
            )
            .await?;
        let (recorded_first, recorded_ticks, recorded_tick_ms): (i64, i64, i64) =
            (row.get(0), row.get(1), row.get(2));
        let last_tick_start =
            (recorded_first + recorded_ticks - 1).saturating_mul(recorded_tick_ms);
        let first_tick = if i64::try_from(unix_millis())? >= last_tick_start {
            transaction
                .execute(
                    &format!(
                        "UPDATE {} SET first_tick = $2, ticks = $3, tick_ms = $4 WHERE job = $1",
                        self.schedule
                    ),
                    &[&options.job, &proposed, &ticks, &tick_ms],
                )
                .await?;
            proposed
        } else if (recorded_ticks, recorded_tick_ms) != (ticks, tick_ms) {
            return Err(format!(
                "job {:?} is running with --ticks {recorded_ticks} --tick-ms {recorded_tick_ms} \
                 until tick {}: join it with the same flags, or start after it",
                options.job,
                recorded_first + recorded_ticks - 1
            )
            .into());
        } else {
            recorded_first
        };
        let worker = transaction
            .query_one(
                &format!(
                    "INSERT INTO {} (job, first_tick, pid) VALUES ($1, $2, $3) RETURNING worker",
                    self.workers
                ),
                &[&options.job, &first_tick, &i64::from(std::process::id())],
            )
            .await?
            .get(0);
        transaction.commit().await?;
        Ok(Run { first_tick, worker })
    }

    /// The job: records who ran `tick` under `token`, unless a higher token recorded it first.
    /// Whether the write was made.
    async fn record(&self, job: &str, tick: i64, token: u64) -> Result<bool, Error> {
        let statement = format!(
            "INSERT INTO {} AS runs (job, tick, pid, token, runs) VALUES ($1, $2, $3, $4, 1) \
             ON CONFLICT (job, tick) DO UPDATE \
             SET pid = excluded.pid, token = excluded.token, runs = runs.runs + 1 \
             WHERE runs.token < excluded.token",
            self.runs
        );
        let pid = i64::from(std::process::id());
        let token = i64::try_from(token)?;
        let written = self
            .client
            .execute(&statement, &[&job, &tick, &pid, &token])
            .await?;
        Ok(written == 1)
    }

    /// Marks this process done; whether it was the run's last worker.
    async fn finish(&mut self, job: &str, run: &Run) -> Result<bool, Error> {
        let transaction = self.client.transaction().await?;
        transaction
            .execute(
                &format!("SELECT 1 FROM {} WHERE job = $1 FOR UPDATE", self.schedule),
                &[&job],
            )
            .await?;
        transaction
            .execute(
                &format!("UPDATE {} SET done = true WHERE worker = $1", self.workers),
                &[&run.worker],
            )
            .await?;
        let not_done: i64 = transaction
            .query_one(
                &format!(
                    "SELECT count(*) FROM {} WHERE job = $1 AND first_tick = $2 AND NOT done",
                    self.workers
                ),
                &[&job, &run.first_tick],
            )
            .await?
            .get(0);
        transaction.commit().await?;
        Ok(not_done == 0)
    }

    /// How many times each of the run's ticks was recorded, in tick order (0 for a tick that
    /// never ran).
    async fn runs_per_tick(
        &self,
        job: &str,
        run: &Run,
        ticks: u64,
    ) -> Result<Vec<(i64, i32)>, Error> {
        let end = run.first_tick + i64::try_from(ticks)?;
        let rows = self
            .client
            .query(
                &format!(
                    "SELECT series.tick, coalesce(runs.runs, 0) \
                     FROM generate_series($2::bigint, $3::bigint - 1) AS series (tick) \
                     LEFT JOIN {} AS runs ON runs.job = $1 AND runs.tick = series.tick \
                     ORDER BY series.tick",
                    self.runs
                ),
                &[&job, &run.first_tick, &end],
            )
            .await?;
        Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
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
    let tick_ms = options.tick_ms;
    // Longer than a key is ever held (two ticks), so a living holder's lease is renewed, never
    // lost; a dead one's runs out on its own.
    let lease = Duration::from_millis(tick_ms.saturating_mul(4)).max(Duration::from_secs(2));
    let registry = ClusterRegistry::<String>::builder(&options.database_url)
        .table_prefix(&options.prefix)
        .lease(lease)
        .connect()
        .await?;

    // The demo's own tables, on a connection of its own. The prefix was checked by `connect`.
    let mut jobs = Jobs::connect(&options).await?;
    let run = jobs.join(&options).await?;
    let first = u64::try_from(run.first_tick)?;
    let end = first + options.ticks;

    // The guards still held, oldest first, each with its tick.
    let mut held: VecDeque<(u64, ClusterGuard<String>)> = VecDeque::new();
    let mut ran = 0u64;
    let mut tick = first.max(unix_millis() / tick_ms);
    while tick < end {
        sleep_until_tick(tick, tick_ms).await;
        let now = unix_millis() / tick_ms;
        if now > tick {
            // Woken after its tick ended (a loaded machine): the tick is another process's,
            // or nobody's; trying it now could run it after its holder let go.
            tick = now;
            continue;
        }
        // A key is held until the end of the tick after its own.
        while held.front().is_some_and(|(of, _)| of + 2 <= tick) {
            held.pop_front();
        }
        match registry.try_lock(format!("{}:{tick}", options.job)).await {
            Ok(guard) => {
                let token = guard.fencing_token();
                if jobs
                    .record(&options.job, i64::try_from(tick)?, token)
                    .await?
                {
                    ran += 1;
                } else {
                    eprintln!("tick {tick}: the write under token {token} was fenced off");
                }
                held.push_back((tick, guard));
            }
            Err(TryLockError::WouldBlock) => {}
            Err(closed) => return Err(closed.into()),
        }
        tick += 1;
    }
    sleep_until_tick(end + 1, tick_ms).await;
    drop(held);
    registry.shutdown().await;
    say(format_args!("ran {ran} of {} ticks", options.ticks));

    if jobs.finish(&options.job, &run).await? {
        let runs = jobs
            .runs_per_tick(&options.job, &run, options.ticks)
            .await?;
        let mut exactly_once = 0u64;
        for (tick, count) in runs {
            if count == 1 {
                exactly_once += 1;
            } else {
                eprintln!("tick {tick} ran {count} times");
            }
        }
        say(format_args!(
            "ticks run exactly once: {exactly_once} of {}",
            options.ticks
        ));
        if exactly_once != options.ticks {
            std::process::exit(1);
        }
    }
    Ok(())
}
