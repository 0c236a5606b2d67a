//! Transfers between accounts, each holding both of its accounts with `lock_all`.
//!
//! Run with `cargo run --example transfer`. 100 accounts start with 1,000 each; 100 tasks
//! make 100 transfers each between random pairs of accounts, listing the two accounts in
//! whichever order the pair came out, so that half the time two transfers between the same
//! accounts name them in opposite orders. Each transfer reads both balances, waits a moment
//! (a database round trip, say), then writes both: without the locks, updates would be lost.
//! At the end it prints
//!
//! ```text
//! total conserved: 100000
//! ```
//!
//! or, if the total changed, a line saying so and an error exit. Locking the two accounts one
//! after the other in the order given would deadlock here; `lock_all` cannot.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use futures::future::try_join_all;
use keyed_locks::LockRegistry;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const ACCOUNTS: u32 = 100;
const OPENING_BALANCE: i64 = 1_000;
const TASKS: u64 = 100;
const TRANSFERS_PER_TASK: u64 = 100;

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

async fn transfer(
    registry: &LockRegistry<u32>,
    ledger: &Ledger,
    from: u32,
    to: u32,
    amount: i64,
) -> Result<(), keyed_locks::LockError> {
    let _both = registry.lock_all([from, to]).await?;
    let (from_balance, to_balance) = (ledger.read(from), ledger.read(to));
    tokio::time::sleep(Duration::from_micros(50)).await;
    ledger.write(from, from_balance - amount);
    ledger.write(to, to_balance + amount);
    Ok(())
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
    let tasks = (0..TASKS).map(|task| {
        let (registry, ledger) = (registry.clone(), Arc::clone(&ledger));
        tokio::spawn(async move {
            // Seeded per task: the same run every time.
            let mut numbers = StdRng::seed_from_u64(task);
            for _ in 0..TRANSFERS_PER_TASK {
                let from = numbers.random_range(0..ACCOUNTS);
                let to = (from + numbers.random_range(1..ACCOUNTS)) % ACCOUNTS;
                let amount = numbers.random_range(1..=50);
                transfer(&registry, &ledger, from, to, amount).await?;
            }
            Ok::<(), keyed_locks::LockError>(())
        })
    });
    for finished in try_join_all(tasks).await? {
        finished?;
    }
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
