//! Per-key async locks for tokio, with one owner of all the bookkeeping.
//!
//! A [`LockRegistry`] serializes work per key (a user, an account, a job) without a lock map that
//! grows for ever and without the race where an entry is removed while a task still uses it. Each
//! shard's map (holder, FIFO waiter queue and reference count per key) has one owner that changes
//! it one step at a time, in one total order; an entry exists exactly while someone holds or waits
//! for its key, whatever happens to the waiters. The README lists the guarantees, compares the
//! crate with its peers and gives the measured performance; this page is the API guide.
//!
//! ```
//! use keyed_locks::LockRegistry;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), keyed_locks::LockError> {
//! let registry = LockRegistry::spawn();
//!
//! let guard = registry.lock(42u64).await?;   // waits, FIFO, while another task holds 42
//! println!("fencing token {}", guard.fencing_token());
//! drop(guard);                               // releases without awaiting
//!
//! assert_eq!(registry.stats().await?.keys, 0); // nothing left behind
//! # Ok(())
//! # }
//! ```
//!
//! # The calls
//!
//! Every call is cancel safe: `tokio::time::timeout(d, registry.lock(k))` is a lock timeout, and a
//! `select!` that drops a waiting call leaves nothing behind.
//!
//! ```
//! use std::time::Duration;
//!
//! use keyed_locks::{LockError, LockRegistry, TryLockError};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), LockError> {
//! let registry: LockRegistry<String> = LockRegistry::spawn();
//!
//! // Wait for a key; give up after a while without leaving anything behind.
//! match tokio::time::timeout(Duration::from_secs(1), registry.lock("user:42".into())).await {
//!     Ok(guard) => {
//!         let _guard = guard?; // Err only if the registry has shut down
//!     }
//!     Err(_elapsed) => { /* nothing to clean up */ }
//! }
//!
//! // Take a key only if it is free right now (a key with waiters is not free).
//! match registry.try_lock("job:9".into()).await {
//!     Ok(_guard) => { /* ... */ }
//!     Err(TryLockError::WouldBlock) => { /* someone has it */ }
//!     Err(_closed) => { /* the registry has shut down */ }
//! }
//!
//! // Counts, after every request this task made before.
//! let stats = registry.stats().await?;
//! println!("{} keys, {} held, {} waiting", stats.keys, stats.held, stats.waiting);
//!
//! // Stop: waiters get Closed, later calls get Closed, guards still out drop quietly.
//! registry.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! **Shared locks and permits.** A key can have several permits
//! ([`RegistryBuilder::capacity`]). [`lock_shared`](LockRegistry::lock_shared) takes one,
//! [`lock`](LockRegistry::lock) takes them all, and [`acquire`](LockRegistry::acquire) takes any
//! number: read/write locks and per-key semaphores, in one strict FIFO per key, so a queued
//! writer is never starved by later readers and a big request is never overtaken by small ones.
//!
//! ```
//! use std::num::NonZeroU32;
//!
//! use keyed_locks::LockRegistry;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = LockRegistry::builder()
//!     .capacity(NonZeroU32::new(3).ok_or("no permits")?) // permits per key; 1 by default
//!     .spawn();
//!
//! // Readers share a key (up to its 3 permits); a writer waits for all of them.
//! let reader = registry.lock_shared("balance:7").await?;
//! let another = registry.lock_shared("balance:7").await?;
//! drop((reader, another));
//! drop(registry.lock("balance:7").await?);
//!
//! // At most 3 requests in flight per user (the repository's examples/rate_limit.rs).
//! let permit = registry.acquire("user:42", 1).await?;
//! assert_eq!(registry.stats().await?.permits, 1);
//! drop(permit);
//! # Ok(())
//! # }
//! ```
//!
//! **Several keys at once.** [`lock_all`](LockRegistry::lock_all) holds every key of a set or
//! none, and cannot deadlock whatever order callers list the keys in: the request joins the
//! queue of each of its keys in one step and is granted when it is first in all of them.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), keyed_locks::LockError> {
//! let registry = keyed_locks::LockRegistry::spawn();
//! let (from, to) = ("account:1", "account:2");
//! // Another task may lock [to, from] at the same time: one of the two goes first.
//! let both = registry.lock_all([from, to]).await?;
//! assert!(both.fencing_token(&from).is_some());
//! drop(both); // releases both keys
//! assert_eq!(registry.stats().await?.keys, 0);
//! # Ok(())
//! # }
//! ```
//!
//! **Threads.** Code outside the runtime (a std thread, `spawn_blocking`, a synchronous
//! callback) takes keys with [`blocking_lock`](LockRegistry::blocking_lock),
//! [`blocking_lock_shared`](LockRegistry::blocking_lock_shared),
//! [`blocking_acquire`](LockRegistry::blocking_acquire),
//! [`blocking_lock_all`](LockRegistry::blocking_lock_all) and their `blocking_try_*` twins
//! (the `try_*` futures wait for the actor task in actor mode, so sync code needs the twins):
//! the same queue, tokens and guards as the async calls, the thread parked while it waits.
//! On a runtime's own thread they panic, as tokio's `Mutex::blocking_lock` does.
//!
//! **Shards.** [`RegistryBuilder::shards`] spreads the keys over several owners, each with its
//! own lock, table and actor: many tasks over many keys then stop meeting on one lock. Every rule
//! holds per key; fencing tokens increase per key (with one shard, across the registry), and each
//! shard keeps its own journal ([`LockRegistry::journals`]).
//!
//! **Execution modes.** By default a call runs its own step under its shard's lock, with no
//! task switch. [`Execution::ActorTask`] sends every request to the shard's actor task instead;
//! every promise holds the same in both.
//!
//! **kameo.** Code that composes kameo actors can talk to a shard's actor directly with the
//! [`messages`]: `registry.actor_ref_for(&key).ask(messages::Acquire { key })` yields the guard
//! once granted (the module says how its cancellation differs from `lock`).
//!
//! **Across processes.** With the `postgres` feature, `ClusterRegistry` takes the same locks
//! across the processes that share a PostgreSQL database, with leases and fencing tokens
//! (the repository's `docs/cluster.md`).
//!
//! **Observing it.** [`LockRegistry::stats`]; a `tracing` span per acquisition (target
//! `keyed_locks::lock`); stall warnings ([`RegistryBuilder::warn_held_longer_than`],
//! [`RegistryBuilder::warn_ungranted_pickup_after`]); counters, gauges and histograms with the
//! `metrics` feature. The repository's `docs/observability.md` lists every field, target and
//! metric.
//!
//! **Recording.** [`RegistryBuilder::journal`] keeps a journal of every input and output of the
//! lock table, which [`replay`] reproduces exactly (the repository's `docs/record-replay.md`).
//! With the `timeline` feature, `journal.to_svg()` draws it: one lane per key, holds and waits
//! as bars (`keyed_locks::timeline`).
//!
//! # When not to use it
//!
//! - **Synchronous code only**, or critical sections that never await: a `std` or
//!   `parking_lot` mutex per shard, or `dashmap`, is simpler and faster. Threads that share
//!   keys with async tasks take them here with the blocking calls.
//! - **A fixed, small set of keys** known up front: a `tokio::sync::Mutex` per key in a plain
//!   struct needs no registry.
//! - **Throughput above all**: with one shard the best mutex-map crates do more lock/unlock
//!   pairs per second on the repository's benchmarks (the README has the figures).
//!
//! # FAQ
//!
//! **I locked a key I already hold and the task hangs.** Locks are not re-entrant: a second
//! [`lock`](LockRegistry::lock) of a key from the task that holds it queues behind that task's
//! own guard, which is never dropped while the task waits. Keep the guard and pass it (or a
//! reference) down instead of locking again, or use [`try_lock`](LockRegistry::try_lock), which
//! answers [`TryLockError::WouldBlock`] rather than wait:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = keyed_locks::LockRegistry::spawn();
//! let guard = registry.lock("account:1").await?;
//! // Would wait for ever: this task holds the key.
//! let again = tokio::time::timeout(
//!     std::time::Duration::from_millis(10),
//!     registry.lock("account:1"),
//! );
//! assert!(again.await.is_err());
//! assert_eq!(
//!     registry.try_lock("account:1").await.unwrap_err(),
//!     keyed_locks::TryLockError::WouldBlock
//! );
//! # drop(guard);
//! # Ok(())
//! # }
//! ```
//!
//! **What if a guard is passed to `std::mem::forget`?** Its key stays held for the life of the
//! registry, as with any forgotten mutex guard: forgetting is safe in Rust, so it cannot be
//! forbidden, and the registry cannot tell a forgotten guard from a long hold.
//! [`warn_held_longer_than`](RegistryBuilder::warn_held_longer_than) is how you find one;
//! [`stats`](LockRegistry::stats) shows the key as held. Other keys are not affected.
//!
//! **What is a futurelock, and how do I avoid it?** Strict FIFO means the key goes to the first
//! waiter the moment it is free, even if that waiter's future is no longer being polled. The
//! usual cause is `select!` over `&mut fut` in a loop: the branch that lost keeps its future alive
//! (so it stays queued and gets the grant) while the task works elsewhere, maybe waiting for
//! something that needs the same key. Avoid it by dropping a lock future you are not polling (a
//! `select!` on the future itself, not on `&mut`, drops the loser), or by spawning the locked
//! work as its own task.
//! [`warn_ungranted_pickup_after`](RegistryBuilder::warn_ungranted_pickup_after) reports the
//! symptom: a grant nobody picked up. The repository's `futurelock` example makes one, and shows
//! both the warning and the fix.
//!
//! **Every call suddenly returns `Closed`, though I never called `shutdown`.** A key's
//! `Hash`, `Eq`, `Clone` or `Debug` panicked inside the registry's step. The table may then be
//! half-changed, so the shard closes rather than hand out wrong grants: the panic reached the
//! caller that ran the step, and from then on every call on that shard gets
//! [`LockError::Closed`], which with one shard (the default) is every key. Keys whose traits
//! cannot panic never do this; see [`LockKey`].
//!
//! **Why is there no lock timeout parameter?** Because every call is cancel safe: dropping a
//! waiting future leaves nothing behind, so `tokio::time::timeout` around any call is the
//! timeout, and `select!` with any other event (shutdown, a client disconnect) works the same way.
//!
//! # Stability and supported versions
//!
//! Everything public follows semver: the handle, the builder, the guards, the errors, the stats,
//! [`Execution`], the kameo actor and [`messages`], and recording ([`journal`], [`replay`]). The
//! lock table itself is internal.
//!
//! kameo's `ActorRef<RegistryActor<K>>` is part of the API ([`LockRegistry::actor_ref`],
//! [`messages`]), and kameo is not 1.0 yet: this crate supports one kameo minor series at a
//! time, today 0.22 (0.22.0 and later patches). Moving to a new kameo minor series is a breaking
//! release of this crate. tokio 1.47 or later is required (kameo 0.22's own floor), and Rust 1.88
//! or later.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]
#![deny(unused_must_use)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The layers, arrows pointing down (`.ci/run` checks that no module imports form a cycle):
// - `key`: what a key must be, which every layer above names.
// - `pure`: the lock table and what records, writes and replays it. No tokio, no kameo, no
//   clock; it imports nothing from the other layers.
// - `runtime`: the owner of each shard's table at run time: the shard and its mutex, the
//   owner's step, the pending grants, the actor, the shard router, the stall timer, metrics.
//   It names nothing of the face: what both need (`Execution`) lives here.
// - the public face, at the top: the handle, the guard, the messages, the errors, and what
//   each acquisition tells `tracing` (`observe`).
mod key;
mod pure;
mod runtime;
// Cluster mode (the `postgres` feature): the same locks across processes, with leases per key
// in a PostgreSQL table. The tests build its core without the feature, for the simulator.
#[cfg(any(feature = "postgres", test))]
mod cluster;

// The blocking twins of the acquires, for threads outside the runtime.
mod blocking;
mod error;
mod guard;
pub mod messages;
mod multi_guard;
mod observe;
mod registry;
// Lock timelines (the `timeline` feature): a journal drawn as SVG or text. A face over `pure`,
// whose journal it reads; no module names it.
#[cfg(feature = "timeline")]
pub mod timeline;

pub use pure::{journal, replay, trace};

/// **Unstable, not covered by semver**: the lock table itself and its recording wrapper, for
/// the crate's own model tests and for tools that drive a table step by step. Present only
/// with the `unstable-table` feature; the registry is the supported way in.
#[cfg(feature = "unstable-table")]
#[doc(hidden)]
pub mod table {
    pub use crate::pure::journaled_table::JournaledTable;
    pub use crate::pure::table::*;
}

/// Every code block of README.md, compiled and run by `cargo test` as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The code blocks of `docs/service.md`, as doctests.
#[doc = include_str!("../docs/service.md")]
#[cfg(doctest)]
pub struct ServiceDoctests;

/// The code blocks of `docs/cluster.md`, as doctests.
#[doc = include_str!("../docs/cluster.md")]
#[cfg(doctest)]
pub struct ClusterDoctests;

/// The code blocks of `docs/record-replay.md`, as doctests.
#[doc = include_str!("../docs/record-replay.md")]
#[cfg(doctest)]
pub struct RecordReplayDoctests;

/// The code blocks of `docs/observability.md`, as doctests.
#[doc = include_str!("../docs/observability.md")]
#[cfg(doctest)]
pub struct ObservabilityDoctests;

#[cfg(feature = "postgres")]
pub use cluster::{
    ClusterBuilder, ClusterError, ClusterGuard, ClusterMultiGuard, ClusterRegistry,
    ClusterSnapshot, LeaseHolder, LeaseOwner, LeaseSnapshot, WaitingRequest,
};
pub use error::{
    AcquireError, JournalError, LockError, PermitsError, TryAcquireError, TryLockError,
    TryPermitsError,
};
pub use guard::KeyGuard;
pub use key::LockKey;
pub use messages::actor::RegistryActor;
pub use multi_guard::MultiGuard;
pub use pure::snapshot::{DurationBounds, HolderSnapshot, KeyHold, KeySnapshot};
pub use pure::stats::RegistryStats;
pub use registry::LockRegistry;
pub use registry::builder::RegistryBuilder;
pub use runtime::execution::Execution;
