//! The messages of the registry actor, for use through [`LockRegistry::actor_ref`].
//!
//! Most code should call the methods of [`LockRegistry`] instead: they are faster (an idle
//! registry runs them on the caller, where a message always waits for the actor task) and give
//! what a raw `ask` cannot, such as prompt cleanup when a waiting `lock` is dropped. The
//! messages are for code that composes actors with kameo directly.
//!
//! # Ordering with the handle's calls
//!
//! Messages travel on kameo's mailbox; the handle's calls and the guards' releases run on
//! their caller or wait in the registry's own queue. Each is FIFO. When the actor handles a
//! message, it first serves every call queued before, so whatever happened before the
//! message, such as a dropped guard, is visible to it. A call made *after* a message was sent
//! may still be handled before it: between the two kinds, "arrival" (and so FIFO among
//! waiters) is the moment the registry's owner takes each one.
//!
//! # Sharded registries
//!
//! A registry built with [`shards`](crate::RegistryBuilder::shards) has one actor per shard.
//! Send [`Acquire`] and [`TryAcquire`] to [`LockRegistry::actor_ref_for`] the key: another
//! shard refuses them with `WrongShard` rather than lock the key in a table that does not own
//! it. [`GetStats`] and [`GetJournal`] answer for the one shard they are sent to.
//!
//! ```
//! use keyed_locks::{LockRegistry, messages::Acquire};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = LockRegistry::<u64>::spawn();
//! let guard = registry.actor_ref_for(&42).ask(Acquire { key: 42 }).await?;
//! assert_eq!(*guard.key(), 42);
//! # Ok(())
//! # }
//! ```
//!
//! [`LockRegistry`]: crate::LockRegistry
//! [`LockRegistry::actor_ref`]: crate::LockRegistry::actor_ref
//! [`LockRegistry::actor_ref_for`]: crate::LockRegistry::actor_ref_for

use kameo::error::Infallible;
use kameo::message::{Context, Message};
use kameo::reply::{DelegatedReply, Reply, ReplyError};
use tracing::debug;

use crate::error::{AcquireError, TryAcquireError};
use crate::guard::KeyGuard;
use crate::key::LockKey;
use crate::observe::Acquisition;
use crate::pure::journal::Journal;
use crate::pure::stats::RegistryStats;
use crate::runtime::owner::OWNER_TARGET;
use crate::runtime::request::{Delivery, MessageGrant, Outcome, Request};

pub(crate) mod actor;

use actor::RegistryActor;

/// Waits for `key` and replies with its [`KeyGuard`] once granted (FIFO).
///
/// Send it with `ask`; an `Acquire` sent with `tell` has nobody to grant to and is ignored.
/// The reply is [`Err(AcquireError::Closed)`](AcquireError::Closed) if the registry stops first,
/// and [`AcquireError::WrongShard`] if the key belongs to another shard's actor.
///
/// # Cancel safety
///
/// Dropping the `ask` future never leaves a key held or an entry behind: when the key's turn
/// comes, the guard that nobody receives is dropped and releases the key at once. Unlike
/// [`LockRegistry::lock`](crate::LockRegistry::lock), the abandoned request keeps its place
/// in the queue (and counts in [`RegistryStats::waiting`](crate::RegistryStats::waiting))
/// until then, because kameo does not tell an actor that an asker went away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquire<K> {
    /// The key to lock.
    pub key: K,
}

/// Takes `key` if it is free and replies with its [`KeyGuard`], or with
/// [`TryAcquireError::WouldBlock`] at once ([`TryAcquireError::Closed`] once the registry has
/// stopped, [`TryAcquireError::WrongShard`] for another shard's key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TryAcquire<K> {
    /// The key to lock.
    pub key: K,
}

/// Replies with the registry's [`RegistryStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GetStats;

/// Replies with a snapshot of the registry's [`Journal`] (empty unless the registry was built
/// with [`RegistryBuilder::journal`](crate::RegistryBuilder::journal)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GetJournal;

// The handlers: each takes the shard's lock once, after what was queued before (see
// "Ordering with the handle's calls" above).

impl<K: LockKey> Message<Acquire<K>> for RegistryActor<K> {
    type Reply = DelegatedReply<Result<KeyGuard<K>, AcquireError>>;

    async fn handle(
        &mut self,
        Acquire { key }: Acquire<K>,
        ctx: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        let (delegated, reply) = ctx.reply_sender();
        let Some(reply) = reply else {
            debug!(
                target: OWNER_TARGET,
                ?key,
                "acquire sent with tell has nobody to grant to: ignored"
            );
            return delegated;
        };
        let Some(shard) = self.shard() else {
            reply.send(Err(AcquireError::Closed));
            return delegated;
        };
        // The reply goes out after the lock is let go, unless the step keeps it to answer
        // when the key is granted. A closed shard drops the request, and with it the reply:
        // the asker then learns that the registry is gone.
        let answered = shard.with_state(|state, effects| {
            if !state.owner().owns(&key) {
                debug!(target: OWNER_TARGET, ?key, "acquire sent to the wrong shard: refused");
                return Some(reply);
            }
            let delivery = Delivery::Message(Box::new(Box::new(move |grant: Option<_>| {
                reply.send(grant.map(guard_of).ok_or(AcquireError::Closed))
            })));
            let permits = state.owner().all_permits();
            state
                .step(
                    Request::Acquire {
                        key,
                        permits,
                        delivery,
                    },
                    effects,
                )
                .discard();
            None
        });
        if let Some(Some(reply)) = answered {
            reply.send(Err(AcquireError::WrongShard));
        }
        delegated
    }
}

impl<K: LockKey> Message<TryAcquire<K>> for RegistryActor<K> {
    // Delegated rather than a plain `Result`: kameo stops an actor whose handler returns `Err`
    // to a `tell`, and a busy key must not stop the registry.
    type Reply = DelegatedReply<Result<KeyGuard<K>, TryAcquireError>>;

    async fn handle(
        &mut self,
        TryAcquire { key }: TryAcquire<K>,
        ctx: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        let reply = self
            .shard()
            .and_then(|shard| {
                shard.with_state(|state, effects| {
                    if !state.owner().owns(&key) {
                        debug!(target: OWNER_TARGET, ?key, "try acquire sent to the wrong shard: refused");
                        return Err(TryAcquireError::WrongShard);
                    }
                    let request = Request::TryAcquire {
                        key,
                        permits: state.owner().all_permits(),
                        delivery: Delivery::Caller,
                    };
                    match state.step(request, effects) {
                        // No guard only if no handle or guard is left: the registry is about
                        // to stop.
                        Outcome::Granted(granted) => state
                            .owner()
                            .message_grant(granted.waiter_id, granted.fencing_token)
                            .map(guard_of)
                            .ok_or(TryAcquireError::Closed),
                        _ => Err(TryAcquireError::WouldBlock),
                    }
                })
            })
            .unwrap_or(Err(TryAcquireError::Closed));
        // With `tell` there is no reply sender: the guard is dropped here and releases.
        ctx.reply(reply)
    }
}

impl<K: LockKey> Message<GetStats> for RegistryActor<K> {
    type Reply = RegistryStats;

    async fn handle(&mut self, _: GetStats, _: &mut Context<Self, RegistryStats>) -> RegistryStats {
        self.with_owner(|owner, _| owner.stats())
            .unwrap_or_default()
    }
}

impl<K: LockKey> Message<GetJournal> for RegistryActor<K> {
    type Reply = Journal<K>;

    async fn handle(&mut self, _: GetJournal, _: &mut Context<Self, Journal<K>>) -> Journal<K> {
        match self.step(Request::Journal { reply: None }) {
            Some(Outcome::Journal(journal)) => journal,
            _ => self
                .shard()
                .and_then(|shard| shard.final_journal())
                .unwrap_or_default(),
        }
    }
}

/// The guard for a grant to a message. A message has no acquisition span: only the handle's
/// calls do.
fn guard_of<K: LockKey>(grant: MessageGrant<K>) -> KeyGuard<K> {
    KeyGuard::new(
        grant.key,
        grant.fencing_token,
        grant.held,
        Acquisition::default(),
    )
}

/// Implements kameo's `Reply` for a type returned as is, as kameo's `#[derive(Reply)]` would;
/// written out to spare the crate kameo's proc-macro dependency.
macro_rules! plain_reply {
    ($type:ty $(, $param:ident)?) => {
        impl$(<$param: Send + 'static>)? Reply for $type {
            type Ok = Self;
            type Error = Infallible;
            type Value = Self;

            fn to_result(self) -> Result<Self, Infallible> {
                Ok(self)
            }

            fn into_any_err(self) -> Option<Box<dyn ReplyError>> {
                None
            }

            fn into_value(self) -> Self {
                self
            }
        }
    };
}

plain_reply!(RegistryStats);
plain_reply!(Journal<K>, K);
