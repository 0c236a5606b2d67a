//! The lock the shard protocol is built on, swapped for loom's under `--cfg loom`, so that the
//! models in `runtime/loom_models.rs` explore every interleaving of callers, guards, dropped
//! futures, the actor task and shutdown (the way tokio checks its semaphore: `src/sync/tests/
//! loom_*.rs`, with `#[cfg(loom)]` swapping the sync types).
//!
//! Outside loom it is `parking_lot`'s mutex: it spins briefly before it parks (a step is
//! shorter than a park), and it does not poison, which the shard does not need: a step that
//! panics closes the shard before the lock is let go (`runtime/shard.rs`).

#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use loom_mutex::{Mutex, MutexGuard};

#[cfg(loom)]
mod loom_mutex {
    /// loom's mutex with `parking_lot`'s signature: `lock` returns the guard.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }
    }
}
