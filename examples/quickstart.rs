//! Two tasks serialize their requests for user 42, and no lock is left in
//! memory afterwards.
//!
//! Run with `cargo run --example quickstart`. It prints:
//!
//! ```text
//! Starting request for 42
//! Finished request for 42
//! Starting request for 42
//! Finished request for 42
//! Remaining locks in memory: 0
//! ```
//!
//! With `-- --trace PATH` it also records what the registry saw and did, and writes it to
//! `PATH` as a trace (JSON Lines, `keyed_locks::trace`); draw it with
//! `cargo run --example timeline -- PATH --svg timeline.svg`. The trace is recorded on tokio's
//! paused clock, which jumps to each timer as soon as every task waits: the run takes no time
//! and writes the same trace every time, so the one in `docs/` can be checked for staleness.

use std::time::Duration;

use clap::Parser;
use keyed_locks::{LockError, LockRegistry};

/// Two tasks serialize their requests for user 42, and no lock is left in memory afterwards.
#[derive(Debug, Parser)]
struct Cli {
    /// Also record what the registry saw and did, and write it to PATH as a trace (JSON Lines)
    #[arg(long, value_name = "PATH")]
    trace: Option<String>,
}

async fn send_request(user_id: u64) {
    println!("Starting request for {user_id}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!("Finished request for {user_id}");
}

async fn process(registry: LockRegistry<u64>, user_id: u64) -> Result<(), LockError> {
    let _guard = registry.lock(user_id).await?;
    send_request(user_id).await;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A usage error exits 1, as every other error of this program does (clap's own code is 2);
    // `--help` exits 0.
    let trace_path = Cli::try_parse()
        .unwrap_or_else(|error| {
            let _ = error.print();
            std::process::exit(if error.use_stderr() { 1 } else { 0 })
        })
        .trace;
    let mut runtime = tokio::runtime::Builder::new_current_thread();
    runtime.enable_all().start_paused(trace_path.is_some());
    runtime.build()?.block_on(run(trace_path))
}

async fn run(trace_path: Option<String>) -> Result<(), Box<dyn std::error::Error>> {
    let mut builder = LockRegistry::builder();
    if trace_path.is_some() {
        builder = builder.journal(10_000);
    }
    let registry = builder.spawn();

    // Like Python's `asyncio.gather`: both requests run concurrently, the second starting 10 ms
    // after the first, and the lock makes the second wait for the first to finish.
    futures::future::try_join(process(registry.clone(), 42), async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        process(registry.clone(), 42).await
    })
    .await?;
    println!(
        "Remaining locks in memory: {}",
        registry.stats().await?.keys
    );

    if let Some(path) = trace_path {
        let journal = registry.journal().await?;
        let description = "The quickstart: two requests for user 42, the second 10 ms after \
                           the first, each holding the lock for 500 ms.";
        let file = std::io::BufWriter::new(std::fs::File::create(&path)?);
        journal.write_json_lines(Some(description), file)?;
        eprintln!("Wrote {} journal events to {path}", journal.entries.len());
    }
    Ok(())
}
