//! The lock the shard protocol is built on, swapped for loom's under `--cfg loom`, so that the
//! models in `runtime/loom_models.rs` explore every interleaving of callers, guards, dropped
//! futures, the actor task and shutdown (the way tokio checks its semaphore: `src/sync/tests/
//! loom_*.rs`, with `#[cfg(loom)]` swapping the sync types).

#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
