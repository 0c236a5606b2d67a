//! At most 3 requests in flight per user: a semaphore per key, with `acquire`.
//!
//! Run with `cargo run --example rate_limit`. Five users send 40 requests each, all at once;
//! each request takes one of its user's 3 permits for a few milliseconds. It prints, at the
//! end, the most requests any user ever had in flight:
//!
//! ```text
//! peak in flight per user: 3
//! ```
//!
//! and exits with an error if a user ever had more than 3, or if the registry kept an entry.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::future::try_join_all;
use keyed_locks::LockRegistry;

const USERS: usize = 5;
const REQUESTS_PER_USER: usize = 40;
const LIMIT: u32 = 3;

/// Requests in flight for one user, and the most there ever were.
#[derive(Default)]
struct InFlight {
    now: AtomicU32,
    peak: AtomicU32,
}

async fn handle_request(
    registry: LockRegistry<usize>,
    in_flight: Arc<Vec<InFlight>>,
    user: usize,
) -> Result<(), keyed_locks::PermitsError> {
    let _permit = registry.acquire(user, 1).await?;
    let count = &in_flight[user];
    let now = count.now.fetch_add(1, Ordering::SeqCst) + 1;
    count.peak.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(5)).await;
    count.now.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = LockRegistry::builder()
        .capacity(NonZeroU32::new(LIMIT).ok_or("a limit above 0")?)
        .spawn();
    let in_flight: Arc<Vec<InFlight>> = Arc::new((0..USERS).map(|_| InFlight::default()).collect());
    let requests = (0..USERS * REQUESTS_PER_USER).map(|request| {
        let user = request % USERS;
        tokio::spawn(handle_request(
            registry.clone(),
            Arc::clone(&in_flight),
            user,
        ))
    });
    for handled in try_join_all(requests).await? {
        handled?;
    }
    let peak = in_flight
        .iter()
        .map(|count| count.peak.load(Ordering::SeqCst))
        .max()
        .unwrap_or(0);
    println!("peak in flight per user: {peak}");
    if peak > LIMIT {
        return Err(
            format!("a user had {peak} requests in flight, above the limit of {LIMIT}").into(),
        );
    }
    let left = registry.stats().await?.keys;
    if left != 0 {
        return Err(format!("{left} entries left in the registry").into());
    }
    Ok(())
}
