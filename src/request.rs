//! The requests handles and guards send to the registry actor through its inbox.
//!
//! Every call of [`LockRegistry`](crate::LockRegistry) and every guard's release travels in
//! one [`crate::inbox`], which the actor empties a batch at a time. One inbox for all
//! of them is what keeps a task's requests in program order. It bypasses kameo's mailbox,
//! which boxes every message and runs each in its own unwind guard: for a lock and a release
//! that was most of the cost (ARCHITECTURE.md, "Performance"). kameo still runs the actor,
//! its lifecycle and the public [`messages`](crate::messages).

use tokio::sync::oneshot;

use crate::grant::GrantSender;
use crate::inbox;
use crate::journal::Journal;
use crate::stats::RegistryStats;
use crate::table::WaiterId;

/// One request to the registry actor.
#[derive(Debug)]
pub(crate) enum Request<K> {
    /// A [`lock`](crate::LockRegistry::lock) call: grant `key` through `grant`, in turn.
    Acquire { key: K, grant: GrantSender },
    /// A [`try_lock`](crate::LockRegistry::try_lock) call: grant `key` through `grant` if it
    /// is free, else answer would-block.
    TryAcquire { key: K, grant: GrantSender },
    /// A guard's drop, or a `lock` call dropped with its grant in flight.
    Release { waiter_id: WaiterId },
    /// A queued `lock` call dropped.
    Cancel { waiter_id: WaiterId },
    /// A [`stats`](crate::LockRegistry::stats) call.
    Stats {
        reply: oneshot::Sender<RegistryStats>,
    },
    /// A [`journal`](crate::LockRegistry::journal) call.
    Journal { reply: oneshot::Sender<Journal<K>> },
}

/// The sending end, held by handles and guards. The actor runs until every sender is gone.
pub(crate) type RequestSender<K> = inbox::Sender<Request<K>>;

/// The actor's end.
pub(crate) type RequestReceiver<K> = inbox::Receiver<Request<K>>;

/// A sender that does not keep the actor alive: the actor's own, to make guards for `ask`s.
pub(crate) type WeakRequestSender<K> = inbox::WeakSender<Request<K>>;
