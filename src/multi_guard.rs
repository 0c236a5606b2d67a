//! [`MultiGuard`], the proof of holding several keys at once.

use std::fmt;

use crate::key::LockKey;
use crate::observe::Acquisition;
use crate::runtime::shard::HeldGrant;

/// Holds every key of a [`lock_all`](crate::LockRegistry::lock_all) or
/// [`try_lock_all`](crate::LockRegistry::try_lock_all) until dropped, then releases them all.
///
/// The keys of one registry shard are granted together, as one grant with one fencing token;
/// a registry with several [`shards`](crate::RegistryBuilder::shards) grants each shard's keys
/// separately, so keys of different shards may carry different tokens. Dropping the guard
/// releases every key without awaiting, as dropping a [`KeyGuard`](crate::KeyGuard) does.
#[must_use = "if unused the keys are released at once"]
#[clippy::has_significant_drop]
pub struct MultiGuard<K: LockKey> {
    /// One per shard whose keys it holds, in shard order.
    grants: Vec<ShardGrant<K>>,
    /// Reports the release to the call's span (and metrics) after `grants` released.
    acquisition: Acquisition,
}

/// The keys one shard granted to a multi-key request, with their token.
struct ShardGrant<K: LockKey> {
    keys: Vec<K>,
    fencing_token: u64,
    /// Dropped with the guard, which releases the keys.
    _held: HeldGrant<K>,
}

impl<K: LockKey> MultiGuard<K> {
    /// A guard of no keys, until [`push`](Self::push) adds some.
    pub(crate) fn new() -> Self {
        MultiGuard {
            grants: Vec::new(),
            acquisition: Acquisition::default(),
        }
    }

    /// This guard, reporting its release to `acquisition`.
    pub(crate) fn observed(mut self, acquisition: Acquisition) -> Self {
        self.acquisition = acquisition;
        self
    }

    /// The token of the first shard's grant; `None` for an empty set.
    pub(crate) fn first_fencing_token(&self) -> Option<u64> {
        self.grants.first().map(|grant| grant.fencing_token)
    }

    /// Adds the `keys` one shard granted under `fencing_token`, held by `held`.
    pub(crate) fn push(&mut self, keys: Vec<K>, fencing_token: u64, held: HeldGrant<K>) {
        self.grants.push(ShardGrant {
            keys,
            fencing_token,
            _held: held,
        });
    }

    /// Every key held, each once.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keyed_locks::LockError> {
    /// let registry = keyed_locks::LockRegistry::spawn();
    /// let guard = registry.lock_all(["from", "to", "from"]).await?;
    /// let mut keys: Vec<&str> = guard.keys().copied().collect();
    /// keys.sort();
    /// assert_eq!(keys, ["from", "to"]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.grants.iter().flat_map(|grant| grant.keys.iter())
    }

    /// How many keys are held.
    pub fn len(&self) -> usize {
        self.grants.iter().map(|grant| grant.keys.len()).sum()
    }

    /// Whether no key is held: the guard of an empty set.
    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }

    /// The fencing token of the grant that holds `key`, or `None` if this guard does not hold
    /// it. Strictly greater than the token of every earlier grant of `key` (and, as for a
    /// [`KeyGuard`](crate::KeyGuard), of every earlier grant of its shard); keys of one shard
    /// share their token.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keyed_locks::LockError> {
    /// let registry = keyed_locks::LockRegistry::spawn();
    /// let before = registry.lock(1u64).await?.fencing_token();
    /// let guard = registry.lock_all([1, 2]).await?;
    /// assert!(guard.fencing_token(&1) > Some(before));
    /// assert_eq!(guard.fencing_token(&1), guard.fencing_token(&2)); // one shard, one grant
    /// assert_eq!(guard.fencing_token(&3), None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn fencing_token(&self, key: &K) -> Option<u64> {
        self.grants
            .iter()
            .find(|grant| grant.keys.contains(key))
            .map(|grant| grant.fencing_token)
    }
}

impl<K: LockKey> fmt::Debug for MultiGuard<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let grants: Vec<(&[K], u64)> = self
            .grants
            .iter()
            .map(|grant| (grant.keys.as_slice(), grant.fencing_token))
            .collect();
        f.debug_struct("MultiGuard")
            .field("grants", &grants)
            .finish()
    }
}
