//! The lease store on PostgreSQL: everything that knows SQL or the wire.
//!
//! - `store`: [`PgLeaseStore`](store::PgLeaseStore), the tables, their invariants and the
//!   statements that keep them (a new kind of lease's SQL goes there), and its tests against
//!   the real server (`store/tests.rs`).
//! - `batch`: group commit on the client, the requests of many keys in one statement.
//! - `link`: the statement connection, made again after a loss; `listener`: the LISTEN
//!   connection, likewise; `connection`: the server's address and one connection to it;
//!   `backoff`: the delays between reconnection attempts; `sslmode`: libpq's TLS parameters,
//!   taken out of the URL; `tls`: the TLS configuration each mode asks for, and the
//!   handshake's failures named.
//! - `view`: the cluster view's read of the live rows, on a connection of its own.
//! - `config`: what a store is told (URL, table prefix, lease and heartbeat), checked before
//!   anything reaches the server.

pub(crate) mod backoff;
pub(crate) mod batch;
pub(crate) mod config;
pub(crate) mod connection;
pub(crate) mod link;
pub(crate) mod listener;
pub(crate) mod sslmode;
pub(crate) mod store;
pub(crate) mod tls;
pub(crate) mod view;
