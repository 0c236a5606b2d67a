//! The account store: balances in memory, behind a simulated database round trip.
//!
//! [`Accounts::read`] takes the balance as it is when the query runs and hands it over only
//! after [`DB_LATENCY`], as a real database call would. Two requests that read the same
//! account within that window and both write back lose one of the two updates, unless
//! something (here, the per-account lock in `api.rs`) keeps them from overlapping.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// How long a read of a balance takes to come back.
pub const DB_LATENCY: Duration = Duration::from_millis(5);

/// Balances by account id, in minor units (cents). An account never written has balance 0.
#[derive(Debug, Default)]
pub struct Accounts {
    balances: Mutex<HashMap<u64, u64>>,
}

impl Accounts {
    /// The balance of `id` as of the query, returned after a database round trip.
    pub async fn read(&self, id: u64) -> u64 {
        let balance = self.now(id);
        tokio::time::sleep(DB_LATENCY).await;
        balance
    }

    /// Stores `balance` as the balance of `id`, whatever it is now.
    pub fn write(&self, id: u64, balance: u64) {
        self.lock().insert(id, balance);
    }

    fn now(&self, id: u64) -> u64 {
        self.lock().get(&id).copied().unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, u64>> {
        // The map is consistent after any panic: every change is one insert.
        self.balances.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A change to one balance.
#[derive(Debug, Clone, Copy)]
pub enum Change {
    Credit(u64),
    Debit(u64),
}

/// Why a change was refused; the balance is left as it was.
#[derive(Debug)]
pub enum Refused {
    /// The debit is larger than the balance.
    Overdraft { balance: u64, debit: u64 },
    /// The credit would take the balance past `u64::MAX`.
    Overflow { balance: u64, credit: u64 },
}

impl Change {
    /// The balance after this change, or why it cannot be made.
    pub fn apply(self, balance: u64) -> Result<u64, Refused> {
        match self {
            Change::Credit(credit) => balance
                .checked_add(credit)
                .ok_or(Refused::Overflow { balance, credit }),
            Change::Debit(debit) => balance
                .checked_sub(debit)
                .ok_or(Refused::Overdraft { balance, debit }),
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Overdraft { balance, debit } => {
                write!(f, "insufficient funds: balance {balance}, debit {debit}")
            }
            Refused::Overflow { balance, credit } => {
                write!(f, "balance {balance} cannot take a credit of {credit}")
            }
        }
    }
}
