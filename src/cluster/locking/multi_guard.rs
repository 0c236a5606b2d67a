//! [`ClusterMultiGuard`], the proof of holding a set of keys across the cluster.

use std::fmt;
use std::future::Future;

use crate::cluster::locking::guard::until_lost;
use crate::cluster::locking::leases::{Interest, OwnedLease};
use crate::key::LockKey;
use crate::multi_guard::MultiGuard;

/// Holds every key of a [`ClusterRegistry::lock_all`](crate::ClusterRegistry::lock_all): the
/// local locks and a whole lease per key, until dropped.
///
/// The leases were taken in one statement, all of them or none, and each has a fence of its
/// own: [`fencing_token`](Self::fencing_token) per key. Dropping the guard gives the leases
/// back, in tasks of their own, then releases the local locks.
#[must_use = "if unused the locks are released at once"]
#[clippy::has_significant_drop]
pub struct ClusterMultiGuard<K: LockKey + fmt::Display> {
    // Field order is drop order: the leases go back first, then the local locks, then the
    // process's interest in the keys.
    /// The leases, one per key name, sorted by name.
    leases: Vec<OwnedLease>,
    /// The names of the leases, in the same order.
    names: Vec<String>,
    local: MultiGuard<K>,
    _interests: Vec<Interest>,
}

impl<K: LockKey + fmt::Display> ClusterMultiGuard<K> {
    pub(crate) fn new(
        local: MultiGuard<K>,
        names: Vec<String>,
        leases: Vec<OwnedLease>,
        interests: Vec<Interest>,
    ) -> Self {
        debug_assert_eq!(names.len(), leases.len(), "one lease per key name");
        ClusterMultiGuard {
            leases,
            names,
            local,
            _interests: interests,
        }
    }

    /// Every key held, each once.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.local.keys()
    }

    /// How many keys are held.
    pub fn len(&self) -> usize {
        self.local.len()
    }

    /// Whether no key is held: the guard of an empty set.
    pub fn is_empty(&self) -> bool {
        self.local.is_empty()
    }

    /// The fencing token of `key`'s lease, or `None` if this guard does not hold it: strictly
    /// greater than every earlier token of the key, in any process sharing the lease table,
    /// as [`ClusterGuard::fencing_token`](crate::ClusterGuard::fencing_token). Each key has
    /// its own.
    pub fn fencing_token(&self, key: &K) -> Option<u64> {
        let name = key.to_string();
        let at = self.names.binary_search(&name).ok()?;
        self.leases.get(at).map(OwnedLease::fencing_token)
    }

    /// Whether the lease of any of the keys is lost (see
    /// [`ClusterGuard::is_lost`](crate::ClusterGuard::is_lost)): then another process may
    /// hold that key now, and the resource's fencing check is what keeps this holder's
    /// writes out.
    pub fn is_lost(&self) -> bool {
        self.leases
            .iter()
            .any(|lease| lease.validity.borrow().is_lost())
    }

    /// Completes when the lease of any of the keys is lost (at once if one is already; never
    /// for an empty set). Use it to stop work that no longer holds every key, for example in
    /// a `select!` beside the work.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping it changes nothing, and a later call sees the same state.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .connect()
    ///     .await?;
    /// let both = registry.lock_all(["a".to_string(), "b".to_string()]).await?;
    /// tokio::select! {
    ///     () = both.lost() => println!("a lease was lost: stop"),
    ///     () = tokio::time::sleep(std::time::Duration::from_millis(10)) => println!("done"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn lost(&self) {
        let mut each: Vec<_> = self
            .leases
            .iter()
            .map(|lease| Box::pin(until_lost(lease.validity.clone())))
            .collect();
        if each.is_empty() {
            return std::future::pending().await;
        }
        std::future::poll_fn(|cx| {
            if each
                .iter_mut()
                .any(|lost| lost.as_mut().poll(cx).is_ready())
            {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
    }
}

impl<K: LockKey + fmt::Display> fmt::Debug for ClusterMultiGuard<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tokens: Vec<(&str, u64)> = self
            .names
            .iter()
            .zip(&self.leases)
            .map(|(name, lease)| (name.as_str(), lease.fencing_token()))
            .collect();
        f.debug_struct("ClusterMultiGuard")
            .field("fencing_tokens", &tokens)
            .field("lost", &self.is_lost())
            .finish()
    }
}
