//! Cluster mode's lease store: per-key leases in a PostgreSQL table, so that processes sharing
//! a database exclude each other per key, each acquisition numbered by a fence.
//!
//! - `lease_store`: the interface the rest of the crate uses ([`LeaseStore`], [`Fence`],
//!   [`LeaseNotice`]); it knows no SQL.
//! - `postgres`: [`PgLeaseStore`], the table, its invariants and its statements.
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
mod lease_store;
mod link;
mod listener;
mod notices;
mod postgres;

pub(crate) use config::PgLeaseConfig;
pub(crate) use error::{ClusterError, LeaseError};
pub(crate) use lease_store::{Fence, LeaseNotice, LeaseStore};
pub(crate) use notices::LeaseNotices;
pub(crate) use postgres::PgLeaseStore;
