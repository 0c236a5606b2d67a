//! The case where lockable, keyed-lock and key-mutex leak (their cleanup counts `Arc`
//! references in the guard's drop, which a cancelled waiter's dropped future does not show:
//! keyed-lock `src/async.rs`, key-mutex `src/inner.rs`, lockable `src/lockable_map_impl.rs`):
//! task A holds key k, task B waits for k, A releases, and B is cancelled before it runs
//! again. The grant to B is then in flight; it must pass on, and the entry for k must go.
//! The multi-thread cases run in both execution modes.
//!
//! The cases that loop or race (threads, aborts, timers) hit the window where the grant is in
//! flight often but by chance. The cases marked *step by step* reach it for certain: on the
//! current-thread runtime, with the `lock` futures polled by hand, and with
//! `registry.stats().await` as the point where every request sent before has been handled (in
//! actor mode, the point where the actor task has run); they pin the table's events with the
//! registry's journal.

use std::time::Duration;

use keyed_locks::journal::JournalEvent;
use keyed_locks::{Execution, KeyGuard, LockError, LockRegistry};
use tokio_test::{assert_pending, assert_ready, task};

use crate::reference_model::trace_lines;

const BOTH_MODES: [Execution; 2] = [Execution::RunOnCaller, Execution::ActorTask];

/// The key every step-by-step case locks.
const KEY: u64 = 7;

fn journaled(execution: Execution) -> LockRegistry<u64> {
    LockRegistry::builder()
        .execution(execution)
        .journal(1_000)
        .spawn()
}

/// Everything the registry's table did, as trace lines without number and time.
async fn table_events(registry: &LockRegistry<u64>) -> String {
    let journal = registry.journal().await.unwrap();
    trace_lines(journal.entries.iter().map(|entry| &entry.event))
}

type Locked = Result<KeyGuard<u64>, LockError>;

/// A holder (w1) and two waiters queued behind it in this order (w2, then w3), every request
/// handled.
async fn held_with_two_waiters(
    registry: &LockRegistry<u64>,
) -> (
    KeyGuard<u64>,
    task::Spawn<impl Future<Output = Locked> + '_>,
    task::Spawn<impl Future<Output = Locked> + '_>,
) {
    let holder = registry.lock(KEY).await.unwrap();
    let mut first = task::spawn(registry.lock(KEY));
    let mut second = task::spawn(registry.lock(KEY));
    assert_pending!(first.poll());
    assert_pending!(second.poll());
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.held, stats.waiting), (1, 1, 2));
    (holder, first, second)
}

#[tokio::test]
async fn waiter_dropped_after_the_holder_released_leaves_no_entry_a_thousand_times() {
    let registry = LockRegistry::spawn();
    for key in 0..1_000u32 {
        let holder = registry.lock(key).await.unwrap();
        let mut waiter = task::spawn(registry.lock(key));
        assert_pending!(waiter.poll());
        registry.stats().await.unwrap(); // B is queued

        drop(holder);
        registry.stats().await.unwrap(); // the key is granted to B, who has not run since
        drop(waiter);
    }
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.held, stats.waiting), (0, 0, 0));
    // Every waiter was granted (the grant was in flight each time), and each such grant
    // passed on: 1,000 holders and 1,000 in-flight grants.
    assert_eq!(stats.grants, 2_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_waiter_after_release_leaves_no_entry_for_a_thousand_distinct_keys() {
    for execution in [Execution::RunOnCaller, Execution::ActorTask] {
        aborted_waiter_after_release(LockRegistry::builder().execution(execution).spawn()).await;
    }
}

async fn aborted_waiter_after_release(registry: LockRegistry<u32>) {
    for key in 0..1_000u32 {
        let holder = registry.lock(key).await.unwrap();
        let waiter = tokio::spawn({
            let registry = registry.clone();
            async move { registry.lock(key).await.map(drop) }
        });
        while registry.stats().await.unwrap().waiting == 0 {
            tokio::task::yield_now().await;
        }
        drop(holder);
        waiter.abort();
        let _ = waiter.await;
    }
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.held, stats.waiting), (0, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn waiter_whose_timeout_expires_after_release_leaves_no_entry_for_a_thousand_distinct_keys() {
    let registry = LockRegistry::spawn();
    for key in 0..1_000u32 {
        let holder = registry.lock(key).await.unwrap();
        let waiter = tokio::spawn({
            let registry = registry.clone();
            async move { tokio::time::timeout(Duration::from_millis(5), registry.lock(key)).await }
        });
        while registry.stats().await.unwrap().waiting == 0 {
            tokio::task::yield_now().await;
        }
        // Release, then let the waiter's deadline pass before it runs again. tokio's `Timeout`
        // polls the lock before its timer, so the waiter takes the guard and drops it (the
        // step-by-step case below pins this); the deadline never wins over a grant made.
        drop(holder);
        tokio::time::advance(Duration::from_millis(5)).await;
        let _ = waiter.await.unwrap();
    }
    let stats = registry.stats().await.unwrap();
    assert_eq!((stats.keys, stats.held, stats.waiting), (0, 0, 0));
}

#[tokio::test]
async fn the_next_waiter_gets_a_grant_refused_in_flight() {
    let registry = LockRegistry::spawn();
    let holder = registry.lock("k").await.unwrap();
    let mut gives_up = task::spawn(registry.lock("k"));
    let mut stays = task::spawn(registry.lock("k"));
    assert_pending!(gives_up.poll());
    assert_pending!(stays.poll());
    registry.stats().await.unwrap();

    drop(holder);
    registry.stats().await.unwrap(); // granted to `gives_up`, in flight
    drop(gives_up);
    registry.stats().await.unwrap(); // its release was handled: granted to `stays`
    assert!(stays.is_woken());
    let guard = stays.await.unwrap();
    assert_eq!(guard.fencing_token(), 3);
    drop(guard);
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}

#[tokio::test]
async fn a_waiter_giving_up_while_its_grant_is_being_made_passes_the_key_on() {
    let registry = LockRegistry::spawn();
    for key in 0..100u32 {
        let holder = registry.lock(key).await.unwrap();
        let mut waiter = task::spawn(registry.lock(key));
        assert_pending!(waiter.poll());
        registry.stats().await.unwrap(); // queued

        // The release and the waiter's cancel are both in the mailbox, release first: the
        // registry grants to a waiter that has already given up, and must pass the key on.
        drop(holder);
        drop(waiter);
        let stats = registry.stats().await.unwrap();
        assert_eq!(
            (stats.keys, stats.held, stats.waiting),
            (0, 0, 0),
            "key {key}"
        );
    }
}

/// Step by step: the grant is made and the waiter is woken, but its future is dropped before
/// it runs again. The drop releases the grant, and the next waiter gets the key with the next
/// token.
#[tokio::test]
async fn a_waiter_dropped_with_its_grant_in_flight_passes_the_key_on_in_either_mode() {
    for execution in BOTH_MODES {
        let registry = journaled(execution);
        let (holder, in_flight, mut next) = held_with_two_waiters(&registry).await;

        drop(holder);
        let stats = registry.stats().await.unwrap();
        // The table counts w2 as the holder: the grant is made, only its delivery is pending.
        assert_eq!(
            (stats.keys, stats.held, stats.waiting),
            (1, 1, 1),
            "{execution:?}"
        );
        assert!(in_flight.is_woken() && !next.is_woken(), "{execution:?}");

        drop(in_flight);
        registry.stats().await.unwrap();
        assert!(next.is_woken(), "{execution:?}");
        let guard = assert_ready!(next.poll()).unwrap();
        assert_eq!(guard.fencing_token(), 3, "{execution:?}");
        drop(guard);
        assert_eq!(registry.stats().await.unwrap().keys, 0, "{execution:?}");
        assert_eq!(
            table_events(&registry).await,
            "acquire w1 1 7; grant w1 1; acquire w2 1 7; acquire w3 1 7; \
             release w1; grant w2 2; release w2; grant w3 3; release w3",
            "{execution:?}"
        );
    }
}

/// Step by step: the waiter takes its guard (token 2) on its next poll and drops it at once.
#[tokio::test]
async fn a_waiter_that_takes_its_guard_and_drops_it_at_once_passes_the_key_on_in_either_mode() {
    for execution in BOTH_MODES {
        let registry = journaled(execution);
        let (holder, mut granted, mut next) = held_with_two_waiters(&registry).await;

        drop(holder);
        registry.stats().await.unwrap();
        assert!(granted.is_woken(), "{execution:?}");
        let guard = assert_ready!(granted.poll()).unwrap();
        assert_eq!(guard.fencing_token(), 2, "{execution:?}");
        drop(guard);
        registry.stats().await.unwrap();
        assert!(next.is_woken(), "{execution:?}");
        assert_eq!(
            assert_ready!(next.poll()).unwrap().fencing_token(),
            3,
            "{execution:?}"
        );
        assert_eq!(registry.stats().await.unwrap().keys, 0, "{execution:?}");
        assert_eq!(
            table_events(&registry).await,
            "acquire w1 1 7; grant w1 1; acquire w2 1 7; acquire w3 1 7; \
             release w1; grant w2 2; release w2; grant w3 3; release w3",
            "{execution:?}"
        );
    }
}

/// Step by step, in actor mode: the release and the waiter's give-up wait in the actor's queue
/// together, release first. The actor grants to a waiter that has already given up, releases
/// at once, and grants the next; the cancel that follows finds nothing and is refused.
#[tokio::test]
async fn a_waiter_giving_up_before_the_actor_handles_the_release_passes_the_key_on() {
    let registry = journaled(Execution::ActorTask);
    let (holder, gives_up, mut next) = held_with_two_waiters(&registry).await;

    drop(holder);
    drop(gives_up);
    registry.stats().await.unwrap();
    assert!(next.is_woken());
    assert_eq!(assert_ready!(next.poll()).unwrap().fencing_token(), 3);
    assert_eq!(registry.stats().await.unwrap().keys, 0);
    assert_eq!(
        table_events(&registry).await,
        "acquire w1 1 7; grant w1 1; acquire w2 1 7; acquire w3 1 7; \
         release w1; grant w2 2; release w2; grant w3 3; cancel w2; refused w2 unknown; release w3"
    );
}

/// Step by step, with a real task: its grant is made (by the release, run on this thread) and
/// it is woken, but it is aborted before the current-thread runtime runs it again. Only the
/// default mode can be pinned so: in actor mode the grant is made on the actor task, and the
/// runtime then runs the woken waiter before this test can abort it.
#[tokio::test]
async fn a_task_aborted_with_its_grant_in_flight_passes_the_key_on() {
    let registry = journaled(Execution::RunOnCaller);
    let holder = registry.lock(KEY).await.unwrap();
    let aborted = tokio::spawn({
        let registry = registry.clone();
        async move { registry.lock(KEY).await.map(drop) }
    });
    while registry.stats().await.unwrap().waiting == 0 {
        tokio::task::yield_now().await; // lets the task run until it queues
    }
    let mut next = task::spawn(registry.lock(KEY));
    assert_pending!(next.poll());

    drop(holder); // runs here: grants to the task, which cannot run before the abort
    aborted.abort();
    assert!(
        aborted.await.unwrap_err().is_cancelled(),
        "it never ran again"
    );
    assert!(next.is_woken());
    assert_eq!(assert_ready!(next.poll()).unwrap().fencing_token(), 3);
    assert_eq!(registry.stats().await.unwrap().keys, 0);
    assert_eq!(
        table_events(&registry).await,
        "acquire w1 1 7; grant w1 1; acquire w2 1 7; acquire w3 1 7; \
         release w1; grant w2 2; release w2; grant w3 3; release w3"
    );
}

/// Step by step: a `timeout` whose deadline passes while the grant is in flight. tokio's
/// `Timeout` polls the future before the timer, so the guard is handed over all the same and
/// its drop passes the key on: a timeout gives up with a grant in flight only if its future is
/// dropped before it is polled again, as in the cases above.
#[tokio::test(start_paused = true)]
async fn a_timeout_expiring_with_the_grant_in_flight_still_hands_over_the_guard_in_either_mode() {
    for execution in BOTH_MODES {
        let registry = journaled(execution);
        let holder = registry.lock(KEY).await.unwrap();
        let mut patient = task::spawn(tokio::time::timeout(
            Duration::from_millis(5),
            registry.lock(KEY),
        ));
        assert_pending!(patient.poll());
        registry.stats().await.unwrap();

        drop(holder);
        registry.stats().await.unwrap();
        tokio::time::advance(Duration::from_millis(5)).await;
        let guard = assert_ready!(patient.poll())
            .expect("the grant came first")
            .unwrap();
        assert_eq!(guard.fencing_token(), 2, "{execution:?}");
        drop(guard);
        assert_eq!(registry.stats().await.unwrap().keys, 0, "{execution:?}");
        let journal = registry.journal().await.unwrap();
        assert!(
            !journal
                .entries
                .iter()
                .any(|entry| matches!(entry.event, JournalEvent::Cancel { .. })),
            "{execution:?}: nothing was cancelled"
        );
    }
}
