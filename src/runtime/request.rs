//! The requests the owner's step takes, whoever runs it.
//!
//! A caller that runs its own step (the default mode) takes the [`Outcome`] the step returns:
//! its deliveries are [`Delivery::Caller`] and its reply fields `None`. In actor mode a request
//! waits in the shard's queue for the actor task, with a pending grant
//! ([`Delivery::Pending`]) or a reply channel to answer it through.

use tokio::sync::oneshot;

use crate::key::LockKey;
use crate::pure::journal::Journal;
use crate::pure::snapshot::KeySnapshot;
use crate::pure::stats::RegistryStats;
use crate::pure::table::{KeySet, Permits, WaiterId};
use crate::runtime::pending::{Granted, PendingKey};
use crate::runtime::shard::HeldGrant;

/// One request to a registry shard's owner.
#[derive(Debug)]
pub(crate) enum Request<K: LockKey> {
    /// A [`lock`](crate::LockRegistry::lock) call or an `ask(Acquire)`: grant `permits` of
    /// `key` in turn (an exclusive lock asks for every permit of the key).
    Acquire {
        key: K,
        permits: Permits,
        delivery: Delivery<K>,
    },
    /// A [`try_lock`](crate::LockRegistry::try_lock) call or an `ask(TryAcquire)`: grant
    /// `key` if it is free, else answer would-block.
    TryAcquire {
        key: K,
        permits: Permits,
        delivery: Delivery<K>,
    },
    /// A [`lock_all`](crate::LockRegistry::lock_all) call, for this shard's keys of it:
    /// grant all of `keys` at once, exclusively, in turn.
    AcquireAll {
        keys: KeySet<K>,
        delivery: Delivery<K>,
    },
    /// A [`try_lock_all`](crate::LockRegistry::try_lock_all) call, for this shard's keys of
    /// it: grant all of `keys` if all are free, else answer would-block.
    TryAcquireAll {
        keys: KeySet<K>,
        delivery: Delivery<K>,
    },
    /// A guard's drop, or a `lock` future dropped with its grant in flight.
    Release { waiter_id: WaiterId },
    /// A queued `lock` future dropped.
    Cancel { waiter_id: WaiterId },
    /// A [`stats`](crate::LockRegistry::stats) call. `None`: the caller runs the step.
    Stats {
        reply: Option<oneshot::Sender<RegistryStats>>,
    },
    /// A [`snapshot`](crate::LockRegistry::snapshot) call, for the first `limit` keys (all
    /// if `None`). `None` reply: the caller runs the step.
    Snapshot {
        limit: Option<usize>,
        reply: Option<oneshot::Sender<Vec<KeySnapshot<K>>>>,
    },
    /// A [`journal`](crate::LockRegistry::journal) call. `None`: the caller runs the step.
    Journal {
        reply: Option<oneshot::Sender<Journal<K>>>,
    },
    /// A note for the journal ([`JournalEvent::Note`](crate::journal::JournalEvent::Note)),
    /// sent only while one is on.
    #[cfg(feature = "postgres")]
    Note { text: String },
}

impl<K: LockKey> Request<K> {
    /// The pending grant this request answers through, if any.
    #[inline]
    pub(crate) fn pending_key(&self) -> Option<PendingKey> {
        match self {
            Request::Acquire { delivery, .. }
            | Request::TryAcquire { delivery, .. }
            | Request::AcquireAll { delivery, .. }
            | Request::TryAcquireAll { delivery, .. } => match delivery {
                Delivery::Pending(key) => Some(*key),
                _ => None,
            },
            _ => None,
        }
    }

    /// Sets how an acquire's grant reaches its caller; other requests have no delivery.
    pub(crate) fn deliver_to(&mut self, to: Delivery<K>) {
        match self {
            Request::Acquire { delivery, .. }
            | Request::TryAcquire { delivery, .. }
            | Request::AcquireAll { delivery, .. }
            | Request::TryAcquireAll { delivery, .. } => *delivery = to,
            _ => {}
        }
    }
}

/// How a grant reaches its acquirer; the lock table keeps it with each waiter.
pub(crate) enum Delivery<K: LockKey> {
    /// The caller runs this very step and takes the grant from its [`Outcome`]. If the key is
    /// busy the caller replaces it with a pending grant before it lets go of the shard, so a
    /// waiting record never keeps it.
    Caller,
    /// A future that waits on its pending grant in the shard.
    Pending(PendingKey),
    /// An `ask(Acquire)`: sends kameo's reply. Boxed again: this path is rare, and a thin
    /// pointer keeps every waiter's record (so every held key) 8 bytes smaller.
    Message(Box<MessageReply<K>>),
}

/// Sends the reply to an `ask(Acquire)`: the grant, made into a guard by the message's
/// handler, or `None` if the registry closed first. A trait object rather than kameo's
/// `ReplySender` itself: the reply holds a guard, the guard the shard and the shard this
/// delivery, and only a `dyn ... + Send` lets the compiler see that such a cycle is `Send`.
pub(crate) type MessageReply<K> = Box<dyn FnOnce(Option<MessageGrant<K>>) + Send>;

/// A grant to a kameo message, handed up for its handler to make a guard of. Its hold
/// releases the key if it is dropped on the way (the asker gone, or the reply never sent).
pub(crate) struct MessageGrant<K: LockKey> {
    pub(crate) key: K,
    pub(crate) fencing_token: u64,
    pub(crate) held: HeldGrant<K>,
}

impl<K: LockKey> std::fmt::Debug for Delivery<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Delivery::Caller => f.write_str("Caller"),
            Delivery::Pending(key) => f.debug_tuple("Pending").field(key).finish(),
            Delivery::Message(_) => f.write_str("Message"),
        }
    }
}

/// What a step gives back to a caller that ran it itself.
#[derive(Debug)]
pub(crate) enum Outcome<K: LockKey> {
    /// Nothing to give: a release, a cancel, or a request answered through its delivery.
    Done,
    /// The key is the caller's now.
    Granted(Granted),
    /// The key is busy: the caller's request waits in the table under this id, with
    /// [`Delivery::Caller`] until the caller gives it a pending grant.
    Queued(WaiterId),
    /// A try-acquire found the key taken; nothing changed.
    WouldBlock,
    /// The counts asked for.
    Stats(RegistryStats),
    /// The journal asked for.
    Journal(Journal<K>),
    /// The view asked for, in contention order.
    Snapshot(Vec<KeySnapshot<K>>),
}

impl<K: LockKey> Outcome<K> {
    /// Drops an outcome the caller is done with. One with nothing to drop (a release's
    /// `Done`, an acquire's `Granted`) is dropped inline with nothing to run; a journal is
    /// dropped out of line. Left to the compiler, dropping an `Outcome` is a call into its
    /// drop glue on every lock and every release.
    #[inline]
    pub(crate) fn discard(self) {
        #[cold]
        #[inline(never)]
        fn drop_out_of_line<K: LockKey>(outcome: Outcome<K>) {
            drop(outcome);
        }
        match self {
            // Nothing in these needs dropping: forgetting them leaves nothing behind.
            Outcome::Done
            | Outcome::Granted(_)
            | Outcome::Queued(_)
            | Outcome::WouldBlock
            | Outcome::Stats(_) => std::mem::forget(self),
            other => drop_out_of_line(other),
        }
    }
}
