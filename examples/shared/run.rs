//! A run that several processes of a cluster example join, so that their work overlaps and the
//! last to finish knows it is last: the first process to start records a run that begins a
//! second ahead, every process that starts before the run is over joins it (a row in the
//! workers' table), and each marks itself done at its end. Joining and finishing hold the lock
//! of the run's row, so the process that finds no worker of the run left is the last; one
//! that starts once every worker of the run is done starts a new run. Included by each example
//! with `#[path]`, beside `database.rs`.

use std::time::Duration;

use super::database::{self, Error};

/// How far ahead of the first process's start a run begins: time for the others to join.
const JOIN_MARGIN: Duration = Duration::from_secs(1);

/// The run this process joined.
pub struct Run {
    /// The run's number, which the example's own rows name.
    pub run: i64,
    worker: i64,
    /// How long until the run begins.
    pub starts_in: Duration,
}

/// The tables of the runs and their workers: `{prefix}{name}_runs` and
/// `{prefix}{name}_workers`.
pub struct Runs {
    runs: String,
    workers: String,
}

impl Runs {
    /// Creates the tables if missing.
    pub async fn create(
        client: &tokio_postgres::Client,
        prefix: &str,
        name: &str,
    ) -> Result<Runs, Error> {
        let runs = Runs {
            runs: format!("\"{prefix}{name}_runs\""),
            workers: format!("\"{prefix}{name}_workers\""),
        };
        database::create(
            client,
            &format!(
                "CREATE TABLE IF NOT EXISTS {} (one_row boolean PRIMARY KEY CHECK (one_row), \
                 run bigint NOT NULL, starts_at timestamptz NOT NULL)",
                runs.runs
            ),
        )
        .await?;
        database::create(
            client,
            &format!(
                "CREATE TABLE IF NOT EXISTS {} \
                 (worker bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, run bigint NOT NULL, \
                  pid bigint NOT NULL, done boolean NOT NULL DEFAULT false)",
                runs.workers
            ),
        )
        .await?;
        Ok(runs)
    }

    /// Joins the run under way, or starts a new one if every worker of the last is done.
    pub async fn join(&self, client: &mut tokio_postgres::Client) -> Result<Run, Error> {
        let margin_ms = i64::try_from(JOIN_MARGIN.as_millis())?;
        let transaction = client.transaction().await?;
        transaction
            .execute(
                &format!(
                    "INSERT INTO {} (one_row, run, starts_at) \
                     VALUES (true, 0, clock_timestamp()) ON CONFLICT (one_row) DO NOTHING",
                    self.runs
                ),
                &[],
            )
            .await?;
        // The row's lock, held to the commit, orders joins and finishes of every process.
        let row = transaction
            .query_one(&format!("SELECT run FROM {} FOR UPDATE", self.runs), &[])
            .await?;
        let mut run: i64 = row.get(0);
        let not_done: i64 = transaction
            .query_one(
                &format!(
                    "SELECT count(*) FROM {} WHERE run = $1 AND NOT done",
                    self.workers
                ),
                &[&run],
            )
            .await?
            .get(0);
        if not_done == 0 {
            run += 1;
            transaction
                .execute(
                    &format!(
                        "UPDATE {} SET run = $1, \
                         starts_at = clock_timestamp() + $2::bigint * interval '1 millisecond'",
                        self.runs
                    ),
                    &[&run, &margin_ms],
                )
                .await?;
        }
        let worker: i64 = transaction
            .query_one(
                &format!(
                    "INSERT INTO {} (run, pid) VALUES ($1, $2) RETURNING worker",
                    self.workers
                ),
                &[&run, &i64::from(std::process::id())],
            )
            .await?
            .get(0);
        let starts_in_ms: f64 = transaction
            .query_one(
                &format!(
                    "SELECT greatest(extract(epoch FROM starts_at - clock_timestamp()), 0)::float8 \
                     * 1000 FROM {}",
                    self.runs
                ),
                &[],
            )
            .await?
            .get(0);
        transaction.commit().await?;
        Ok(Run {
            run,
            worker,
            starts_in: Duration::from_secs_f64(starts_in_ms / 1000.0),
        })
    }

    /// Marks this process done; whether it was the run's last worker.
    pub async fn finish(
        &self,
        client: &mut tokio_postgres::Client,
        run: &Run,
    ) -> Result<bool, Error> {
        let transaction = client.transaction().await?;
        transaction
            .execute(&format!("SELECT 1 FROM {} FOR UPDATE", self.runs), &[])
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
                    "SELECT count(*) FROM {} WHERE run = $1 AND NOT done",
                    self.workers
                ),
                &[&run.run],
            )
            .await?
            .get(0);
        transaction.commit().await?;
        Ok(not_done == 0)
    }
}
