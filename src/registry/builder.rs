//! [`RegistryBuilder`]: a registry's settings, and the registry it spawns.

use std::fmt;
use std::marker::PhantomData;
use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use crate::key::LockKey;
use crate::registry::LockRegistry;
use crate::runtime::execution::Execution;
use crate::runtime::stall::StallThresholds;

/// The shortest stall threshold: shorter ones would have the timer spin.
const MIN_STALL_THRESHOLD: Duration = Duration::from_millis(1);

/// Builds a [`LockRegistry`] with non-default settings; made by [`LockRegistry::builder`].
pub struct RegistryBuilder<K: LockKey> {
    settings: RegistrySettings,
    key: PhantomData<fn() -> K>,
}

/// What a builder has been told, for [`LockRegistry::start`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct RegistrySettings {
    /// Keep the last this many journal events; no journal if `None`.
    pub(crate) journal_capacity: Option<usize>,
    pub(crate) stall_thresholds: StallThresholds,
    /// Permits per key.
    pub(crate) capacity: NonZeroU32,
    pub(crate) shards: NonZeroUsize,
    pub(crate) execution: Execution,
    /// Seeds the shard router instead of drawing its seed at random, so that a simulated run
    /// routes every key the same way each time (the cluster simulator).
    #[cfg(test)]
    pub(crate) router_seed: Option<u64>,
}

impl<K: LockKey> RegistryBuilder<K> {
    pub(crate) fn new() -> Self {
        RegistryBuilder {
            settings: RegistrySettings {
                journal_capacity: None,
                stall_thresholds: StallThresholds::default(),
                capacity: NonZeroU32::MIN,
                shards: NonZeroUsize::MIN,
                execution: Execution::default(),
                #[cfg(test)]
                router_seed: None,
            },
            key: PhantomData,
        }
    }

    /// Records every input the lock table processes and every output it gives, keeping the
    /// last `capacity` events (older ones are dropped and counted). Read it with
    /// [`LockRegistry::journal`]. Off by default; when off it costs one branch per request.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::LockRegistry::builder().journal(2).spawn();
    /// drop(registry.lock(1u8).await?);
    /// let journal = registry.journal().await?;
    /// assert_eq!((journal.entries.len(), journal.dropped), (2, 1));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use = "a builder does nothing until `spawn`"]
    pub fn journal(mut self, capacity: usize) -> Self {
        self.settings.journal_capacity = Some(capacity);
        self
    }

    /// Gives each key `permits` permits: an exclusive [`lock`](LockRegistry::lock) takes them
    /// all, a [`lock_shared`](LockRegistry::lock_shared) takes one, an
    /// [`acquire`](LockRegistry::acquire) takes the number it asks for. One by default, so
    /// that every lock is exclusive.
    ///
    /// A `NonZeroU32`, because a key with no permits could never be locked: a count of 0 is
    /// refused where it is written, not when the first lock waits for ever.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::num::NonZeroU32;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::LockRegistry::builder()
    ///     .capacity(NonZeroU32::new(3).ok_or("no permits")?)
    ///     .spawn();
    /// let first = registry.lock_shared("doc").await?;
    /// let second = registry.lock_shared("doc").await?; // readers share the key
    /// assert_eq!(registry.stats().await?.holders, 2);
    /// # drop((first, second));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use = "a builder does nothing until `spawn`"]
    pub fn capacity(mut self, permits: NonZeroU32) -> Self {
        self.settings.capacity = permits;
        self
    }

    /// Splits the keys among `count` registry actors (shards), each the single owner of the
    /// keys that hash to it. One by default.
    ///
    /// More shards let several cores do bookkeeping at once, each on a table of its own, when
    /// many tasks lock many keys; the README's benchmark table shows what 8 shards give on
    /// its 2-core machine (where 8 is DashMap's default shard count). Measure on your own before raising it. Every rule holds per key: mutual
    /// exclusion, FIFO, cancel safety, fencing tokens increasing per key (they are unique
    /// across shards, but two keys in different shards are not ordered by them). Each shard keeps its own journal
    /// ([`LockRegistry::journals`]). With more than one shard, keys are hashed by the caller
    /// to pick the shard.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keyed_locks::LockError> {
    /// let registry = keyed_locks::LockRegistry::builder()
    ///     .shards(NonZeroUsize::new(2).unwrap())
    ///     .spawn();
    /// let a = registry.lock("a").await?;
    /// let b = registry.lock("b").await?;
    /// assert_ne!(a.fencing_token(), b.fencing_token());
    /// # Ok(())
    /// # }
    /// ```
    #[must_use = "a builder does nothing until `spawn`"]
    pub fn shards(mut self, count: NonZeroUsize) -> Self {
        self.settings.shards = count;
        self
    }

    /// Who runs the registry's bookkeeping: [`Execution::RunOnCaller`] (the default) or
    /// [`Execution::ActorTask`]. Every rule holds the same in both; see [`Execution`].
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::{Execution, LockRegistry};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keyed_locks::LockError> {
    /// let registry = LockRegistry::builder()
    ///     .execution(Execution::ActorTask)
    ///     .spawn();
    /// drop(registry.lock(7u32).await?);
    /// assert_eq!(registry.stats().await?.keys, 0);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use = "a builder does nothing until `spawn`"]
    pub fn execution(mut self, execution: Execution) -> Self {
        self.settings.execution = execution;
        self
    }

    /// Warns (one `tracing` warning, target `keyed_locks::stall`) about every hold that lasts
    /// longer than `threshold`, once per hold, with the key, the fencing token and how long it
    /// has been held so far: the classic production stall, a guard kept across a slow call or
    /// forgotten in a long-lived struct. Off by default.
    ///
    /// Each shard then runs a timer task that wakes when the oldest hold comes due (at least
    /// once per `threshold`), and each grant is noted with the time it was made: 32 bytes per
    /// grant made in the last `threshold`, released or not (a release does not look for its
    /// note; the note is dropped when it comes due). When no warning is set there is no
    /// timer, no note and no clock reading. A threshold below 1 ms counts as 1 ms.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keyed_locks::LockError> {
    /// let registry = keyed_locks::LockRegistry::builder()
    ///     .warn_held_longer_than(Duration::from_secs(5))
    ///     .spawn();
    /// let guard = registry.lock("invoice:12").await?;
    /// // Held for more than 5 s from here on: one warning, "key held longer than the threshold".
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use = "a builder does nothing until `spawn`"]
    pub fn warn_held_longer_than(mut self, threshold: Duration) -> Self {
        self.settings.stall_thresholds.held_longer_than = Some(threshold.max(MIN_STALL_THRESHOLD));
        self
    }

    /// Warns (one `tracing` warning, target `keyed_locks::stall`) when a key was granted to a
    /// waiting future that has not picked the grant up `threshold` later, once per grant, with
    /// the key, the fencing token and how long the grant has waited. Off by default.
    ///
    /// This is the symptom of a "futurelock": the future that asked for the key is still
    /// alive but no longer polled (for example the losing branch of a `select!` over
    /// `&mut fut` in a loop), so the key is held by nobody who runs and everyone behind it
    /// waits. See the crate docs' FAQ for how to avoid it. The timer is as for
    /// [`warn_held_longer_than`](Self::warn_held_longer_than); a note is kept for each grant
    /// made to a waiting future (in the default mode, not for a key granted on the first poll):
    /// 40 bytes, the key of the future's pending grant included, until the note comes due. A
    /// threshold below 1 ms counts as 1 ms.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let registry = keyed_locks::LockRegistry::<u64>::builder()
    ///     .warn_ungranted_pickup_after(Duration::from_millis(500))
    ///     .spawn();
    /// # drop(registry);
    /// # }
    /// ```
    #[must_use = "a builder does nothing until `spawn`"]
    pub fn warn_ungranted_pickup_after(mut self, threshold: Duration) -> Self {
        self.settings.stall_thresholds.ungranted_pickup_after =
            Some(threshold.max(MIN_STALL_THRESHOLD));
        self
    }

    /// Routes keys to shards by a hash seeded with `seed` (see [`RegistrySettings`]).
    #[cfg(test)]
    pub(crate) fn router_seed(mut self, seed: u64) -> Self {
        self.settings.router_seed = Some(seed);
        self
    }

    /// Whether the registry will keep a journal.
    #[cfg(feature = "postgres")]
    pub(crate) fn journaling(&self) -> bool {
        self.settings.journal_capacity.is_some()
    }

    /// Spawns the registry actor (one per shard) on the current tokio runtime.
    ///
    /// The actor's mailbox (and, in actor mode, the shard's queue) is unbounded, so that a
    /// guard's drop never waits for room and never loses its release. The actor runs without
    /// supervision and is never restarted (see [`RegistryActor`](crate::RegistryActor)).
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
    /// let registry = keyed_locks::LockRegistry::<String>::builder().spawn();
    /// # }
    /// ```
    #[must_use = "a registry stops once every handle and guard is gone"]
    pub fn spawn(self) -> LockRegistry<K> {
        LockRegistry::start(&self.settings)
    }
}

impl<K: LockKey> fmt::Debug for RegistryBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryBuilder")
            .field("settings", &self.settings)
            .finish()
    }
}
