//! Per-key async locks for tokio, with one owner of all the bookkeeping.
//!
//! Services that must serialize work per key (a user, an account, a job) need a lock per key
//! without a lock map that grows for ever, and without the race where an entry is removed
//! while a task still uses it, so that two tasks hold "the same" key. `keyed-locks` keeps the
//! whole map (holder, FIFO waiter queue and reference count per key) with one owner that
//! changes it one step at a time, in one total order, as a [kameo](https://docs.rs/kameo)
//! actor would. Ownership is a role: each call runs its own step under the shard's lock,
//! with no task switch, and steps take the lock one at a time, in arrival order. An
//! entry exists exactly while someone holds or waits for its key, whatever happens to the
//! waiters: timeouts, `select!`, aborted tasks and panics included.
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
//! # What it guarantees
//!
//! - **Mutual exclusion per key**; distinct keys never wait for each other.
//! - **FIFO per key**, by order of arrival at the registry.
//! - **No leak**: the map holds an entry only while someone holds or waits for its key.
//! - **Cancel safety**: dropping a [`lock`](LockRegistry::lock) future at any moment, even
//!   with its grant in flight, leaves nothing behind and never wedges the key.
//! - **Every exit releases**: a [`KeyGuard`] releases on drop, on panic and on abort,
//!   without awaiting.
//! - **Shared locks, permits and several keys at once**: [`lock_shared`](LockRegistry::lock_shared)
//!   and [`acquire`](LockRegistry::acquire) share a key's permits in the same FIFO;
//!   [`lock_all`](LockRegistry::lock_all) holds every key of a set or none, and cannot
//!   deadlock whatever order callers list the keys in.
//! - **Fencing tokens**: every grant carries a token greater than all earlier ones (with
//!   [`shards`](RegistryBuilder::shards): greater than all earlier ones of its key, and never
//!   repeated).
//! - **Closed, not hung**: after [`shutdown`](LockRegistry::shutdown), or if the actor dies,
//!   every waiter and every later call gets [`LockError::Closed`].
//!
//! # How it is built
//!
//! [`table::LockTable`] is the pure state machine: no tokio, no clock, replayable step by
//! step. Each shard of a registry (one by default, see [`RegistryBuilder::shards`]) keeps one
//! table behind one mutex, and the one step that turns a request into table calls runs under
//! it: by default each caller runs its own step, on its own thread; in actor mode the shard's
//! [`RegistryActor`] runs every step, from a queue. The actor also handles kameo's messages
//! ([`Execution`] says who runs what). The order in which steps take the mutex is the order
//! of arrival that FIFO follows, and [`shutdown`](LockRegistry::shutdown) closes every shard
//! under its mutex before it returns.
//! [`LockRegistry`] and [`KeyGuard`] are the thin public handles. With a journal on
//! ([`RegistryBuilder::journal`]), everything the table did can be saved as text
//! ([`trace`]), replayed exactly ([`replay`]) and drawn (the `timeline` example).
//! ARCHITECTURE.md in the repository follows a request through every layer.
//!
//! # When not to use it
//!
//! - **Synchronous code** or critical sections that never await: a `std`/`parking_lot`
//!   mutex per shard, or `dashmap`, is simpler and faster. Threads that must share keys with
//!   async tasks can take them here with the blocking calls
//!   ([`blocking_lock`](LockRegistry::blocking_lock) and its siblings), in the same queue.
//! - **A fixed, small set of keys** known up front: a `tokio::sync::Mutex` per key in a plain
//!   struct needs no registry at all.
//! - **Across processes or machines**, `LockRegistry` alone: it lives in one process. With
//!   the `postgres` feature, `ClusterRegistry` takes the same locks across the processes that
//!   share a PostgreSQL database, with leases and fencing tokens (check them at the
//!   resource).
//! - **Throughput above all**: on the repository's 2-core benchmarks the best mutex-map
//!   crate does 1.2× (many tasks on one key) to 1.4× (one task, a new key each time)
//!   more lock/unlock pairs per second than the default registry; with 8 shards we lead on
//!   many keys under many tasks. The README has the figures and the commands that measure
//!   them.

//! # Observing it in a service
//!
//! **Spans.** Every acquisition through the handle is a debug-level `tracing` span named
//! `acquisition`, target `keyed_locks::lock`, with the fields `call` (`"lock"`,
//! `"lock_shared"`, `"acquire"`, `"try_lock"`, ..., `"lock_all"`), `key` (its `Debug`; the
//! list of keys for `lock_all`), `permits` (for `acquire` and shared locks), and, once known,
//! `fencing_token`, `wait_us` (call to grant) and `hold_us` (grant to release). Inside it come
//! the events `granted`, `released`, `cancelled` (the future was dropped before it got the
//! key), `would block` and `closed`. The span lives in the call's future and then in the guard.
//! When no subscriber wants debug-level data the span is not made at all: the check is one
//! load of `tracing`'s global level filter (`cargo bench --bench observability` measures no
//! subscriber against one at info; `docs/performance-log.md` in the repository has those runs
//! and the instruction counts).
//!
//! **Targets**, for filters such as `RUST_LOG=keyed_locks::stall=warn`:
//! - `keyed_locks::lock`: the acquisition spans and their events (debug);
//! - `keyed_locks::owner`: every request the owner takes (`acquire`, `grant`, `release`,
//!   `cancel`, debug), and a `release refused` warning that only a bug can cause;
//! - `keyed_locks::stall`: the stall warnings below (warn).
//!
//! **Stall warnings.** [`RegistryBuilder::warn_held_longer_than`] warns once per hold that
//! passes its threshold, with the key, the fencing token and how long it has been held;
//! [`RegistryBuilder::warn_ungranted_pickup_after`] warns once per grant that its future has
//! not picked up in time (a futurelock, see the FAQ). Both are off by default and cost nothing
//! then.
//!
//! **Metrics** (feature `metrics`, through the [`metrics`](https://docs.rs/metrics) facade;
//! the application installs the exporter, before building the registry):
//!
//! | name | kind | meaning |
//! |---|---|---|
//! | `keyed_locks_grants_total` | counter | grants made |
//! | `keyed_locks_cancellations_total` | counter | waiters withdrawn from a queue, and grants refused because their waiter had given up (one that gives up after its grant reached it counts as a grant and a release) |
//! | `keyed_locks_would_blocks_total` | counter | try calls refused because the key was taken |
//! | `keyed_locks_keys` | gauge | entries in the lock map |
//! | `keyed_locks_held` | gauge | keys held |
//! | `keyed_locks_waiting` | gauge | callers queued |
//! | `keyed_locks_wait_seconds` | histogram | from a handle's call to its grant |
//! | `keyed_locks_hold_seconds` | histogram | from a grant to the guard's drop |
//!
//! There are no labels: a label per key would make one series per key, without bound. The
//! gauges are sums over every shard of every registry in the process. With the feature on,
//! every call reads the clock three times and allocates its observation: an uncontended
//! lock/unlock pair runs about 1,500 instructions instead of about 800 (callgrind, in the
//! repository's `docs/performance-log.md`), so switch it on where the numbers are wanted.
//!
//! # FAQ
//!
//! **I locked a key I already hold and the task hangs.** Locks are not re-entrant: a
//! second [`lock`](LockRegistry::lock) of a key from the task that holds it queues behind
//! that task's own guard, which is never dropped while the task waits. Keep the guard and pass
//! it (or a reference) down instead of locking again, or use
//! [`try_lock`](LockRegistry::try_lock), which answers [`TryLockError::WouldBlock`] rather
//! than wait:
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
//! **What if a guard is passed to `std::mem::forget`?** Its key stays held for the life of
//! the registry, as with any forgotten mutex guard: forgetting is safe in Rust, so it cannot
//! be forbidden, and the registry cannot tell a forgotten guard from a long hold.
//! [`warn_held_longer_than`](RegistryBuilder::warn_held_longer_than) is how you find one;
//! [`stats`](LockRegistry::stats) shows the key as held. Nothing else is affected: other
//! keys, and the map's entry count, stay as they are.
//!
//! **What is a futurelock, and how do I avoid it?** Strict FIFO means the key goes to the
//! first waiter the moment it is free, even if that waiter's future is no longer being polled.
//! The usual cause is `select!` over `&mut fut` in a loop: the branch that lost keeps its
//! future alive (so it stays queued and gets the grant) while the task works elsewhere, maybe
//! waiting for something that needs the same key. The key is then held by nobody who runs.
//! Avoid it by dropping a lock future you are not polling (a `select!` on the future itself,
//! not on `&mut`, drops the loser, and dropping is always safe here), or by spawning the
//! locked work as its own task. [`warn_ungranted_pickup_after`](RegistryBuilder::warn_ungranted_pickup_after)
//! reports the symptom: a grant nobody picked up. The repository's `futurelock` example makes
//! one, and shows both the warning and the fix.
//!
//! **Why is there no lock timeout parameter?** Because every call is cancel safe: dropping
//! a waiting future leaves nothing behind, so `tokio::time::timeout(d, registry.lock(k))` is
//! the timeout, and `select!` with any other event (shutdown, a client disconnect) works the
//! same way. A parameter would do the same thing with less choice.
//!
//! ```
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), keyed_locks::LockError> {
//! let registry = keyed_locks::LockRegistry::spawn();
//! let held = registry.lock("job:3").await?;
//! match tokio::time::timeout(Duration::from_millis(50), registry.lock("job:3")).await {
//!     Ok(guard) => drop(guard?),
//!     Err(_elapsed) => println!("busy; try later"),  // and no entry is left behind
//! }
//! drop(held);
//! assert_eq!(registry.stats().await?.keys, 0);
//! # Ok(())
//! # }
//! ```
//!
//! # Stability and supported versions
//!
//! Everything public follows semver: the handle, the guard, the errors, the kameo
//! [`messages`], and the pure core ([`table`], [`journal`], [`trace`], [`replay`]), which is
//! public because replaying and model-testing the table are features. The core's types are
//! the crate's own: a [`table::WaiterId`] is the acquirer's arrival number at its table,
//! not a storage detail, so traces stay valid whatever the table stores records in. The trace
//! format carries a version in its header; the parser reads its own version and rejects
//! others with a message saying what changed.
//!
//! kameo's `ActorRef<RegistryActor<K>>` is part of the API ([`LockRegistry::actor_ref`],
//! [`messages`]), and kameo is not 1.0 yet: this crate supports one kameo minor series at a
//! time, today 0.22 (0.22.0 and later patches). Moving to a new kameo minor series is a
//! breaking release of this crate. tokio 1.47 or later is required (kameo 0.22's own floor),
//! and Rust 1.88 or later.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]
#![deny(unused_must_use)]

// The layers, one folder each:
// - `pure`: the lock table and what records, writes and replays it. No tokio, no kameo, no
//   clock; it imports nothing from the other layers.
// - `runtime`: the owner of each shard's table at run time: the shard and its mutex, the
//   owner's step, the pending grants, the actor, the shard router, the stall timer, metrics.
// - the public face, at the top: the handle, the guard, the messages, the errors, and what
//   each acquisition tells `tracing` (`observe`).
mod pure;
mod runtime;
// Cluster mode (the `postgres` feature): the same locks across processes, with leases per key
// in a PostgreSQL table.
#[cfg(feature = "postgres")]
mod cluster;

// The blocking twins of the acquires, for threads outside the runtime.
mod blocking;
mod error;
mod guard;
pub mod messages;
mod multi_guard;
mod observe;
mod registry;

pub use pure::{journal, replay, table, trace};
use pure::{overdue, stats};
use runtime::{actor, execution, owner, pending, request, router, shard, stall, sync};

use std::fmt::Debug;
use std::hash::Hash;

/// Every code block of README.md, compiled and run by `cargo test` as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub use actor::RegistryActor;
#[cfg(feature = "postgres")]
pub use cluster::{ClusterBuilder, ClusterError, ClusterGuard, ClusterRegistry};
pub use error::{
    AcquireError, JournalError, LockError, PermitsError, TryAcquireError, TryLockError,
    TryPermitsError,
};
pub use execution::Execution;
pub use guard::KeyGuard;
pub use multi_guard::MultiGuard;
pub use registry::{LockRegistry, RegistryBuilder};
pub use stats::RegistryStats;

/// What a key must be: hashable, comparable, cloneable, printable for `tracing`, and movable
/// across tasks. Implemented for every such type.
pub trait LockKey: Hash + Eq + Clone + Debug + Send + Sync + 'static {}

impl<K> LockKey for K where K: Hash + Eq + Clone + Debug + Send + Sync + 'static {}
