//! The requests the owner's step takes, whoever runs it.
//!
//! A caller that holds the run token ([`crate::run_token`]) runs its own request at once and
//! takes the [`Outcome`] the step returns; the reply fields are then `None` (or
//! [`Delivery::Caller`]). A request that finds the owner busy waits in the queue with a channel
//! to answer it through, and whoever serves it later answers there.

use std::time::Duration;

use tokio::sync::oneshot;

use crate::LockKey;
use crate::grant::{GrantReceiver, GrantSender, Granted};
use crate::guard::KeyGuard;
use crate::journal::Journal;
#[cfg(feature = "postgres")]
use crate::journal::JournalEvent;
use crate::owner::Owner;
use crate::run_token;
use crate::stats::RegistryStats;
use crate::table::{KeySet, Permits, WaiterId};

/// One request to a registry shard's owner.
#[derive(Debug)]
pub(crate) enum Request<K: LockKey> {
    /// A [`lock`](crate::LockRegistry::lock) call or an `ask(Acquire)`: grant `key` in turn.
    /// `permits`: `None` for an exclusive lock (every permit of the key).
    Acquire {
        key: K,
        permits: Option<Permits>,
        delivery: Delivery<K>,
    },
    /// A [`try_lock`](crate::LockRegistry::try_lock) call or an `ask(TryAcquire)`: grant
    /// `key` if it is free, else answer would-block. `None`: the caller runs the step.
    TryAcquire {
        key: K,
        permits: Option<Permits>,
        grant: Option<GrantSender>,
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
        grant: Option<GrantSender>,
    },
    /// A guard's drop, or a `lock` call dropped with its grant in flight.
    Release { waiter_id: WaiterId },
    /// A queued `lock` call dropped.
    Cancel { waiter_id: WaiterId },
    /// A [`stats`](crate::LockRegistry::stats) call. `None`: the caller runs the step.
    Stats {
        reply: Option<oneshot::Sender<RegistryStats>>,
    },
    /// A [`journal`](crate::LockRegistry::journal) call. `None`: the caller runs the step.
    Journal {
        reply: Option<oneshot::Sender<Journal<K>>>,
    },
    /// The stall timer's check ([`crate::stall`]): warn about what came due. `None`: the
    /// caller runs the step.
    CheckStalls {
        reply: Option<oneshot::Sender<Duration>>,
    },
    /// A note for the journal ([`JournalEvent::is_note`]), sent only while one is on.
    #[cfg(feature = "postgres")]
    Note { event: JournalEvent<K> },
}

impl<K: LockKey> Request<K> {
    /// Whether this is an acquire whose caller gave up while it waited in the queue: the
    /// owner then skips it. A caller that runs its own step cannot have given up.
    #[inline]
    pub(crate) fn gave_up(&self) -> bool {
        let grant = match self {
            Request::Acquire {
                delivery: Delivery::Channel(grant),
                ..
            }
            | Request::AcquireAll {
                delivery: Delivery::Channel(grant),
                ..
            }
            | Request::TryAcquire {
                grant: Some(grant), ..
            }
            | Request::TryAcquireAll {
                grant: Some(grant), ..
            } => grant,
            _ => return false,
        };
        grant.is_abandoned()
    }
}

/// How a grant reaches its acquirer; the lock table keeps it with each waiter.
pub(crate) enum Delivery<K: LockKey> {
    /// The caller runs this very step and takes the grant from its [`Outcome`]. If the key is
    /// busy the step replaces it with a grant channel before the token is let go, so a
    /// waiting record never keeps it.
    Caller,
    /// A [`lock`](crate::LockRegistry::lock) call that waits on its grant channel.
    Channel(GrantSender),
    /// An `ask(Acquire)`: sends kameo's reply. Boxed again: this path is rare, and a thin
    /// pointer keeps every waiter's record (so every held key) 8 bytes smaller.
    Message(Box<MessageReply<K>>),
}

/// Sends the reply to an `ask(Acquire)`: the guard, or `None` if the registry closed first. A
/// trait object rather than kameo's `ReplySender` itself:
/// the reply holds a guard, the guard a sender, the sender the owner and the owner this
/// delivery, and only a `dyn ... + Send` lets the compiler see that such a cycle is `Send`.
pub(crate) type MessageReply<K> = Box<dyn FnOnce(Option<KeyGuard<K>>) + Send>;

impl<K: LockKey> std::fmt::Debug for Delivery<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Delivery::Caller => f.write_str("Caller"),
            Delivery::Channel(sender) => f.debug_tuple("Channel").field(sender).finish(),
            Delivery::Message(_) => f.write_str("Message"),
        }
    }
}

/// What a step gives back to a caller that ran it itself.
#[derive(Debug)]
pub(crate) enum Outcome<K: LockKey> {
    /// Nothing to give: a release, a cancel, or a request answered through its channel.
    Done,
    /// The key is the caller's now.
    Granted(Granted),
    /// The key is busy: the caller waits on this channel, already queued.
    Queued(GrantReceiver),
    /// A try-acquire found the key taken; nothing changed.
    WouldBlock,
    /// The counts asked for.
    Stats(RegistryStats),
    /// How long the stall timer may sleep before its next check.
    NextCheck(Duration),
    /// The journal asked for.
    Journal(Journal<K>),
}

impl<K: LockKey> Outcome<K> {
    /// Drops an outcome the caller is done with. One with nothing to drop (a release's
    /// `Done`, an acquire's `Granted`) is dropped inline with nothing to run; a receiver or a
    /// journal is dropped out of line. Left to the compiler, dropping an `Outcome` is a call
    /// into its drop glue on every lock and every release, a few percent of an uncontended
    /// pair (`valgrind --tool=callgrind` on `examples/profile_distinct.rs`).
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
            | Outcome::WouldBlock
            | Outcome::Stats(_)
            | Outcome::NextCheck(_) => std::mem::forget(self),
            other => drop_out_of_line(other),
        }
    }
}

/// The sending end, held by handles and guards. The actor runs until every sender is gone.
pub(crate) type RequestSender<K> = run_token::Sender<Owner<K>, Request<K>>;

/// The actor's end.
pub(crate) type RequestReceiver<K> = run_token::Receiver<Owner<K>, Request<K>>;

/// A sender that does not keep the actor alive: the owner's own, to make guards for `ask`s.
pub(crate) type WeakRequestSender<K> = run_token::WeakSender<Owner<K>, Request<K>>;
