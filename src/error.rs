//! The errors of the public API, one type per kind of call, each with only the variants that
//! call can return.

use std::fmt;

/// Why [`lock`](crate::LockRegistry::lock), [`stats`](crate::LockRegistry::stats) or
/// [`journals`](crate::LockRegistry::journals) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockError {
    /// The registry has shut down (or its actor stopped): it grants nothing any more. Besides
    /// [`shutdown`](crate::LockRegistry::shutdown), a shard also closes when a key's `Hash`,
    /// `Eq`, `Clone` or `Debug` panics inside its step (see [`LockKey`](crate::LockKey)).
    Closed,
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::Closed => f.write_str("the lock registry is closed"),
        }
    }
}

impl std::error::Error for LockError {}

/// Why [`try_lock`](crate::LockRegistry::try_lock) did not take the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TryLockError {
    /// The key is held (or has waiters, who come first).
    WouldBlock,
    /// The registry has shut down (or its actor stopped).
    Closed,
}

impl fmt::Display for TryLockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryLockError::WouldBlock => f.write_str("the key is held"),
            TryLockError::Closed => f.write_str("the lock registry is closed"),
        }
    }
}

impl std::error::Error for TryLockError {}

/// Why [`acquire`](crate::LockRegistry::acquire) gave no guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PermitsError {
    /// The request asked for 0 permits or more than a key has; nothing changed.
    OutOfRange {
        /// The permits asked for.
        requested: u32,
        /// The permits each key has ([`RegistryBuilder::capacity`](crate::RegistryBuilder::capacity)).
        capacity: u32,
    },
    /// The registry has shut down (or its actor stopped).
    Closed,
}

impl fmt::Display for PermitsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PermitsError::OutOfRange {
                requested,
                capacity,
            } => write!(
                f,
                "asked for {requested} permits; each key has {capacity}, and a request takes \
                 at least 1"
            ),
            PermitsError::Closed => f.write_str("the lock registry is closed"),
        }
    }
}

impl std::error::Error for PermitsError {}

/// Why [`try_acquire`](crate::LockRegistry::try_acquire) gave no guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TryPermitsError {
    /// Not enough permits are free, or the key has waiters (who come first); nothing changed.
    WouldBlock,
    /// The request asked for 0 permits or more than a key has; nothing changed.
    OutOfRange {
        /// The permits asked for.
        requested: u32,
        /// The permits each key has.
        capacity: u32,
    },
    /// The registry has shut down (or its actor stopped).
    Closed,
}

impl fmt::Display for TryPermitsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryPermitsError::WouldBlock => f.write_str("not enough permits are free"),
            TryPermitsError::OutOfRange {
                requested,
                capacity,
            } => PermitsError::OutOfRange {
                requested: *requested,
                capacity: *capacity,
            }
            .fmt(f),
            TryPermitsError::Closed => f.write_str("the lock registry is closed"),
        }
    }
}

impl std::error::Error for TryPermitsError {}

/// Why [`journal`](crate::LockRegistry::journal) gave no journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JournalError {
    /// The registry has stopped and kept no journal.
    Closed,
    /// The registry has several shards, each with a journal of its own: read them with
    /// [`journals`](crate::LockRegistry::journals).
    Sharded,
}

impl fmt::Display for JournalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JournalError::Closed => f.write_str("the lock registry is closed"),
            JournalError::Sharded => {
                f.write_str("the lock registry has several shards, each with its own journal")
            }
        }
    }
}

impl std::error::Error for JournalError {}

/// Why an `ask` of [`messages::Acquire`](crate::messages::Acquire) gave no guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AcquireError {
    /// The registry has shut down (or its actor stopped).
    Closed,
    /// The message was sent to a shard that does not own its key; send it to
    /// [`LockRegistry::actor_ref_for`](crate::LockRegistry::actor_ref_for).
    WrongShard,
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireError::Closed => f.write_str("the lock registry is closed"),
            AcquireError::WrongShard => {
                f.write_str("the key belongs to another shard of the lock registry")
            }
        }
    }
}

impl std::error::Error for AcquireError {}

/// Why an `ask` of [`messages::TryAcquire`](crate::messages::TryAcquire) gave no guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TryAcquireError {
    /// The key is held (or has waiters, who come first).
    WouldBlock,
    /// The registry has shut down (or its actor stopped).
    Closed,
    /// The message was sent to a shard that does not own its key; send it to
    /// [`LockRegistry::actor_ref_for`](crate::LockRegistry::actor_ref_for).
    WrongShard,
}

impl fmt::Display for TryAcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryAcquireError::WouldBlock => f.write_str("the key is held"),
            TryAcquireError::Closed => f.write_str("the lock registry is closed"),
            TryAcquireError::WrongShard => {
                f.write_str("the key belongs to another shard of the lock registry")
            }
        }
    }
}

impl std::error::Error for TryAcquireError {}
