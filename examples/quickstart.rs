//! The seed's scenario: two tasks serialize their requests for user 42, and no lock is left in
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

use std::time::Duration;

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
    let registry = LockRegistry::spawn();

    let first = tokio::spawn(process(registry.clone(), 42));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let second = tokio::spawn(process(registry.clone(), 42));

    first.await??;
    second.await??;
    println!(
        "Remaining locks in memory: {}",
        registry.stats().await?.keys
    );
    Ok(())
}
