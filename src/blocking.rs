//! The blocking calls: [`LockRegistry`]'s acquires for threads outside the async runtime.
//!
//! Each one is its async twin run to completion on the calling thread, which is parked (not
//! spinning) until the answer comes: the same request through the same shard, so the same
//! FIFO queue, fencing tokens and guards. Only the waiting differs, which is all this file
//! is about: how to park, and when parking is forbidden.

use std::cell::Cell;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};

use crate::error::{LockError, PermitsError, TryLockError, TryPermitsError};
use crate::guard::KeyGuard;
use crate::key::LockKey;
use crate::multi_guard::MultiGuard;
use crate::registry::LockRegistry;

impl<K: LockKey> LockRegistry<K> {
    /// Waits for `key`, parking the calling thread, and returns a guard that holds it until
    /// dropped: [`lock`](Self::lock) for threads outside the async runtime.
    ///
    /// The request joins the same FIFO queue as the async calls (see
    /// [Fairness](Self#fairness)): threads and tasks waiting for one key are granted in their
    /// order of arrival, and the fencing tokens are the same sequence. The guard is the same
    /// [`KeyGuard`]; it can be dropped on any thread or task, and a thread that panics while
    /// holding it releases the key as the unwinding drops it.
    ///
    /// In [actor mode](crate::Execution::ActorTask) the grant comes from the registry's actor
    /// task, so the runtime the registry was spawned on must keep running (not be blocked by
    /// a join of this thread) while this waits.
    ///
    /// # Cancel safety
    ///
    /// There is no future to drop: the thread waits until it has the key or the registry
    /// closes. If the registry shuts down meanwhile, the thread gets `Closed` and nothing is
    /// left behind. If the thread panics while holding the guard, unwinding drops the guard,
    /// which releases the key to the next waiter.
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] if the registry has shut down or shuts down while this call
    /// waits (its runtime shutting down included).
    ///
    /// # Panics
    ///
    /// If called from inside an async execution context: on a thread that drives a tokio
    /// runtime (a worker, or inside `block_on`) or inside a `futures` executor. A parked
    /// worker cannot run the tasks that would release the key, so the runtime could hang;
    /// use [`lock`](Self::lock)`.await` there instead. Blocking is allowed on a plain
    /// thread, in [`tokio::task::spawn_blocking`] and in `tokio::task::block_in_place`.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::LockRegistry;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let registry = runtime.block_on(async { LockRegistry::spawn() });
    ///
    /// let held = runtime.block_on(registry.lock("account:7"))?;
    /// let thread = std::thread::spawn({
    ///     let registry = registry.clone();
    ///     // Parks until the task's guard is dropped.
    ///     move || registry.blocking_lock("account:7").map(|guard| guard.fencing_token())
    /// });
    /// let first = held.fencing_token();
    /// drop(held);
    /// assert!(thread.join().expect("the thread did not panic")? > first);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn blocking_lock(&self, key: K) -> Result<KeyGuard<K>, LockError> {
        block_on("blocking_lock", "lock", self.lock(key))
    }

    /// Waits for one of `key`'s permits, parking the calling thread, and returns a guard that
    /// holds it until dropped: [`lock_shared`](Self::lock_shared) for threads outside the
    /// async runtime, in the same FIFO queue.
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] if the registry has shut down, or shuts down while this waits.
    ///
    /// # Panics
    ///
    /// If called from inside an async execution context, as
    /// [`blocking_lock`](Self::blocking_lock); use [`lock_shared`](Self::lock_shared)`.await`
    /// there.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::num::NonZeroU32;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let capacity = NonZeroU32::new(2).ok_or("no permits")?;
    /// let registry = runtime.block_on(async {
    ///     keyed_locks::LockRegistry::builder().capacity(capacity).spawn()
    /// });
    /// let reader = registry.blocking_lock_shared("balance:7")?;
    /// let another = registry.blocking_lock_shared("balance:7")?; // readers share the key
    /// drop((reader, another));
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn blocking_lock_shared(&self, key: K) -> Result<KeyGuard<K>, LockError> {
        block_on("blocking_lock_shared", "lock_shared", self.lock_shared(key))
    }

    /// Waits for `permits` of `key`'s permits, parking the calling thread, and returns a
    /// guard that holds them until dropped: [`acquire`](Self::acquire) for threads outside
    /// the async runtime, in the same FIFO queue.
    ///
    /// # Errors
    ///
    /// [`PermitsError::OutOfRange`] if `permits` is 0 or above the
    /// [`capacity`](crate::RegistryBuilder::capacity) (nothing changes);
    /// [`PermitsError::Closed`] if the registry has shut down, or shuts down while this waits.
    ///
    /// # Panics
    ///
    /// If called from inside an async execution context, as
    /// [`blocking_lock`](Self::blocking_lock); use [`acquire`](Self::acquire)`.await` there.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use keyed_locks::PermitsError;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let capacity = NonZeroU32::new(3).ok_or("no permits")?;
    /// let registry = runtime.block_on(async {
    ///     keyed_locks::LockRegistry::builder().capacity(capacity).spawn()
    /// });
    /// let two = registry.blocking_acquire("user:1", 2)?;
    /// assert_eq!(
    ///     registry.blocking_acquire("user:1", 4).unwrap_err(),
    ///     PermitsError::OutOfRange { requested: 4, capacity: 3 }
    /// );
    /// # drop(two);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn blocking_acquire(&self, key: K, permits: u32) -> Result<KeyGuard<K>, PermitsError> {
        block_on("blocking_acquire", "acquire", self.acquire(key, permits))
    }

    /// Waits for every key of `keys`, parking the calling thread, and returns a guard that
    /// holds them all until dropped: [`lock_all`](Self::lock_all) for threads outside the
    /// async runtime, with the same guarantee that it cannot deadlock whatever order callers
    /// list the keys in.
    ///
    /// # Errors
    ///
    /// [`LockError::Closed`] if the registry has shut down, or shuts down while this waits;
    /// any keys already granted are released.
    ///
    /// # Panics
    ///
    /// If called from inside an async execution context, as
    /// [`blocking_lock`](Self::blocking_lock); use [`lock_all`](Self::lock_all)`.await` there.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let registry = runtime.block_on(async { keyed_locks::LockRegistry::spawn() });
    /// let transfer = registry.blocking_lock_all(["account:1", "account:2"])?;
    /// assert_eq!(transfer.len(), 2);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn blocking_lock_all(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<MultiGuard<K>, LockError> {
        block_on("blocking_lock_all", "lock_all", self.lock_all(keys))
    }

    /// Takes `key` if it is free right now, without waiting for it: [`try_lock`](Self::try_lock)
    /// for threads outside the async runtime.
    ///
    /// `try_lock` itself returns a future. In the default
    /// [execution mode](crate::Execution::RunOnCaller) that future is ready on its first poll,
    /// but in [actor mode](crate::Execution::ActorTask) the answer comes from the actor task,
    /// so sync code cannot just poll it once: this call parks the thread until the answer
    /// comes, which is one step of the registry, never a wait for the key.
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] if the key is held or has waiters (nothing changes),
    /// [`TryLockError::Closed`] if the registry has shut down.
    ///
    /// # Panics
    ///
    /// If called from inside an async execution context, in both execution modes, as
    /// [`blocking_lock`](Self::blocking_lock); use [`try_lock`](Self::try_lock)`.await` there.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::TryLockError;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let registry = runtime.block_on(async { keyed_locks::LockRegistry::spawn() });
    /// let guard = registry.blocking_try_lock("job:9")?;
    /// assert_eq!(registry.blocking_try_lock("job:9").unwrap_err(), TryLockError::WouldBlock);
    /// drop(guard);
    /// assert!(registry.blocking_try_lock("job:9").is_ok());
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn blocking_try_lock(&self, key: K) -> Result<KeyGuard<K>, TryLockError> {
        block_on("blocking_try_lock", "try_lock", self.try_lock(key))
    }

    /// Takes one of `key`'s permits if one is free right now and nobody waits for the key:
    /// [`try_lock_shared`](Self::try_lock_shared) for threads outside the async runtime
    /// (parked only until the registry answers, as [`blocking_try_lock`](Self::blocking_try_lock)).
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] if no permit is free or the key has waiters (nothing
    /// changes), [`TryLockError::Closed`] if the registry has shut down.
    ///
    /// # Panics
    ///
    /// If called from inside an async execution context, as
    /// [`blocking_lock`](Self::blocking_lock); use
    /// [`try_lock_shared`](Self::try_lock_shared)`.await` there.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::TryLockError;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let registry = runtime.block_on(async { keyed_locks::LockRegistry::spawn() });
    /// let writer = registry.blocking_lock("k")?;
    /// assert_eq!(registry.blocking_try_lock_shared("k").unwrap_err(), TryLockError::WouldBlock);
    /// drop(writer);
    /// let _reader = registry.blocking_try_lock_shared("k")?;
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn blocking_try_lock_shared(&self, key: K) -> Result<KeyGuard<K>, TryLockError> {
        block_on(
            "blocking_try_lock_shared",
            "try_lock_shared",
            self.try_lock_shared(key),
        )
    }

    /// Takes `permits` of `key`'s permits if they are free right now and nobody waits for
    /// the key: [`try_acquire`](Self::try_acquire) for threads outside the async runtime
    /// (parked only until the registry answers, as [`blocking_try_lock`](Self::blocking_try_lock)).
    ///
    /// # Errors
    ///
    /// [`TryPermitsError::OutOfRange`] if `permits` is 0 or above the capacity,
    /// [`TryPermitsError::WouldBlock`] if they are not free or the key has waiters (nothing
    /// changes either way), [`TryPermitsError::Closed`] if the registry has shut down.
    ///
    /// # Panics
    ///
    /// If called from inside an async execution context, as
    /// [`blocking_lock`](Self::blocking_lock); use [`try_acquire`](Self::try_acquire)`.await`
    /// there.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use keyed_locks::TryPermitsError;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let capacity = NonZeroU32::new(3).ok_or("no permits")?;
    /// let registry = runtime.block_on(async {
    ///     keyed_locks::LockRegistry::builder().capacity(capacity).spawn()
    /// });
    /// let _two = registry.blocking_try_acquire("user:1", 2)?;
    /// assert_eq!(
    ///     registry.blocking_try_acquire("user:1", 2).unwrap_err(),
    ///     TryPermitsError::WouldBlock
    /// );
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn blocking_try_acquire(
        &self,
        key: K,
        permits: u32,
    ) -> Result<KeyGuard<K>, TryPermitsError> {
        block_on(
            "blocking_try_acquire",
            "try_acquire",
            self.try_acquire(key, permits),
        )
    }

    /// Takes every key of `keys` if all are free right now, all of them or none:
    /// [`try_lock_all`](Self::try_lock_all) for threads outside the async runtime (parked
    /// only until the registry answers, as [`blocking_try_lock`](Self::blocking_try_lock)).
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] if any key is held or has waiters (nothing is held then),
    /// [`TryLockError::Closed`] if the registry has shut down.
    ///
    /// # Panics
    ///
    /// If called from inside an async execution context, as
    /// [`blocking_lock`](Self::blocking_lock); use [`try_lock_all`](Self::try_lock_all)`.await`
    /// there.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyed_locks::TryLockError;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let registry = runtime.block_on(async { keyed_locks::LockRegistry::spawn() });
    /// let one = registry.blocking_lock(1)?;
    /// assert_eq!(registry.blocking_try_lock_all([1, 2]).unwrap_err(), TryLockError::WouldBlock);
    /// drop(one);
    /// assert_eq!(registry.blocking_try_lock_all([1, 2])?.len(), 2);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn blocking_try_lock_all(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<MultiGuard<K>, TryLockError> {
        block_on(
            "blocking_try_lock_all",
            "try_lock_all",
            self.try_lock_all(keys),
        )
    }
}

/// Runs `future` to completion on this thread, parking it while the future waits; panics,
/// naming `call` and its async twin `async_call`, if this thread already runs an executor.
///
/// Whether blocking is allowed is tokio's own rule, not a guess: with a tokio context on the
/// thread, the future runs in [`Handle::block_on`](tokio::runtime::Handle::block_on), which
/// refuses (panics before it polls anything) exactly on a thread that drives the runtime's
/// tasks (a worker, or inside another `block_on`), and accepts a `spawn_blocking` thread or a
/// `block_in_place` closure, where the context is set but not entered. `Handle::try_current`
/// alone cannot tell: it is `Ok` in `spawn_blocking` too. Without a tokio context,
/// `futures_executor::block_on` refuses the same way inside another `futures` executor. The
/// refusal is caught only to put the caller's name on it: the panic hook has already reported
/// the executor's own message, which is fine for what is a bug in the caller.
#[track_caller]
fn block_on<F: Future>(call: &str, async_call: &str, future: F) -> F::Output {
    block_on_named("LockRegistry", call, async_call, future)
}

/// [`block_on`] for the calls of `registry`'s type (`ClusterRegistry` too), named so in the
/// panic.
#[track_caller]
pub(crate) fn block_on_named<F: Future>(
    registry: &str,
    call: &str,
    async_call: &str,
    future: F,
) -> F::Output {
    // Set on the first poll: a panic after it is the future's own (a key's `Hash`, say) and
    // goes on unchanged; a panic before it is the executor refusing to block here.
    let polled = Cell::new(false);
    let future = async {
        polled.set(true);
        future.await
    };
    // Unwind safe: a refusal happens before the future is touched, and any other panic is
    // resumed as it came, as if it had not been caught.
    let outcome = match tokio::runtime::Handle::try_current() {
        Ok(runtime) => panic::catch_unwind(AssertUnwindSafe(|| runtime.block_on(future))),
        Err(_) => panic::catch_unwind(AssertUnwindSafe(|| futures_executor::block_on(future))),
    };
    match outcome {
        Ok(output) => output,
        Err(payload) if polled.get() => panic::resume_unwind(payload),
        Err(_) => panic!(
            "`{registry}::{call}` called from inside an async execution context: blocking \
             this thread would stall the tasks it runs; use `{async_call}(..).await` instead, \
             or call `{call}` from `spawn_blocking` or a thread of your own"
        ),
    }
}
