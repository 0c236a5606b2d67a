//! [`KeyGuard`], the proof of holding a key.

use std::fmt;

use crate::key::LockKey;
use crate::observe::Acquisition;
use crate::runtime::shard::HeldGrant;

/// Holds one key of a [`LockRegistry`](crate::LockRegistry) until dropped.
///
/// Dropping the guard releases the key without awaiting, so it is safe in `Drop`, during a
/// panic's unwinding and when the holding task is aborted: in the default mode the drop runs
/// the release itself and wakes the next waiter; in actor mode it queues the release for the
/// actor task. Either way the release takes effect before any request that the same task (or
/// anything that happens after the drop) sends to the registry.
///
/// A guard keeps its registry alive: the registry stops by itself only once every handle and
/// every guard is gone. A guard that outlives a [`shutdown`](crate::LockRegistry::shutdown)
/// drops quietly.
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
pub struct KeyGuard<K: LockKey> {
    key: K,
    fencing_token: u64,
    /// Dropped with the guard, which releases the key.
    _held: HeldGrant<K>,
    /// Reports the release to the acquisition's span (and metrics) after `_held` released:
    /// fields drop in order.
    _acquisition: Acquisition,
}

impl<K: LockKey> KeyGuard<K> {
    pub(crate) fn new(
        key: K,
        fencing_token: u64,
        held: HeldGrant<K>,
        acquisition: Acquisition,
    ) -> Self {
        KeyGuard {
            key,
            fencing_token,
            _held: held,
            _acquisition: acquisition,
        }
    }

    /// The key this guard holds.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keyed_locks::LockError> {
    /// let registry = keyed_locks::LockRegistry::spawn();
    /// let guard = registry.lock("user:42").await?;
    /// assert_eq!(*guard.key(), "user:42");
    /// # Ok(())
    /// # }
    /// ```
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The fencing token of this grant: strictly greater than the token of every earlier grant
    /// of the same key, and never handed out twice by one registry. With one shard (the
    /// default), greater than every earlier grant of the registry, whatever the key, starting
    /// at 1.
    ///
    /// Pass it to the resource you protect and have the resource refuse tokens lower than the
    /// highest it has seen: that keeps a holder that was paused past its turn from writing.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keyed_locks::LockError> {
    /// let registry = keyed_locks::LockRegistry::spawn();
    /// let first = registry.lock(1).await?.fencing_token();
    /// let second = registry.lock(1).await?.fencing_token();
    /// assert!(second > first);
    /// # Ok(())
    /// # }
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }
}

impl<K: LockKey> fmt::Debug for KeyGuard<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyGuard")
            .field("key", &self.key)
            .field("fencing_token", &self.fencing_token)
            .finish_non_exhaustive()
    }
}
