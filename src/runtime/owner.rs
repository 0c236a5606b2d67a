//! [`Owner`], a registry shard's state, and [`Owner::step`], the one step that changes it.
//!
//! Whoever holds the shard's lock ([`crate::runtime::shard`]) runs the step: a caller of the handle
//! (the default mode), a guard's drop, or the actor task (actor mode, and kameo's messages).
//! It is the same function on every path, so every path keeps the same rules and is recorded
//! in the journal the same way. The step never awaits and never wakes a task or answers a
//! kameo `ask` itself: it leaves those in [`Effects`], which the caller carries out once it has
//! let go of the lock. What does run under the lock is the key's own `Hash`, `Eq`, `Clone`
//! and `Debug`, and a `tracing` subscriber's handling of the debug events: the table cannot
//! work without the first, and the events name the key.

use std::num::NonZeroU32;
use std::sync::Weak;
use std::task::Waker;

use tokio::sync::oneshot;
use tracing::{debug, warn};

use crate::key::LockKey;
use crate::pure::journal::Journal;
use crate::pure::journaled_table::JournaledTable;
use crate::pure::snapshot::KeySnapshot;
use crate::pure::stats::RegistryStats;
use crate::pure::table::{Acquired, Grant, KeySet, Permits, WaiterId, WouldBlock};
use crate::runtime::metrics::ShardMetrics;
use crate::runtime::pending::{Granted, PendingGrants, PendingKey};
use crate::runtime::request::{Delivery, MessageGrant, MessageReply, Outcome, Request};
use crate::runtime::router::ShardRouter;
use crate::runtime::shard::{HeldGrant, Shard};
use crate::runtime::stall::{StallThresholds, StallWatch};

/// The target of the owner's events: every request it takes, at debug level.
pub(crate) const OWNER_TARGET: &str = "keyed_locks::owner";

/// A registry shard's state: its lock table and what it needs to deliver grants. Reached
/// only through the shard's lock.
pub(crate) struct Owner<K: LockKey> {
    /// The lock table, recording into a journal if the builder asked for one.
    table: JournaledTable<K, Delivery<K>>,
    /// The grants that waiting futures wait for ([`crate::runtime::pending`]).
    pending: PendingGrants,
    /// Where journal times count from.
    started: tokio::time::Instant,
    /// Grants made by the current table call and not yet delivered. A field rather than a
    /// local so that its allocation is reused.
    granted: Vec<Grant<Delivery<K>>>,
    /// The shard this owner lives in, for the guards of `ask(Acquire)` replies; weak, so that
    /// the owner does not keep its own shard alive.
    shard_ref: Weak<Shard<K>>,
    /// Which shard of the registry this is.
    shard: usize,
    /// Which keys this shard owns, and how its table's tokens become the registry's.
    router: ShardRouter,
    /// The grants to check on for stall warnings; `None` (the default) if none is asked for.
    stalls: Option<Box<StallWatch>>,
    /// What the shard reports to the `metrics` facade; nothing without the feature.
    metrics: ShardMetrics,
}

/// What a shard's owner is built from.
pub(crate) struct OwnerConfig {
    /// Keep the last this many journal events; no journal if `None`.
    pub(crate) journal_capacity: Option<usize>,
    /// Permits per key.
    pub(crate) capacity: NonZeroU32,
    pub(crate) shard: usize,
    pub(crate) router: ShardRouter,
    pub(crate) stall_thresholds: StallThresholds,
}

/// What steps leave to do once the lock is let go: tasks to wake and kameo replies to send.
///
/// Carried out when dropped, so that nothing is lost even if a step panics half way (the
/// grants already written to waiters' pending slots then still wake them).
pub(crate) struct Effects<K: LockKey> {
    /// The first wake-up, inline: most steps wake at most one task (a release's next holder).
    wake: Option<Waker>,
    /// Everything else, boxed on first use, so that the usual step's effects cost two checks.
    more: Option<Box<MoreEffects<K>>>,
}

struct MoreEffects<K: LockKey> {
    wakes: Vec<Waker>,
    replies: Vec<MessageReplyDue<K>>,
}

type MessageReplyDue<K> = (MessageReply<K>, Option<MessageGrant<K>>);

impl<K: LockKey> Effects<K> {
    #[inline]
    pub(crate) fn new() -> Self {
        Effects {
            wake: None,
            more: None,
        }
    }

    #[inline]
    pub(crate) fn wake(&mut self, waker: Waker) {
        match self.wake {
            None => self.wake = Some(waker),
            Some(_) => self.more().wakes.push(waker),
        }
    }

    fn more(&mut self) -> &mut MoreEffects<K> {
        self.more.get_or_insert_with(|| {
            Box::new(MoreEffects {
                wakes: Vec::new(),
                replies: Vec::new(),
            })
        })
    }

    fn reply(&mut self, reply: MessageReply<K>, grant: Option<MessageGrant<K>>) {
        self.more().replies.push((reply, grant));
    }

    /// Wakes every task and sends every reply, in the order the steps left them.
    #[inline]
    pub(crate) fn carry_out(self) {
        if self.wake.is_none() && self.more.is_none() {
            // Nothing to do, the usual case of a free key: skip the call into the drop.
            std::mem::forget(self);
        } else {
            drop(self);
        }
    }
}

impl<K: LockKey> Drop for Effects<K> {
    #[inline]
    fn drop(&mut self) {
        if let Some(waker) = self.wake.take() {
            waker.wake();
        }
        if let Some(more) = self.more.take() {
            let MoreEffects { wakes, replies } = *more;
            wakes.into_iter().for_each(Waker::wake);
            for (reply, grant) in replies {
                // If the asker is gone, kameo drops the guard, whose drop releases the key.
                reply(grant);
            }
        }
    }
}

impl<K: LockKey> Owner<K> {
    pub(crate) fn new(config: OwnerConfig, shard_ref: Weak<Shard<K>>) -> Self {
        Owner {
            table: JournaledTable::for_permits(config.capacity, config.journal_capacity),
            pending: PendingGrants::default(),
            started: tokio::time::Instant::now(),
            granted: Vec::new(),
            shard_ref,
            shard: config.shard,
            router: config.router,
            stalls: StallWatch::new(config.stall_thresholds).map(Box::new),
            metrics: ShardMetrics::new(),
        }
    }

    /// Runs one request to the end: the owner's one step, whoever runs it.
    #[inline]
    pub(crate) fn step(&mut self, request: Request<K>, effects: &mut Effects<K>) -> Outcome<K> {
        let outcome = self.take(request, effects);
        self.metrics.report(|| self.table.table().stats());
        outcome
    }

    #[inline]
    fn take(&mut self, request: Request<K>, effects: &mut Effects<K>) -> Outcome<K> {
        if let Some(pending) = request.pending_key()
            && self.pending.is_gone(pending)
        {
            // The caller gave up before the request got here: touch nothing, make no entry.
            debug!(target: OWNER_TARGET, ?request, "withdrawn before it arrived");
            return Outcome::Done;
        }
        match request {
            Request::Acquire {
                key,
                permits,
                delivery,
            } => self.acquire(key, permits, delivery, effects),
            Request::TryAcquire {
                key,
                permits,
                delivery,
            } => self.try_acquire(key, permits, delivery, effects),
            Request::AcquireAll { keys, delivery } => self.acquire_all(keys, delivery, effects),
            Request::TryAcquireAll { keys, delivery } => {
                self.try_acquire_all(keys, delivery, effects)
            }
            Request::Release { waiter_id } => {
                self.stamp_time();
                self.release(waiter_id);
                self.deliver_grants(effects)
            }
            Request::Cancel { waiter_id } => {
                // A withdrawn waiter may have held back smaller requests behind it.
                self.stamp_time();
                self.cancel(waiter_id);
                self.deliver_grants(effects)
            }
            Request::Stats { reply } => answer(reply, self.table.table().stats(), Outcome::Stats),
            #[cfg(feature = "postgres")]
            Request::Note { text } => {
                self.stamp_time();
                self.table.note(text);
                Outcome::Done
            }
            Request::Journal { reply } => answer(reply, self.table.journal(), Outcome::Journal),
            Request::Snapshot { limit, reply } => {
                answer(reply, self.snapshot(limit), Outcome::Snapshot)
            }
        }
    }

    /// Every permit of a key: what an exclusive lock asks for.
    pub(crate) fn all_permits(&self) -> Permits {
        self.table.table().all_permits()
    }

    /// Whether `key` belongs to this shard. Requests from the handle always do; a kameo
    /// message may have been sent to the wrong shard.
    pub(crate) fn owns(&self, key: &K) -> bool {
        self.router.shard_of(key) == self.shard
    }

    /// The fencing token a guard shows for this shard's table token (see [`crate::runtime::shard`]).
    #[inline]
    fn registry_token(&self, table_token: u64) -> u64 {
        self.router.registry_token(self.shard, table_token)
    }

    #[inline]
    fn acquire(
        &mut self,
        key: K,
        permits: Permits,
        delivery: Delivery<K>,
        effects: &mut Effects<K>,
    ) -> Outcome<K> {
        debug!(target: OWNER_TARGET, ?key, "acquire");
        self.stamp_time();
        self.mark_time_now_and_then();
        let by_caller = matches!(delivery, Delivery::Caller);
        let acquired = self.table.acquire(key, permits, delivery);
        self.grant_or_queue(acquired, by_caller, effects)
    }

    fn acquire_all(
        &mut self,
        keys: KeySet<K>,
        delivery: Delivery<K>,
        effects: &mut Effects<K>,
    ) -> Outcome<K> {
        debug!(target: OWNER_TARGET, keys = ?keys.as_slice(), "acquire of several keys");
        self.stamp_time();
        self.mark_time_now_and_then();
        let by_caller = matches!(delivery, Delivery::Caller);
        let acquired = self.table.acquire_all(keys, delivery);
        self.grant_or_queue(acquired, by_caller, effects)
    }

    /// What an acquire does once the table has answered: a grant is delivered; a queued
    /// request's waiter learns its place, or is withdrawn if it gave up meanwhile.
    /// `by_caller` says the request came with [`Delivery::Caller`], so that a queued caller is
    /// answered without looking its record up again.
    #[inline]
    fn grant_or_queue(
        &mut self,
        acquired: Acquired<Delivery<K>>,
        by_caller: bool,
        effects: &mut Effects<K>,
    ) -> Outcome<K> {
        match acquired {
            Acquired::Granted(grant) => return self.deliver_first(grant, effects),
            // The caller is here: it gives the record a pending grant before it lets go of
            // the shard ([`Owner::wait_here`]).
            Acquired::Queued(waiter_id) if by_caller => return Outcome::Queued(waiter_id),
            Acquired::Queued(waiter_id) => match self.table.delivery_mut(waiter_id) {
                // Tell the waiter its place, so that giving up becomes a cancel; if it gave
                // up in the meantime, withdraw it now.
                Some(Delivery::Pending(pending))
                    if self.pending.mark_queued(*pending, waiter_id).is_err() =>
                {
                    self.cancel(waiter_id);
                }
                _ => {}
            },
        }
        self.deliver_grants(effects)
    }

    /// Gives the waiting request `waiter_id`, queued by a caller that ran its own step
    /// ([`Outcome::Queued`]), a pending grant for `waker`'s task to wait on.
    #[inline]
    pub(crate) fn wait_here(&mut self, waiter_id: WaiterId, waker: &Waker) -> PendingKey {
        let pending = self.pending.queued(waiter_id, waker);
        match self.table.delivery_mut(waiter_id) {
            Some(delivery) => *delivery = Delivery::Pending(pending),
            // The step that returned `Queued` left the record waiting.
            None => debug_assert!(false, "a waiter queued by this step is waiting"),
        }
        pending
    }

    /// The pending grants, for the futures that wait on them.
    #[inline]
    pub(crate) fn pending(&mut self) -> &mut PendingGrants {
        &mut self.pending
    }

    #[inline]
    fn try_acquire(
        &mut self,
        key: K,
        permits: Permits,
        delivery: Delivery<K>,
        effects: &mut Effects<K>,
    ) -> Outcome<K> {
        debug!(target: OWNER_TARGET, ?key, "try acquire");
        self.stamp_time();
        self.mark_time_now_and_then();
        let taken = self.table.try_acquire(key, permits);
        self.grant_or_refuse(taken, delivery, effects)
    }

    fn try_acquire_all(
        &mut self,
        keys: KeySet<K>,
        delivery: Delivery<K>,
        effects: &mut Effects<K>,
    ) -> Outcome<K> {
        debug!(target: OWNER_TARGET, keys = ?keys.as_slice(), "try acquire of several keys");
        self.stamp_time();
        self.mark_time_now_and_then();
        let taken = self.table.try_acquire_all(keys);
        self.grant_or_refuse(taken, delivery, effects)
    }

    /// What a try-acquire does once the table has answered: a grant is delivered like any
    /// other; a refusal is told to the caller.
    #[inline]
    fn grant_or_refuse(
        &mut self,
        taken: Result<Grant<()>, WouldBlock>,
        delivery: Delivery<K>,
        effects: &mut Effects<K>,
    ) -> Outcome<K> {
        match (taken, delivery) {
            // Delivered like any grant, so a caller that gave up meanwhile releases it at once.
            (Ok(granted), delivery) => self.deliver_first(
                Grant {
                    waiter_id: granted.waiter_id,
                    fencing_token: granted.fencing_token,
                    delivery,
                },
                effects,
            ),
            (Err(_), Delivery::Pending(pending)) => {
                self.metrics.would_block();
                if let Some(waker) = self.pending.would_block(pending) {
                    effects.wake(waker);
                }
                Outcome::Done
            }
            (Err(_), Delivery::Caller | Delivery::Message(_)) => {
                self.metrics.would_block();
                Outcome::WouldBlock
            }
        }
    }

    /// Delivers every pending grant. A grant whose waiter gave up is released on the spot,
    /// which may grant the key to the next waiter, so this loops until nothing is pending.
    /// Returns the caller's own grant, if the step made one.
    #[inline]
    fn deliver_grants(&mut self, effects: &mut Effects<K>) -> Outcome<K> {
        let mut own_grant = None;
        while let Some(grant) = self.granted.pop() {
            if let Some(granted) = self.deliver(grant, effects) {
                own_grant = Some(granted);
            }
        }
        match own_grant {
            Some(granted) => Outcome::Granted(granted),
            None => Outcome::Done,
        }
    }

    /// Delivers `grant`, which the step's own request was just given (it skips the pending
    /// list), then whatever delivering it caused.
    #[inline]
    fn deliver_first(&mut self, grant: Grant<Delivery<K>>, effects: &mut Effects<K>) -> Outcome<K> {
        match self.deliver(grant, effects) {
            // A grant to the caller releases nothing, so nothing else is pending.
            Some(granted) => {
                debug_assert!(
                    self.granted.is_empty(),
                    "a grant to the caller is the only one"
                );
                Outcome::Granted(granted)
            }
            None => self.deliver_grants(effects),
        }
    }

    /// Delivers one grant; returns it if it is the caller's own ([`Delivery::Caller`]).
    #[inline]
    fn deliver(
        &mut self,
        Grant {
            waiter_id,
            fencing_token,
            delivery,
        }: Grant<Delivery<K>>,
        effects: &mut Effects<K>,
    ) -> Option<Granted> {
        let fencing_token = self.registry_token(fencing_token);
        debug!(
            target: OWNER_TARGET,
            keys = ?self.table.table().keys_of(waiter_id),
            fencing_token,
            "grant"
        );
        self.metrics.grant();
        let granted = Granted {
            waiter_id,
            fencing_token,
        };
        if let Some(stalls) = &mut self.stalls {
            stalls.granted(self.started, waiter_id, fencing_token, &delivery);
        }
        match delivery {
            Delivery::Caller => return Some(granted),
            Delivery::Pending(pending) => match self.pending.grant(pending, granted) {
                Ok(waker) => {
                    if let Some(waker) = waker {
                        effects.wake(waker);
                    }
                }
                // The waiter gave up while its grant was being made; a cancel for it may be
                // on its way, and will find nothing. Pass the key on now.
                Err(_gone) => {
                    self.metrics.cancellation();
                    self.release(waiter_id);
                }
            },
            Delivery::Message(reply) => {
                let grant = self.message_grant(waiter_id, fencing_token);
                effects.reply(*reply, grant);
            }
        }
        None
    }

    /// A grant made to a kameo message, with its registry-wide fencing token, for the
    /// message's handler to make a guard of; `None` if no handle and no guard is left to
    /// release with (the registry is about to stop). The grant is then released here, so no
    /// key stays held by a guard never made.
    pub(crate) fn message_grant(
        &mut self,
        waiter_id: WaiterId,
        fencing_token: u64,
    ) -> Option<MessageGrant<K>> {
        let key = self.table.table().key_of(waiter_id).cloned();
        match (key, self.shard_ref.upgrade()) {
            (Some(key), Some(shard)) => Some(MessageGrant {
                key,
                fencing_token,
                held: HeldGrant::new(waiter_id, shard),
            }),
            _ => {
                self.release(waiter_id);
                None
            }
        }
    }

    #[inline]
    fn release(&mut self, waiter_id: WaiterId) {
        match self.table.release(waiter_id, &mut self.granted) {
            Ok(key) => debug!(target: OWNER_TARGET, ?key, "release"),
            // Only a bug can get here: releases come from guards and abandoned grants, one per
            // grant. Refusing keeps the table intact.
            Err(error) => warn!(target: OWNER_TARGET, %error, "release refused"),
        }
    }

    fn cancel(&mut self, waiter_id: WaiterId) {
        match self.table.cancel(waiter_id, &mut self.granted) {
            Ok((key, _delivery)) => {
                self.metrics.cancellation();
                debug!(target: OWNER_TARGET, ?key, "cancel");
            }
            // The waiter was granted (and its grant refused) before its cancel arrived.
            Err(error) => debug!(target: OWNER_TARGET, %error, "cancel found nothing to withdraw"),
        }
    }

    /// Stamps the journal's clock before a request changes the table; free when it is off.
    #[inline]
    fn stamp_time(&mut self) {
        if self.table.is_journaling() {
            self.table.set_time(self.started.elapsed());
        }
    }

    /// Gives the table a time mark once every `MARK_EVERY` arrivals (`src/pure/table/marks.rs`),
    /// so that its view dates holds and waits within that many arrivals while the shard is
    /// busy, for one clock reading per that many locks rather than one per lock.
    #[inline]
    fn mark_time_now_and_then(&mut self) {
        if self.table.table().wants_time_mark() {
            self.mark_time_now();
        }
    }

    #[cold]
    #[inline(never)]
    fn mark_time_now(&mut self) {
        self.table.mark_time(self.started.elapsed());
    }

    /// The view of the first `limit` keys (all if `None`) in contention order, with the
    /// registry's fencing tokens. Runs in the step, so the shard waits for it: O(keys +
    /// holders), see `LockTable::snapshot`.
    #[cold]
    #[inline(never)]
    fn snapshot(&mut self, limit: Option<usize>) -> Vec<KeySnapshot<K>> {
        let mut views = self.table.snapshot(self.started.elapsed(), limit);
        for holder in views.iter_mut().flat_map(|view| view.holders.iter_mut()) {
            holder.fencing_token = self.registry_token(holder.fencing_token);
        }
        views
    }

    /// Answers every waiter, every request still `queued` and every grant not yet picked up
    /// with `Closed`, and empties the table. The journal stays readable; nothing else is done
    /// with the owner after this.
    pub(crate) fn close(&mut self, queued: Vec<Request<K>>, effects: &mut Effects<K>) {
        // Requests still queued are dropped unhandled: their pending grants are closed below,
        // a dropped reply channel tells its caller `Closed`, and releases and cancels no
        // longer matter once the table is emptied.
        for request in queued {
            if let Request::Acquire {
                delivery: Delivery::Message(reply),
                ..
            }
            | Request::AcquireAll {
                delivery: Delivery::Message(reply),
                ..
            } = request
            {
                effects.reply(*reply, None);
            }
        }
        self.stamp_time();
        let waiters = self.table.shutdown();
        debug!(target: OWNER_TARGET, waiters = waiters.len(), "registry closing");
        // Grants cut short by a panic in the middle of a delivery are closed too.
        let cut_short = self.granted.drain(..).map(|grant| grant.delivery);
        for delivery in waiters.into_iter().map(|(_, d)| d).chain(cut_short) {
            if let Delivery::Message(reply) = delivery {
                effects.reply(*reply, None);
            }
        }
        self.pending.close_all(|waker| effects.wake(waker));
        self.metrics.close();
    }

    /// The journal as it is (after a close: as it was when the shard closed); `None` if the
    /// registry keeps none.
    pub(crate) fn journal_kept(&self) -> Option<Journal<K>> {
        self.table.is_journaling().then(|| self.table.journal())
    }

    /// Warns about the stalls that came due, and says how long the stall timer may sleep.
    pub(crate) fn check_stalls(&mut self) -> std::time::Duration {
        let now = self.started.elapsed();
        match &mut self.stalls {
            Some(stalls) => stalls.check(now, self.table.table(), &self.pending),
            // No timer runs without a watch; this answer only stops one that somehow asks.
            None => std::time::Duration::MAX,
        }
    }

    /// The counts at this instant, for a kameo message.
    pub(crate) fn stats(&self) -> RegistryStats {
        self.table.table().stats()
    }
}

/// The answer to a question the step was asked: sent through `reply` if the request waited in
/// the queue, else given back to the caller that ran the step, as `outcome` makes it. Out of
/// line: these requests are rare, and the step that every lock runs stays small.
#[cold]
#[inline(never)]
fn answer<K: LockKey, T>(
    reply: Option<oneshot::Sender<T>>,
    value: T,
    outcome: impl FnOnce(T) -> Outcome<K>,
) -> Outcome<K> {
    match reply {
        None => outcome(value),
        Some(reply) => {
            // A caller that gave up does not want the answer.
            let _ = reply.send(value);
            Outcome::Done
        }
    }
}
