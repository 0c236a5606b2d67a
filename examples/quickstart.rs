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
//! `PATH` as a trace; draw it with `cargo run --example timeline -- PATH --svg timeline.svg`.

use std::time::Duration;

use keyed_locks::trace::{IntegerKeys, write_trace};
use keyed_locks::{LockError, LockRegistry};

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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let trace_path = match std::env::args().skip(1).collect::<Vec<_>>().as_slice() {
        [] => None,
        [flag, path] if flag == "--trace" => Some(path.clone()),
        _ => return Err("usage: quickstart [--trace PATH]".into()),
    };
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
        std::fs::write(&path, write_trace(&journal, &IntegerKeys))?;
        eprintln!("Wrote {} journal events to {path}", journal.entries.len());
    }
    Ok(())
}
