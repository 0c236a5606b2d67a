//! Cluster mode: per-key leases in a PostgreSQL table, so that processes sharing a database
//! exclude each other per key, each acquisition numbered by a fence.
//!
//! The folders are layers, arrows pointing down (`.ci/module-cycles` checks that no import
//! goes up):
//!
//! - `registry`: the public face, [`ClusterRegistry`] and [`ClusterBuilder`], which wires the
//!   lock path to the PostgreSQL store.
//! - `postgres/`: the store on PostgreSQL: statements, connections, listener, batching,
//!   configuration. Everything that knows SQL.
//! - `locking/`: the lock path over any lease store, which the registry runs on PostgreSQL and
//!   the simulator on the in-memory store, and the interface a store implements.
//! - `testing/` (tests only): the in-memory store, the contract every store keeps, and the
//!   simulator.
//! - `error` and `limits`: the errors, and the bounds they name; `owner`: the name a store
//!   writes in its rows ([`LeaseOwner`]); `snapshot`: the cluster view's types
//!   ([`ClusterSnapshot`]). They import nothing above.
//!
//! The crate's tests build this module without the `postgres` feature too, for the simulator
//! and the in-memory store: then only what they use is compiled (no tokio-postgres, no
//! public item), and what only PostgreSQL uses is left unused.
#![cfg_attr(not(feature = "postgres"), allow(dead_code, unused_imports))]

mod error;
mod limits;
mod locking;
#[cfg(feature = "postgres")]
mod owner;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
mod registry;
#[cfg(feature = "postgres")]
mod snapshot;
#[cfg(test)]
mod testing;

#[cfg(feature = "postgres")]
pub use error::ClusterError;
pub use locking::guard::ClusterGuard;
pub use locking::multi_guard::ClusterMultiGuard;
#[cfg(feature = "postgres")]
pub use owner::LeaseOwner;
#[cfg(feature = "postgres")]
pub use registry::{ClusterBuilder, ClusterRegistry};
#[cfg(feature = "postgres")]
pub use snapshot::{ClusterSnapshot, LeaseHolder, LeaseSnapshot, WaitingRequest};
