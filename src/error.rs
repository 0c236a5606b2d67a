//! The errors of the public API.

use std::fmt;

/// Why a call of [`LockRegistry`](crate::LockRegistry), or an `ask` of one of its
/// [`messages`](crate::messages), failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockError {
    /// The registry has shut down (or its actor stopped): it grants nothing any more.
    Closed,
    /// A kameo [`Acquire`](crate::messages::Acquire) was sent to a shard that does not own
    /// its key; send it to [`LockRegistry::actor_ref_for`](crate::LockRegistry::actor_ref_for).
    WrongShard,
    /// [`LockRegistry::journal`](crate::LockRegistry::journal) was called on a registry with
    /// several shards, each with a journal of its own; read them with
    /// [`journals`](crate::LockRegistry::journals).
    Sharded,
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::Closed => f.write_str("the lock registry is closed"),
            LockError::WrongShard => {
                f.write_str("the key belongs to another shard of the lock registry")
            }
            LockError::Sharded => {
                f.write_str("the lock registry has several shards, each with its own journal")
            }
        }
    }
}

impl std::error::Error for LockError {}

/// Why [`try_lock`](crate::LockRegistry::try_lock) did not take the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TryLockError {
    /// The key is held (or has waiters, who come first).
    WouldBlock,
    /// The registry has shut down (or its actor stopped).
    Closed,
    /// A kameo [`TryAcquire`](crate::messages::TryAcquire) was sent to a shard that does not
    /// own its key; send it to [`LockRegistry::actor_ref_for`](crate::LockRegistry::actor_ref_for).
    WrongShard,
}

impl fmt::Display for TryLockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryLockError::WouldBlock => f.write_str("the key is held"),
            TryLockError::Closed => f.write_str("the lock registry is closed"),
            TryLockError::WrongShard => {
                f.write_str("the key belongs to another shard of the lock registry")
            }
        }
    }
}

impl std::error::Error for TryLockError {}
