//! The errors of the public API.

use std::fmt;

/// Why [`lock`](crate::LockRegistry::lock) or [`stats`](crate::LockRegistry::stats) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockError {
    /// The registry has shut down (or its actor stopped): it grants nothing any more.
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

impl From<LockError> for TryLockError {
    fn from(error: LockError) -> Self {
        match error {
            LockError::Closed => TryLockError::Closed,
        }
    }
}
