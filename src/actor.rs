//! [`RegistryActor`], the single owner of the lock table.
//!
//! The actor turns each message into one [`LockTable`] call and each resulting [`Grant`] into a
//! delivery. It does no bookkeeping of its own, holds no lock and awaits nothing in its
//! handlers: every message is handled to the end before the next one starts, which is what
//! makes the table's rules hold across tasks and threads.

use std::fmt;

use kameo::Actor;
use kameo::actor::{ActorRef, WeakActorRef};
use kameo::error::{ActorStopReason, Infallible};
use kameo::message::{Context, Message};
use kameo::reply::{DelegatedReply, ReplySender};
use tracing::{debug, warn};

use crate::LockKey;
use crate::error::{LockError, TryLockError};
use crate::grant::{GrantSender, Granted};
use crate::guard::KeyGuard;
use crate::journal::{Journal, JournaledTable};
use crate::messages::{Acquire, Cancel, Enqueue, GetJournal, GetStats, Release, TryAcquire};
use crate::stats::RegistryStats;
use crate::table::{Acquired, Grant, WaiterId};

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
    /// local so that its allocation is reused from message to message.
    granted: Vec<Grant<Delivery<K>>>,
}

/// How a grant reaches its waiter.
enum Delivery<K: LockKey> {
    /// A [`lock`](crate::LockRegistry::lock) call, through its grant channel.
    Channel(GrantSender),
    /// An `ask(Acquire)`, through kameo's reply.
    Reply(ReplySender<Result<KeyGuard<K>, LockError>>),
}

/// The arguments the actor starts from, made by [`RegistryBuilder`](crate::RegistryBuilder).
/// Public only because kameo names it in `Actor::Args`; it cannot be named outside the crate.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct RegistryConfig {
    /// Keep the last this many journal events; no journal if `None`.
    pub(crate) journal_capacity: Option<usize>,
}

impl<K: LockKey> RegistryActor<K> {
    fn new(config: RegistryConfig) -> Self {
        RegistryActor {
            table: match config.journal_capacity {
                Some(capacity) => JournaledTable::with_journal(capacity),
                None => JournaledTable::new(),
            },
            started: tokio::time::Instant::now(),
            granted: Vec::new(),
        }
    }

    /// Stamps the journal's clock before a message changes the table; free when it is off.
    fn stamp_time(&mut self) {
        if self.table.is_journaling() {
            self.table.set_time(self.started.elapsed());
        }
    }

    /// Delivers every pending grant. A grant whose waiter gave up is released on the spot,
    /// which may grant the key to the next waiter, so this loops until nothing is pending.
    fn deliver_grants(&mut self, actor_ref: &ActorRef<Self>) {
        while let Some(Grant {
            waiter_id,
            fencing_token,
            delivery,
        }) = self.granted.pop()
        {
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
                    let Some(key) = self.table.table().key_of(waiter_id).cloned() else {
                        continue;
                    };
                    // If the asker is gone, kameo drops this guard, whose drop sends a
                    // release: the key passes on one message later.
                    reply.send(Ok(KeyGuard::new(
                        key,
                        waiter_id,
                        fencing_token,
                        actor_ref.clone(),
                    )));
                }
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

    /// Answers every waiter with `Closed` and empties the table.
    fn close(&mut self) {
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
    }
}

impl<K: LockKey> Actor for RegistryActor<K> {
    type Args = RegistryConfig;
    type Error = Infallible;

    fn name() -> &'static str {
        "keyed_locks::RegistryActor"
    }

    async fn on_start(config: RegistryConfig, _: ActorRef<Self>) -> Result<Self, Infallible> {
        Ok(RegistryActor::new(config))
    }

    /// Runs on every stop: shutdown, last reference dropped, panic or kill. Waiters must learn
    /// now: kameo keeps the stopped actor's state alive in its task's output, so dropping the
    /// state is not a signal anyone would see soon.
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

impl<K: LockKey> Message<Enqueue<K>> for RegistryActor<K> {
    type Reply = ();

    async fn handle(&mut self, Enqueue { key, grant }: Enqueue<K>, ctx: &mut Context<Self, ()>) {
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
        self.deliver_grants(ctx.actor_ref());
    }
}

impl<K: LockKey> Message<Acquire<K>> for RegistryActor<K> {
    type Reply = DelegatedReply<Result<KeyGuard<K>, LockError>>;

    async fn handle(
        &mut self,
        Acquire { key }: Acquire<K>,
        ctx: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        let (delegated, reply) = ctx.reply_sender();
        let Some(reply) = reply else {
            debug!(
                ?key,
                "acquire sent with tell has nobody to grant to: ignored"
            );
            return delegated;
        };
        debug!(?key, "acquire");
        self.stamp_time();
        if let Acquired::Granted(grant) = self.table.acquire(key, Delivery::Reply(reply)) {
            self.granted.push(grant);
        }
        self.deliver_grants(ctx.actor_ref());
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
        debug!(?key, "try acquire");
        self.stamp_time();
        let reply = match self.table.try_acquire(key.clone()) {
            Ok(grant) => {
                debug!(?key, fencing_token = grant.fencing_token, "grant");
                Ok(KeyGuard::new(
                    key,
                    grant.waiter_id,
                    grant.fencing_token,
                    ctx.actor_ref().clone(),
                ))
            }
            Err(_) => {
                debug!(?key, "would block");
                Err(TryLockError::WouldBlock)
            }
        };
        // With `tell` there is no reply sender: the guard is dropped here and releases.
        ctx.reply(reply)
    }
}

impl<K: LockKey> Message<Release> for RegistryActor<K> {
    type Reply = ();

    async fn handle(&mut self, Release { waiter_id }: Release, ctx: &mut Context<Self, ()>) {
        self.stamp_time();
        self.release(waiter_id);
        self.deliver_grants(ctx.actor_ref());
    }
}

impl<K: LockKey> Message<Cancel> for RegistryActor<K> {
    type Reply = ();

    async fn handle(&mut self, Cancel { waiter_id }: Cancel, _: &mut Context<Self, ()>) {
        // Cancelling never grants (a queued waiter implies a holder), so nothing to deliver.
        self.stamp_time();
        self.cancel(waiter_id);
    }
}

impl<K: LockKey> Message<GetStats> for RegistryActor<K> {
    type Reply = RegistryStats;

    async fn handle(&mut self, _: GetStats, _: &mut Context<Self, RegistryStats>) -> RegistryStats {
        self.table.table().stats().into()
    }
}

impl<K: LockKey> Message<GetJournal> for RegistryActor<K> {
    type Reply = Journal<K>;

    async fn handle(&mut self, _: GetJournal, _: &mut Context<Self, Journal<K>>) -> Journal<K> {
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
