//! The memory store on tokio's paused clock: the lease contract (`lease_store::contract`), and
//! what is its own (when exactly a lease runs out, what dropping a store does).

use std::num::NonZeroU32;
use std::time::Duration;

use tokio::time::{Instant, advance};

use super::{MemoryLeaseStore, MemoryLeaseTable};
use crate::cluster::locking::lease_store::{LeaseNotice, LeaseStore};
use crate::cluster::locking::notices::LeaseNotices;
use crate::cluster::testing::contract::{Backend, LONG_LEASE, PartView, RowView, contract_tests};

/// A table, and the instant it was made, from which its expiries are measured.
struct MemoryBackend {
    table: MemoryLeaseTable,
    made_at: Instant,
}

impl Backend for MemoryBackend {
    type Store = MemoryLeaseStore;

    async fn stores_with_capacity(
        _test: &str,
        capacity: NonZeroU32,
        leases: &[Duration],
    ) -> (Self, Vec<(MemoryLeaseStore, LeaseNotices)>) {
        let table = MemoryLeaseTable::with_capacity(capacity);
        let stores = leases.iter().map(|&lease| table.store(lease)).collect();
        let backend = MemoryBackend {
            table,
            made_at: Instant::now(),
        };
        (backend, stores)
    }

    fn owner(store: &MemoryLeaseStore) -> String {
        store.owner().to_owned()
    }

    async fn parts(&self, key: &str) -> Vec<PartView> {
        self.table.row(key).map_or_else(Vec::new, |row| {
            row.parts
                .into_iter()
                .map(|part| (part.owner, part.fence, part.permits))
                .collect()
        })
    }

    async fn row(&self, key: &str) -> Option<RowView> {
        self.table.row(key).map(|row| (row.owner, row.fence))
    }

    async fn expires_at(&self, key: &str) -> Duration {
        let row = self.table.row(key).expect("the row exists");
        row.expires_at.saturating_duration_since(self.made_at)
    }
}

contract_tests!(
    #[tokio::test(start_paused = true)]
    MemoryBackend
);

#[tokio::test(start_paused = true)]
async fn a_lease_runs_out_exactly_its_length_after_it_was_taken() {
    let lease = Duration::from_secs(1);
    let table = MemoryLeaseTable::new();
    let (holder, _holder_notices) = table.store(lease);
    let (other, _other_notices) = table.store(lease);
    assert_eq!(holder.acquire("k").await.ok(), Some(Some(1)));
    advance(lease - Duration::from_millis(1)).await;
    assert_eq!(other.acquire("k").await.ok(), Some(None));
    // Live while its expiry is after now, as `expires_at > clock_timestamp()` in `postgres`.
    advance(Duration::from_millis(1)).await;
    assert_eq!(other.acquire("k").await.ok(), Some(Some(2)));
}

#[tokio::test(start_paused = true)]
async fn every_store_is_an_owner_of_its_own() {
    let table = MemoryLeaseTable::new();
    let (first, _first_notices) = table.store(LONG_LEASE);
    let owner = first.owner().to_owned();
    drop(first);
    let (second, _second_notices) = table.store(LONG_LEASE);
    assert_ne!(second.owner(), owner);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_store_ends_its_notices_and_only_its_own() {
    let table = MemoryLeaseTable::new();
    let (dropped, mut dropped_notices) = table.store(LONG_LEASE);
    let (holder, mut holder_notices) = table.store(LONG_LEASE);
    let (waiter, _waiter_notices) = table.store(LONG_LEASE);
    drop(dropped);
    assert_eq!(dropped_notices.recv().await, None);
    let fence = holder
        .acquire("k")
        .await
        .ok()
        .flatten()
        .expect("a free key");
    assert_eq!(waiter.acquire("k").await.ok(), Some(None));
    assert_eq!(holder.release("k", fence).await.ok(), Some(true));
    assert_eq!(
        holder_notices.recv().await,
        Some(LeaseNotice::Released("k".to_owned()))
    );
}
