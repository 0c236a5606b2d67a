//! A futurelock, and the warning that finds it.
//!
//! A task waits for a key in a `select!` loop over `&mut` its lock future, next to a timer.
//! The timer wins; its branch needs the same key and awaits it. Meanwhile the key is released
//! and, FIFO, granted to the first waiter: the lock future, still alive in the loop but not
//! polled while the branch runs. Nobody who runs holds the key, and the branch waits behind a
//! grant that only it could pick up. With `warn_ungranted_pickup_after`, the registry says so
//! on stderr, with the key and the fencing token.
//!
//! Then the same work without the trap: the lock future lives inside the `select!`, so the
//! branch that loses drops it, and dropping a waiting `lock` leaves nothing behind.
//!
//! ```sh
//! cargo run --example futurelock
//! ```

use std::pin::pin;
use std::time::Duration;

use keyed_locks::{LockError, LockRegistry};
use tokio::time::{sleep, timeout};

const KEY: &str = "report:2026-12";

#[tokio::main]
async fn main() -> Result<(), LockError> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::WARN)
        .init();
    let registry = LockRegistry::builder()
        .warn_ungranted_pickup_after(Duration::from_millis(200))
        .spawn();

    let held = registry.lock(KEY).await?;
    let release_soon = async {
        sleep(Duration::from_millis(50)).await;
        drop(held);
    };
    let (stuck, ()) = tokio::join!(with_the_trap(&registry), release_soon);
    println!("with the trap: {stuck}");
    // The lock future was dropped at the end of `with_the_trap`, which released its grant.
    assert_eq!(registry.stats().await?.keys, 0);

    let held = registry.lock(KEY).await?;
    let release_soon = async {
        sleep(Duration::from_millis(50)).await;
        drop(held);
    };
    let (done, ()) = tokio::join!(without_the_trap(&registry), release_soon);
    println!("without it: {done}");
    Ok(())
}

/// `select!` over `&mut` a lock future kept across iterations: the futurelock.
async fn with_the_trap(registry: &LockRegistry<&'static str>) -> &'static str {
    let mut lock = pin!(registry.lock(KEY));
    let mut ticks = tokio::time::interval(Duration::from_millis(10));
    ticks.tick().await;
    loop {
        tokio::select! {
            guard = &mut lock => {
                drop(guard);
                return "locked";
            }
            _ = ticks.tick() => {
                // Housekeeping that needs the key too. It queues behind `lock`, which is granted
                // the key at 50 ms and never polled again while this waits.
                match timeout(Duration::from_millis(500), registry.lock(KEY)).await {
                    Ok(guard) => drop(guard),
                    Err(_) => return "the housekeeping waited 500 ms for a key nobody running held",
                }
            }
        }
    }
}

/// The same work, with a fresh lock future in each `select!`: the losing branch drops it.
async fn without_the_trap(registry: &LockRegistry<&'static str>) -> &'static str {
    let mut ticks = tokio::time::interval(Duration::from_millis(10));
    ticks.tick().await;
    loop {
        tokio::select! {
            guard = registry.lock(KEY) => {
                drop(guard);
                return "locked, with the housekeeping done in between";
            }
            _ = ticks.tick() => {
                match timeout(Duration::from_millis(500), registry.lock(KEY)).await {
                    Ok(guard) => drop(guard),
                    Err(_) => return "stuck after all",
                }
            }
        }
    }
}
