//! [`ClusterRegistry`]: the per-key lock of [`LockRegistry`], extended across the processes
//! that share one PostgreSQL database.

use std::fmt;
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use crate::blocking::block_on_named;
use crate::cluster::error::ClusterError;
use crate::cluster::locking::entropy::Jitter;
use crate::cluster::locking::guard::ClusterGuard;
use crate::cluster::locking::leases::{self, CohortBounds, HANDOFF_BITS, Leases};
use crate::cluster::locking::locks::ClusterLocks;
use crate::cluster::locking::multi_guard::ClusterMultiGuard;
use crate::cluster::owner::LeaseOwner;
use crate::cluster::postgres::config::PgLeaseConfig;
use crate::cluster::postgres::store::PgLeaseStore;
use crate::cluster::postgres::view::LeaseView;
use crate::cluster::snapshot::ClusterSnapshot;
use crate::error::{LockError, PermitsError, TryLockError, TryPermitsError};
use crate::key::LockKey;
use crate::pure::stats::RegistryStats;
use crate::registry::LockRegistry;

/// Guards issued in one round of a lease, by default: the first holder and 15 local
/// hand-offs.
const DEFAULT_MAX_USES: u32 = 16;

/// Per-key locks shared by every process that connects to the same lease table.
///
/// Each process keeps its own [`LockRegistry`] for its local queues (FIFO, cancel-safe, no
/// entry left behind) and holds a *lease* per key in a PostgreSQL table while its local
/// holders use the key. A lease passes from one local holder to the next without a database
/// round trip, in rounds of a bound ([`ClusterBuilder::max_local_handoffs`],
/// [`ClusterBuilder::max_local_hold`]); at a round's end it goes back if another process wants
/// the key, and is kept for another round if a renewal says nobody does. A heartbeat renews the leases; a lease that cannot be renewed is *lost*, and its
/// guard says so ([`ClusterGuard::is_lost`], [`ClusterGuard::lost`]).
///
/// A lease can run out while its holder is paused, so the resource you protect must check
/// [`ClusterGuard::fencing_token`]: tokens of one key strictly increase across the whole
/// cluster, and a write with a token lower than one the resource has seen is stale.
///
/// The key's [`Display`](fmt::Display) text names its lease: keys that print alike share one.
///
/// Cloning is cheap; every clone talks to the same local registry and leases. Dropping the
/// last clone and the last guard stops the heartbeat; leases still held then run out on their
/// own, as they do when the process dies. Call [`shutdown`](Self::shutdown) to give them back
/// at once.
pub struct ClusterRegistry<K: LockKey + fmt::Display> {
    locks: ClusterLocks<K, PgLeaseStore>,
    /// The runtime it was connected on, where its tasks (statements, heartbeat) run: the
    /// blocking calls enter it, so that they work on a thread with no tokio context.
    runtime: Handle,
    /// The store's reads of the lease table for [`snapshot`](Self::snapshot), on a
    /// connection of their own.
    view: Arc<LeaseView>,
}

impl<K: LockKey + fmt::Display> Clone for ClusterRegistry<K> {
    fn clone(&self) -> Self {
        ClusterRegistry {
            locks: self.locks.clone(),
            runtime: self.runtime.clone(),
            view: Arc::clone(&self.view),
        }
    }
}

impl<K: LockKey + fmt::Display> fmt::Debug for ClusterRegistry<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (keys, leases) = self.locks.leases.counts();
        f.debug_struct("ClusterRegistry")
            .field("owner", &self.view.owner().to_string())
            .field("local", &self.locks.local)
            .field("keys", &keys)
            .field("leases", &leases)
            .finish()
    }
}

impl<K: LockKey + fmt::Display> ClusterRegistry<K> {
    /// A builder for a registry on the PostgreSQL server at `database_url` (a `postgres://`
    /// URL, or tokio-postgres' `key=value` form).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use keyed_locks::ClusterRegistry;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .table_prefix("orders_")
    ///     .lease(Duration::from_secs(10))
    ///     .connect()
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(database_url: impl Into<String>) -> ClusterBuilder<K> {
        ClusterBuilder {
            config: PgLeaseConfig::new(database_url),
            heartbeat: None,
            max_uses: DEFAULT_MAX_USES,
            max_hold: None,
            local: LockRegistry::builder(),
        }
    }

    /// Waits for `key` in this process (FIFO), then for its lease, and returns a guard that
    /// holds both.
    ///
    /// While another process holds the lease, the wait is woken by the release's
    /// notification, or by polling the table at a random interval between half the lease and
    /// the whole of it if a notification is lost. While the database cannot be reached, it
    /// retries with a growing delay (at most half the lease); bound the wait with
    /// `tokio::time::timeout` if you need to.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe. Dropping the future at any point gives up the place in the local queue,
    /// and a lease being taken for it at that moment is recorded all the same (the statement
    /// runs in a task of its own), then passed to the next local waiter or released.
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] after [`shutdown`](Self::shutdown).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .connect()
    ///     .await?;
    /// let guard = registry.lock("account:42".to_string()).await?;
    /// // Write with `guard.fencing_token()`, and have the store refuse lower tokens.
    /// println!("token {}", guard.fencing_token());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn lock(&self, key: K) -> Result<ClusterGuard<K>, LockError> {
        self.locks.lock(key).await
    }

    /// Takes `key` if it is free right now across the cluster, without waiting: in this
    /// process (no local holder or waiter, as [`LockRegistry::try_lock`]) and in every other
    /// (no live lease of another process, and no other process waiting for it).
    ///
    /// A key that another process waits for is not free, even in the moment after its holder
    /// released it: the waiter was refused before, and it comes first (it asks again within
    /// its poll interval; a waiting mark older than one lease after the key's last release is
    /// taken for a waiter that went away). Nor is a key whose lease this process is still
    /// giving back (the release on its way). A refused try leaves nothing behind in the table.
    /// At most one statement: none if this process holds the key's lease already (a local
    /// hand-off, under the same bound as `lock`'s), else one round trip. If that statement
    /// fails (the server is unreachable), the key cannot be known to be free, and the answer
    /// is [`TryLockError::WouldBlock`]: a try never waits for the server to come back.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe. Dropping the future gives up the local key at once; a lease being taken
    /// for it at that moment is recorded all the same (the statement runs in a task of its
    /// own), then passed to the next local waiter or released.
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] if the key is held or waited for, here or in another
    /// process, or the server could not be asked; [`TryLockError::Closed`] after
    /// [`shutdown`](Self::shutdown).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use keyed_locks::TryLockError;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .connect()
    ///     .await?;
    /// // Every replica tries the job's key at the same tick: one runs the job, the others skip.
    /// match registry.try_lock("job:nightly-report".to_string()).await {
    ///     Ok(guard) => println!("running the job under token {}", guard.fencing_token()),
    ///     Err(TryLockError::WouldBlock) => println!("another replica runs it"),
    ///     Err(closed) => return Err(closed.into()),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_lock(&self, key: K) -> Result<ClusterGuard<K>, TryLockError> {
        self.locks.try_lock(key).await
    }

    /// Waits for one of `key`'s permits across the cluster and returns a guard that holds it:
    /// a shared (read) lock, as [`LockRegistry::lock_shared`]. Up to
    /// [`capacity`](ClusterBuilder::capacity) shared holders, in any processes, hold a key
    /// at once; an exclusive [`lock`](Self::lock) waits until they are all gone.
    ///
    /// Each shared guard holds a lease of its own in the table (a *part lease*, with its own
    /// fence and fencing token), given back when the guard drops. With the default capacity
    /// of one permit per key, a shared lock is exclusive, as locally.
    ///
    /// # Fairness
    ///
    /// In this process, strict FIFO across modes, as [`LockRegistry::lock_shared`]. Across
    /// processes, a request that is refused is recorded in the key's row with its size, for
    /// a lease, renewed each time it asks again: while it is, no smaller request of any
    /// process is granted, so readers of other processes cannot starve a writer (a writer
    /// counts as the whole capacity). Of two waiting requests, the larger is served first.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`lock`](Self::lock): a part lease taken for a dropped future is given
    /// back at once.
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] after [`shutdown`](Self::shutdown).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::num::NonZeroU32;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .capacity(NonZeroU32::new(8).ok_or("no permits")?)
    ///     .connect()
    ///     .await?;
    /// let reader = registry.lock_shared("report:7".to_string()).await?;
    /// let another = registry.lock_shared("report:7".to_string()).await?;
    /// assert_ne!(reader.fencing_token(), another.fencing_token());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn lock_shared(&self, key: K) -> Result<ClusterGuard<K>, LockError> {
        self.locks
            .acquire(key, 1)
            .await
            .map_err(|_closed| LockError::Closed)
    }

    /// Waits for `permits` of `key`'s permits across the cluster and returns a guard that
    /// holds them: a semaphore per key shared by every process, for "at most N calls in
    /// flight to the provider, whichever replica makes them". As
    /// [`LockRegistry::acquire`]; all of the permits is [`lock`](Self::lock).
    ///
    /// # Fairness
    ///
    /// As [`lock_shared`](Self::lock_shared): FIFO in the process; across processes, a
    /// refused request holds back every smaller one until it is served.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`lock_shared`](Self::lock_shared).
    ///
    /// # Errors
    ///
    /// [`PermitsError::OutOfRange`] if `permits` is 0 or above the
    /// [`capacity`](ClusterBuilder::capacity) (nothing changes, nothing is sent);
    /// [`PermitsError::Closed`] after [`shutdown`](Self::shutdown).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::num::NonZeroU32;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // At most 4 calls in flight to the provider, across every replica.
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .capacity(NonZeroU32::new(4).ok_or("no permits")?)
    ///     .connect()
    ///     .await?;
    /// let permit = registry.acquire("provider".to_string(), 1).await?;
    /// // ... call the provider ...
    /// drop(permit);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire(&self, key: K, permits: u32) -> Result<ClusterGuard<K>, PermitsError> {
        self.locks.acquire(key, permits).await
    }

    /// Takes one of `key`'s permits if one is free right now across the cluster and no
    /// request for the key waits anywhere, without waiting: as [`try_lock`](Self::try_lock)
    /// for a shared lock.
    ///
    /// At most one statement. A key whose whole lease this process holds idle (its last
    /// exclusive holder just left) is given back, and this try refused: the release is on
    /// its way, and a try does not wait for it.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`try_lock`](Self::try_lock).
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] if no permit is free, a request for the key waits, or the
    /// server could not be asked; [`TryLockError::Closed`] after
    /// [`shutdown`](Self::shutdown).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::num::NonZeroU32;
    /// use keyed_locks::TryLockError;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .capacity(NonZeroU32::new(2).ok_or("no permits")?)
    ///     .connect()
    ///     .await?;
    /// let writer = registry.lock("k".to_string()).await?;
    /// assert_eq!(registry.try_lock_shared("k".to_string()).await.unwrap_err(), TryLockError::WouldBlock);
    /// drop(writer);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_lock_shared(&self, key: K) -> Result<ClusterGuard<K>, TryLockError> {
        self.locks
            .try_acquire(key, 1)
            .await
            .map_err(|error| match error {
                TryPermitsError::Closed => TryLockError::Closed,
                // One permit is never out of range.
                TryPermitsError::WouldBlock | TryPermitsError::OutOfRange { .. } => {
                    TryLockError::WouldBlock
                }
            })
    }

    /// Takes `permits` of `key`'s permits if they are free right now across the cluster and
    /// no request for the key waits anywhere, without waiting: as
    /// [`try_lock_shared`](Self::try_lock_shared), for any number of permits.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`try_lock`](Self::try_lock).
    ///
    /// # Errors
    ///
    /// [`TryPermitsError::OutOfRange`] if `permits` is 0 or above the capacity (nothing is
    /// sent), [`TryPermitsError::WouldBlock`] if they are not free, a request waits, or the
    /// server could not be asked; [`TryPermitsError::Closed`] after
    /// [`shutdown`](Self::shutdown).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::num::NonZeroU32;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .capacity(NonZeroU32::new(3).ok_or("no permits")?)
    ///     .connect()
    ///     .await?;
    /// match registry.try_acquire("provider".to_string(), 2).await {
    ///     Ok(permits) => println!("calling under token {}", permits.fencing_token()),
    ///     Err(busy) => println!("not now: {busy}"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_acquire(
        &self,
        key: K,
        permits: u32,
    ) -> Result<ClusterGuard<K>, TryPermitsError> {
        self.locks.try_acquire(key, permits).await
    }

    /// Waits for every key of `keys` across the cluster and returns a guard that holds them
    /// all, exclusively, until dropped: for work on several keys at once, such as a transfer
    /// between two accounts served by different replicas. As [`LockRegistry::lock_all`], it
    /// never deadlocks, whatever order callers in any process list the keys in.
    ///
    /// In this process the keys are taken as [`LockRegistry::lock_all`] takes them; then
    /// their leases in one statement, all of them or none, which locks the keys' rows in key
    /// order, as every statement does. While any key is held elsewhere, the set holds none of
    /// their leases (it never holds some while it waits for others), and it is recorded as
    /// waiting for each key as a writer is, so that readers of other processes do not
    /// overtake it; it asks again when a release of any of its keys is announced, or after a
    /// poll interval. Duplicates count once, and an empty set is granted at once. Each key has
    /// its own lease, fence and fencing token.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe. Dropping the future gives up the local queues and any leases being taken
    /// for it at that moment (they are recorded, then given back).
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] after [`shutdown`](Self::shutdown).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .connect()
    ///     .await?;
    /// let transfer = registry
    ///     .lock_all(["account:2".to_string(), "account:1".to_string()])
    ///     .await?;
    /// let from = transfer.fencing_token(&"account:2".to_string());
    /// println!("debit under token {from:?}");
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_all(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> impl Future<Output = Result<ClusterMultiGuard<K>, LockError>> + '_ {
        // Collected now, so that the future does not keep the caller's iterator (which need
        // not be `Send`).
        let keys: Vec<K> = keys.into_iter().collect();
        self.locks.lock_all(keys)
    }

    /// Takes every key of `keys` if all are free right now across the cluster and no request
    /// waits for any of them, without waiting: all of them or none. At most one statement (none
    /// if a key is held or waited for in this process). A key whose lease this process holds
    /// idle or is giving back makes the try refused, as for [`try_lock`](Self::try_lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`try_lock`](Self::try_lock).
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] if any key is held or waited for anywhere, or the server
    /// could not be asked (nothing is held then); [`TryLockError::Closed`] after
    /// [`shutdown`](Self::shutdown).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use keyed_locks::TryLockError;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .connect()
    ///     .await?;
    /// match registry.try_lock_all(["a".to_string(), "b".to_string()]).await {
    ///     Ok(both) => println!("holding {} keys", both.len()),
    ///     Err(TryLockError::WouldBlock) => println!("busy; try later"),
    ///     Err(closed) => return Err(closed.into()),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_lock_all(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> impl Future<Output = Result<ClusterMultiGuard<K>, TryLockError>> + '_ {
        let keys: Vec<K> = keys.into_iter().collect();
        self.locks.try_lock_all(keys)
    }

    /// Waits for every key of `keys`, parking the calling thread:
    /// [`lock_all`](Self::lock_all) for threads outside the async runtime.
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] after [`shutdown`](Self::shutdown).
    ///
    /// # Panics
    ///
    /// As [`blocking_lock`](Self::blocking_lock), on a thread that drives an async executor.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let registry = runtime.block_on(
    ///     keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///         .connect(),
    /// )?;
    /// let both = std::thread::spawn(move || {
    ///     registry.blocking_lock_all(["a".to_string(), "b".to_string()]).map(|both| both.len())
    /// })
    /// .join()
    /// .expect("the thread ran")?;
    /// assert_eq!(both, 2);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn blocking_lock_all(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<ClusterMultiGuard<K>, LockError> {
        let _entered = self.runtime.enter();
        block_on_named(
            "ClusterRegistry",
            "blocking_lock_all",
            "lock_all",
            self.lock_all(keys),
        )
    }

    /// Takes every key of `keys` if all are free right now across the cluster:
    /// [`try_lock_all`](Self::try_lock_all) for threads outside the async runtime. It parks
    /// the thread for one statement at most.
    ///
    /// # Errors
    ///
    /// As [`try_lock_all`](Self::try_lock_all).
    ///
    /// # Panics
    ///
    /// As [`blocking_lock`](Self::blocking_lock), on a thread that drives an async executor.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let registry = runtime.block_on(
    ///     keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///         .connect(),
    /// )?;
    /// let got = std::thread::spawn(move || {
    ///     registry.blocking_try_lock_all(["a".to_string(), "b".to_string()]).is_ok()
    /// })
    /// .join()
    /// .expect("the thread ran");
    /// println!("both now: {got}");
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn blocking_try_lock_all(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<ClusterMultiGuard<K>, TryLockError> {
        let _entered = self.runtime.enter();
        block_on_named(
            "ClusterRegistry",
            "blocking_try_lock_all",
            "try_lock_all",
            self.try_lock_all(keys),
        )
    }

    /// Waits for `key`, parking the calling thread: [`lock`](Self::lock) for threads outside
    /// the async runtime, in the same local FIFO and with the same leases and tokens.
    ///
    /// The registry's statements and heartbeat run on the runtime it was connected on, which
    /// must keep running while this waits.
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] after [`shutdown`](Self::shutdown).
    ///
    /// # Panics
    ///
    /// If called on a thread that drives an async executor (a runtime's worker, or inside a
    /// `block_on`): use [`lock`](Self::lock) there, or call this from `spawn_blocking` or a
    /// thread of your own.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let registry = runtime.block_on(
    ///     keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///         .connect(),
    /// )?;
    /// let guard = std::thread::spawn(move || registry.blocking_lock("account:42".to_string()))
    ///     .join()
    ///     .expect("the thread ran")?;
    /// println!("token {}", guard.fencing_token());
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn blocking_lock(&self, key: K) -> Result<ClusterGuard<K>, LockError> {
        let _entered = self.runtime.enter();
        block_on_named("ClusterRegistry", "blocking_lock", "lock", self.lock(key))
    }

    /// Takes `key` if it is free right now across the cluster: [`try_lock`](Self::try_lock)
    /// for threads outside the async runtime. It parks the thread for one statement at most,
    /// never for another process's release.
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Self::try_lock): [`TryLockError::WouldBlock`] if the key is held or
    /// waited for anywhere (or the server could not be asked), [`TryLockError::Closed`] after
    /// [`shutdown`](Self::shutdown).
    ///
    /// # Panics
    ///
    /// As [`blocking_lock`](Self::blocking_lock), on a thread that drives an async executor.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let registry = runtime.block_on(
    ///     keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///         .connect(),
    /// )?;
    /// let ran = std::thread::spawn(move || {
    ///     registry.blocking_try_lock("job:nightly".to_string()).is_ok()
    /// })
    /// .join()
    /// .expect("the thread ran");
    /// println!("this replica runs the job: {ran}");
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn blocking_try_lock(&self, key: K) -> Result<ClusterGuard<K>, TryLockError> {
        let _entered = self.runtime.enter();
        block_on_named(
            "ClusterRegistry",
            "blocking_try_lock",
            "try_lock",
            self.try_lock(key),
        )
    }

    /// Waits for a shared lock of `key`, parking the calling thread:
    /// [`lock_shared`](Self::lock_shared) for threads outside the async runtime.
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] after [`shutdown`](Self::shutdown).
    ///
    /// # Panics
    ///
    /// As [`blocking_lock`](Self::blocking_lock), on a thread that drives an async executor.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let registry = runtime.block_on(
    ///     keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///         .connect(),
    /// )?;
    /// let guard = std::thread::spawn(move || registry.blocking_lock_shared("k".to_string()))
    ///     .join()
    ///     .expect("the thread ran")?;
    /// println!("token {}", guard.fencing_token());
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn blocking_lock_shared(&self, key: K) -> Result<ClusterGuard<K>, LockError> {
        let _entered = self.runtime.enter();
        block_on_named(
            "ClusterRegistry",
            "blocking_lock_shared",
            "lock_shared",
            self.lock_shared(key),
        )
    }

    /// Waits for `permits` of `key`, parking the calling thread:
    /// [`acquire`](Self::acquire) for threads outside the async runtime.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Panics
    ///
    /// As [`blocking_lock`](Self::blocking_lock), on a thread that drives an async executor.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let registry = runtime.block_on(
    ///     keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///         .connect(),
    /// )?;
    /// let permit = std::thread::spawn(move || registry.blocking_acquire("provider".to_string(), 1))
    ///     .join()
    ///     .expect("the thread ran")?;
    /// drop(permit);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn blocking_acquire(&self, key: K, permits: u32) -> Result<ClusterGuard<K>, PermitsError> {
        let _entered = self.runtime.enter();
        block_on_named(
            "ClusterRegistry",
            "blocking_acquire",
            "acquire",
            self.acquire(key, permits),
        )
    }

    /// Takes a shared lock of `key` if one is free right now across the cluster:
    /// [`try_lock_shared`](Self::try_lock_shared) for threads outside the async runtime. It
    /// parks the thread for one statement at most.
    ///
    /// # Errors
    ///
    /// As [`try_lock_shared`](Self::try_lock_shared).
    ///
    /// # Panics
    ///
    /// As [`blocking_lock`](Self::blocking_lock), on a thread that drives an async executor.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let registry = runtime.block_on(
    ///     keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///         .connect(),
    /// )?;
    /// let read = std::thread::spawn(move || registry.blocking_try_lock_shared("k".to_string()).is_ok())
    ///     .join()
    ///     .expect("the thread ran");
    /// println!("read now: {read}");
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn blocking_try_lock_shared(&self, key: K) -> Result<ClusterGuard<K>, TryLockError> {
        let _entered = self.runtime.enter();
        block_on_named(
            "ClusterRegistry",
            "blocking_try_lock_shared",
            "try_lock_shared",
            self.try_lock_shared(key),
        )
    }

    /// Takes `permits` of `key` if they are free right now across the cluster:
    /// [`try_acquire`](Self::try_acquire) for threads outside the async runtime. It parks the
    /// thread for one statement at most.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    ///
    /// # Panics
    ///
    /// As [`blocking_lock`](Self::blocking_lock), on a thread that drives an async executor.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let registry = runtime.block_on(
    ///     keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///         .connect(),
    /// )?;
    /// let got = std::thread::spawn(move || registry.blocking_try_acquire("provider".to_string(), 1).is_ok())
    ///     .join()
    ///     .expect("the thread ran");
    /// println!("a permit now: {got}");
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn blocking_try_acquire(
        &self,
        key: K,
        permits: u32,
    ) -> Result<ClusterGuard<K>, TryPermitsError> {
        let _entered = self.runtime.enter();
        block_on_named(
            "ClusterRegistry",
            "blocking_try_acquire",
            "try_acquire",
            self.try_acquire(key, permits),
        )
    }

    /// The local registry's counts: keys with a local holder or waiter.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] after [`shutdown`](Self::shutdown).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .connect()
    ///     .await?;
    /// assert_eq!(registry.stats().await?.keys, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn stats(&self) -> Result<RegistryStats, LockError> {
        self.locks.local.stats().await
    }

    /// The local registry's journal (built with `.local(|local| local.journal(capacity))`):
    /// its table's events, with what the process did with each lease as notes
    /// ([`JournalEvent::Note`](crate::journal::JournalEvent::Note), such as
    /// `lease "k" granted under fence 7`) in between. It replays
    /// against the table like any journal ([`replay`](crate::replay)).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    ///
    /// # Errors
    ///
    /// As [`LockRegistry::journal`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .local(|local| local.journal(10_000))
    ///     .connect()
    ///     .await?;
    /// drop(registry.lock("k".to_string()).await?);
    /// keyed_locks::replay::verify(&registry.journal().await?)?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn journal(
        &self,
    ) -> Result<crate::pure::journal::Journal<K>, crate::error::JournalError> {
        self.locks.local.journal().await
    }

    /// How many leases this process holds now.
    pub fn leases_held(&self) -> usize {
        self.locks.leases.counts().1
    }

    /// This registry's owner name, `host:pid:random`, as every lease row it holds carries it:
    /// log it at start, and a row found in the table (or a [`snapshot`](Self::snapshot) of
    /// another process) leads to this process.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .connect()
    ///     .await?;
    /// assert_eq!(registry.owner().pid(), std::process::id());
    /// println!("lease owner {}", registry.owner());
    /// # Ok(())
    /// # }
    /// ```
    pub fn owner(&self) -> &LeaseOwner {
        self.view.owner()
    }

    /// Every key held or waited for in the cluster: the lease table's live rows, of every
    /// process (each key's holders with their owner names, fences and time left, and the
    /// request that waits for it), and this process's local view
    /// ([`LockRegistry::snapshot`]) beside them.
    ///
    /// The rows come from one SELECT, on a connection of the view's own, opened at the first
    /// snapshot and kept: a scan there never holds back a renewal on the statement
    /// connection. It reads every row of the table (one per key ever locked), at one instant
    /// of the server's clock; times left are the server's, so clocks of the clients do not
    /// matter. The keys a request waits for come first, then those whose leases run out
    /// soonest (the table does not record when a lease was taken). On a large table, use
    /// [`snapshot_top`](Self::snapshot_top), which the server cuts before sending.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads. Dropping the future during the statement leaves the view's
    /// connection to finish it, or to be made again by the next snapshot.
    ///
    /// # Errors
    ///
    /// [`ClusterError::Closed`] after [`shutdown`](Self::shutdown);
    /// [`ClusterError::Unreachable`] (or another failure to connect) if the server cannot be
    /// reached, [`ClusterError::ConnectTimeout`] if it does not answer within the heartbeat,
    /// [`ClusterError::Database`] or [`ClusterError::MissingPermission`] if it refuses the
    /// read. It waits for no reconnection: the next call tries again.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .connect()
    ///     .await?;
    /// let guard = registry.lock("account:42".to_string()).await?;
    /// let view = registry.snapshot().await?;
    /// let row = view.leases.iter().find(|row| row.key == "account:42").ok_or("no row")?;
    /// assert!(row.ours);
    /// assert_eq!(row.holders[0].owner.as_ref(), Some(registry.owner()));
    /// assert_eq!(row.holders[0].fence, guard.fencing_token() >> 20);
    /// println!("{} held by {} for {:?} more", row.key, row.holders[0].owner_name, row.holders[0].expires_in);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn snapshot(&self) -> Result<ClusterSnapshot<K>, ClusterError> {
        self.views(None).await
    }

    /// The first `n` keys of [`snapshot`](Self::snapshot), in the table and in this process:
    /// the first `n` rows of the table (the keys a request waits for first, then those whose
    /// leases run out soonest), cut on the server, and the `n` most contended local keys
    /// ([`LockRegistry::snapshot_top`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`snapshot`](Self::snapshot).
    ///
    /// # Errors
    ///
    /// As [`snapshot`](Self::snapshot).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .connect()
    ///     .await?;
    /// for row in registry.snapshot_top(20).await?.leases {
    ///     let waiting = row.waiting.map_or("", |_| " (waited for)");
    ///     for holder in &row.holders {
    ///         println!("{}{waiting}: {} under fence {}", row.key, holder.owner_name, holder.fence);
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn snapshot_top(&self, n: usize) -> Result<ClusterSnapshot<K>, ClusterError> {
        self.views(Some(n)).await
    }

    /// The local view and the table's, each of at most `limit` keys.
    async fn views(&self, limit: Option<usize>) -> Result<ClusterSnapshot<K>, ClusterError> {
        // The local registry first: it says whether the registry has shut down, and then the
        // server is not asked.
        let local = match limit {
            Some(n) => self.locks.local.snapshot_top(n).await,
            None => self.locks.local.snapshot().await,
        }
        .map_err(|_closed| ClusterError::Closed)?;
        let leases = self.view.live_rows(limit).await?;
        Ok(ClusterSnapshot {
            owner: self.view.owner().clone(),
            leases,
            local,
        })
    }

    /// Stops the local registry (every local waiter gets [`LockError::Closed`]), releases
    /// every lease this process holds, marks their guards lost, and closes the view's
    /// connection ([`snapshot`](Self::snapshot) gives [`ClusterError::Closed`] after it).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future part-way may leave leases to run out on their own instead of being
    /// released; nothing else is left behind.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .connect()
    ///     .await?;
    /// registry.shutdown().await;
    /// assert!(registry.lock("k".to_string()).await.is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn shutdown(&self) {
        self.locks.shutdown().await;
        self.view.close().await;
    }
}

/// Configures and connects a [`ClusterRegistry`]. Made by [`ClusterRegistry::builder`].
#[must_use = "a builder does nothing until `connect`"]
pub struct ClusterBuilder<K: LockKey + fmt::Display> {
    config: PgLeaseConfig,
    heartbeat: Option<Duration>,
    max_uses: u32,
    max_hold: Option<Duration>,
    local: crate::registry::builder::RegistryBuilder<K>,
}

impl<K: LockKey + fmt::Display> fmt::Debug for ClusterBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterBuilder")
            .field("table_prefix", &self.config.table_prefix)
            .field("lease", &self.config.lease)
            .field("heartbeat", &self.heartbeat)
            .field("max_local_handoffs", &(self.max_uses - 1))
            .field("max_local_hold", &self.max_hold)
            .field("capacity", &self.config.capacity)
            .finish_non_exhaustive()
    }
}

impl<K: LockKey + fmt::Display> ClusterBuilder<K> {
    /// The lease table is `{prefix}leases`, with `{prefix}fences` and `{prefix}run` beside it
    /// (see `docs/cluster.md`): ASCII letters, digits and underscores, not starting with a
    /// digit. Default `keyed_locks_`.
    pub fn table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.table_prefix = prefix.into();
        self
    }

    /// How long a lease lasts without renewal: after a process dies or stalls, other
    /// processes wait this long for its keys. Default 30 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// How often held leases are renewed. Default a quarter of the lease; at most a third of
    /// it, so that two renewals can fail before the lease runs out.
    pub fn heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat = Some(heartbeat);
        self
    }

    /// The longest wait for the server when connecting. Default 5 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// The TLS configuration for every connection to the server, instead of the one the URL's
    /// `sslmode` asks for: for custom roots, client certificates or another crypto provider.
    /// The URL's `sslmode` still says whether TLS is used (`disable`: never; `prefer`: if
    /// the server offers it; `require` and stricter: always), and `sslrootcert` is ignored:
    /// what is checked is whatever `config`'s verifier checks.
    ///
    /// This names [`rustls::ClientConfig`] in the crate's API: it is `rustls` 0.23's, and a
    /// `rustls` release that breaks its API will be a breaking release of this crate too.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    ///
    /// let mut roots = rustls::RootCertStore::empty();
    /// for certificate in rustls_native_certs::load_native_certs().certs {
    ///     roots.add(certificate)?;
    /// }
    /// let provider = Arc::new(rustls::crypto::ring::default_provider());
    /// let tls = rustls::ClientConfig::builder_with_provider(provider)
    ///     .with_safe_default_protocol_versions()?
    ///     .with_root_certificates(roots)
    ///     .with_no_client_auth();
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder(
    ///     "postgres://postgres@db.example.com/test?sslmode=verify-full",
    /// )
    /// .tls_config(tls)
    /// .connect()
    /// .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn tls_config(mut self, config: rustls::ClientConfig) -> Self {
        self.config.tls_config = Some(std::sync::Arc::new(config));
        self
    }

    /// How many times a lease passes from one local holder to the next in one round. At a
    /// round's end the lease goes back if another process wants the key (a renewal asks the
    /// table when the process does not know), else it is kept for another round; a process
    /// that waits gets the key after at most two rounds once its refusal has marked it.
    /// Default 15. 0 makes every round one lock: a process gives the lease back to a waiting
    /// process at once, and asks the table at every lock while it keeps it.
    pub fn max_local_handoffs(mut self, handoffs: u32) -> Self {
        self.max_uses = handoffs.saturating_add(1);
        self
    }

    /// How long one round of a lease lasts while local holders pass it on (see
    /// [`max_local_handoffs`](Self::max_local_handoffs)). Default half the lease.
    pub fn max_local_hold(mut self, hold: Duration) -> Self {
        self.max_hold = Some(hold);
        self
    }

    /// Permits per key, in every process of the table: up to this many
    /// [`lock_shared`](ClusterRegistry::lock_shared) holders at once, or
    /// [`acquire`](ClusterRegistry::acquire) permits in all; [`lock`](ClusterRegistry::lock)
    /// takes them all. Default 1 (a shared lock is then exclusive). It is the table's: the
    /// first process to connect records it, and a process that connects with another gets
    /// [`ClusterError::CapacityMismatch`]. It is also the local registry's, whatever
    /// [`local`](Self::local) sets.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::num::NonZeroU32;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let registry = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1/test")
    ///     .table_prefix("provider_")
    ///     .capacity(NonZeroU32::new(10).ok_or("no permits")?)
    ///     .connect()
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn capacity(mut self, permits: NonZeroU32) -> Self {
        self.config.capacity = permits;
        self
    }

    /// Settings of the local registry (shards, execution mode, journal). Its capacity is the
    /// cluster's ([`capacity`](Self::capacity)).
    pub fn local(
        mut self,
        configure: impl FnOnce(
            crate::registry::builder::RegistryBuilder<K>,
        ) -> crate::registry::builder::RegistryBuilder<K>,
    ) -> Self {
        self.local = configure(self.local);
        self
    }

    /// Checks the settings, connects, creates the lease table if missing, checks this role
    /// can use it, and starts the heartbeat. Must run inside a tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future part-way closes what it opened; the lease table may have been
    /// created.
    ///
    /// # Errors
    ///
    /// A [`ClusterError`] naming the cause: a bad setting (found before connecting), an
    /// unreachable or silent server (within the connect timeout), TLS that fails as the URL's
    /// `sslmode` asks (a server that offers none, a certificate that does not verify, a root
    /// file that cannot be read; never retried, never a silent fall back to plain text), a
    /// missing permission on the table, or any other refusal by the server.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let unreachable = keyed_locks::ClusterRegistry::<String>::builder("postgres://postgres@127.0.0.1:1/test")
    ///     .connect()
    ///     .await;
    /// assert!(unreachable.is_err());
    /// # }
    /// ```
    pub async fn connect(mut self) -> Result<ClusterRegistry<K>, ClusterError> {
        let max_uses_limit = 1u32 << HANDOFF_BITS;
        if self.max_uses > max_uses_limit {
            return Err(ClusterError::TooManyHandoffs {
                asked: self.max_uses - 1,
                max: max_uses_limit - 1,
            });
        }
        self.config.heartbeat = self.heartbeat.unwrap_or(self.config.lease / 4);
        let bounds = CohortBounds {
            max_uses: self.max_uses,
            max_hold: self.max_hold.unwrap_or(self.config.lease / 2),
        };
        let (store, notices) = PgLeaseStore::connect(&self.config).await?;
        let view = store.view();
        let journaling = self.local.journaling();
        let local = self.local.capacity(self.config.capacity).spawn();
        let journal: Option<leases::LeaseJournal> = journaling.then(|| {
            let local = local.clone();
            Box::new(move |note: String| local.note(note)) as _
        });
        let leases = Leases::new(store, bounds, self.config.lease, journal, Jitter::random());
        leases::spawn_background(&leases, notices, self.config.heartbeat);
        Ok(ClusterRegistry {
            locks: ClusterLocks::new(local, leases),
            runtime: Handle::current(),
            view,
        })
    }
}
