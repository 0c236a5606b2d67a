//! [`Shard`]: one lock table, its owner state, and the lock that makes its steps one total
//! order.
//!
//! # The protocol
//!
//! Everything a shard knows lies in [`ShardState`] behind one mutex: the owner (table, pending
//! grants, journal), whether the shard is closed, and in actor mode the queue of requests for
//! the actor task and that task's waker. Every change to any of it is made while holding the
//! mutex, so "is the shard closed?", "run my step" and "queue my request" are one decision,
//! and the order in which callers take the mutex *is* the shard's total order of steps: the
//! order of arrival by which FIFO is defined.
//!
//! - **Default mode** ([`Execution::RunOnCaller`]): a call takes the mutex, runs its own step
//!   and lets go; an uncontended step costs the mutex's two atomic read-modify-writes. A
//!   caller that finds the mutex taken waits the length of one step (they never await and run
//!   no user code beyond the key's `Hash`, `Eq`, `Clone` and `Debug`), the case for which
//!   tokio's docs recommend a blocking mutex over an async one.
//! - **Actor mode** ([`Execution::ActorTask`]): a call takes the mutex to queue its request
//!   and wake the actor, which takes it to serve the queue, oldest first.
//! - **Pending grants** ([`crate::runtime::pending`]): a queued waiter's grant is written to its slot
//!   under the mutex and its waker woken after the mutex is let go; the waiting future takes
//!   the mutex to read it, or to withdraw when dropped.
//! - **Close**: sets `closed` under the mutex, answers every waiter, and empties the table.
//!   Every later call takes the same mutex and finds `closed`, so nothing is granted after a
//!   close has returned: this is what makes [`shutdown`](crate::LockRegistry::shutdown) final.
//!
//! Wake-ups and kameo replies are collected in [`Effects`] during a step and carried out after
//! the mutex is let go: a woken task never finds the shard still locked by its waker.
//!
//! # Panics in a step
//!
//! A step runs user code (the key's `Hash`, `Eq`, `Clone`, `Debug`). If it panics, the table
//! may be half way through a change: the shard closes on the spot (every waiter gets
//! `Closed`, the actor is woken to stop) and the panic goes on to the caller.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::key::LockKey;
use crate::pure::journal::Journal;
use crate::pure::table::WaiterId;
use crate::runtime::execution::Execution;
use crate::runtime::owner::{Effects, Owner};
use crate::runtime::pending::{Granted, NotGranted, PendingKey, Undo};
use crate::runtime::request::{Delivery, Outcome, Request};
use crate::runtime::sync::{Mutex, MutexGuard};

/// Requests the actor task serves per hold of the shard's lock, between two looks at its
/// mailbox and its tokio budget: callers that queue meanwhile wait at most this many steps
/// for the lock.
pub(crate) const ACTOR_SERVE_BOUND: usize = 64;

/// One shard of a registry: its owner state behind the lock every step takes.
pub(crate) struct Shard<K: LockKey> {
    state: Mutex<ShardState<K>>,
    execution: Execution,
}

/// What the shard's lock guards.
pub(crate) struct ShardState<K: LockKey> {
    owner: Owner<K>,
    /// No request is taken any more; set once, by [`Shard::close`] or a step that panicked.
    closed: bool,
    /// Actor mode: requests waiting for the actor task, oldest first.
    queue: Vec<Request<K>>,
    /// The actor task's waker while it sleeps; taken by whoever wakes it.
    actor: Option<Waker>,
}

/// What the first poll of an acquire found.
pub(crate) enum Started {
    /// The key is the caller's.
    Granted(Granted),
    /// The request waits on this pending grant.
    Waiting(PendingKey),
    /// Refused at once: the key is taken (try-acquire) or the shard is closed.
    Refused(NotGranted),
}

/// What the actor task should do next.
pub(crate) enum Work {
    /// It served a share of the queue.
    Served,
    /// The shard is closed, or every handle and guard is gone: stop.
    Stop,
}

impl<K: LockKey> Shard<K> {
    pub(crate) fn new(owner: Owner<K>, execution: Execution) -> Self {
        Shard {
            state: Mutex::new(ShardState {
                owner,
                closed: false,
                queue: Vec::new(),
                actor: None,
            }),
            execution,
        }
    }

    #[inline]
    fn lock(&self) -> MutexGuard<'_, ShardState<K>> {
        self.state.lock()
    }

    /// Starts an acquire (the first poll of its future): in the default mode runs its step
    /// here, in actor mode queues it for the actor. `request` comes with
    /// [`Delivery::Caller`]; `waker` is the task to wake when a queued request is answered.
    #[inline]
    pub(crate) fn start(&self, mut request: Request<K>, waker: &Waker) -> Started {
        // Declared before the lock, so dropped after it even when a step panics: wake-ups and
        // replies never run under the lock.
        let mut effects = Effects::new();
        let mut state = self.lock();
        if state.closed {
            return Started::Refused(NotGranted::Closed);
        }
        let started = match self.execution {
            Execution::RunOnCaller => {
                let outcome = state.step(request, &mut effects);
                let started = match outcome {
                    Outcome::Granted(granted) => Started::Granted(granted),
                    Outcome::Queued(waiter_id) => {
                        Started::Waiting(state.owner.wait_here(waiter_id, waker))
                    }
                    Outcome::WouldBlock => Started::Refused(NotGranted::WouldBlock),
                    // A step answers an acquire in one of the ways above; refusing beats
                    // hanging.
                    _ => Started::Refused(NotGranted::Closed),
                };
                // Matched by copy and discarded here, so that the usual answers cost no call
                // into the drop of an `Outcome` (whose answers to questions need one).
                outcome.discard();
                started
            }
            Execution::ActorTask => {
                let pending = state.owner.pending().sent(waker);
                request.deliver_to(Delivery::Pending(pending));
                state.queue_for_actor(request, &mut effects);
                Started::Waiting(pending)
            }
        };
        drop(state);
        effects.carry_out();
        started
    }

    /// Polls the pending grant of a started acquire.
    #[inline]
    pub(crate) fn poll_grant(
        &self,
        pending: PendingKey,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Granted, NotGranted>> {
        self.lock().owner.pending().poll(pending, cx.waker())
    }

    /// Withdraws a started acquire whose future was dropped: cancels it if it waits in the
    /// table, releases its grant if one was made and not picked up.
    pub(crate) fn abandon(&self, pending: PendingKey) {
        self.send(|state| match state.owner.pending().abandon(pending) {
            Undo::Nothing => None,
            Undo::Cancel(waiter_id) => Some(Request::Cancel { waiter_id }),
            Undo::Release(waiter_id) => Some(Request::Release { waiter_id }),
        });
    }

    /// Releases a grant: a guard's drop. Never waits for anything but the lock.
    #[inline]
    pub(crate) fn release(&self, waiter_id: WaiterId) {
        self.send(|_| Some(Request::Release { waiter_id }));
    }

    /// A note for the journal.
    #[cfg(feature = "postgres")]
    pub(crate) fn note(&self, text: String) {
        self.send(|_| Some(Request::Note { text }));
    }

    /// Runs the request that `make` builds under the lock, if any, which needs no answer: as
    /// a step here (default mode), or queued for the actor. A closed shard takes nothing, and
    /// then nothing is left to release or cancel.
    #[inline]
    fn send(&self, make: impl FnOnce(&mut ShardState<K>) -> Option<Request<K>>) {
        let mut effects = Effects::new();
        let mut state = self.lock();
        if let Some(request) = make(&mut state)
            && !state.closed
        {
            match self.execution {
                Execution::RunOnCaller => state.step(request, &mut effects).discard(),
                Execution::ActorTask => state.queue_for_actor(request, &mut effects),
            }
        }
        drop(state);
        effects.carry_out();
    }

    /// Asks the owner a question: answered here in the default mode, by the actor (after the
    /// requests queued before it) in actor mode. `None` once the shard is closed.
    pub(crate) async fn ask<T>(
        &self,
        make: impl FnOnce(Option<oneshot::Sender<T>>) -> Request<K>,
        take: impl FnOnce(Outcome<K>) -> Option<T>,
    ) -> Option<T> {
        let answer = {
            let mut effects = Effects::new();
            let mut state = self.lock();
            if state.closed {
                return None;
            }
            let answer = match self.execution {
                Execution::RunOnCaller => Ok(state.step(make(None), &mut effects)),
                Execution::ActorTask => {
                    let (reply, answer) = oneshot::channel();
                    state.queue_for_actor(make(Some(reply)), &mut effects);
                    Err(answer)
                }
            };
            drop(state);
            effects.carry_out();
            answer
        };
        match answer {
            Ok(outcome) => take(outcome),
            // The owner drops the reply unanswered only when it closes.
            Err(answer) => answer.await.ok(),
        }
    }

    /// Has the owner warn about the stalls that came due; says how long the stall timer may
    /// sleep, or `None` once the shard is closed. Housekeeping: run on the timer's task in
    /// both modes, since it changes nothing in the table.
    pub(crate) fn check_stalls(&self) -> Option<Duration> {
        let mut state = self.lock();
        if state.closed {
            return None;
        }
        Some(state.owner.check_stalls())
    }

    /// The journal as it was when the shard closed, if it keeps one.
    pub(crate) fn final_journal(&self) -> Option<Journal<K>> {
        let state = self.lock();
        if !state.closed {
            return None;
        }
        state.owner.journal_kept()
    }

    /// Closes the shard for good: serves what the actor had not served yet (requests sent
    /// before the close are handled first), then answers every waiter with `Closed` and
    /// empties the table. Every call that takes the lock after this finds the shard closed.
    /// Closing a closed shard does nothing.
    pub(crate) fn close(&self) {
        let mut effects = Effects::new();
        let mut state = self.lock();
        if state.closed {
            return;
        }
        state.serve_queue(usize::MAX, &mut effects);
        state.close(&mut effects);
        drop(state);
        effects.carry_out();
    }

    /// Whether the shard has closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// For the actor task: serves up to [`ACTOR_SERVE_BOUND`] queued requests, oldest first,
    /// or, with nothing queued, registers to be woken when something is. Takes one unit of the
    /// task's tokio budget, as tokio's channels do, so an actor that is never short of work
    /// still yields now and then.
    pub(crate) fn poll_work(&self, cx: &mut Context<'_>) -> Poll<Work> {
        let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        let mut effects = Effects::new();
        let mut state = self.lock();
        if state.closed {
            coop.made_progress();
            return Poll::Ready(Work::Stop);
        }
        if state.queue.is_empty() {
            match &mut state.actor {
                Some(waker) if waker.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
            return Poll::Pending;
        }
        state.serve_queue(ACTOR_SERVE_BOUND, &mut effects);
        drop(state);
        effects.carry_out();
        coop.made_progress();
        Poll::Ready(Work::Served)
    }

    /// For the actor's message handlers: serves everything queued (so that what was sent
    /// before the message is handled first), then runs `f` on the shard's state. `None` if
    /// the shard is closed.
    pub(crate) fn with_state<T>(
        &self,
        f: impl FnOnce(&mut ShardState<K>, &mut Effects<K>) -> T,
    ) -> Option<T> {
        let mut effects = Effects::new();
        let mut state = self.lock();
        if state.closed {
            return None;
        }
        state.serve_queue(usize::MAX, &mut effects);
        let result = f(&mut state, &mut effects);
        drop(state);
        effects.carry_out();
        Some(result)
    }
}

impl<K: LockKey> ShardState<K> {
    /// Runs one step. If it panics, the shard closes before the panic leaves this frame (and
    /// before the lock is let go): no step ever runs on a half-changed table.
    #[inline]
    pub(crate) fn step(&mut self, request: Request<K>, effects: &mut Effects<K>) -> Outcome<K> {
        let mut on_panic = CloseOnPanic {
            state: self,
            finished: false,
        };
        let outcome = on_panic.state.owner.step(request, effects);
        on_panic.finished = true;
        outcome
    }

    /// The owner, for the actor's message handlers.
    pub(crate) fn owner(&mut self) -> &mut Owner<K> {
        &mut self.owner
    }

    /// Queues `request` for the actor task and hands its waker to `effects`.
    #[inline]
    fn queue_for_actor(&mut self, request: Request<K>, effects: &mut Effects<K>) {
        self.queue.push(request);
        if let Some(actor) = self.actor.take() {
            effects.wake(actor);
        }
    }

    /// Serves at most `bound` queued requests, oldest first.
    fn serve_queue(&mut self, bound: usize, effects: &mut Effects<K>) {
        if self.queue.is_empty() {
            return;
        }
        let mut queue = std::mem::take(&mut self.queue);
        let rest = queue.split_off(bound.min(queue.len()));
        for request in queue.drain(..) {
            // A step that panics closes the shard, and the panic leaves here: the requests
            // not served yet are dropped, their pending grants answered by the close.
            self.step(request, effects).discard();
        }
        // Put back what is left (before anything queued meanwhile: nothing can be, the lock
        // is held) and keep the emptied vector's allocation for the next batch.
        debug_assert!(self.queue.is_empty());
        self.queue = rest;
        if self.queue.is_empty() {
            self.queue = queue;
        }
    }

    /// Closes the shard: refuses every later request, answers every waiter, wakes the actor
    /// so that it stops.
    fn close(&mut self, effects: &mut Effects<K>) {
        self.closed = true;
        let queued = std::mem::take(&mut self.queue);
        self.owner.close(queued, effects);
        if let Some(actor) = self.actor.take() {
            effects.wake(actor);
        }
    }
}

/// Closes the shard if a step panics (dropped without `finished`).
struct CloseOnPanic<'a, K: LockKey> {
    state: &'a mut ShardState<K>,
    finished: bool,
}

impl<K: LockKey> Drop for CloseOnPanic<'_, K> {
    fn drop(&mut self) {
        if !self.finished {
            // Woken here, under the lock: this is the panic's way out, and the caller's own
            // effects are dropped (so carried out) on the same way.
            let mut effects = Effects::new();
            self.state.close(&mut effects);
        }
    }
}

impl<K: LockKey> Drop for Shard<K> {
    fn drop(&mut self) {
        // The last handle and guard are gone: the actor, which holds only a weak reference,
        // must learn that it is time to stop.
        let actor = self.lock().actor.take();
        if let Some(actor) = actor {
            actor.wake();
        }
    }
}

/// One grant of a registry shard, released when dropped: the part of a guard that ends the
/// hold. A [`KeyGuard`](crate::KeyGuard) has one; a [`MultiGuard`](crate::MultiGuard) has one per shard.
#[clippy::has_significant_drop]
pub(crate) struct HeldGrant<K: LockKey> {
    waiter_id: WaiterId,
    /// The shard that granted it; one reference count, taken once per grant.
    shard: Arc<Shard<K>>,
}

impl<K: LockKey> HeldGrant<K> {
    pub(crate) fn new(waiter_id: WaiterId, shard: Arc<Shard<K>>) -> Self {
        HeldGrant { waiter_id, shard }
    }
}

impl<K: LockKey> Drop for HeldGrant<K> {
    fn drop(&mut self) {
        // Never awaits: waits only for the shard's lock, the length of one step.
        self.shard.release(self.waiter_id);
    }
}

impl<K: LockKey> fmt::Debug for Shard<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shard")
            .field("execution", &self.execution)
            .finish_non_exhaustive()
    }
}

/// An acquire on its way through a shard: started on its first poll, then waiting on its
/// pending grant. Dropping it withdraws the request, whatever stage it is at.
#[must_use = "futures do nothing unless polled"]
pub(crate) struct GrantFuture<'a, K: LockKey> {
    shard: &'a Shard<K>,
    /// The request, until the first poll takes it to the shard.
    request: Option<Request<K>>,
    stage: GrantStage,
}

impl<'a, K: LockKey> GrantFuture<'a, K> {
    /// An acquire of `shard` for `request`, whose delivery is [`Delivery::Caller`].
    pub(crate) fn new(shard: &'a Shard<K>, request: Request<K>) -> Self {
        GrantFuture {
            shard,
            request: Some(request),
            stage: GrantStage::new(),
        }
    }
}

// Nothing in the future is pinned: the request is moved out on the first poll, and the rest
// is a slot's key and a reference.
impl<K: LockKey> Unpin for GrantFuture<'_, K> {}

impl<K: LockKey> Future for GrantFuture<'_, K> {
    type Output = Result<Granted, NotGranted>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let request = &mut this.request;
        this.stage.poll(this.shard, cx, || request.take())
    }
}

impl<K: LockKey> Drop for GrantFuture<'_, K> {
    fn drop(&mut self) {
        self.stage.abandon(self.shard);
    }
}

/// Where an acquire stands, apart from its shard and its request, which its owner keeps (a
/// [`GrantFuture`], or the registry's lock future, which keeps one key for the request and
/// the guard): not started, waiting on a pending grant, or answered and kept until the task's
/// budget lets it be returned. Its owner must call [`abandon`](Self::abandon) when dropped.
pub(crate) struct GrantStage(Stage);

enum Stage {
    /// Not polled yet.
    Start,
    /// Queued; the grant will come to this pending slot.
    Waiting(PendingKey),
    /// Answered, and kept until the task's budget allows to return it.
    Answered(Result<Granted, NotGranted>),
    Done,
}

impl GrantStage {
    #[inline]
    pub(crate) fn new() -> Self {
        GrantStage(Stage::Start)
    }

    /// Polls the acquire on `shard`: its first poll starts the request that `request` makes
    /// (in the default mode runs its step here, in actor mode queues it); later polls look at
    /// its pending grant. `request` is called once, on the first poll; `None` is answered as
    /// a closed shard would be.
    #[inline]
    pub(crate) fn poll<K: LockKey>(
        &mut self,
        shard: &Shard<K>,
        cx: &mut Context<'_>,
        request: impl FnOnce() -> Option<Request<K>>,
    ) -> Poll<Result<Granted, NotGranted>> {
        let answer = match std::mem::replace(&mut self.0, Stage::Done) {
            Stage::Start => match request() {
                Some(request) => match shard.start(request, cx.waker()) {
                    Started::Granted(granted) => Ok(granted),
                    Started::Refused(not_granted) => Err(not_granted),
                    Started::Waiting(pending) => {
                        self.0 = Stage::Waiting(pending);
                        return Poll::Pending;
                    }
                },
                None => Err(NotGranted::Closed),
            },
            Stage::Waiting(pending) => match shard.poll_grant(pending, cx) {
                Poll::Ready(answer) => answer,
                Poll::Pending => {
                    self.0 = Stage::Waiting(pending);
                    return Poll::Pending;
                }
            },
            Stage::Answered(answer) => answer,
            // Polled after completion: behave like a closed shard rather than panic.
            Stage::Done => Err(NotGranted::Closed),
        };
        // An answer costs one unit of the task's tokio budget, as a tokio `Mutex` lock does:
        // a loop that locks free keys (or keeps hearing `Closed` or would-block) is always
        // ready, and would otherwise never let its worker run another task. Charged after the
        // step, so that the first poll always reaches the shard (arrival order stays the order
        // of first polls); with the budget spent, the answer is kept here until the task comes
        // back (and a grant released if it never does).
        match tokio::task::coop::poll_proceed(cx) {
            Poll::Ready(coop) => {
                coop.made_progress();
                Poll::Ready(answer)
            }
            Poll::Pending => {
                self.0 = Stage::Answered(answer);
                Poll::Pending
            }
        }
    }

    /// Withdraws the acquire from `shard`, whatever stage it is at: a queued request is
    /// cancelled, a grant kept for the budget is released. Nothing is left to undo after this.
    #[inline]
    pub(crate) fn abandon<K: LockKey>(&mut self, shard: &Shard<K>) {
        match std::mem::replace(&mut self.0, Stage::Done) {
            Stage::Waiting(pending) => shard.abandon(pending),
            Stage::Answered(Ok(granted)) => shard.release(granted.waiter_id),
            Stage::Start | Stage::Answered(Err(_)) | Stage::Done => {}
        }
    }
}

impl<K: LockKey> fmt::Debug for GrantFuture<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrantFuture").finish_non_exhaustive()
    }
}

impl fmt::Debug for GrantStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stage = match &self.0 {
            Stage::Start => "start",
            Stage::Waiting(_) => "waiting",
            Stage::Answered(_) => "answered",
            Stage::Done => "done",
        };
        f.debug_tuple("GrantStage").field(&stage).finish()
    }
}
