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
//!   `memory_store` (tests only): the same table in memory on tokio's clock, for simulations.
//! - `link`: the statement connection, made again after a loss; `listener`: the LISTEN
//!   connection, likewise; `notices`: the channel from the listener to the waiters.
//! - `config`, `connection`, `backoff`, `entropy`, `error`: what they say.
//!
//! Without TLS for now: tokio-postgres' `NoTls` only.

mod backoff;
mod config;
mod connection;
mod entropy;
mod error;
mod guard;
mod lease_note;
mod lease_store;
mod leases;
mod link;
mod listener;
mod locks;
#[cfg(test)]
mod memory_store;
mod notices;
mod postgres;
mod registry;
#[cfg(test)]
mod sim;

pub use error::ClusterError;
pub use guard::ClusterGuard;
pub use registry::{ClusterBuilder, ClusterRegistry};
