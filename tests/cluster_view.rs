//! `ClusterRegistry::snapshot` shows every process the lease table's live rows (holder's
//! owner name with this host and pid, fence, time left by the server's clock, a waiting
//! request) and its own local view; a released key leaves it, `snapshot_top(n)` cuts it to
//! the waited-for keys first, it reads on a connection of its own, and a registry that has
//! shut down refuses it. Two registries on one table stand for two processes, against the
//! real server.

use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::time::Duration;

use keyed_locks::{
    ClusterError, ClusterRegistry, ClusterSnapshot, KeyHold, LeaseOwner, LeaseSnapshot, LockError,
};
use tokio::time::{Instant, sleep};

use crate::cluster_registry::{database_url, fresh_prefix};

/// Generous: the machine is small and shared, and the server is real.
const BOUND: Duration = Duration::from_secs(20);

/// Long enough that no lease of a test runs out while it looks.
const LEASE: Duration = Duration::from_secs(30);

async fn registry(prefix: &str, capacity: u32) -> ClusterRegistry<String> {
    ClusterRegistry::builder(database_url())
        .table_prefix(prefix)
        .lease(LEASE)
        .capacity(NonZeroU32::new(capacity).expect("a test's capacity is above 0"))
        .connect()
        .await
        .expect("connects to the test server")
}

/// `key`'s row in `view`, if it is there.
fn row<'v>(view: &'v ClusterSnapshot<String>, key: &str) -> Option<&'v LeaseSnapshot> {
    view.leases.iter().find(|row| row.key == key)
}

/// Takes snapshots of `registry` until `ready` holds of one, failing after [`BOUND`]: a
/// waiter's mark and a release are written by statements of their own, soon but not at once.
/// `registry.lock(key)` in a task of its own, which ends when the lock is taken.
fn lock_in_a_task(
    registry: &ClusterRegistry<String>,
    key: &str,
) -> tokio::task::JoinHandle<Result<(), LockError>> {
    let (registry, key) = (registry.clone(), key.to_owned());
    tokio::spawn(async move { registry.lock(key).await.map(drop) })
}

async fn snapshot_when(
    registry: &ClusterRegistry<String>,
    ready: impl Fn(&ClusterSnapshot<String>) -> bool,
) -> ClusterSnapshot<String> {
    let started = Instant::now();
    loop {
        let view = registry.snapshot().await.expect("the table can be read");
        if ready(&view) {
            return view;
        }
        assert!(
            started.elapsed() < BOUND,
            "the view never got there: {view:#?}"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_processes_see_the_holder_and_the_waiting_request() {
    let prefix = fresh_prefix("kl_test_view_waiting_").await;
    let holder = registry(&prefix, 1).await;
    let waiter = registry(&prefix, 1).await;
    assert_ne!(
        holder.owner(),
        waiter.owner(),
        "one owner name per registry"
    );
    let guard = holder.lock("a".to_owned()).await.unwrap();
    let waiting = lock_in_a_task(&waiter, "a");

    let from_holder = snapshot_when(&holder, |view| {
        row(view, "a").is_some_and(|row| row.waiting.is_some())
    })
    .await;
    let from_waiter = waiter.snapshot().await.unwrap();
    for (view, ours) in [(&from_holder, true), (&from_waiter, false)] {
        let row = row(view, "a").expect("the held key is in the view");
        assert_eq!(row.hold, KeyHold::Exclusive);
        assert_eq!(row.ours, ours);
        let [lease] = row.holders.as_slice() else {
            panic!("one whole lease: {row:#?}");
        };
        let owner = lease
            .owner
            .as_ref()
            .expect("an owner name in host:pid:random");
        assert_eq!(owner, holder.owner());
        assert_eq!(owner.pid(), std::process::id());
        assert!(!owner.host().is_empty());
        assert_eq!(lease.owner_name, holder.owner().to_string());
        assert_eq!(LeaseOwner::parse(&lease.owner_name).as_ref(), Some(owner));
        assert_eq!(
            lease.fence,
            guard.fencing_token() >> 20,
            "the guard's fence"
        );
        assert_eq!(lease.permits, 1);
        assert_eq!(lease.ours, ours);
        // Renewed every quarter lease, by the server's clock.
        assert!(
            LEASE / 2 < lease.expires_in && lease.expires_in <= LEASE,
            "{:?} left of a {LEASE:?} lease",
            lease.expires_in
        );
        let request = row.waiting.expect("the waiter's mark is live");
        // An exclusive lock asks for the whole capacity.
        assert_eq!(request.permits, Some(1));
        // Marked for a lease a moment ago.
        assert!(LEASE / 2 < request.expires_in && request.expires_in <= LEASE);
    }
    assert_eq!(&from_holder.owner, holder.owner());
    assert_eq!(&from_waiter.owner, waiter.owner());

    // The holder's local view: its guard. The waiter's: its task, which holds the key in its
    // own process while it waits for the lease (so a key held locally but not ours in the
    // table is a key this process waits for).
    let [local] = from_holder.local.as_slice() else {
        panic!("the holder's one key: {:#?}", from_holder.local);
    };
    assert_eq!((local.key.as_str(), local.hold), ("a", KeyHold::Exclusive));
    assert_eq!(local.holders.len(), 1);
    let [local] = from_waiter.local.as_slice() else {
        panic!("the waiter's one key: {:#?}", from_waiter.local);
    };
    assert_eq!((local.key.as_str(), local.hold), ("a", KeyHold::Exclusive));
    assert_eq!((local.holders.len(), local.waiters), (1, 0));

    drop(guard);
    tokio::time::timeout(BOUND, waiting)
        .await
        .expect("the waiter gets the key")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_holders_of_two_processes_are_two_part_leases() {
    let prefix = fresh_prefix("kl_test_view_shared_").await;
    let first = registry(&prefix, 3).await;
    let second = registry(&prefix, 3).await;
    let one = first.lock_shared("s".to_owned()).await.unwrap();
    let two = second.acquire("s".to_owned(), 2).await.unwrap();

    for (view_of, mine) in [
        (&first, one.fencing_token()),
        (&second, two.fencing_token()),
    ] {
        let view = view_of.snapshot().await.unwrap();
        let row = row(&view, "s").expect("the shared key is in the view");
        assert_eq!(
            row.hold,
            KeyHold::Shared {
                permits: 3,
                capacity: 3
            }
        );
        assert!(row.ours);
        assert_eq!(row.waiting, None);
        let owners: BTreeSet<_> = row
            .holders
            .iter()
            .map(|part| (part.owner.clone().expect("owner name"), part.permits))
            .collect();
        let expected = BTreeSet::from([(first.owner().clone(), 1), (second.owner().clone(), 2)]);
        assert_eq!(owners, expected);
        // The parts come in the order granted, each with its own fence.
        assert_eq!(row.holders[0].fence << 20, one.fencing_token());
        assert_eq!(row.holders[1].fence << 20, two.fencing_token());
        let ours: Vec<_> = row.holders.iter().filter(|part| part.ours).collect();
        assert_eq!(ours.len(), 1);
        assert_eq!(ours[0].fence << 20, mine);
        assert_eq!(ours[0].owner.as_ref(), Some(view_of.owner()));
        for part in &row.holders {
            assert!(LEASE / 2 < part.expires_in && part.expires_in <= LEASE);
        }
        let local = view.local.iter().find(|local| local.key == "s").unwrap();
        assert!(matches!(local.hold, KeyHold::Shared { .. }));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_key_leaves_the_view() {
    let prefix = fresh_prefix("kl_test_view_released_").await;
    let registry = registry(&prefix, 1).await;
    let kept = registry.lock("kept".to_owned()).await.unwrap();
    let guard = registry.lock("gone".to_owned()).await.unwrap();
    let view = registry.snapshot().await.unwrap();
    assert!(row(&view, "gone").is_some());
    drop(guard);
    let view = snapshot_when(&registry, |view| row(view, "gone").is_none()).await;
    assert!(row(&view, "kept").is_some(), "a key still held stays");
    assert_eq!(view.leases.len(), 1);
    assert!(view.local.iter().all(|local| local.key != "gone"));
    drop(kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_top_gives_the_waited_for_key_first() {
    let prefix = fresh_prefix("kl_test_view_top_").await;
    let holder = registry(&prefix, 1).await;
    let waiter = registry(&prefix, 1).await;
    // "z" is last by key, and its lease the last taken: only its waiter puts it first.
    let _b = holder.lock("b".to_owned()).await.unwrap();
    let _c = holder.lock("c".to_owned()).await.unwrap();
    let _z = holder.lock("z".to_owned()).await.unwrap();
    let waiting = lock_in_a_task(&waiter, "z");
    let all = snapshot_when(&holder, |view| {
        row(view, "z").is_some_and(|row| row.waiting.is_some())
    })
    .await;
    assert_eq!(all.leases.len(), 3);
    assert_eq!(all.local.len(), 3);

    for view_of in [&holder, &waiter] {
        let top = view_of.snapshot_top(1).await.unwrap();
        let keys: Vec<_> = top.leases.iter().map(|row| row.key.as_str()).collect();
        assert_eq!(keys, ["z"]);
        assert_eq!(top.local.len(), 1);
    }
    assert!(holder.snapshot_top(0).await.unwrap().leases.is_empty());
    waiting.abort();
}

/// The server's connections named as `owner`'s view connection.
async fn view_connections(owner: &LeaseOwner) -> i64 {
    let (client, connection) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
        .await
        .expect("connects to the test server");
    tokio::spawn(connection);
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            &[&format!("keyed-locks view {owner}")],
        )
        .await
        .expect("pg_stat_activity")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_view_reads_on_a_connection_of_its_own_opened_at_the_first_view() {
    let prefix = fresh_prefix("kl_test_view_connection_").await;
    let registry = registry(&prefix, 1).await;
    let _held = registry.lock("k".to_owned()).await.unwrap();
    assert_eq!(
        view_connections(registry.owner()).await,
        0,
        "none before a view"
    );
    registry.snapshot().await.unwrap();
    registry.snapshot_top(1).await.unwrap();
    assert_eq!(view_connections(registry.owner()).await, 1, "one, kept");
    registry.shutdown().await;
    let started = Instant::now();
    while view_connections(registry.owner()).await > 0 {
        assert!(started.elapsed() < BOUND, "closed at shutdown");
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_has_shut_down_gives_no_view() {
    let prefix = fresh_prefix("kl_test_view_shutdown_").await;
    let stopping = registry(&prefix, 1).await;
    let other = registry(&prefix, 1).await;
    let _held = stopping.lock("k".to_owned()).await.unwrap();
    assert!(stopping.snapshot().await.is_ok());
    stopping.shutdown().await;
    assert!(matches!(
        stopping.snapshot().await,
        Err(ClusterError::Closed)
    ));
    assert!(matches!(
        stopping.snapshot_top(5).await,
        Err(ClusterError::Closed)
    ));
    // Its leases went back at shutdown: another process sees none of them.
    let view = other.snapshot().await.unwrap();
    assert!(view.leases.is_empty(), "{view:#?}");
}
