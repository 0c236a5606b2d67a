//! With the default execution mode every call runs the owner's step itself (a free key is
//! granted on the first poll, a release wakes the next waiter at once), and a call that finds
//! a step running waits for it, then runs its own. Actor mode keeps every request on the actor
//! task.

use std::hash::{Hash, Hasher};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use keyed_locks::journal::WaiterId;
use keyed_locks::journal::{JournalEvent, Refusal};
use keyed_locks::{Execution, LockRegistry};
use tokio_test::{assert_pending, assert_ready, task};

fn registry<K: keyed_locks::LockKey>(execution: Execution) -> LockRegistry<K> {
    LockRegistry::builder().execution(execution).spawn()
}

#[tokio::test]
async fn a_free_key_is_granted_on_the_first_poll_without_the_actor() {
    let registry = registry(Execution::RunOnCaller);
    let mut lock = task::spawn(registry.lock(1));
    let guard = assert_ready!(lock.poll()).unwrap();
    assert_eq!(guard.fencing_token(), 1);
}

#[tokio::test]
async fn in_actor_mode_even_a_free_key_waits_for_the_actor() {
    let registry = registry(Execution::ActorTask);
    let mut lock = task::spawn(registry.lock(1));
    assert_pending!(lock.poll());
    assert_eq!(lock.await.unwrap().fencing_token(), 1);
}

#[tokio::test]
async fn a_release_hands_the_key_to_the_next_waiter_directly() {
    // Current-thread runtime: the actor cannot run until this test awaits, so a waiter woken
    // right after the drop was woken by the drop itself.
    let registry = registry(Execution::RunOnCaller);
    let holder = registry.lock(1).await.unwrap();
    let mut waiter = task::spawn(registry.lock(1));
    assert_pending!(waiter.poll());
    drop(holder);
    assert!(waiter.is_woken(), "the release woke the next holder");
    assert_eq!(assert_ready!(waiter.poll()).unwrap().fencing_token(), 2);
}

#[tokio::test]
async fn in_actor_mode_a_release_goes_through_the_actor() {
    let registry = registry(Execution::ActorTask);
    let holder = registry.lock(1).await.unwrap();
    let mut waiter = task::spawn(registry.lock(1));
    assert_pending!(waiter.poll());
    registry.stats().await.unwrap();
    drop(holder);
    assert!(
        !waiter.is_woken(),
        "queued for the actor, which has not run yet"
    );
    registry.stats().await.unwrap();
    assert!(waiter.is_woken());
}

/// A key whose `Hash` can be made to wait at a gate, once: the step that first hashes it
/// keeps running (holding the shard's lock) until the test opens the gate.
#[derive(Debug, Clone)]
struct Gated {
    id: u32,
    gate: Option<Gate>,
}

#[derive(Debug, Clone)]
struct Gate {
    /// Told when a step has reached the gate.
    reached: mpsc::SyncSender<()>,
    /// Waited on until the test opens the gate; taken by the first hash.
    open: Arc<Mutex<Option<mpsc::Receiver<()>>>>,
}

impl Hash for Gated {
    fn hash<H: Hasher>(&self, state: &mut H) {
        if let Some(gate) = &self.gate
            && let Some(open) = gate.open.lock().unwrap().take()
        {
            let _ = gate.reached.send(());
            let _ = open.recv();
        }
        self.id.hash(state);
    }
}

impl PartialEq for Gated {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Gated {}

fn key(id: u32) -> Gated {
    Gated { id, gate: None }
}

/// Starts a step on another thread that stops at a gate while holding the shard's lock;
/// returns the sender that opens the gate and the thread.
fn hold_the_shard_on_another_thread(
    registry: &LockRegistry<Gated>,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (reached, reached_rx) = mpsc::sync_channel(1);
    let (open, open_rx) = mpsc::channel();
    let gated = Gated {
        id: 999,
        gate: Some(Gate {
            reached,
            open: Arc::new(Mutex::new(Some(open_rx))),
        }),
    };
    let registry = registry.clone();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async move { drop(registry.try_lock(gated).await.unwrap()) });
    });
    reached_rx.recv().expect("the step reached the gate");
    (open, thread)
}

/// A call made while another thread's step runs does not get ahead of it: it waits for that
/// step to end, then runs its own, and its grant comes after the running step's.
#[test]
fn a_call_made_while_a_step_runs_waits_for_it_then_runs_its_own() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let registry: LockRegistry<Gated> =
        runtime.block_on(async { registry(Execution::RunOnCaller) });
    let (open, gated) = hold_the_shard_on_another_thread(&registry);

    let (done, done_rx) = mpsc::channel();
    let caller = {
        let registry = registry.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let token =
                runtime.block_on(async { registry.lock(key(1)).await.unwrap().fencing_token() });
            done.send(token).unwrap();
        })
    };
    // However long it is given, the caller cannot finish while the gated step runs.
    assert!(
        done_rx
            .recv_timeout(std::time::Duration::from_millis(100))
            .is_err(),
        "the call ran while another step held the shard"
    );
    open.send(()).unwrap();
    gated.join().unwrap();
    caller.join().unwrap();
    assert_eq!(
        done_rx.recv().unwrap(),
        2,
        "after the gated step's grant (1)"
    );
    runtime.block_on(async {
        assert_eq!(registry.stats().await.unwrap().keys, 0);
    });
}

#[tokio::test]
async fn a_grant_made_while_its_caller_gave_up_passes_the_key_on() {
    let registry = registry(Execution::RunOnCaller);
    let holder = registry.lock(key(1)).await.unwrap();
    let mut gives_up = task::spawn(registry.lock(key(1)));
    assert_pending!(gives_up.poll());
    let mut next = task::spawn(registry.lock(key(1)));
    assert_pending!(next.poll());

    drop(holder); // granted to `gives_up`, which is woken but not polled
    assert!(gives_up.is_woken());
    drop(gives_up); // its grant in flight: the drop releases, and `next` gets the key
    assert!(next.is_woken());
    let guard = assert_ready!(next.poll()).unwrap();
    assert_eq!(guard.fencing_token(), 3);
    drop(guard);
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}

/// In actor mode, a waiter that gives up while the release that grants to it waits for the
/// actor: both wait in the queue, release first. The actor grants to a waiter that has
/// already given up, releases at once and grants the next; the cancel that follows finds
/// nothing and is refused.
#[tokio::test]
async fn a_waiter_giving_up_after_its_holder_released_in_the_actors_queue_passes_the_key_on() {
    let registry = LockRegistry::builder()
        .execution(Execution::ActorTask)
        .journal(1_000)
        .spawn();
    let holder = registry.lock(key(1)).await.unwrap();
    let mut gives_up = task::spawn(registry.lock(key(1)));
    assert_pending!(gives_up.poll());
    let mut next = task::spawn(registry.lock(key(1)));
    assert_pending!(next.poll());
    registry.stats().await.unwrap(); // both are queued in the table

    drop(holder); // queued for the actor
    drop(gives_up); // queued after it: a cancel, since the waiter is still queued
    assert!(!next.is_woken());
    registry.stats().await.unwrap();
    assert!(next.is_woken());
    assert_eq!(assert_ready!(next.poll()).unwrap().fencing_token(), 3);
    assert_eq!(registry.stats().await.unwrap().keys, 0);

    let waiter = |arrival| WaiterId::new(arrival).unwrap();
    let grant = |arrival, fencing_token| JournalEvent::Grant {
        waiter: waiter(arrival),
        fencing_token,
    };
    let release = |arrival| JournalEvent::Release {
        waiter: waiter(arrival),
    };
    let journal = registry.journal().await.unwrap();
    let events: Vec<_> = journal
        .entries
        .into_iter()
        .map(|entry| entry.event)
        .collect();
    let acquire = |arrival| JournalEvent::Acquire {
        waiter: waiter(arrival),
        key: key(1),
        permits: 1,
    };
    assert_eq!(
        events,
        [
            acquire(1),
            grant(1, 1),
            acquire(2),
            acquire(3),
            release(1),
            grant(2, 2),
            release(2),
            grant(3, 3),
            JournalEvent::Cancel { waiter: waiter(2) },
            JournalEvent::Refused {
                waiter: waiter(2),
                reason: Refusal::Unknown,
            },
            release(3),
        ]
    );
}
