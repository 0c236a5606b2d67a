//! Cases of the leases' invariants that need a statement held in flight, on the in-memory
//! store and tokio's paused clock. Each pins a bug the simulator found.

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::cluster::error::LeaseError;
use crate::cluster::locking::entropy::Jitter;
use crate::cluster::locking::lease_store::{Fence, LeaseStore, Renewal};
use crate::cluster::locking::leases::*;
use crate::cluster::testing::memory_store::{MemoryLeaseStore, MemoryLeaseTable};

const LEASE: Duration = Duration::from_secs(10);

/// Where a statement waits for the test to let it go on.
#[derive(Clone)]
enum Hold {
    /// Before it reaches the table.
    BeforeApplying(Arc<Semaphore>),
    /// After it was applied: its reply is late.
    AfterApplying(Arc<Semaphore>),
}

/// The in-memory store, with statements held where the test says: each acquisition takes the
/// next hold from `acquires` (none left: it runs at once), and `release_all` takes `release_all`.
struct HeldStore {
    inner: MemoryLeaseStore,
    acquires: Mutex<VecDeque<Option<Hold>>>,
    release_all: Option<Hold>,
}

impl HeldStore {
    async fn held<T>(hold: Option<Hold>, statement: impl Future<Output = T>) -> T {
        if let Some(Hold::BeforeApplying(gate)) = &hold {
            let _permit = gate.acquire().await.expect("the gate stays open");
        }
        let reply = statement.await;
        if let Some(Hold::AfterApplying(gate)) = &hold {
            let _permit = gate.acquire().await.expect("the gate stays open");
        }
        reply
    }
}

impl LeaseStore for HeldStore {
    async fn acquire(&self, key: &str) -> Result<Option<Fence>, LeaseError> {
        let hold = self.acquires.lock().unwrap().pop_front().flatten();
        Self::held(hold, self.inner.acquire(key)).await
    }

    async fn try_acquire(&self, key: &str) -> Result<Option<Fence>, LeaseError> {
        let hold = self.acquires.lock().unwrap().pop_front().flatten();
        Self::held(hold, self.inner.try_acquire(key)).await
    }

    async fn renew(&self, key: &str, fence: Fence) -> Result<Renewal, LeaseError> {
        self.inner.renew(key, fence).await
    }

    async fn release(&self, key: &str, fence: Fence) -> Result<bool, LeaseError> {
        self.inner.release(key, fence).await
    }

    async fn acquire_part(
        &self,
        key: &str,
        permits: NonZeroU32,
    ) -> Result<Option<Fence>, LeaseError> {
        let hold = self.acquires.lock().unwrap().pop_front().flatten();
        Self::held(hold, self.inner.acquire_part(key, permits)).await
    }

    async fn try_acquire_part(
        &self,
        key: &str,
        permits: NonZeroU32,
    ) -> Result<Option<Fence>, LeaseError> {
        let hold = self.acquires.lock().unwrap().pop_front().flatten();
        Self::held(hold, self.inner.try_acquire_part(key, permits)).await
    }

    async fn acquire_all(&self, keys: &[String]) -> Result<Option<Vec<Fence>>, LeaseError> {
        let hold = self.acquires.lock().unwrap().pop_front().flatten();
        Self::held(hold, self.inner.acquire_all(keys)).await
    }

    async fn try_acquire_all(&self, keys: &[String]) -> Result<Option<Vec<Fence>>, LeaseError> {
        let hold = self.acquires.lock().unwrap().pop_front().flatten();
        Self::held(hold, self.inner.try_acquire_all(keys)).await
    }

    async fn renew_part(&self, key: &str, fence: Fence) -> Result<Renewal, LeaseError> {
        self.inner.renew_part(key, fence).await
    }

    async fn release_part(&self, key: &str, fence: Fence) -> Result<bool, LeaseError> {
        self.inner.release_part(key, fence).await
    }

    async fn release_all(&self) -> Result<u64, LeaseError> {
        Self::held(self.release_all.clone(), self.inner.release_all()).await
    }
}

fn leases(
    acquires: Vec<Option<Hold>>,
    release_all: Option<Hold>,
) -> (Arc<Leases<HeldStore>>, MemoryLeaseTable) {
    let table = MemoryLeaseTable::new();
    let (inner, _notices) = table.store(LEASE);
    let store = HeldStore {
        inner,
        acquires: Mutex::new(acquires.into()),
        release_all,
    };
    let bounds = CohortBounds {
        max_uses: 16,
        max_hold: LEASE / 2,
    };
    let leases = Leases::new(store, bounds, LEASE, None, Jitter::from_seed(0));
    (leases, table)
}

/// Lets the tasks the leases spawned (acquisitions, releases, the linger of a lease nobody
/// wants) run to their end.
async fn settle() {
    tokio::time::sleep(IDLE_LINGER + Duration::from_millis(1)).await;
}

fn held_now(table: &MemoryLeaseTable, key: &str) -> bool {
    table
        .row(key)
        .is_some_and(|row| row.is_held_at(tokio::time::Instant::now()))
}

/// Invariant 5.
#[tokio::test(start_paused = true)]
async fn a_lease_taken_during_shutdown_is_given_back() {
    let gate = Arc::new(Semaphore::new(0));
    let (leases, table) = leases(vec![Some(Hold::BeforeApplying(Arc::clone(&gate)))], None);
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
    settle().await;
    assert_eq!(leases.counts().1, 0, "a lease is still recorded as held");
    assert!(
        !held_now(&table, "k"),
        "the lease taken during shutdown was not given back"
    );
    drop(interest);
}

/// Invariant 6.
#[tokio::test(start_paused = true)]
async fn a_late_reply_for_an_older_fence_is_not_recorded() {
    let late = Arc::new(Semaphore::new(0));
    let (leases, _table) = leases(vec![Some(Hold::AfterApplying(Arc::clone(&late)))], None);

    // A caller's acquisition takes fence 1, but its reply is late, and the caller gives up.
    let first = leases.register("k");
    let gave_up = tokio::time::timeout(Duration::from_millis(5), leases.acquire("k")).await;
    assert!(
        gave_up.is_err(),
        "the first acquisition's reply came at once"
    );
    drop(first);

    // The next caller takes the row again (fence 2), uses it, and goes; the lease goes back.
    let second = leases.register("k");
    let Ok(Some(lease)) = leases.acquire("k").await else {
        panic!("the second acquisition did not take the lease");
    };
    assert_eq!(lease.fence, 2);
    leases.put_back("k", lease.fence);
    drop(second);
    settle().await;

    // Then the first reply comes, while a third caller waits for the key.
    let third = leases.register("k");
    late.add_permits(1);
    settle().await;
    assert_eq!(
        leases.counts().1,
        0,
        "the late reply's fence 1 was recorded after fence 2"
    );
    assert!(
        matches!(leases.next_for_holder("k"), Next::Acquire { .. }),
        "the third caller was offered the older fence"
    );
    drop(third);
    settle().await;
    assert_eq!(leases.counts(), (0, 0), "an entry outlived its callers");
}

/// Invariant 6, for a set: a set's reply that comes back after a newer acquisition of ours took
/// one of its rows over is stale. No guard gets it, and the row it still holds goes back.
#[tokio::test(start_paused = true)]
async fn a_late_reply_to_a_set_below_a_newer_fence_of_ours_is_not_granted() {
    let late = Arc::new(Semaphore::new(0));
    let (leases, table) = leases(vec![Some(Hold::AfterApplying(Arc::clone(&late)))], None);

    // The set's statement takes both rows (fence 1 each), but its reply is late.
    let set = tokio::spawn({
        let leases = Arc::clone(&leases);
        async move {
            let keys = vec!["a".to_owned(), "b".to_owned()];
            let taken = leases.acquire_all(keys, Ask::Acquire).await;
            taken.map(|owned| owned.is_some())
        }
    });
    settle().await;

    // A lock of "a" in this process takes its row over (ours counts as free).
    let interest = leases.register("a");
    let Ok(Some(lease)) = leases.acquire("a").await else {
        panic!("the lock did not take the row");
    };
    assert_eq!(lease.fence, 2);

    // Then the set's reply comes.
    late.add_permits(1);
    let granted = set.await.expect("the set's task ends");
    assert!(
        !matches!(granted, Ok(true)),
        "the set was granted \"a\" under fence 1, below our fence 2"
    );
    settle().await;
    assert!(
        held_now(&table, "a"),
        "the newer lease of \"a\" was given back"
    );
    assert!(
        !held_now(&table, "b"),
        "the stale set's row of \"b\" is still held"
    );
    leases.put_back("a", lease.fence);
    drop(interest);
    settle().await;
    assert_eq!(leases.counts(), (0, 0), "an entry outlived its callers");
}

/// A whole lease that no guard uses goes back once the heartbeat learns that another process
/// wants its key, even while a caller of this process still wants the key: that caller may be
/// queued locally behind a `lock_all` that waits for another process, which may wait for this
/// very key (found by the simulator's seed 12261), and no local holder would come to give the
/// lease back at its bound.
#[tokio::test(start_paused = true)]
async fn an_idle_lease_another_process_wants_goes_back_at_the_heartbeat() {
    let (leases, table) = leases(vec![], None);
    let (_sender, notices) = crate::cluster::locking::notices::channel();
    let heartbeat = LEASE / 4;
    spawn_background(&leases, notices, heartbeat);
    let waiting_locally = leases.register("k");
    let Ok(Some(lease)) = leases.acquire("k").await else {
        panic!("the key was free");
    };
    leases.put_back("k", lease.fence);

    // Another process asks, and is refused: the row is wanted.
    let (other, _other_notices) = table.store(LEASE);
    assert_eq!(other.acquire("k").await.ok(), Some(None));
    tokio::time::sleep(heartbeat + Duration::from_millis(1)).await;
    settle().await;
    assert!(
        !held_now(&table, "k"),
        "the idle lease is kept while another process waits for it"
    );
    assert!(matches!(other.acquire("k").await, Ok(Some(_))));
    drop(waiting_locally);
}

/// Invariant 7.
#[tokio::test(start_paused = true)]
async fn guards_learn_of_shutdown_before_the_release_is_sent() {
    let late = Arc::new(Semaphore::new(0));
    let (leases, table) = leases(Vec::new(), Some(Hold::AfterApplying(Arc::clone(&late))));
    let interest = leases.register("k");
    let Ok(Some(lease)) = leases.acquire("k").await else {
        panic!("the acquisition did not take the lease");
    };

    let shutting_down = tokio::spawn({
        let leases = Arc::clone(&leases);
        async move { leases.release_everything().await }
    });
    settle().await;
    assert!(
        !held_now(&table, "k"),
        "the release was not applied before its reply"
    );
    assert!(
        lease.validity.borrow().is_lost(),
        "the table gave the lease back while its guard still believed it live"
    );
    late.add_permits(1);
    shutting_down.await.expect("shutdown ends");
    drop(interest);
}

/// Invariant 8, with a set's late statement: a `lock_all` statement of a caller that went away
/// lands after a newer set of this process took the keys, and takes the rows over (ours counts
/// as free). The newer set's leases are gone then, and its guard must say so.
#[tokio::test(start_paused = true)]
async fn a_late_set_of_ours_that_takes_the_rows_over_marks_the_older_set_lost() {
    let gate = Arc::new(Semaphore::new(0));
    let (leases, table) = leases(vec![Some(Hold::BeforeApplying(Arc::clone(&gate)))], None);
    let keys = vec!["a".to_owned(), "b".to_owned()];

    // The first set's statement waits to be applied, and its caller gives up.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(5),
        leases.acquire_all(keys.clone(), Ask::Acquire),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "the first set's statement was applied at once"
    );

    // A newer set takes both keys.
    let Ok(Some(newer)) = leases.acquire_all(keys.clone(), Ask::Acquire).await else {
        panic!("the newer set did not take the keys");
    };
    assert!(newer.iter().all(|lease| !lease.validity.borrow().is_lost()));

    // The first statement lands: it takes the rows over under new fences, and, its caller
    // gone, gives them back.
    gate.add_permits(1);
    settle().await;
    assert!(!held_now(&table, "a") && !held_now(&table, "b"));
    assert!(
        newer.iter().all(|lease| lease.validity.borrow().is_lost()),
        "the newer set still believes it holds keys another process may take now"
    );
    drop(newer);
    settle().await;
    assert_eq!(leases.counts(), (0, 0), "an entry outlived its callers");
}
