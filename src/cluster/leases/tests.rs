//! Cases of the leases' invariants that need a statement held in flight, on the in-memory
//! store and tokio's paused clock.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::*;
use crate::cluster::error::LeaseError;
use crate::cluster::memory_store::{MemoryLeaseStore, MemoryLeaseTable};

const LEASE: Duration = Duration::from_secs(10);

/// The in-memory store, with acquisitions held at the door until the test lets them in.
struct GatedStore {
    inner: MemoryLeaseStore,
    gate: Arc<Semaphore>,
}

impl LeaseStore for GatedStore {
    async fn acquire(&self, key: &str) -> Result<Option<Fence>, LeaseError> {
        let _permit = self.gate.acquire().await.expect("the gate stays open");
        self.inner.acquire(key).await
    }

    async fn renew(&self, key: &str, fence: Fence) -> Result<bool, LeaseError> {
        self.inner.renew(key, fence).await
    }

    async fn release(&self, key: &str, fence: Fence) -> Result<bool, LeaseError> {
        self.inner.release(key, fence).await
    }

    async fn release_all(&self) -> Result<u64, LeaseError> {
        self.inner.release_all().await
    }
}

#[tokio::test(start_paused = true)]
async fn a_lease_taken_during_shutdown_is_given_back() {
    let table = MemoryLeaseTable::new();
    let (inner, _notices) = table.store(LEASE);
    let gate = Arc::new(Semaphore::new(0));
    let bounds = CohortBounds {
        max_uses: 16,
        max_hold: LEASE / 2,
    };
    let store = GatedStore {
        inner,
        gate: Arc::clone(&gate),
    };
    let leases = Leases::new(store, bounds, LEASE, None, Jitter::from_seed(0));
    let interest = leases.register("k");

    // A lock's acquisition is on its way to the table when shutdown releases everything.
    let acquiring = tokio::spawn({
        let leases = Arc::clone(&leases);
        async move { leases.acquire("k").await.map(|lease| lease.is_some()) }
    });
    tokio::task::yield_now().await;
    leases.release_everything().await;
    gate.add_permits(1);

    let got_a_lease = acquiring.await.expect("the acquisition task ends");
    assert!(
        matches!(got_a_lease, Ok(false)),
        "a lease acquired after shutdown began was handed to the caller"
    );
    // The release runs in a task of its own; let it land.
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(leases.counts().1, 0, "a lease is still recorded as held");
    let row = table.row("k").expect("the acquisition made the row");
    assert!(
        !row.is_held_at(tokio::time::Instant::now()),
        "the lease taken during shutdown was not given back: {row:?}"
    );
    drop(interest);
}
