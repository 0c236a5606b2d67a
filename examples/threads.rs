//! Threads and async tasks moving money between the same accounts.
//!
//! Run with `cargo run --example threads`. Four accounts start with 1,000 each. Two std
//! threads make transfers through `blocking_lock_all` (they park while they wait), and two
//! tokio tasks make transfers through `lock_all().await`, all on the same four accounts, in
//! both key orders. Each transfer reads both balances, pauses (a thread sleeps, a task
//! awaits), then writes both: without the locks, updates would be lost. At the end it prints
//!
//! ```text
//! total conserved: 4000
//! ```
//!
//! or, if the total changed, a line saying so and an error exit.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use keyed_locks::{LockError, LockRegistry};

const ACCOUNTS: u32 = 4;
const OPENING_BALANCE: i64 = 1_000;
const THREADS: u32 = 2;
const TASKS: u32 = 2;
const TRANSFERS_EACH: u32 = 500;

/// Balances, read and written in separate steps as a store would: only the locks keep two
/// transfers on one account from interleaving.
struct Ledger(Vec<AtomicI64>);

impl Ledger {
    fn read(&self, account: u32) -> i64 {
        self.0[account as usize].load(Ordering::SeqCst)
    }

    fn write(&self, account: u32, balance: i64) {
        self.0[account as usize].store(balance, Ordering::SeqCst);
    }

    fn total(&self) -> i64 {
        self.0
            .iter()
            .map(|balance| balance.load(Ordering::SeqCst))
            .sum()
    }
}

/// The accounts of the `n`th transfer of worker `worker`: every pair, in both orders.
fn accounts(worker: u32, n: u32) -> (u32, u32) {
    let from = (worker + n) % ACCOUNTS;
    let to = (from + 1 + n % (ACCOUNTS - 1)) % ACCOUNTS;
    (from, to)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = LockRegistry::spawn();
    let ledger = Arc::new(Ledger(
        (0..ACCOUNTS)
            .map(|_| AtomicI64::new(OPENING_BALANCE))
            .collect(),
    ));
    let expected = ledger.total();

    // Plain threads: the blocking calls park them, never a runtime worker.
    let threads: Vec<_> = (0..THREADS)
        .map(|thread| {
            let (registry, ledger) = (registry.clone(), Arc::clone(&ledger));
            std::thread::spawn(move || {
                for n in 0..TRANSFERS_EACH {
                    let (from, to) = accounts(thread, n);
                    let amount = i64::from(n % 7 + 1);
                    let _both = registry.blocking_lock_all([from, to])?;
                    let (from_balance, to_balance) = (ledger.read(from), ledger.read(to));
                    std::thread::sleep(Duration::from_micros(10));
                    ledger.write(from, from_balance - amount);
                    ledger.write(to, to_balance + amount);
                }
                Ok::<(), LockError>(())
            })
        })
        .collect();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (registry, ledger) = (registry.clone(), Arc::clone(&ledger));
            tokio::spawn(async move {
                for n in 0..TRANSFERS_EACH {
                    let (from, to) = accounts(THREADS + task, n);
                    let amount = i64::from(n % 5 + 1);
                    let _both = registry.lock_all([from, to]).await?;
                    let (from_balance, to_balance) = (ledger.read(from), ledger.read(to));
                    tokio::time::sleep(Duration::from_micros(10)).await;
                    ledger.write(from, from_balance - amount);
                    ledger.write(to, to_balance + amount);
                }
                Ok::<(), LockError>(())
            })
        })
        .collect();

    for task in tasks {
        task.await??;
    }
    // Joined off the runtime's workers: a join parks its thread too.
    tokio::task::spawn_blocking(move || {
        threads.into_iter().try_for_each(|thread| {
            thread
                .join()
                .map_err(|_| "a thread panicked")?
                .map_err(|error| error.to_string())
        })
    })
    .await??;

    let total = ledger.total();
    if total != expected {
        println!("total mismatch: expected {expected}, found {total}");
        return Err("transfers lost money".into());
    }
    println!("total conserved: {total}");
    let left = registry.stats().await?.keys;
    if left != 0 {
        return Err(format!("{left} entries left in the registry").into());
    }
    Ok(())
}
