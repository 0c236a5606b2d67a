//! Cluster mode: per-key leases in a PostgreSQL table, so that processes sharing a database
//! exclude each other per key, each acquisition numbered by a fence.
//!
//! - `registry` and `guard`: the public face, [`ClusterRegistry`] and [`ClusterGuard`].
//! - `locks`: the lock path on any lease store, which the registry runs on PostgreSQL and the
//!   simulator on the in-memory store.
//! - `leases`: the process's leases and who in the process wants them (lock cohorting); it
//!   knows the store only through [`LeaseStore`]. `lease_note`: what it notes in the journal.
//! - `lease_store`: the interface the rest of the crate uses ([`LeaseStore`], [`Fence`],
//!   [`LeaseNotice`]); it knows no SQL.
//! - `postgres`: [`PgLeaseStore`], the table, its invariants and its statements.
//!   `memory_store` (tests only): the same table in memory on tokio's clock.
//! - `sim` (tests only): the simulator, several processes over one in-memory table.
//! - `link`: the statement connection, made again after a loss; `listener`: the LISTEN
//!   connection, likewise; `notices`: the channel from the listener to the waiters.
//! - `batch`: group commit on the client, the requests of many keys in one statement.
//! - `config`, `connection`, `backoff`, `entropy`, `error`: what they say.
//!
//! Without TLS for now: tokio-postgres' `NoTls` only.
//!
//! The crate's tests build this module without the `postgres` feature too, for the simulator
//! and the in-memory store: then only what they use is compiled (no tokio-postgres, no
//! public item), and what only PostgreSQL uses is left unused.
#![cfg_attr(not(feature = "postgres"), allow(dead_code, unused_imports))]

#[cfg(feature = "postgres")]
mod backoff;
mod batch;
#[cfg(feature = "postgres")]
mod config;
#[cfg(feature = "postgres")]
mod connection;
mod entropy;
mod error;
mod guard;
mod lease_note;
mod lease_store;
mod leases;
#[cfg(feature = "postgres")]
mod link;
#[cfg(feature = "postgres")]
mod listener;
mod locks;
#[cfg(test)]
mod memory_store;
mod notices;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
mod registry;
#[cfg(test)]
mod sim;

#[cfg(feature = "postgres")]
pub use error::ClusterError;
pub use guard::ClusterGuard;
#[cfg(feature = "postgres")]
pub use registry::{ClusterBuilder, ClusterRegistry};
