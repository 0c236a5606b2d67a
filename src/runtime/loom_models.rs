//! loom models of the shard protocol: every interleaving of two or three threads that take,
//! queue, give up, release and close, with the shard's mutex swapped for loom's
//! (`runtime/sync.rs`). Run with `RUSTFLAGS="--cfg loom" cargo test --release --lib loom`.
//!
//! Each model drives the shard the way its callers do (`start` is a future's first poll,
//! `poll_grant` a later one, `abandon` its drop, `release` a guard's drop, `poll_work` the actor
//! task, `close` a shutdown) and checks, once every thread is done, that nothing was lost: no
//! request dropped or reordered, no grant after a close, no entry left behind, no waiter
//! forgotten without a wake-up.

use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

use crate::pure::table::Permits;
use crate::runtime::execution::Execution;
use crate::runtime::owner::{Owner, OwnerConfig};
use crate::runtime::pending::{Granted, NotGranted, PendingKey};
use crate::runtime::request::{Delivery, Outcome, Request};
use crate::runtime::router::ShardRouter;
use crate::runtime::shard::{Shard, Started, Work};
use crate::runtime::stall::StallThresholds;

/// A waker that counts its wake-ups in a loom atomic, so that a wake-up's visibility is part
/// of the model.
struct Flag(AtomicUsize);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Flag {
    fn woken(&self) -> bool {
        self.0.load(Ordering::SeqCst) > 0
    }
}

fn flag() -> (Arc<Flag>, Waker) {
    let flag = Arc::new(Flag(AtomicUsize::new(0)));
    (Arc::clone(&flag), Waker::from(flag))
}

fn shard(execution: Execution) -> Arc<Shard<u32>> {
    let config = OwnerConfig {
        journal_capacity: None,
        capacity: std::num::NonZeroU32::MIN,
        shard: 0,
        router: ShardRouter::new(std::num::NonZeroUsize::MIN),
        stall_thresholds: StallThresholds::default(),
    };
    Arc::new_cyclic(|shard_ref| Shard::new(Owner::new(config, shard_ref.clone()), execution))
}

/// Every permit of a key of the models' registry, which has one per key: an exclusive lock.
const ONE_PERMIT: Permits = Permits(std::num::NonZeroU32::MIN);

fn acquire(key: u32) -> Request<u32> {
    Request::Acquire {
        key,
        permits: ONE_PERMIT,
        delivery: Delivery::Caller,
    }
}

fn try_acquire(key: u32) -> Request<u32> {
    Request::TryAcquire {
        key,
        permits: ONE_PERMIT,
        delivery: Delivery::Caller,
    }
}

/// Serves the actor-mode queue until it is empty, as the actor task does when woken.
fn serve_as_actor(shard: &Shard<u32>) {
    let (_, waker) = flag();
    let mut cx = Context::from_waker(&waker);
    while let Poll::Ready(Work::Served) = shard.poll_work(&mut cx) {}
}

/// Takes the free `key` before the model's threads start, in either mode: the holder the
/// threads then race around.
fn hold_free_key(shard: &Shard<u32>, key: u32) -> Granted {
    let (_, waker) = flag();
    let started = shard.start(acquire(key), &waker);
    serve_as_actor(shard);
    match started {
        Started::Granted(granted) => granted,
        Started::Waiting(pending) => match poll(shard, pending) {
            Poll::Ready(Ok(granted)) => granted,
            other => panic!("a free key is granted: {other:?}"),
        },
        Started::Refused(refused) => panic!("open shard refused: {refused:?}"),
    }
}

/// Queues a request for the held `key`, for `waker`'s task.
fn wait_for_held_key(shard: &Shard<u32>, key: u32, waker: &Waker) -> PendingKey {
    match shard.start(acquire(key), waker) {
        Started::Waiting(pending) => pending,
        _ => panic!("the key is held"),
    }
}

/// Before the model's threads start: key 1 held, and one request waiting for it (in actor mode
/// too: served) for `waker`'s task. Returns the holder and the waiter.
fn one_waiter_behind_a_holder(shard: &Shard<u32>, waker: &Waker) -> (Granted, PendingKey) {
    let held = hold_free_key(shard, 1);
    let waiting = wait_for_held_key(shard, 1, waker);
    serve_as_actor(shard);
    (held, waiting)
}

/// Releases `held` on a model thread of its own, and serves what the release queued.
fn release_on_thread(shard: &Arc<Shard<u32>>, held: Granted) -> thread::JoinHandle<()> {
    on_thread(shard, move |shard| {
        shard.release(held.waiter_id);
        serve_as_actor(shard);
    })
}

/// Runs `work` on a model thread of its own.
fn on_thread(
    shard: &Arc<Shard<u32>>,
    work: impl FnOnce(&Shard<u32>) + Send + 'static,
) -> thread::JoinHandle<()> {
    let shard = Arc::clone(shard);
    thread::spawn(move || work(&shard))
}

/// Releases the last grant and checks that the shard keeps no entry.
fn let_go_and_find_nothing_left(shard: &Shard<u32>, granted: Granted) {
    shard.release(granted.waiter_id);
    serve_as_actor(shard);
    assert_eq!(keys(shard), 0, "no entry left");
}

/// Explores every interleaving of `model`, once in each execution mode.
fn in_both_modes(model: fn(Execution)) {
    for execution in [Execution::RunOnCaller, Execution::ActorTask] {
        loom::model(move || model(execution));
    }
}

/// Polls a pending grant once.
fn poll(shard: &Shard<u32>, pending: PendingKey) -> Poll<Result<Granted, NotGranted>> {
    let (_, waker) = flag();
    shard.poll_grant(pending, &mut Context::from_waker(&waker))
}

/// The key's entry count, read by a step like any caller's.
fn keys(shard: &Shard<u32>) -> usize {
    match shard.with_state(|state, effects| state.step(Request::Stats { reply: None }, effects)) {
        Some(Outcome::Stats(stats)) => stats.keys,
        _ => 0,
    }
}

/// Take-or-queue against give-back: a holder releases while another caller asks for the key.
/// Whatever the order, the caller ends with the key, and if it had to wait it was woken: no
/// request is lost between the release and the queue.
#[test]
fn loom_take_or_queue_against_give_back() {
    in_both_modes(|execution| {
        let shard = shard(execution);
        let held = hold_free_key(&shard, 1);
        let releaser = on_thread(&shard, move |shard| shard.release(held.waiter_id));
        let (woken, waker) = flag();
        let started = shard.start(acquire(1), &waker);
        releaser.join().unwrap();
        serve_as_actor(&shard);
        let granted = match started {
            Started::Granted(granted) => granted,
            Started::Waiting(pending) => {
                let answer = poll(&shard, pending);
                if let Poll::Ready(Ok(granted)) = answer {
                    assert!(woken.woken(), "granted without a wake");
                    granted
                } else {
                    panic!("the release passed the key on: {answer:?}");
                }
            }
            Started::Refused(refused) => panic!("open shard refused: {refused:?}"),
        };
        assert_eq!(granted.fencing_token, 2);
        let_go_and_find_nothing_left(&shard, granted);
    });
}

/// Grant against cancel: the holder releases while the first waiter's future is dropped.
/// Whichever comes first, the key reaches the second waiter (a grant in flight to a waiter
/// that gave up passes on), and nothing is left once it lets go.
#[test]
fn loom_grant_against_cancel() {
    in_both_modes(|execution| {
        let shard = shard(execution);
        let held = hold_free_key(&shard, 1);
        let (_, waker) = flag();
        let gives_up = wait_for_held_key(&shard, 1, &waker);
        let (second_woken, second_waker) = flag();
        let second = wait_for_held_key(&shard, 1, &second_waker);
        serve_as_actor(&shard);

        let releaser = on_thread(&shard, move |shard| shard.release(held.waiter_id));
        let dropper = on_thread(&shard, move |shard| shard.abandon(gives_up));
        releaser.join().unwrap();
        dropper.join().unwrap();
        serve_as_actor(&shard);
        assert!(second_woken.woken(), "the second waiter was woken");
        let Poll::Ready(Ok(granted)) = poll(&shard, second) else {
            panic!("the key passed on to the second waiter");
        };
        let_go_and_find_nothing_left(&shard, granted);
    });
}

/// Shutdown against a step in progress: a close runs while another thread asks for a free
/// key and a third waits for a held one. A call that starts after the close returned is
/// refused; the waiter gets `Closed` and a wake-up; nothing is granted after the close.
#[test]
fn loom_shutdown_against_a_step_in_progress() {
    in_both_modes(|execution| {
        let shard = shard(execution);
        hold_free_key(&shard, 1);
        let (waiter_woken, waiter_waker) = flag();
        let waiter = wait_for_held_key(&shard, 1, &waiter_waker);
        serve_as_actor(&shard);
        let close_returned = Arc::new(AtomicBool::new(false));

        let closer = on_thread(&shard, {
            let close_returned = Arc::clone(&close_returned);
            move |shard| {
                shard.close();
                close_returned.store(true, Ordering::SeqCst);
            }
        });
        let caller = on_thread(&shard, {
            let close_returned = Arc::clone(&close_returned);
            move |shard| {
                let after_close = close_returned.load(Ordering::SeqCst);
                let (_, waker) = flag();
                let started = shard.start(try_acquire(2), &waker);
                if after_close {
                    assert!(
                        matches!(started, Started::Refused(NotGranted::Closed)),
                        "a call made after the close returned was not refused"
                    );
                }
                if let Started::Waiting(pending) = started {
                    serve_as_actor(shard);
                    // Answered by the actor or by the close; never left hanging.
                    assert!(poll(shard, pending).is_ready());
                }
            }
        });
        closer.join().unwrap();
        caller.join().unwrap();
        assert!(waiter_woken.woken(), "the waiter was woken");
        assert_eq!(poll(&shard, waiter), Poll::Ready(Err(NotGranted::Closed)));
        let (_, waker) = flag();
        assert!(matches!(
            shard.start(acquire(3), &waker),
            Started::Refused(NotGranted::Closed)
        ));
    });
}

/// A poll against the grant it waits for: the waiting future polls its slot, with a waker other
/// than the one it started with, while the holder's release grants it. Whichever comes first,
/// the poll either finds the grant or leaves its waker for the grant to wake, and the next poll
/// finds it.
#[test]
fn loom_poll_against_grant() {
    in_both_modes(|execution| {
        let shard = shard(execution);
        let (_, first_waker) = flag();
        let (held, waiting) = one_waiter_behind_a_holder(&shard, &first_waker);

        let releaser = release_on_thread(&shard, held);
        let (polled_woken, polled_waker) = flag();
        let first = shard.poll_grant(waiting, &mut Context::from_waker(&polled_waker));
        releaser.join().unwrap();
        serve_as_actor(&shard);
        let granted = match first {
            Poll::Ready(Ok(granted)) => granted,
            Poll::Pending => {
                assert!(
                    polled_woken.woken(),
                    "the grant woke the waker the poll left"
                );
                match poll(&shard, waiting) {
                    Poll::Ready(Ok(granted)) => granted,
                    other => panic!("the release passed the key on: {other:?}"),
                }
            }
            other => panic!("an open shard answered {other:?}"),
        };
        assert_eq!(granted.fencing_token, 2);
        let_go_and_find_nothing_left(&shard, granted);
    });
}

/// Giving up against a close: a waiter's future is dropped (its slot removed and its cancel
/// sent) while the shard closes. Whatever the order, neither side panics or deadlocks, and the
/// closed shard refuses every later call.
#[test]
fn loom_give_up_against_close() {
    in_both_modes(|execution| {
        let shard = shard(execution);
        hold_free_key(&shard, 1);
        let (_, waker) = flag();
        // In actor mode this request is still in the inbox when the threads start.
        let gives_up = wait_for_held_key(&shard, 1, &waker);

        let closer = on_thread(&shard, |shard| shard.close());
        shard.abandon(gives_up);
        closer.join().unwrap();
        serve_as_actor(&shard);
        assert!(matches!(
            shard.start(acquire(2), &waker),
            Started::Refused(NotGranted::Closed)
        ));
    });
}

/// A pick-up against a close: the key was granted to a waiter's slot, and the waiter picks it
/// up while the shard closes. If the close returned before the poll began, the poll answers
/// `Closed`; otherwise it may take the grant, whose release is then harmless. Either way nobody
/// panics or waits forever, and the closed shard refuses every later call.
#[test]
fn loom_pickup_against_close() {
    in_both_modes(|execution| {
        let shard = shard(execution);
        let (woken, waker) = flag();
        let (held, waiting) = one_waiter_behind_a_holder(&shard, &waker);
        shard.release(held.waiter_id);
        serve_as_actor(&shard);
        assert!(woken.woken(), "the grant woke its waiter");
        let close_returned = Arc::new(AtomicBool::new(false));

        let closer = on_thread(&shard, {
            let close_returned = Arc::clone(&close_returned);
            move |shard| {
                shard.close();
                close_returned.store(true, Ordering::SeqCst);
            }
        });
        let after_close = close_returned.load(Ordering::SeqCst);
        let picked = poll(&shard, waiting);
        if after_close {
            assert_eq!(
                picked,
                Poll::Ready(Err(NotGranted::Closed)),
                "a grant was handed out after the close returned"
            );
        }
        closer.join().unwrap();
        match picked {
            Poll::Ready(Ok(granted)) => shard.release(granted.waiter_id),
            Poll::Ready(Err(NotGranted::Closed)) => {}
            other => panic!("a granted slot answers at once, with the grant or Closed: {other:?}"),
        }
        // Polled again after its answer, as a buggy caller might: `Closed`, not a second grant.
        assert_eq!(poll(&shard, waiting), Poll::Ready(Err(NotGranted::Closed)));
        assert!(matches!(
            shard.start(acquire(2), &waker),
            Started::Refused(NotGranted::Closed)
        ));
    });
}

/// Giving up against the grant in flight, with nobody else waiting: the waiter's future is
/// dropped while the holder's release grants it the key. Whichever comes first, the key comes
/// back to the table (released by the drop, or by the owner when it finds the slot given up)
/// and no entry is left.
#[test]
fn loom_give_up_against_grant_in_flight() {
    in_both_modes(|execution| {
        let shard = shard(execution);
        let (_, waker) = flag();
        let (held, gives_up) = one_waiter_behind_a_holder(&shard, &waker);

        let releaser = release_on_thread(&shard, held);
        shard.abandon(gives_up);
        releaser.join().unwrap();
        serve_as_actor(&shard);
        assert_eq!(
            keys(&shard),
            0,
            "the grant in flight came back: no entry left"
        );
        let again = hold_free_key(&shard, 1);
        let_go_and_find_nothing_left(&shard, again);
    });
}
