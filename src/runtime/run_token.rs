//! The run token: who may run the owner's step right now, and the queue of requests that wait
//! for whoever does.
//!
//! A registry shard has one owner state (its lock table) and runs one step at a time on it, in
//! one total order. *Ownership is a role, not a thread*: whoever holds the run token may run the
//! step, be it the actor task or a caller of the handle. This is the move of Swift's actor
//! runtime (`swift_task_switchImpl` and `tryAssumeThreadForSwitch` in
//! `stdlib/public/Concurrency/Actor.cpp`: a job runs on the caller's thread when the actor is
//! idle) and of delegation locks such as CC-Synch (Fatourou and Kallimanis, PPoPP 2012) and
//! queue delegation locking (Klaftenegger, Sagonas and Winblad, Euro-Par 2014): the caller that
//! finds the owner free serves its own request, then the queued ones, in arrival order, up to a
//! bound.
//!
//! # The protocol
//!
//! One mutex guards the queue and the *idle owner*: the owner state, boxed, lies in the mutex
//! while nobody holds the token, and taking the token is taking it out. So "is the owner idle?",
//! "is anything queued?" and "take the token or queue" are one decision under one lock, and so
//! are "is anything left?" and "give the token back". The state itself is only ever touched by
//! the token's holder, outside the mutex.
//!
//! - [`Sender::enter`]: if the owner is idle and nothing is queued, the caller takes the token
//!   ([`Entry::Run`]); otherwise it gets the queue ([`Entry::Busy`]) and pushes its request.
//! - [`RunToken::release`]: the holder serves what was queued meanwhile, oldest first, up to a
//!   bound; it gives the token back only when it finds the queue empty under the lock, or,
//!   past the bound, hands the rest to the actor task by waking it.
//! - The actor task ([`Receiver::poll_work`]) takes the token when the owner is idle and
//!   requests are queued, which happens only after such a hand-over (or in actor mode, where
//!   callers never take the token).
//!
//! # Why no request is lost or reordered
//!
//! A request is pushed only under the lock and only when the token is held or the queue is
//! non-empty. In the first case the holder's release takes the lock later and sees it: a holder
//! never gives the token back while the queue is non-empty without waking the actor. In the
//! second case the actor has been woken already (the push wakes it if the token lies idle), or
//! a holder will serve the queue. Requests leave the queue oldest first, and a caller never
//! runs its own step while anything is queued, so the steps run in the order the requests took
//! the lock: that is the arrival order the registry's FIFO is defined by. The unit tests below
//! pin each of these cases step by step.
//!
//! # Panics in a step
//!
//! A step runs user code (the key's `Hash`, `Eq`, `Clone`, `Debug`). If it panics, the
//! token's drop closes the queue, puts the owner state back for the actor to close, and wakes
//! the actor: every waiter then gets `Closed`, the same as when the actor itself dies.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

/// The owner state behind a run token: what it serves a queued request with.
///
/// The request type is a parameter rather than an associated type so that the structs below
/// name it directly: an associated type in a stored field defeats the compiler's proof that a
/// `lock` future holding a `&str` key is `Send`.
pub(crate) trait Owned<R> {
    /// What steps leave to do once the token is let go (wake-ups, replies).
    type Effects;

    /// Runs the step for one request that waited in the queue.
    fn serve(&mut self, request: R, effects: &mut Self::Effects);
}

/// Requests one caller serves for others before it hands the rest to the actor task: about a
/// microsecond of work at most, so no caller pays much for being first. Small on purpose: a
/// caller that keeps the token while other workers keep queueing makes the table's memory
/// travel between cores at every turn, where the actor task keeps it on one (the runs that
/// chose 8 over 64 are in `docs/performance-log.md`). CC-Synch, for threads that spin rather
/// than tasks, uses 144 (`bitslab/ffwd`, `liblock/ccsynch.c`).
pub(crate) const CALLER_SERVE_BOUND: usize = 8;

/// Requests the actor task serves per hold of the token, between two looks at its mailbox and
/// its tokio budget.
pub(crate) const ACTOR_SERVE_BOUND: usize = 1024;

/// Who runs a registry's bookkeeping (set with [`RegistryBuilder::execution`](crate::RegistryBuilder::execution)).
///
/// Each shard's lock table has one owner and changes one step at a time, in one total order,
/// whoever runs the step. The two modes differ only in who that is when nobody else is using
/// the shard; FIFO, cancel safety, fencing tokens, ordering and shutdown hold the same in
/// both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Execution {
    /// A call that finds the shard idle (no step running, nothing queued) runs its step
    /// itself, on the caller's thread, and a guard's drop that finds a waiter wakes it
    /// directly: a free key costs no task switch. A call that finds the shard busy queues
    /// its request; whoever runs steps serves the queue in arrival order, up to a bound,
    /// then hands the rest to the actor task. The default.
    RunOnCaller,
    /// Every request goes through the queue to the registry's actor task, which runs every
    /// step: two task switches per `lock`, but the caller never runs bookkeeping for others.
    ActorTask,
}

impl Default for Execution {
    fn default() -> Self {
        // The test suite runs a second time with every registry in actor mode (`.ci/run`).
        if cfg!(keyed_locks_actor_default) {
            Execution::ActorTask
        } else {
            Execution::RunOnCaller
        }
    }
}

/// Creates the token for the owner state that `make` builds (given a weak sender, for the
/// state to make strong ones from), with one sender.
pub(crate) fn run_token<S: Owned<R>, R>(
    make: impl FnOnce(WeakSender<S, R>) -> S,
    execution: Execution,
) -> (Sender<S, R>, Receiver<S, R>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            idle: None,
            queue: Vec::new(),
            closed: false,
            receiver_gone: false,
            owner_taken: false,
            actor: None,
            actor_wants_token: false,
        }),
        senders: AtomicUsize::new(1),
        execution,
    });
    let owner = make(WeakSender {
        shared: Arc::clone(&shared),
    });
    shared.lock().idle = Some(Box::new(Idle {
        owner,
        batch: Vec::new(),
    }));
    (
        Sender {
            shared: Arc::clone(&shared),
        },
        Receiver { shared },
    )
}

struct Shared<S: Owned<R>, R> {
    state: Mutex<State<S, R>>,
    /// Strong senders alive. Changed outside the mutex; only the change to zero takes it, to
    /// wake the actor.
    senders: AtomicUsize,
    execution: Execution,
}

impl<S: Owned<R>, R> Shared<S, R> {
    fn lock(&self) -> MutexGuard<'_, State<S, R>> {
        // Nothing that can panic runs under this lock (user code runs under the token, not
        // the lock), so poisoning cannot happen; if it ever did, the state is still plain data.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct State<S: Owned<R>, R> {
    /// The owner state while nobody holds the token; `None` while someone does, and for good
    /// once the actor has closed it.
    idle: Option<Box<Idle<S, R>>>,
    /// Requests that found the owner busy, oldest first.
    queue: Vec<R>,
    /// No request is taken any more.
    closed: bool,
    /// The actor is gone: an owner state given back now is dropped instead.
    receiver_gone: bool,
    /// The actor took the owner state for good, to close it.
    owner_taken: bool,
    /// The actor task's waker while it sleeps. Taken by whoever wakes it, so that one wake
    /// serves for many pushes.
    actor: Option<Waker>,
    /// The actor sleeps until the token is given back (to handle a message, or to close).
    actor_wants_token: bool,
}

/// What lies in the mutex while the owner is idle: the state, and the batch buffer that the
/// next holder swaps with the queue (so that serving a queue allocates nothing once warm).
/// Boxed, so that taking the token and giving it back moves one pointer.
struct Idle<S: Owned<R>, R> {
    owner: S,
    batch: Vec<R>,
}

/// What a caller found: the token, the queue, or a closed owner.
pub(crate) enum Entry<'a, S: Owned<R>, R> {
    /// The owner was idle and nothing was queued: run the step, then
    /// [`release`](RunToken::release).
    Run(RunToken<'a, S, R>),
    /// The owner is busy: push the request (under the lock, so the decision still holds).
    Busy(Queue<'a, S, R>),
    /// The owner takes no more requests.
    Closed,
}

/// The sending end, held by handles and guards. The actor runs until every sender is gone.
pub(crate) struct Sender<S: Owned<R>, R> {
    shared: Arc<Shared<S, R>>,
}

impl<S: Owned<R>, R> Sender<S, R> {
    /// Takes the run token if the owner is idle and nothing is queued; otherwise hands over the
    /// queue, locked, for the caller to push its request.
    #[inline]
    pub(crate) fn enter(&self) -> Entry<'_, S, R> {
        let mut state = self.shared.lock();
        if state.closed {
            return Entry::Closed;
        }
        if self.shared.execution == Execution::RunOnCaller
            && state.queue.is_empty()
            && let Some(idle) = state.idle.take()
        {
            return Entry::Run(RunToken {
                shared: &self.shared,
                idle: Some(idle),
            });
        }
        Entry::Busy(Queue { state })
    }

    /// A sender that does not keep the owner running.
    pub(crate) fn downgrade(&self) -> WeakSender<S, R> {
        WeakSender {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Whether requests are refused from now on.
    pub(crate) fn is_closed(&self) -> bool {
        self.shared.lock().closed
    }
}

impl<S: Owned<R>, R> Clone for Sender<S, R> {
    fn clone(&self) -> Self {
        // Relaxed, as for `Arc`: this sender already keeps the count above zero.
        self.shared.senders.fetch_add(1, Ordering::Relaxed);
        Sender {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: Owned<R>, R> Drop for Sender<S, R> {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last sender: an actor asleep must learn that nothing will come. Taking the
            // waker under the lock orders this with its check of the count, which it makes
            // under the same lock before it sleeps.
            let waker = self.shared.lock().actor.take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }
}

impl<S: Owned<R>, R> fmt::Debug for Sender<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

/// A sender that does not count: it can become a [`Sender`] again only while another is alive.
pub(crate) struct WeakSender<S: Owned<R>, R> {
    shared: Arc<Shared<S, R>>,
}

impl<S: Owned<R>, R> WeakSender<S, R> {
    /// A strong sender, unless every strong sender is gone (then the actor stops, for good).
    pub(crate) fn upgrade(&self) -> Option<Sender<S, R>> {
        let mut senders = self.shared.senders.load(Ordering::Relaxed);
        loop {
            if senders == 0 {
                return None;
            }
            match self.shared.senders.compare_exchange_weak(
                senders,
                senders + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(Sender {
                        shared: Arc::clone(&self.shared),
                    });
                }
                Err(now) => senders = now,
            }
        }
    }
}

impl<S: Owned<R>, R> fmt::Debug for WeakSender<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakSender").finish_non_exhaustive()
    }
}

/// The queue, locked, found busy by [`Sender::enter`].
pub(crate) struct Queue<'a, S: Owned<R>, R> {
    state: MutexGuard<'a, State<S, R>>,
}

impl<S: Owned<R>, R> Queue<'_, S, R> {
    /// Queues `request`. If the token lies idle (a holder handed the queue to the actor, or
    /// callers never take it), wakes the actor; if someone holds it, that holder serves the
    /// request before giving it back.
    pub(crate) fn push(mut self, request: R) {
        self.state.queue.push(request);
        let waker = if self.state.idle.is_some() {
            self.state.actor.take()
        } else {
            None
        };
        drop(self.state);
        // Outside the lock: the actor may run at once on another thread and want it.
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// The right to run the owner's step, with the owner state it gives access to.
///
/// Never held across an `.await`: every step is synchronous. Give it back with
/// [`release`](Self::release); dropping it without (only a panic does) closes the owner.
pub(crate) struct RunToken<'a, S: Owned<R>, R> {
    shared: &'a Shared<S, R>,
    /// `Some` until released.
    idle: Option<Box<Idle<S, R>>>,
}

impl<S: Owned<R>, R> RunToken<'_, S, R> {
    /// The owner state.
    #[inline]
    pub(crate) fn owner(&mut self) -> &mut S {
        match &mut self.idle {
            Some(idle) => &mut idle.owner,
            // `release` consumes the token: there is no way to reach a released one.
            None => unreachable!("a released run token is consumed"),
        }
    }

    /// Serves everything queued so far, oldest first, keeping the token: for the actor, before
    /// a message that must come after the requests sent before it.
    pub(crate) fn serve_queued(&mut self, effects: &mut S::Effects) {
        loop {
            let state = self.shared.lock();
            if state.queue.is_empty() {
                return;
            }
            if self.serve_oldest(state, usize::MAX, effects) == 0 {
                return;
            }
        }
    }

    /// Serves the requests queued while the token was held, oldest first, at most `bound` of
    /// them, then gives the token back. Past the bound, whatever is still queued goes to the
    /// actor task, which is woken for it. Effects of the steps are added to `effects`, for the
    /// caller to carry out once this returns, outside the token.
    #[inline]
    pub(crate) fn release(mut self, effects: &mut S::Effects, bound: usize) {
        let mut served = 0;
        loop {
            let state = self.shared.lock();
            if state.queue.is_empty() || served >= bound || state.closed {
                if let Some(idle) = self.idle.take() {
                    give_back(idle, state);
                }
                return;
            }
            match self.serve_oldest(state, bound - served, effects) {
                // Only a token without its state serves nothing from a non-empty queue.
                0 => return,
                taken => served += taken,
            }
        }
    }

    /// Takes the oldest queued requests, at most `room` of them, lets go of the lock and serves
    /// them; returns how many (0 only if the state is gone). The usual case takes the whole queue by swapping it with the
    /// (empty) batch buffer. The owner state stays in `self` meanwhile, so that if a step
    /// panics the token's drop finds it and closes the owner.
    fn serve_oldest(
        &mut self,
        mut state: MutexGuard<'_, State<S, R>>,
        room: usize,
        effects: &mut S::Effects,
    ) -> usize {
        let Some(idle) = &mut self.idle else {
            return 0;
        };
        if state.queue.len() <= room {
            std::mem::swap(&mut state.queue, &mut idle.batch);
        } else {
            idle.batch.extend(state.queue.drain(..room));
        }
        drop(state);
        let Idle { owner, batch } = &mut **idle;
        let served = batch.len();
        for request in batch.drain(..) {
            owner.serve(request, effects);
        }
        served
    }
}

impl<S: Owned<R>, R> Drop for RunToken<'_, S, R> {
    fn drop(&mut self) {
        // Reached with the state still here only if a step panicked. The table may be half
        // way through a step: take no more requests, and let the actor close it.
        let Some(idle) = self.idle.take() else {
            return;
        };
        let mut state = self.shared.lock();
        state.closed = true;
        give_back(idle, state);
    }
}

/// Puts the owner state back in the mutex (or drops it, if the actor is gone) and lets go of
/// the lock. Wakes the actor if it waits for the token, if work is left for it (a hand-over
/// past the bound), or if the owner was closed meanwhile: the one place the token is given
/// back, so no wake-up the actor needs can be skipped.
#[inline]
fn give_back<S: Owned<R>, R>(idle: Box<Idle<S, R>>, mut state: MutexGuard<'_, State<S, R>>) {
    let wake_actor = state.actor_wants_token || !state.queue.is_empty() || state.closed;
    let waker = if wake_actor { state.actor.take() } else { None };
    if state.receiver_gone {
        drop(state);
        // Outside the lock: dropping the owner state closes its waiters' channels, which
        // wakes them.
        drop(idle);
    } else {
        state.idle = Some(idle);
        drop(state);
    }
    if let Some(waker) = waker {
        waker.wake();
    }
}

impl<S: Owned<R>, R> fmt::Debug for RunToken<'_, S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunToken").finish_non_exhaustive()
    }
}

/// What the actor task should do next.
pub(crate) enum Work<'a, S: Owned<R>, R> {
    /// Requests are queued and the owner is idle: serve them.
    Serve(RunToken<'a, S, R>),
    /// The owner was closed (a step panicked), or every sender is gone and nothing is
    /// queued: stop.
    Stop,
}

/// The actor task's end.
pub(crate) struct Receiver<S: Owned<R>, R> {
    shared: Arc<Shared<S, R>>,
}

impl<S: Owned<R>, R> Receiver<S, R> {
    /// Ready with the token when requests wait for the actor, or with [`Work::Stop`]. Takes one
    /// unit of the task's tokio budget, as tokio's channels do, so an actor that is never short
    /// of work still yields now and then.
    pub(crate) fn poll_work(&self, cx: &mut Context<'_>) -> Poll<Work<'_, S, R>> {
        let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        let mut state = self.shared.lock();
        if state.closed {
            coop.made_progress();
            return Poll::Ready(Work::Stop);
        }
        if !state.queue.is_empty()
            && let Some(idle) = state.idle.take()
        {
            state.actor = None;
            coop.made_progress();
            return Poll::Ready(Work::Serve(RunToken {
                shared: &self.shared,
                idle: Some(idle),
            }));
        }
        if state.queue.is_empty()
            && state.idle.is_some()
            && self.shared.senders.load(Ordering::Acquire) == 0
        {
            return Poll::Ready(Work::Stop);
        }
        // Asleep until a push finds the token idle, a holder hands work over, or the last
        // sender goes.
        register(&mut state.actor, cx);
        Poll::Pending
    }

    /// Ready with the token as soon as nobody else holds it, whatever is queued (the caller
    /// serves the queue first if order matters), or `None` once the owner has been closed for
    /// good by [`close`](Self::close).
    pub(crate) fn poll_token(&self, cx: &mut Context<'_>) -> Poll<Option<RunToken<'_, S, R>>> {
        let mut state = self.shared.lock();
        if state.owner_taken {
            return Poll::Ready(None);
        }
        if let Some(idle) = state.idle.take() {
            state.actor_wants_token = false;
            return Poll::Ready(Some(RunToken {
                shared: &self.shared,
                idle: Some(idle),
            }));
        }
        state.actor_wants_token = true;
        register(&mut state.actor, cx);
        Poll::Pending
    }

    /// Refuses every later request and takes the owner state for good, with what was still
    /// queued (oldest first), for the caller to close. `token` must come from
    /// [`poll_token`](Self::poll_token).
    pub(crate) fn close(&self, mut token: RunToken<'_, S, R>) -> (S, Vec<R>) {
        let Some(idle) = token.idle.take() else {
            unreachable!("a token is released only by consuming it");
        };
        let mut state = self.shared.lock();
        state.closed = true;
        state.owner_taken = true;
        let queued = std::mem::take(&mut state.queue);
        let Idle { owner, .. } = *idle;
        (owner, queued)
    }
}

impl<S: Owned<R>, R> Drop for Receiver<S, R> {
    fn drop(&mut self) {
        // The actor is gone (stopped, or its task dropped with the runtime). Whatever is still
        // here is dropped outside the lock: dropping a waiter's grant channel wakes it with
        // `Closed`, and its task may send again, which must find the owner closed.
        let (idle, queued) = {
            let mut state = self.shared.lock();
            state.closed = true;
            state.receiver_gone = true;
            (state.idle.take(), std::mem::take(&mut state.queue))
        };
        drop(queued);
        drop(idle);
    }
}

impl<S: Owned<R>, R> fmt::Debug for Receiver<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver").finish_non_exhaustive()
    }
}

fn register(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(waker) if waker.will_wake(cx.waker()) => {}
        slot => *slot = Some(cx.waker().clone()),
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use tokio_test::{assert_pending, assert_ready, task};

    use super::*;

    /// An owner whose step writes down what it served, in order.
    #[derive(Debug, Default)]
    struct Log(Vec<u32>);

    impl Owned<u32> for Log {
        type Effects = ();

        fn serve(&mut self, request: u32, _: &mut ()) {
            assert_ne!(request, PANICS, "a step that panics");
            self.0.push(request);
        }
    }

    const PANICS: u32 = u32::MAX;

    fn log(execution: Execution) -> (Sender<Log, u32>, Receiver<Log, u32>) {
        run_token(|_weak| Log::default(), execution)
    }

    /// Runs `request` the way a caller does: its own step if the owner is idle, else queued.
    fn call(sender: &Sender<Log, u32>, request: u32, bound: usize) {
        match sender.enter() {
            Entry::Run(mut token) => {
                token.owner().serve(request, &mut ());
                token.release(&mut (), bound);
            }
            Entry::Busy(queue) => queue.push(request),
            Entry::Closed => panic!("the owner is closed"),
        }
    }

    fn held(sender: &Sender<Log, u32>) -> RunToken<'_, Log, u32> {
        match sender.enter() {
            Entry::Run(token) => token,
            _ => panic!("the owner is idle"),
        }
    }

    /// An actor task's first turn: serves what it is handed, if anything, then ends.
    fn serving_actor(
        receiver: &Receiver<Log, u32>,
    ) -> task::Spawn<impl std::future::Future<Output = ()> + '_> {
        task::spawn(poll_fn(|cx| {
            receiver.poll_work(cx).map(|work| match work {
                Work::Serve(token) => token.release(&mut (), ACTOR_SERVE_BOUND),
                Work::Stop => panic!("nothing stops the owner here"),
            })
        }))
    }

    /// An actor task that only reports whether it was told to stop.
    fn stop_watcher(
        receiver: &Receiver<Log, u32>,
    ) -> task::Spawn<impl std::future::Future<Output = bool> + '_> {
        task::spawn(poll_fn(|cx| {
            receiver
                .poll_work(cx)
                .map(|work| matches!(work, Work::Stop))
        }))
    }

    /// What the owner served so far; takes the token, so the owner must be idle.
    fn served(receiver: &Receiver<Log, u32>) -> Vec<u32> {
        let mut poll = task::spawn(poll_fn(|cx| {
            receiver
                .poll_token(cx)
                .map(|token| token.map(|mut token| std::mem::take(&mut token.owner().0)))
        }));
        assert_ready!(poll.poll()).expect("the owner is open")
    }

    #[test]
    fn an_idle_owner_runs_on_the_caller_without_waking_the_actor() {
        let (sender, receiver) = log(Execution::RunOnCaller);
        let mut actor = serving_actor(&receiver);
        assert_pending!(actor.poll());
        call(&sender, 1, CALLER_SERVE_BOUND);
        call(&sender, 2, CALLER_SERVE_BOUND);
        assert!(!actor.is_woken(), "no task switch for an idle owner");
        drop(actor);
        assert_eq!(served(&receiver), [1, 2]);
    }

    #[test]
    fn requests_queued_while_a_caller_runs_are_served_by_it_in_arrival_order() {
        let (sender, receiver) = log(Execution::RunOnCaller);
        let mut actor = serving_actor(&receiver);
        assert_pending!(actor.poll());
        let mut token = held(&sender);
        call(&sender, 2, CALLER_SERVE_BOUND);
        call(&sender, 3, CALLER_SERVE_BOUND);
        token.owner().serve(1, &mut ());
        token.release(&mut (), CALLER_SERVE_BOUND);
        assert!(!actor.is_woken(), "the holder served everything itself");
        drop(actor);
        assert_eq!(served(&receiver), [1, 2, 3]);
    }

    #[test]
    fn past_the_bound_the_holder_hands_the_rest_to_the_actor_and_wakes_it() {
        let (sender, receiver) = log(Execution::RunOnCaller);
        let mut actor = serving_actor(&receiver);
        assert_pending!(actor.poll());
        let token = held(&sender);
        for request in 0..5 {
            call(&sender, request, 2);
        }
        token.release(&mut (), 2);
        assert!(actor.is_woken(), "the queue was handed over");
        // Until the actor runs, the owner is busy: a caller queues behind the others.
        call(&sender, 5, 2);
        assert_ready!(actor.poll());
        drop(actor);
        assert_eq!(served(&receiver), [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_push_that_finds_the_token_idle_wakes_the_actor_once() {
        let (sender, receiver) = log(Execution::ActorTask);
        let mut actor = serving_actor(&receiver);
        assert_pending!(actor.poll());
        call(&sender, 1, CALLER_SERVE_BOUND);
        assert!(actor.is_woken());
        call(&sender, 2, CALLER_SERVE_BOUND);
        assert_eq!(
            actor.waker_ref_count(),
            1,
            "the waker was taken by the first push"
        );
        assert_ready!(actor.poll());
        assert_eq!(served(&receiver), [1, 2]);
    }

    #[test]
    fn an_actor_waiting_for_the_token_gets_it_when_the_caller_lets_go() {
        let (sender, receiver) = log(Execution::RunOnCaller);
        let token = held(&sender);
        let mut actor = task::spawn(poll_fn(|cx| receiver.poll_token(cx).map(|t| t.is_some())));
        assert_pending!(actor.poll());
        token.release(&mut (), CALLER_SERVE_BOUND);
        assert!(actor.is_woken());
        assert!(assert_ready!(actor.poll()));
    }

    #[test]
    fn the_actor_stops_once_every_sender_is_gone_and_nothing_is_queued() {
        let (sender, receiver) = log(Execution::RunOnCaller);
        let mut actor = stop_watcher(&receiver);
        assert_pending!(actor.poll());
        let second = sender.clone();
        drop(sender);
        assert!(!actor.is_woken());
        drop(second);
        assert!(actor.is_woken());
        assert!(assert_ready!(actor.poll()));
    }

    #[test]
    fn a_step_that_panics_closes_the_owner_and_wakes_the_actor() {
        let (sender, receiver) = log(Execution::RunOnCaller);
        let mut actor = stop_watcher(&receiver);
        assert_pending!(actor.poll());
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            call(&sender, PANICS, CALLER_SERVE_BOUND)
        }));
        assert!(panicked.is_err());
        assert!(matches!(sender.enter(), Entry::Closed));
        assert!(actor.is_woken());
        assert!(assert_ready!(actor.poll()), "the actor stops");
        // The state is back for the actor to close.
        let mut close = task::spawn(poll_fn(|cx| receiver.poll_token(cx).map(|t| t.is_some())));
        assert!(assert_ready!(close.poll()));
    }

    /// Threads that run or queue requests at random moments, against an actor task that serves
    /// hand-overs, with a bound of 2 so that hand-overs are frequent: every request is served
    /// once, each thread's in its order. A lost wake-up would leave requests queued for ever
    /// and the wait below would time out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn under_contention_every_request_is_served_once_and_in_each_callers_order() {
        const THREADS: u32 = 4;
        const EACH: u32 = 20_000;
        let (sender, receiver) = log(Execution::RunOnCaller);
        let actor = tokio::spawn(async move {
            loop {
                let stop = poll_fn(|cx| {
                    receiver.poll_work(cx).map(|work| match work {
                        Work::Serve(token) => {
                            token.release(&mut (), 2);
                            false
                        }
                        Work::Stop => true,
                    })
                })
                .await;
                if stop {
                    return receiver;
                }
            }
        });
        let threads: Vec<_> = (0..THREADS)
            .map(|thread| {
                let sender = sender.clone();
                std::thread::spawn(move || {
                    for n in 0..EACH {
                        call(&sender, thread * EACH + n, 2);
                    }
                })
            })
            .collect();
        drop(sender);
        for thread in threads {
            thread.join().expect("a caller thread");
        }
        let receiver = tokio::time::timeout(std::time::Duration::from_secs(60), actor)
            .await
            .expect("every request is served and the actor stops")
            .expect("the actor task");
        let log = served(&receiver);
        assert_eq!(log.len(), (THREADS * EACH) as usize);
        let mut next = vec![0; THREADS as usize];
        for request in log {
            let (thread, n) = ((request / EACH) as usize, request % EACH);
            assert_eq!(n, next[thread], "caller {thread} out of order");
            next[thread] += 1;
        }
    }
}
