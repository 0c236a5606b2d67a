//! Per-key async locks for tokio, with one owner of all the bookkeeping.
//!
//! Services that must serialize work per key (a user, an account, a job) need a lock per key
//! without a lock map that grows for ever, and without the race where an entry is removed
//! while a task still uses it, so that two tasks hold "the same" key. `keyed-locks` keeps the
//! whole map (holder, FIFO waiter queue and reference count per key) with one owner that
//! changes it one step at a time, in one total order, as a [kameo](https://docs.rs/kameo)
//! actor would. Ownership is a role: a call that finds the owner idle runs the step itself,
//! with no task switch; a call that finds it busy queues, and is served in arrival order. An
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
//! step. Each shard of a registry (one by default, see [`RegistryBuilder::shards`]) owns one
//! table behind a run token: whoever holds the token runs the one step that turns a request
//! into table calls, be it a caller that found the shard idle or the shard's
//! [`RegistryActor`], which serves requests handed to it and kameo's messages
//! ([`Execution`] says who runs what).
//! [`LockRegistry`] and [`KeyGuard`] are the thin public handles. With a journal on
//! ([`RegistryBuilder::journal`]), everything the table did can be saved as text
//! ([`trace`]), replayed exactly ([`replay`]) and drawn (the `timeline` example).
//! ARCHITECTURE.md in the repository follows a request through every layer.
//!
//! # When not to use it
//!
//! - **Synchronous code** or critical sections that never await: a `std`/`parking_lot`
//!   mutex per shard, or `dashmap`, is simpler and faster.
//! - **A fixed, small set of keys** known up front: a `tokio::sync::Mutex` per key in a plain
//!   struct needs no registry at all.
//! - **Across processes or machines**, `LockRegistry` alone: it lives in one process. With
//!   the `postgres` feature, `ClusterRegistry` takes the same locks across the processes that
//!   share a PostgreSQL database, with leases and fencing tokens (check them at the
//!   resource).
//! - **Throughput above all**: on the repository's 2-core benchmarks the best mutex-map
//!   crate does 1.2× (one key, many tasks) to 1.5× (many keys, many tasks) more lock/unlock
//!   pairs per second. The README has the figures and the commands that measure them.

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
// - `runtime`: the owner of each shard's table at run time: the run token and its queue, the
//   owner's step, the grant channels, the actor, the shard router.
// - the public face, at the top: the handle, the guard, the messages, the errors.
mod pure;
mod runtime;
// Cluster mode (the `postgres` feature): the same locks across processes, with leases per key
// in a PostgreSQL table.
#[cfg(feature = "postgres")]
mod cluster;

mod error;
mod guard;
pub mod messages;
mod multi_guard;
mod observe;
mod registry;

pub use pure::{journal, replay, table, trace};
use pure::{overdue, stats};
use runtime::{actor, grant, owner, request, run_token, shard, stall};

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
pub use guard::KeyGuard;
pub use multi_guard::MultiGuard;
pub use registry::{LockRegistry, RegistryBuilder};
pub use run_token::Execution;
pub use stats::RegistryStats;

/// What a key must be: hashable, comparable, cloneable, printable for `tracing`, and movable
/// across tasks. Implemented for every such type.
pub trait LockKey: Hash + Eq + Clone + Debug + Send + Sync + 'static {}

impl<K> LockKey for K where K: Hash + Eq + Clone + Debug + Send + Sync + 'static {}
