//! [`LockRegistry`], the cloneable handle.

use std::fmt;
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;

use kameo::actor::{ActorRef, Spawn};
use kameo::mailbox;

use crate::error::{JournalError, LockError, PermitsError, TryLockError, TryPermitsError};
use crate::guard::KeyGuard;
use crate::key::LockKey;
use crate::messages::actor::{RegistryActor, RegistryConfig};
use crate::multi_guard::MultiGuard;
use crate::observe::{Acquisition, CallKind};
use crate::pure::journal::Journal;
use crate::pure::snapshot::{self, KeySnapshot};
use crate::pure::stats::RegistryStats;
use crate::pure::table::{KeySet, Permits};
use crate::runtime::metrics::Histograms;
use crate::runtime::owner::{Owner, OwnerConfig};
use crate::runtime::pending::{Granted, NotGranted};
use crate::runtime::request::{Delivery, Outcome, Request};
use crate::runtime::router::ShardRouter;
use crate::runtime::shard::{GrantFuture, HeldGrant, Shard};
use crate::runtime::stall;

pub(crate) mod builder;
mod lock_future;

use builder::{RegistryBuilder, RegistrySettings};
use lock_future::LockFuture;

/// A registry of per-key async locks: the handle to its shard (or, when built with
/// [`RegistryBuilder::shards`], its shards, each owning the keys that hash to it), where each
/// call runs its step or, in actor mode, queues it for the shard's actor task.
///
/// Cloning is cheap (a reference count) and every clone talks to the same registry. The
/// registry stops by itself once every handle and every [`KeyGuard`] is gone, or at once on
/// [`shutdown`](Self::shutdown).
///
/// # Fairness
///
/// Strict FIFO per key, in order of arrival at the registry: a waiter is granted only after
/// every earlier waiter for the same key was granted or gave up, and a new request never
/// overtakes a queued one. Requests sent one after the other by one task arrive in that order.
/// Requests of different tasks arrive in the order the registry receives them, which the
/// tokio scheduler decides.
///
/// # Examples
///
/// ```
/// use keyed_locks::LockRegistry;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), keyed_locks::LockError> {
/// let registry = LockRegistry::spawn();
/// {
///     let _guard = registry.lock("account:7").await?;
///     // ... the only task working on account 7 ...
/// }
/// assert_eq!(registry.stats().await?.keys, 0);
/// # Ok(())
/// # }
/// ```
pub struct LockRegistry<K: LockKey> {
    /// One per shard, in shard order; shared by every clone of the handle.
    shards: Arc<[ShardHandle<K>]>,
    router: ShardRouter,
    /// Permits per key ([`RegistryBuilder::capacity`]).
    capacity: NonZeroU32,
    /// The wait and hold histograms of the `metrics` feature; nothing without it.
    histograms: Histograms,
}

/// The handle's end of one shard: the shard itself, and its actor.
struct ShardHandle<K: LockKey> {
    shard: Arc<Shard<K>>,
    actor_ref: ActorRef<RegistryActor<K>>,
}

impl<K: LockKey> LockRegistry<K> {
    /// Spawns a registry with default settings on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, as [`tokio::spawn`] does.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let registry = keyed_locks::LockRegistry::<String>::spawn();
    /// # }
    /// ```
    #[must_use = "a registry stops once every handle and guard is gone"]
    pub fn spawn() -> Self {
        Self::builder().spawn()
    }

    /// A builder for a registry with non-default settings.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let registry = keyed_locks::LockRegistry::<u64>::builder().spawn();
    /// # }
    /// ```
    #[must_use = "a builder does nothing until `spawn`"]
    pub fn builder() -> RegistryBuilder<K> {
        RegistryBuilder::new()
    }

    /// Waits for `key` and returns a guard that holds it until dropped.
    ///
    /// Waiters of one key are granted in FIFO order (see [Fairness](Self#fairness)); distinct
    /// keys never wait for each other.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. Dropping the future at any point (a `timeout`, a losing `select!` branch,
    /// an aborted task) withdraws the request: if it was queued it leaves the queue at once,
    /// and if the key was granted to it but not yet received, the key is released and passes
    /// to the next waiter. No entry is left behind and the key is never stuck. The future
    /// keeps its place in the queue across polls.
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] if the registry has shut down or stops while this call waits.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_locks::LockRegistry;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keyed_locks::LockError> {
    /// let registry = LockRegistry::spawn();
    /// let guard = registry.lock(42u64).await?;
    ///
    /// // A second caller waits; here it gives up after 10 ms, leaving nothing behind.
    /// let second = tokio::time::timeout(Duration::from_millis(10), registry.lock(42)).await;
    /// assert!(second.is_err());
    ///
    /// drop(guard);
    /// assert_eq!(registry.stats().await?.keys, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock(&self, key: K) -> impl Future<Output = Result<KeyGuard<K>, LockError>> + '_ {
        self.lock_permits(key, None, CallKind::Lock)
    }

    /// Waits for one of `key`'s permits and returns a guard that holds it until dropped:
    /// a shared (read) lock. Up to [`capacity`](RegistryBuilder::capacity) shared holders hold
    /// a key at once, and an exclusive [`lock`](Self::lock) waits until they are all gone.
    ///
    /// Strict FIFO across modes: a queued `lock` holds back every `lock_shared` that arrives
    /// after it, so a stream of readers cannot starve a writer. With the default capacity of
    /// one permit per key, a shared lock is exclusive.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] if the registry has shut down, or shuts down while this waits.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::LockRegistry::builder()
    ///     .capacity(NonZeroU32::new(8).ok_or("no permits")?)
    ///     .spawn();
    /// let reader = registry.lock_shared("balance:7").await?;
    /// let another = registry.lock_shared("balance:7").await?;
    /// // A writer waits for both readers.
    /// let writer = tokio::time::timeout(Duration::from_millis(10), registry.lock("balance:7"));
    /// assert!(writer.await.is_err());
    /// drop((reader, another));
    /// let _writer = registry.lock("balance:7").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_shared(&self, key: K) -> impl Future<Output = Result<KeyGuard<K>, LockError>> + '_ {
        self.lock_permits(key, Some(Permits(NonZeroU32::MIN)), CallKind::LockShared)
    }

    /// Waits for `permits` of `key`'s permits and returns a guard that holds them until
    /// dropped: a semaphore per key, for "at most N at once per user".
    ///
    /// Strict FIFO: a request for many permits is not overtaken by later smaller ones; if it
    /// gives up, the smaller ones behind it that now fit are granted at once.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    ///
    /// # Errors
    ///
    /// [`PermitsError::OutOfRange`] if `permits` is 0 or above the
    /// [`capacity`](RegistryBuilder::capacity) (nothing changes);
    /// [`PermitsError::Closed`] if the registry has shut down.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use keyed_locks::PermitsError;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::LockRegistry::builder()
    ///     .capacity(NonZeroU32::new(3).ok_or("no permits")?)
    ///     .spawn();
    /// let two = registry.acquire("user:1", 2).await?;
    /// let one = registry.acquire("user:1", 1).await?;
    /// assert_eq!(registry.stats().await?.permits, 3);
    /// assert_eq!(
    ///     registry.acquire("user:1", 4).await.unwrap_err(),
    ///     PermitsError::OutOfRange { requested: 4, capacity: 3 }
    /// );
    /// # drop((two, one));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire(&self, key: K, permits: u32) -> Result<KeyGuard<K>, PermitsError> {
        let permits = self
            .checked_permits(permits)
            .map_err(|(requested, capacity)| PermitsError::OutOfRange {
                requested,
                capacity,
            })?;
        self.lock_permits(key, Some(permits), CallKind::Acquire)
            .await
            .map_err(|LockError::Closed| PermitsError::Closed)
    }

    /// Permits per key ([`RegistryBuilder::capacity`]); cluster mode's lock path reads it.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn capacity(&self) -> NonZeroU32 {
        self.capacity
    }

    /// `permits` as the table takes them, or (requested, capacity) if out of range.
    fn checked_permits(&self, permits: u32) -> Result<Permits, (u32, u32)> {
        NonZeroU32::new(permits)
            .filter(|permits| *permits <= self.capacity)
            .map(Permits)
            .ok_or((permits, self.capacity.get()))
    }

    /// Waits for `permits` of `key` (`None`: all of them) and returns the guard.
    #[inline]
    fn lock_permits(&self, key: K, permits: Option<Permits>, call: CallKind) -> LockFuture<'_, K> {
        LockFuture::new(self, key, permits, call)
    }

    /// Takes `key` if it is free right now, without waiting.
    ///
    /// A key with waiters is not free: they come first.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. If the future is dropped after the registry granted the key, the guard
    /// that nobody receives is dropped and releases the key at once; either way no entry is
    /// left behind.
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] if the key is held or has waiters (nothing changes),
    /// [`TryLockError::Closed`] if the registry has shut down.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::{LockRegistry, TryLockError};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), TryLockError> {
    /// let registry = LockRegistry::spawn();
    /// let guard = registry.try_lock("job:9").await?;
    /// assert_eq!(registry.try_lock("job:9").await.unwrap_err(), TryLockError::WouldBlock);
    /// drop(guard);
    /// assert!(registry.try_lock("job:9").await.is_ok());
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_lock(&self, key: K) -> impl Future<Output = Result<KeyGuard<K>, TryLockError>> + '_ {
        self.try_lock_permits(key, None, CallKind::TryLock)
    }

    /// Takes one of `key`'s permits (a shared lock, see [`lock_shared`](Self::lock_shared))
    /// if one is free right now and nobody waits for the key, without waiting.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`try_lock`](Self::try_lock).
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] if no permit is free or the key has waiters (nothing
    /// changes), [`TryLockError::Closed`] if the registry has shut down.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use keyed_locks::TryLockError;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::LockRegistry::builder()
    ///     .capacity(NonZeroU32::new(2).ok_or("no permits")?)
    ///     .spawn();
    /// let writer = registry.lock("k").await?;
    /// assert_eq!(registry.try_lock_shared("k").await.unwrap_err(), TryLockError::WouldBlock);
    /// drop(writer);
    /// let _reader = registry.try_lock_shared("k").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_lock_shared(
        &self,
        key: K,
    ) -> impl Future<Output = Result<KeyGuard<K>, TryLockError>> + '_ {
        self.try_lock_permits(key, Some(Permits(NonZeroU32::MIN)), CallKind::TryLockShared)
    }

    /// Takes `permits` of `key`'s permits if they are free right now and nobody waits for the
    /// key, without waiting.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`try_lock`](Self::try_lock).
    ///
    /// # Errors
    ///
    /// [`TryPermitsError::OutOfRange`] if `permits` is 0 or above the capacity,
    /// [`TryPermitsError::WouldBlock`] if they are not free or the key has waiters (nothing
    /// changes either way), [`TryPermitsError::Closed`] if the registry has shut down.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use keyed_locks::TryPermitsError;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::LockRegistry::builder()
    ///     .capacity(NonZeroU32::new(3).ok_or("no permits")?)
    ///     .spawn();
    /// let _two = registry.try_acquire("user:1", 2).await?;
    /// assert_eq!(registry.try_acquire("user:1", 2).await.unwrap_err(), TryPermitsError::WouldBlock);
    /// let _one = registry.try_acquire("user:1", 1).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_acquire(&self, key: K, permits: u32) -> Result<KeyGuard<K>, TryPermitsError> {
        let permits = self
            .checked_permits(permits)
            .map_err(|(requested, capacity)| TryPermitsError::OutOfRange {
                requested,
                capacity,
            })?;
        self.try_lock_permits(key, Some(permits), CallKind::TryAcquire)
            .await
            .map_err(|error| match error {
                TryLockError::WouldBlock => TryPermitsError::WouldBlock,
                TryLockError::Closed => TryPermitsError::Closed,
            })
    }

    /// Takes `permits` of `key` (`None`: all of them) if free, and returns the guard.
    async fn try_lock_permits(
        &self,
        key: K,
        permits: Option<Permits>,
        call: CallKind,
    ) -> Result<KeyGuard<K>, TryLockError> {
        let acquisition =
            Acquisition::start(call, &key, permits.map(|p| p.get()), &self.histograms);
        let shard = self.shard_for(&key);
        let request = Request::TryAcquire {
            key: key.clone(),
            permits: permits.unwrap_or(Permits(self.capacity)),
            delivery: Delivery::Caller,
        };
        match GrantFuture::new(&shard.shard, request).await {
            Ok(granted) => Ok(shard.guard(key, granted, acquisition)),
            Err(not_granted) => Err(refused(acquisition, not_granted)),
        }
    }

    /// Waits for every key of `keys` and returns a guard that holds them all, exclusively,
    /// until dropped: for work on several keys at once, such as a transfer between two
    /// accounts. It never deadlocks, whatever order callers list the keys in.
    ///
    /// Duplicates count once, and an empty set is granted at once. The request takes its
    /// place in the queue of each of its keys in one step of the registry and is granted when
    /// it is first in all of them, so FIFO holds on each key as for [`lock`](Self::lock), and
    /// requests cannot wait for each other in a cycle: the earliest waiting request waits
    /// only for holders. While it waits, its keys are not held, but later requests for them
    /// queue behind it.
    ///
    /// With [`shards`](RegistryBuilder::shards), each shard's keys are taken in one step of
    /// that shard, shard after shard in ascending order, and the keys of earlier shards are
    /// held while later ones are awaited. Every multi-key request follows the same order, so
    /// this is deadlock-free too.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. Dropping the future at any point withdraws the request from every queue
    /// it is in, in one step, and releases whatever was already granted to it (the keys of
    /// earlier shards, or a grant in flight). No entry is left behind and no key is stuck.
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] if the registry has shut down, or shuts down while this waits;
    /// any keys already granted are released.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keyed_locks::LockError> {
    /// let registry = keyed_locks::LockRegistry::spawn();
    /// let transfer = registry.lock_all(["account:1", "account:2"]).await?;
    /// // Listing the keys the other way round waits; it cannot deadlock.
    /// let reverse = registry.lock_all(["account:2", "account:1"]);
    /// assert!(tokio::time::timeout(Duration::from_millis(10), reverse).await.is_err());
    /// drop(transfer);
    /// assert_eq!(registry.lock_all(["account:2", "account:1"]).await?.len(), 2);
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_all(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> impl Future<Output = Result<MultiGuard<K>, LockError>> + '_ {
        // Split now, so that the future does not keep the caller's iterator (which need not
        // be `Send`).
        let keys_by_shard = self.keys_by_shard(keys);
        async move {
            // A waiting request ends only in a grant or a close.
            self.take_keys_by_shard(keys_by_shard, Wait::Yes)
                .await
                .map_err(|_| LockError::Closed)
        }
    }

    /// Takes every key of `keys` if all are free right now, without waiting: all of them or
    /// none. Duplicates count once, and an empty set is granted at once.
    ///
    /// A key with waiters is not free: they come first. With
    /// [`shards`](RegistryBuilder::shards), each shard's keys are tried in one step, shard
    /// after shard; if a later shard's keys are taken, the earlier ones are released before
    /// this returns, so another request may have seen them held for that moment.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, whatever was granted to it is released and no
    /// entry is left behind.
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] if any key is held or has waiters (nothing is held then),
    /// [`TryLockError::Closed`] if the registry has shut down.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::TryLockError;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), TryLockError> {
    /// let registry = keyed_locks::LockRegistry::spawn();
    /// let one = registry.try_lock(1).await?;
    /// assert_eq!(registry.try_lock_all([1, 2]).await.unwrap_err(), TryLockError::WouldBlock);
    /// drop(one);
    /// let both = registry.try_lock_all([1, 2]).await?;
    /// assert_eq!(both.len(), 2);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_lock_all(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> impl Future<Output = Result<MultiGuard<K>, TryLockError>> + '_ {
        let keys_by_shard = self.keys_by_shard(keys);
        self.take_keys_by_shard(keys_by_shard, Wait::No)
    }

    /// Takes each shard's keys in turn, in the order given, waiting for them or not; on an
    /// error, what was taken is released as the guard under construction drops.
    async fn take_keys_by_shard(
        &self,
        keys_by_shard: Vec<(usize, KeySet<K>)>,
        wait: Wait,
    ) -> Result<MultiGuard<K>, TryLockError> {
        let call = match wait {
            Wait::Yes => CallKind::LockAll,
            Wait::No => CallKind::TryLockAll,
        };
        let mut acquisition =
            Acquisition::start(call, &KeysOf(&keys_by_shard), None, &self.histograms);
        // An empty set asks no shard, so no shard can refuse it: ask whether they are closed,
        // so that after a shutdown every call gets `Closed`, this one too.
        if keys_by_shard.is_empty() && self.is_closed() {
            return Err(refused(acquisition, NotGranted::Closed));
        }
        let mut guard = MultiGuard::new();
        for (shard, keys) in keys_by_shard {
            let shard = &self.shards[shard];
            let keys_held = keys.as_slice().to_vec();
            let request = match wait {
                Wait::Yes => Request::AcquireAll {
                    keys,
                    delivery: Delivery::Caller,
                },
                Wait::No => Request::TryAcquireAll {
                    keys,
                    delivery: Delivery::Caller,
                },
            };
            let granted = match GrantFuture::new(&shard.shard, request).await {
                Ok(granted) => granted,
                Err(not_granted) => return Err(refused(acquisition, not_granted)),
            };
            guard.push(keys_held, granted.fencing_token, shard.held(granted));
        }
        // One span for the whole call, granted once every shard has granted; it reports the
        // first shard's token.
        acquisition.granted(guard.first_fencing_token().unwrap_or(0));
        Ok(guard.observed(acquisition))
    }

    /// The distinct keys of `keys`, split by the shard that owns them, in ascending shard
    /// order: the one order every multi-key request takes shards in.
    fn keys_by_shard(&self, keys: impl IntoIterator<Item = K>) -> Vec<(usize, KeySet<K>)> {
        let Some(keys) = KeySet::new(keys) else {
            return Vec::new();
        };
        if self.shards.len() == 1 {
            return vec![(0, keys)];
        }
        let mut by_shard: Vec<Vec<K>> = vec![Vec::new(); self.shards.len()];
        for key in keys.into_vec() {
            by_shard[self.router.shard_of(&key)].push(key);
        }
        by_shard
            .into_iter()
            .enumerate()
            .filter_map(|(shard, keys)| Some((shard, KeySet::new(keys)?)))
            .collect()
    }

    /// The registry's counts, taken after every request sent before this one. With several
    /// shards, the sum of every shard's counts, each taken when that shard answers.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] if the registry has shut down.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keyed_locks::LockError> {
    /// let registry = keyed_locks::LockRegistry::spawn();
    /// let guard = registry.lock("a").await?;
    /// let stats = registry.stats().await?;
    /// assert_eq!((stats.keys, stats.held, stats.waiting), (1, 1, 0));
    /// drop(guard);
    /// assert_eq!(registry.stats().await?.keys, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn stats(&self) -> Result<RegistryStats, LockError> {
        let mut total = RegistryStats::default();
        for shard in self.shards.iter() {
            total.add(
                shard
                    .shard
                    .ask(
                        |reply| Request::Stats { reply },
                        |outcome| match outcome {
                            Outcome::Stats(stats) => Some(stats),
                            _ => None,
                        },
                    )
                    .await
                    .ok_or(LockError::Closed)?,
            );
        }
        Ok(total)
    }

    /// Every key held or waited for, with its holders (fencing token, permits, how long held)
    /// and its waiters (how many, what the first asks for, how long it has waited), the most
    /// contended first.
    ///
    /// Each shard is viewed in one step, after every request sent to it before this call:
    /// a shard's keys are as they were at one instant, and shards are viewed one after the
    /// other. A shard waits while its view is built, one pass over its keys and holders
    /// (`docs/performance-log.md` has the figures); on a large registry,
    /// [`snapshot_top`](Self::snapshot_top) returns less but pauses each shard as long. Durations are bounds ([`DurationBounds`](crate::DurationBounds)):
    /// no clock is read on a lock's way, so each shard dates grants and arrivals by time marks,
    /// taken at its start, at each snapshot and every 256 arrivals.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] if the registry has shut down: a closed registry holds nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::KeyHold;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keyed_locks::LockError> {
    /// let registry = keyed_locks::LockRegistry::spawn();
    /// let guard = registry.lock("a").await?;
    /// let view = registry.snapshot().await?;
    /// assert_eq!(view.len(), 1);
    /// assert_eq!((view[0].key, view[0].hold, view[0].waiters), ("a", KeyHold::Exclusive, 0));
    /// assert_eq!(view[0].holders[0].fencing_token, guard.fencing_token());
    /// drop(guard);
    /// assert!(registry.snapshot().await?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn snapshot(&self) -> Result<Vec<KeySnapshot<K>>, LockError> {
        self.views(None).await
    }

    /// The `n` most contended keys of [`snapshot`](Self::snapshot): most waiters first, then
    /// held longest, then waited for longest.
    ///
    /// Each shard picks its own first `n` in its step and clones only those keys; the shards'
    /// lists are merged. The pause of each shard is still one pass over its keys and holders.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] if the registry has shut down.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keyed_locks::LockError> {
    /// let registry = keyed_locks::LockRegistry::spawn();
    /// let _quiet = registry.lock("quiet").await?;
    /// let _busy = registry.lock("busy").await?;
    /// let waiter = registry.lock("busy");
    /// tokio::pin!(waiter);
    /// assert!(futures::poll!(waiter.as_mut()).is_pending());
    /// let top = registry.snapshot_top(1).await?;
    /// assert_eq!((top.len(), top[0].key, top[0].waiters), (1, "busy", 1));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn snapshot_top(&self, n: usize) -> Result<Vec<KeySnapshot<K>>, LockError> {
        self.views(Some(n)).await
    }

    /// Every shard's view of its first `limit` keys, merged.
    async fn views(&self, limit: Option<usize>) -> Result<Vec<KeySnapshot<K>>, LockError> {
        let mut shards = Vec::with_capacity(self.shards.len());
        for shard in self.shards.iter() {
            shards.push(
                shard
                    .shard
                    .ask(
                        |reply| Request::Snapshot { limit, reply },
                        |outcome| match outcome {
                            Outcome::Snapshot(views) => Some(views),
                            _ => None,
                        },
                    )
                    .await
                    .ok_or(LockError::Closed)?,
            );
        }
        Ok(snapshot::merge(shards, limit))
    }

    /// A snapshot of the journal: every table input and output so far, oldest first, up to
    /// the capacity set with [`RegistryBuilder::journal`]. Empty if the registry was built
    /// without a journal.
    ///
    /// The snapshot is taken after every request sent before this call. Once the registry has
    /// stopped, this returns the journal as it was at the stop, `shutdown` included.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    ///
    /// [`JournalError::Closed`] if the registry has stopped and kept no journal;
    /// [`JournalError::Sharded`] if it has several shards (read them with
    /// [`journals`](Self::journals)).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::journal::JournalEvent;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::LockRegistry::builder().journal(1_000).spawn();
    /// drop(registry.lock("k").await?);
    /// let journal = registry.journal().await?;
    /// assert!(matches!(journal.entries[0].event, JournalEvent::Acquire { key: "k", .. }));
    /// assert_eq!(journal.entries.len(), 3); // acquire, grant, release
    /// # Ok(())
    /// # }
    /// ```
    pub async fn journal(&self) -> Result<Journal<K>, JournalError> {
        match &*self.shards {
            [shard] => shard
                .journal()
                .await
                .map_err(|LockError::Closed| JournalError::Closed),
            _ => Err(JournalError::Sharded),
        }
    }

    /// Records a note (what cluster mode did with a lease) in the journal of the first shard,
    /// in order with the table's events. Never waits. A note belongs to no shard and does not
    /// change any table, so one shard's journal is as good as another's.
    #[cfg(feature = "postgres")]
    pub(crate) fn note(&self, text: String) {
        // Comes to nothing only when the registry has closed: its journal ends at the close.
        self.shards[0].shard.note(text);
    }

    /// The journal of every shard, in shard order; one journal for a registry with one shard.
    ///
    /// Each shard owns a table of its own, so each journal replays on its own
    /// ([`replay`](crate::replay)). A shard's journal shows its table's fencing tokens, 1, 2,
    /// 3, ...; the guards of shard `i` of `n` show `(t - 1) * n + i + 1` for table token `t`.
    /// Each snapshot is taken after every request sent to that shard before this call.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] if a shard has stopped and kept no journal.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::LockRegistry::builder()
    ///     .shards(NonZeroUsize::new(2).unwrap())
    ///     .journal(1_000)
    ///     .spawn();
    /// for key in 0..10u32 {
    ///     drop(registry.lock(key).await?);
    /// }
    /// let journals = registry.journals().await?;
    /// assert_eq!(journals.len(), 2);
    /// for journal in &journals {
    ///     keyed_locks::replay::verify(journal)?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn journals(&self) -> Result<Vec<Journal<K>>, LockError> {
        let mut journals = Vec::with_capacity(self.shards.len());
        for shard in self.shards.iter() {
            journals.push(shard.journal().await?);
        }
        Ok(journals)
    }

    /// Stops the registry and returns once its actor has stopped.
    ///
    /// Requests sent before the shutdown are handled first; then every waiter gets
    /// [`LockError::Closed`], and so does every later call on any handle. Guards still out
    /// stay valid values and can be dropped at any time. Calling it again is harmless.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: once the first poll has begun the shutdown, the registry stops whether or
    /// not the future is polled again.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::{LockError, LockRegistry};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let registry = LockRegistry::spawn();
    /// let guard = registry.lock(1).await.unwrap();
    /// registry.shutdown().await;
    /// assert_eq!(registry.lock(2).await.unwrap_err(), LockError::Closed);
    /// drop(guard);
    /// # }
    /// ```
    pub async fn shutdown(&self) {
        // Closed first, each under its lock: from here on every call finds its shard closed,
        // whoever else is calling, and every waiter has its `Closed`.
        for shard in self.shards.iter() {
            shard.shard.close();
        }
        for shard in self.shards.iter() {
            // Fails only if the actor has stopped already, which is what we want anyway.
            let _ = shard.actor_ref.stop_gracefully().await;
        }
        for shard in self.shards.iter() {
            shard.actor_ref.wait_for_shutdown().await;
        }
    }

    /// Whether the registry has stopped (or is stopping) and will grant nothing more. With
    /// several shards: whether any of them has, since its keys can no longer be locked.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let registry = keyed_locks::LockRegistry::<u8>::spawn();
    /// assert!(!registry.is_closed());
    /// registry.shutdown().await;
    /// assert!(registry.is_closed());
    /// # }
    /// ```
    pub fn is_closed(&self) -> bool {
        self.shards
            .iter()
            .any(|shard| shard.shard.is_closed() || !shard.actor_ref.is_alive())
    }

    /// How many actors share the keys: 1 unless built with [`RegistryBuilder::shards`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// assert_eq!(keyed_locks::LockRegistry::<u8>::spawn().shards(), 1);
    /// # }
    /// ```
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// The registry actor, for sending it [`messages`](crate::messages) with kameo directly;
    /// `None` if the registry has several shards, whose actors each own only some keys: send
    /// [`Acquire`](crate::messages::Acquire) and [`TryAcquire`](crate::messages::TryAcquire)
    /// to [`actor_ref_for`](Self::actor_ref_for) the key, and other messages to each of
    /// [`actor_refs`](Self::actor_refs).
    ///
    /// kameo's `ActorRef` is part of this crate's API: the registry is built on kameo 0.22.
    /// A clone of it does not keep the registry running on its own: the registry stops once
    /// every [`LockRegistry`] handle and every guard is gone, and messages sent after that fail
    /// with kameo's `ActorNotRunning`. Keep a handle for as long as you send messages.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::messages::GetStats;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::LockRegistry::<u64>::spawn();
    /// let actor = registry.actor_ref().expect("one shard");
    /// assert_eq!(actor.ask(GetStats).await?.keys, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn actor_ref(&self) -> Option<&ActorRef<RegistryActor<K>>> {
        match &*self.shards {
            [shard] => Some(&shard.actor_ref),
            _ => None,
        }
    }

    /// The actor of every shard, in shard order (one for a registry with one shard).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// use keyed_locks::messages::GetStats;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::LockRegistry::<u64>::builder()
    ///     .shards(NonZeroUsize::new(3).unwrap())
    ///     .spawn();
    /// let mut keys = 0;
    /// for actor in registry.actor_refs() {
    ///     keys += actor.ask(GetStats).await?.keys;
    /// }
    /// assert_eq!(keys, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn actor_refs(&self) -> impl ExactSizeIterator<Item = &ActorRef<RegistryActor<K>>> {
        self.shards.iter().map(|shard| &shard.actor_ref)
    }

    /// The actor that owns `key`: the one to send it [`Acquire`](crate::messages::Acquire) and
    /// [`TryAcquire`](crate::messages::TryAcquire) for that key (another shard answers them
    /// with `WrongShard`). The same as [`actor_ref`](Self::actor_ref) with one shard.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// use keyed_locks::messages::Acquire;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::LockRegistry::<u64>::builder()
    ///     .shards(NonZeroUsize::new(4).unwrap())
    ///     .spawn();
    /// let guard = registry.actor_ref_for(&7).ask(Acquire { key: 7 }).await?;
    /// assert!(registry.try_lock(7).await.is_err()); // the same key, the same shard
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    pub fn actor_ref_for(&self, key: &K) -> &ActorRef<RegistryActor<K>> {
        &self.shard_for(key).actor_ref
    }

    /// Starts a registry with `settings`: its shards, their actors and stall timers.
    pub(crate) fn start(settings: &RegistrySettings) -> Self {
        #[cfg(test)]
        let router = match settings.router_seed {
            Some(seed) => ShardRouter::seeded(settings.shards, seed),
            None => ShardRouter::new(settings.shards),
        };
        #[cfg(not(test))]
        let router = ShardRouter::new(settings.shards);
        let shards = (0..settings.shards.get())
            .map(|shard| {
                let owner_config = OwnerConfig {
                    journal_capacity: settings.journal_capacity,
                    capacity: settings.capacity,
                    shard,
                    router: router.clone(),
                    stall_thresholds: settings.stall_thresholds,
                };
                let execution = settings.execution;
                let shard = Arc::new_cyclic(|shard_ref| {
                    Shard::new(Owner::new(owner_config, shard_ref.clone()), execution)
                });
                if let Some(shortest) = settings.stall_thresholds.shortest() {
                    tokio::spawn(stall::watch_for_stalls(Arc::downgrade(&shard), shortest));
                }
                let config = RegistryConfig {
                    shard: Arc::downgrade(&shard),
                };
                // Spawned by hand rather than with `spawn_with_mailbox`, which wraps the task in a
                // task-local scope (for kameo's `is_current`, which nothing here uses) that costs
                // every wake-up of the actor a copy in and out (`docs/performance-log.md`). The
                // lifecycle is the same.
                let prepared = RegistryActor::prepare_with_mailbox(mailbox::unbounded());
                let actor_ref = prepared.actor_ref().clone();
                tokio::spawn(prepared.run(config));
                ShardHandle { shard, actor_ref }
            })
            .collect();
        LockRegistry {
            shards,
            router,
            capacity: settings.capacity,
            histograms: Histograms::new(),
        }
    }

    #[inline]
    fn shard_for(&self, key: &K) -> &ShardHandle<K> {
        &self.shards[self.router.shard_of(key)]
    }
}

/// The error a try call or a closed registry ends an acquisition with, reported to its span.
fn refused(acquisition: Acquisition, not_granted: NotGranted) -> TryLockError {
    match not_granted {
        NotGranted::WouldBlock => {
            acquisition.would_block();
            TryLockError::WouldBlock
        }
        NotGranted::Closed => {
            acquisition.closed();
            TryLockError::Closed
        }
    }
}

/// The keys of a multi-key request, split by shard, shown as one list (for its span) without
/// collecting them.
struct KeysOf<'a, K>(&'a [(usize, KeySet<K>)]);

impl<K: fmt::Debug> fmt::Debug for KeysOf<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().flat_map(|(_, keys)| keys.as_slice()))
            .finish()
    }
}

/// Whether a multi-key request waits for its keys or takes them only if free.
#[derive(Debug, Clone, Copy)]
enum Wait {
    Yes,
    No,
}

/// Where an acquire stands once the owner has seen it, or queued it.
impl<K: LockKey> ShardHandle<K> {
    /// The grant's hold, for a guard: one reference count on the shard.
    fn held(&self, granted: Granted) -> HeldGrant<K> {
        HeldGrant::new(granted.waiter_id, Arc::clone(&self.shard))
    }

    /// The guard for a grant to a call of the handle.
    #[inline]
    fn guard(&self, key: K, granted: Granted, mut acquisition: Acquisition) -> KeyGuard<K> {
        acquisition.granted(granted.fencing_token);
        KeyGuard::new(key, granted.fencing_token, self.held(granted), acquisition)
    }

    /// The shard's journal; after a close, as it was when the shard closed.
    async fn journal(&self) -> Result<Journal<K>, LockError> {
        let current = self
            .shard
            .ask(
                |reply| Request::Journal { reply },
                |outcome| match outcome {
                    Outcome::Journal(journal) => Some(journal),
                    _ => None,
                },
            )
            .await;
        current
            .or_else(|| self.shard.final_journal())
            .ok_or(LockError::Closed)
    }
}

impl<K: LockKey> Clone for LockRegistry<K> {
    fn clone(&self) -> Self {
        LockRegistry {
            shards: Arc::clone(&self.shards),
            router: self.router.clone(),
            capacity: self.capacity,
            histograms: self.histograms.clone(),
        }
    }
}

impl<K: LockKey> fmt::Debug for LockRegistry<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let actor_ids: Vec<_> = self
            .shards
            .iter()
            .map(|shard| shard.actor_ref.id())
            .collect();
        f.debug_struct("LockRegistry")
            .field("actor_ids", &actor_ids)
            .field("closed", &self.is_closed())
            .finish()
    }
}
