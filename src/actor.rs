//! [`RegistryActor`], the single owner of the lock table.
//!
//! The actor turns each request into one table call and each resulting [`Grant`] into a
//! delivery. It does no bookkeeping of its own, holds no lock and awaits nothing while it
//! handles a request: every request is handled to the end before the next one starts, which
//! is what makes the table's rules hold across tasks and threads.
//!
//! Requests arrive on two channels. The inbox ([`crate::inbox`], carrying
//! [`crate::request`]s) takes every call of the handle and every release of a guard; the actor
//! takes it a whole batch at a time in [`Actor::next`]. kameo's mailbox carries the public
//! [`messages`](crate::messages) and kameo's own signals (stop), and is looked at when its
//! doorbell rang ([`crate::doorbell`]). Before it hands kameo any mailbox signal, and again
//! when a message handler starts, the actor drains the inbox, so whatever was sent there
//! before is handled first.

use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::{Arc, OnceLock};
use std::task::{self, Poll, Waker};

use kameo::Actor;
use kameo::actor::{ActorRef, WeakActorRef};
use kameo::error::{ActorStopReason, Infallible};
use kameo::mailbox::{MailboxReceiver, Signal};
use kameo::message::{Context, Message};
use kameo::reply::{DelegatedReply, ReplySender};
use tracing::{debug, warn};

use crate::LockKey;
use crate::doorbell::Doorbell;
use crate::error::{LockError, TryLockError};
use crate::grant::{GrantSender, Granted};
use crate::guard::KeyGuard;
use crate::journal::{Journal, JournaledTable};
use crate::messages::{Acquire, GetJournal, GetStats, TryAcquire};
use crate::request::{Request, RequestReceiver, WeakRequestSender};
use crate::shard::ShardRouter;
use crate::stats::RegistryStats;
use crate::table::{Acquired, Grant, WaiterId};

/// Requests' worth of memory the actor keeps for batches between bursts (32 bytes each for
/// `u64` keys). More arrive in one batch when they must; the excess is freed afterwards.
const RETAINED_BATCH_CAPACITY: usize = 1024;

/// The kameo actor behind a [`LockRegistry`](crate::LockRegistry). Its state is private; talk
/// to it through the registry or through the public [`messages`](crate::messages).
///
/// It is never restarted: a fresh, empty table while guards are still out would grant keys
/// that are held. If it stops for any reason (shutdown, panic, kill), every waiter gets
/// [`LockError::Closed`] and so does every later request.
pub struct RegistryActor<K: LockKey> {
    /// The lock table, recording into a journal if the builder asked for one.
    table: JournaledTable<K, Delivery<K>>,
    /// Where journal times count from.
    started: tokio::time::Instant,
    /// Grants made by the current table call and not yet delivered. A field rather than a
    /// local so that its allocation is reused.
    granted: Vec<Grant<Delivery<K>>>,
    requests: RequestReceiver<K>,
    /// The batch being handled; kept to reuse its allocation.
    batch: Vec<Request<K>>,
    /// For the guards of `ask(Acquire)` replies; weak, so that the actor alone does not keep
    /// its request channel open.
    weak_requests: WeakRequestSender<K>,
    /// Whether kameo's mailbox can still deliver. It closes when no `ActorRef` is left, while
    /// guards may still send releases on the request channel.
    mailbox_open: bool,
    /// Rung by kameo's mailbox; the mailbox is polled only while it is (see [`crate::doorbell`]).
    doorbell: Arc<Doorbell>,
    /// The doorbell as a waker, made once.
    doorbell_waker: Waker,
    /// Where the journal is left when the actor stops, for reading after a shutdown.
    final_journal: Arc<OnceLock<Journal<K>>>,
    /// Which shard of the registry this actor is.
    shard: usize,
    /// Which keys this shard owns, and how its table's tokens become the registry's.
    router: ShardRouter,
}

/// How a grant reaches its waiter.
enum Delivery<K: LockKey> {
    /// A [`lock`](crate::LockRegistry::lock) call, through its grant channel.
    Channel(GrantSender),
    /// An `ask(Acquire)`, through kameo's reply. The guard is built when the grant is made.
    /// Boxed: this path is rare, and the box keeps every waiter's record one word smaller.
    Reply(Box<ReplySender<Result<KeyGuard<K>, LockError>>>),
}

/// The arguments the actor starts from, made by [`RegistryBuilder`](crate::RegistryBuilder).
/// Public only because kameo names it in `Actor::Args`; it cannot be named outside the crate.
#[derive(Debug)]
pub struct RegistryConfig<K> {
    /// Keep the last this many journal events; no journal if `None`.
    pub(crate) journal_capacity: Option<usize>,
    pub(crate) requests: RequestReceiver<K>,
    pub(crate) weak_requests: WeakRequestSender<K>,
    pub(crate) final_journal: Arc<OnceLock<Journal<K>>>,
    pub(crate) shard: usize,
    pub(crate) router: ShardRouter,
}

impl<K: LockKey> RegistryActor<K> {
    fn new(config: RegistryConfig<K>) -> Self {
        let doorbell = Doorbell::new();
        RegistryActor {
            table: match config.journal_capacity {
                Some(capacity) => JournaledTable::with_journal(capacity),
                None => JournaledTable::new(),
            },
            started: tokio::time::Instant::now(),
            granted: Vec::new(),
            requests: config.requests,
            batch: Vec::new(),
            weak_requests: config.weak_requests,
            mailbox_open: true,
            doorbell_waker: Waker::from(Arc::clone(&doorbell)),
            doorbell,
            final_journal: config.final_journal,
            shard: config.shard,
            router: config.router,
        }
    }

    /// The fencing token a guard shows for this shard's table token (see [`crate::shard`]).
    fn registry_token(&self, table_token: u64) -> u64 {
        self.router.registry_token(self.shard, table_token)
    }

    /// Whether `key` belongs to this shard. Requests from the handle always do; a kameo
    /// message may have been sent to the wrong shard.
    fn owns(&self, key: &K) -> bool {
        self.router.shard_of(key) == self.shard
    }

    /// Handles every request in `self.batch`.
    fn handle_batch(&mut self) {
        let mut batch = std::mem::take(&mut self.batch);
        for request in batch.drain(..) {
            self.handle_request(request);
        }
        // The batch and the inbox's queue trade allocations at every batch; after a burst,
        // give the memory back rather than keep both at the burst's size for ever.
        batch.shrink_to(RETAINED_BATCH_CAPACITY);
        self.batch = batch;
    }

    /// Handles every request already in the inbox, without waiting for more. Requests sent
    /// while a batch is handled form the next batch.
    ///
    /// Called before a mailbox signal goes to kameo, and first thing in every message handler:
    /// kameo handles the messages that arrive before its start-up has finished in a row, from
    /// a buffer, without calling `next` in between, so only the handler itself can be sure
    /// that a release sent while the previous message was handled comes first.
    fn drain_requests(&mut self) {
        while self.requests.try_recv_batch(&mut self.batch) > 0 {
            self.handle_batch();
        }
    }

    fn handle_request(&mut self, request: Request<K>) {
        match request {
            Request::Acquire { key, grant } => self.acquire(key, grant),
            Request::TryAcquire { key, grant } => self.try_acquire(key, grant),
            Request::Release { waiter_id } => {
                self.stamp_time();
                self.release(waiter_id);
                self.deliver_grants();
            }
            Request::Cancel { waiter_id } => {
                // Cancelling never grants (a queued waiter implies a holder): nothing to deliver.
                self.stamp_time();
                self.cancel(waiter_id);
            }
            Request::Stats { reply } => {
                // A caller that gave up does not want the answer.
                let _ = reply.send(self.stats());
            }
            Request::Journal { reply } => {
                let _ = reply.send(self.table.journal());
            }
        }
    }

    fn acquire(&mut self, key: K, grant: GrantSender) {
        if grant.is_abandoned() {
            // The caller gave up before we got here: touch nothing, create no entry.
            debug!(?key, "acquire withdrawn before it arrived");
            return;
        }
        debug!(?key, "acquire");
        self.stamp_time();
        match self.table.acquire(key, Delivery::Channel(grant)) {
            Acquired::Granted(grant) => self.granted.push(grant),
            Acquired::Queued(waiter_id) => {
                // Tell the caller its place, so that giving up becomes a cancel; if it gave up
                // in the meantime, withdraw it now.
                if let Some(Delivery::Channel(grant)) = self.table.table().delivery_of(waiter_id)
                    && grant.queued(waiter_id).is_err()
                {
                    self.cancel(waiter_id);
                }
            }
        }
        self.deliver_grants();
    }

    fn try_acquire(&mut self, key: K, grant: GrantSender) {
        if grant.is_abandoned() {
            debug!(?key, "try acquire withdrawn before it arrived");
            return;
        }
        debug!(?key, "try acquire");
        self.stamp_time();
        match self.table.try_acquire(key) {
            // Delivered like any grant, so a caller that gave up meanwhile releases it at once.
            Ok(granted) => self.granted.push(Grant {
                waiter_id: granted.waiter_id,
                fencing_token: granted.fencing_token,
                delivery: Delivery::Channel(grant),
            }),
            Err(_) => grant.would_block(),
        }
        self.deliver_grants();
    }

    /// Delivers every pending grant. A grant whose waiter gave up is released on the spot,
    /// which may grant the key to the next waiter, so this loops until nothing is pending.
    fn deliver_grants(&mut self) {
        while let Some(Grant {
            waiter_id,
            fencing_token,
            delivery,
        }) = self.granted.pop()
        {
            let fencing_token = self.registry_token(fencing_token);
            debug!(key = ?self.table.table().key_of(waiter_id), fencing_token, "grant");
            match delivery {
                Delivery::Channel(sender) => {
                    let granted = Granted {
                        waiter_id,
                        fencing_token,
                    };
                    if sender.grant(granted).is_err() {
                        // The waiter gave up while its grant was being made; a cancel for it
                        // may be on its way, and will find nothing. Pass the key on now.
                        self.release(waiter_id);
                    }
                }
                Delivery::Reply(reply) => {
                    let guard = self.guard_for_reply(waiter_id, fencing_token);
                    // If the asker is gone, kameo drops this guard, whose drop sends a
                    // release: the key passes on one request later.
                    reply.send(guard);
                }
            }
        }
    }

    /// The guard for a grant made to a kameo `ask`, with its registry-wide fencing token.
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] if no handle and no guard is left to send a release with: the
    /// registry is about to stop. The grant is released here, so no key stays held by a
    /// guard that was never made.
    fn guard_for_reply(
        &mut self,
        waiter_id: WaiterId,
        fencing_token: u64,
    ) -> Result<KeyGuard<K>, LockError> {
        let key = self.table.table().key_of(waiter_id).cloned();
        match (key, self.weak_requests.upgrade()) {
            (Some(key), Some(requests)) => {
                Ok(KeyGuard::new(key, waiter_id, fencing_token, requests))
            }
            _ => {
                self.release(waiter_id);
                Err(LockError::Closed)
            }
        }
    }

    fn release(&mut self, waiter_id: WaiterId) {
        match self.table.release(waiter_id, &mut self.granted) {
            Ok(key) => debug!(?key, "release"),
            // Only a bug can get here: releases come from guards and abandoned grants, one per
            // grant. Refusing keeps the table intact.
            Err(error) => warn!(%error, "release refused"),
        }
    }

    fn cancel(&mut self, waiter_id: WaiterId) {
        match self.table.cancel(waiter_id) {
            Ok((key, _delivery)) => debug!(?key, "cancel"),
            // The waiter was granted (and its grant refused) before its cancel arrived.
            Err(error) => debug!(%error, "cancel found nothing to withdraw"),
        }
    }

    fn stats(&self) -> RegistryStats {
        self.table.table().stats()
    }

    /// Stamps the journal's clock before a request changes the table; free when it is off.
    fn stamp_time(&mut self) {
        if self.table.is_journaling() {
            self.table.set_time(self.started.elapsed());
        }
    }

    /// Refuses new requests, answers every waiter and every request still queued with
    /// `Closed`, empties the table and leaves the journal for the handles to read.
    fn close(&mut self) {
        // From here on, sends fail at once and callers see `Closed`. Requests still queued are
        // dropped unhandled: dropping a grant channel or a reply tells its caller `Closed`,
        // and releases and cancels no longer matter once the table is emptied below.
        self.requests.close();
        self.requests.try_recv_batch(&mut self.batch);
        self.batch.clear();
        self.stamp_time();
        let waiters = self.table.shutdown();
        debug!(waiters = waiters.len(), "registry closing");
        // Grants cut short by a panic in the middle of a delivery are closed too.
        let cut_short = self.granted.drain(..).map(|grant| grant.delivery);
        for delivery in waiters.into_iter().map(|(_, d)| d).chain(cut_short) {
            match delivery {
                // Dropping an unresolved grant channel closes it.
                Delivery::Channel(sender) => drop(sender),
                Delivery::Reply(reply) => reply.send(Err(LockError::Closed)),
            }
        }
        if self.table.is_journaling() {
            let _ = self.final_journal.set(self.table.journal());
        }
    }
}

impl<K: LockKey> RegistryActor<K> {
    /// Polls kameo's mailbox if its doorbell rang: `Some` with what it gave (`None` inside
    /// when it is closed), or `None` if it was not rung or is empty.
    fn poll_mailbox_if_rung(
        &mut self,
        mailbox_rx: &mut MailboxReceiver<Self>,
    ) -> Option<Option<Signal<Self>>> {
        if !self.doorbell.take_ring() {
            return None;
        }
        let mut doorbell_cx = task::Context::from_waker(&self.doorbell_waker);
        match pin!(mailbox_rx.recv()).poll(&mut doorbell_cx) {
            // Empty: the doorbell is registered with the mailbox and rings on the next signal.
            Poll::Pending => None,
            Poll::Ready(signal) => {
                // More may be queued behind it, and they will not ring: keep looking.
                self.doorbell.ring_again();
                Some(signal)
            }
        }
    }
}

/// What woke the actor up.
enum Wake<K: LockKey> {
    Mailbox(Option<Signal<RegistryActor<K>>>),
    Requests(usize),
}

impl<K: LockKey> Actor for RegistryActor<K> {
    type Args = RegistryConfig<K>;
    type Error = Infallible;

    fn name() -> &'static str {
        "keyed_locks::RegistryActor"
    }

    async fn on_start(config: RegistryConfig<K>, _: ActorRef<Self>) -> Result<Self, Infallible> {
        Ok(RegistryActor::new(config))
    }

    /// Serves the inbox in batches, and returns to kameo only for a mailbox signal (after
    /// draining the inbox, for ordering) or when nobody is left to send.
    async fn next(
        &mut self,
        _: WeakActorRef<Self>,
        mailbox_rx: &mut MailboxReceiver<Self>,
    ) -> Result<Option<Signal<Self>>, Infallible> {
        loop {
            // Requests first; the mailbox only when its doorbell rang, both while waiting and
            // after every batch, so a busy inbox cannot starve a stop.
            let wake = poll_fn(|cx| {
                if let Poll::Ready(received) = self.requests.poll_batch(cx, &mut self.batch) {
                    return Poll::Ready(Wake::Requests(received));
                }
                if self.mailbox_open {
                    // Before looking at the flag, so that a ring in between wakes this task.
                    self.doorbell.wake_on_ring(cx.waker());
                    if let Some(signal) = self.poll_mailbox_if_rung(mailbox_rx) {
                        return Poll::Ready(Wake::Mailbox(signal));
                    }
                }
                Poll::Pending
            })
            .await;
            let wake = match wake {
                Wake::Requests(received) if received > 0 => {
                    self.handle_batch();
                    if !self.mailbox_open {
                        continue;
                    }
                    match self.poll_mailbox_if_rung(mailbox_rx) {
                        Some(signal) => Wake::Mailbox(signal),
                        None => continue,
                    }
                }
                wake => wake,
            };
            match wake {
                Wake::Mailbox(Some(signal)) => {
                    // For a stop: what was sent before it is handled before `on_stop` closes.
                    self.drain_requests();
                    return Ok(Some(signal));
                }
                // No `ActorRef` is left, but guards may still send releases.
                Wake::Mailbox(None) => self.mailbox_open = false,
                // Every handle and every guard is gone: nobody can send a request again.
                Wake::Requests(_) => return Ok(None),
            }
        }
    }

    /// Runs on every stop: shutdown, last handle and guard gone, panic or kill. Waiters must
    /// learn now: kameo keeps a stopped actor's state until its task is dropped.
    async fn on_stop(
        &mut self,
        _: WeakActorRef<Self>,
        reason: ActorStopReason,
    ) -> Result<(), Infallible> {
        debug!(%reason, "registry actor stopping");
        self.close();
        Ok(())
    }
}

impl<K: LockKey> Message<Acquire<K>> for RegistryActor<K> {
    type Reply = DelegatedReply<Result<KeyGuard<K>, LockError>>;

    async fn handle(
        &mut self,
        Acquire { key }: Acquire<K>,
        ctx: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        self.drain_requests();
        let (delegated, reply) = ctx.reply_sender();
        let Some(reply) = reply else {
            debug!(
                ?key,
                "acquire sent with tell has nobody to grant to: ignored"
            );
            return delegated;
        };
        if !self.owns(&key) {
            debug!(?key, "acquire sent to the wrong shard: refused");
            reply.send(Err(LockError::WrongShard));
            return delegated;
        }
        debug!(?key, "acquire");
        self.stamp_time();
        if let Acquired::Granted(grant) = self.table.acquire(key, Delivery::Reply(Box::new(reply)))
        {
            self.granted.push(grant);
        }
        self.deliver_grants();
        delegated
    }
}

impl<K: LockKey> Message<TryAcquire<K>> for RegistryActor<K> {
    // Delegated rather than a plain `Result`: kameo stops an actor whose handler returns `Err`
    // to a `tell`, and a busy key must not stop the registry.
    type Reply = DelegatedReply<Result<KeyGuard<K>, TryLockError>>;

    async fn handle(
        &mut self,
        TryAcquire { key }: TryAcquire<K>,
        ctx: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        self.drain_requests();
        if !self.owns(&key) {
            debug!(?key, "try acquire sent to the wrong shard: refused");
            return ctx.reply(Err(TryLockError::WrongShard));
        }
        debug!(?key, "try acquire");
        self.stamp_time();
        let reply = match self.table.try_acquire(key) {
            Ok(grant) => {
                let fencing_token = self.registry_token(grant.fencing_token);
                debug!(key = ?self.table.table().key_of(grant.waiter_id), fencing_token, "grant");
                // The only error: no handle or guard is left, the registry is about to stop.
                self.guard_for_reply(grant.waiter_id, fencing_token)
                    .map_err(|_closed| TryLockError::Closed)
            }
            Err(_) => Err(TryLockError::WouldBlock),
        };
        // With `tell` there is no reply sender: the guard is dropped here and releases.
        ctx.reply(reply)
    }
}

impl<K: LockKey> Message<GetStats> for RegistryActor<K> {
    type Reply = RegistryStats;

    async fn handle(&mut self, _: GetStats, _: &mut Context<Self, RegistryStats>) -> RegistryStats {
        self.drain_requests();
        self.stats()
    }
}

impl<K: LockKey> Message<GetJournal> for RegistryActor<K> {
    type Reply = Journal<K>;

    async fn handle(&mut self, _: GetJournal, _: &mut Context<Self, Journal<K>>) -> Journal<K> {
        self.drain_requests();
        self.table.journal()
    }
}

impl<K: LockKey> fmt::Debug for RegistryActor<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryActor")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}
