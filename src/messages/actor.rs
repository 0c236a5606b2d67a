//! [`RegistryActor`], the task behind each registry shard: the actor-mode server of its queue,
//! kameo's face of the registry, and the watcher of its lifecycle.
//!
//! In actor mode ([`Execution::ActorTask`](crate::Execution::ActorTask)) every request is
//! queued in the shard and the actor serves the queue a batch at a time, as a classic actor
//! does. In the default mode callers run their own steps and the actor only handles kameo's
//! messages.
//!
//! The actor is also what kameo sees: its mailbox carries the public messages (defined by the
//! face above, in `messages.rs`, which this layer does not name) and kameo's own signals
//! (stop), polled whenever the actor waits and looked at between shares of work. Every message
//! handler takes the shard's lock and first serves whatever is queued, so whatever was sent
//! before is handled first. Its lifecycle is the registry's: when it stops, for any reason, it closes the shard and every
//! waiter gets `Closed`; and it stops by itself once every handle and guard is gone.

use std::fmt;
use std::future::poll_fn;
use std::sync::{Arc, Weak};
use std::task::Poll;

use kameo::Actor;
use kameo::actor::{ActorRef, WeakActorRef};
use kameo::error::{ActorStopReason, Infallible};
use kameo::mailbox::{MailboxReceiver, Signal};
use tokio::sync::mpsc::error::TryRecvError;
use tracing::debug;

use crate::key::LockKey;
use crate::runtime::owner::OWNER_TARGET;
use crate::runtime::owner::{Effects, Owner};
use crate::runtime::request::{Outcome, Request};
use crate::runtime::shard::{Shard, Work};

/// The kameo actor behind a [`LockRegistry`](crate::LockRegistry). Its state is private; talk
/// to it through the registry or through the public messages (`keyed_locks::messages`).
///
/// It is never restarted: a fresh, empty table while guards are still out would grant keys
/// that are held. If it stops for any reason (shutdown, panic, kill), every waiter gets
/// [`LockError::Closed`](crate::LockError::Closed) and so does every later request.
pub struct RegistryActor<K: LockKey> {
    /// The shard it serves; weak, so that the shard goes (and the actor stops) once every
    /// handle and guard is gone.
    shard: Weak<Shard<K>>,
    /// Whether kameo's mailbox can still deliver. It closes when no `ActorRef` is left, while
    /// guards may still send releases.
    mailbox_open: bool,
}

/// The arguments the actor starts from, made by [`RegistryBuilder`](crate::RegistryBuilder).
/// Public only because kameo names it in `Actor::Args`; it cannot be named outside the crate.
#[derive(Debug)]
pub struct RegistryConfig<K: LockKey> {
    pub(crate) shard: Weak<Shard<K>>,
}

impl<K: LockKey> RegistryActor<K> {
    fn new(config: RegistryConfig<K>) -> Self {
        RegistryActor {
            shard: config.shard,
            mailbox_open: true,
        }
    }

    /// The shard it serves, unless it is gone with the last handle and guard.
    pub(crate) fn shard(&self) -> Option<Arc<Shard<K>>> {
        self.shard.upgrade()
    }

    /// Serves what is queued, then runs `f` on the owner, under the shard's lock. `None` if
    /// the shard is closed or gone.
    pub(crate) fn with_owner<T>(
        &self,
        f: impl FnOnce(&mut Owner<K>, &mut Effects<K>) -> T,
    ) -> Option<T> {
        self.shard
            .upgrade()?
            .with_state(|state, effects| f(state.owner(), effects))
    }

    /// Runs `request` as a step, after what is queued. `None` if the shard is closed or gone.
    pub(crate) fn step(&self, request: Request<K>) -> Option<Outcome<K>> {
        self.shard
            .upgrade()?
            .with_state(|state, effects| state.step(request, effects))
    }
}

/// What woke the actor up.
enum Wake<K: LockKey> {
    /// It served a share of the queue.
    Served,
    /// Every sender is gone, or a step panicked: stop.
    Stop,
    Mailbox(Option<Signal<RegistryActor<K>>>),
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

    /// Serves the shard's queue (actor mode) a share at a time, and returns to kameo only for
    /// a mailbox signal (after serving the queue, for ordering) or to stop: once the shard is
    /// closed, or gone with its last handle and guard.
    async fn next(
        &mut self,
        _: WeakActorRef<Self>,
        mailbox_rx: &mut MailboxReceiver<Self>,
    ) -> Result<Option<Signal<Self>>, Infallible> {
        loop {
            // Queued work first, then the mailbox, both while waiting and after every share of
            // work, so a busy queue cannot starve a stop.
            let wake = poll_fn(|cx| {
                let work = match self.shard.upgrade() {
                    Some(shard) => shard.poll_work(cx),
                    None => Poll::Ready(Work::Stop),
                };
                match work {
                    Poll::Ready(Work::Served) => return Poll::Ready(Wake::Served),
                    Poll::Ready(Work::Stop) => return Poll::Ready(Wake::Stop),
                    Poll::Pending => {}
                }
                if self.mailbox_open
                    && let Poll::Ready(signal) = mailbox_rx.poll_recv(cx)
                {
                    return Poll::Ready(Wake::Mailbox(signal));
                }
                Poll::Pending
            })
            .await;
            let wake = match wake {
                // Between two shares of work, a look at the mailbox without waiting, so that a
                // queue that never empties cannot starve a stop.
                Wake::Served if self.mailbox_open => match mailbox_rx.try_recv() {
                    Ok(signal) => Wake::Mailbox(Some(signal)),
                    Err(TryRecvError::Disconnected) => Wake::Mailbox(None),
                    Err(TryRecvError::Empty) => continue,
                },
                wake => wake,
            };
            match wake {
                Wake::Served => continue,
                Wake::Mailbox(Some(signal)) => {
                    // For a stop: what was queued before it is served before `on_stop` closes.
                    self.with_owner(|_, _| ());
                    return Ok(Some(signal));
                }
                // No `ActorRef` is left, but guards may still send releases.
                Wake::Mailbox(None) => self.mailbox_open = false,
                Wake::Stop => return Ok(None),
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
        debug!(target: OWNER_TARGET, %reason, "registry actor stopping");
        if let Some(shard) = self.shard.upgrade() {
            shard.close();
        }
        Ok(())
    }
}

impl<K: LockKey> Drop for RegistryActor<K> {
    fn drop(&mut self) {
        // Dropped without `on_stop` only when its task is (the runtime shutting down): the
        // registry is closed all the same, so no waiter hangs.
        if let Some(shard) = self.shard.upgrade() {
            shard.close();
        }
    }
}

impl<K: LockKey> fmt::Debug for RegistryActor<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryActor")
            .field("mailbox_open", &self.mailbox_open)
            .finish_non_exhaustive()
    }
}
