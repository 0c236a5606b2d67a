//! The errors of cluster mode: [`ClusterError`] for connecting a lease store (public), [`LeaseError`] for one failed lease statement (internal).

use std::error::Error;
use std::fmt;
#[cfg(feature = "postgres")]
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::cluster::limits::{MAX_KEY_BYTES, MIN_HEARTBEAT};

/// The cause behind a [`ClusterError`], boxed so that the public type does not name
/// tokio-postgres' error type (a tokio-postgres upgrade stays out of our API).
pub(crate) type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// Why a lease store could not be connected, or the lease table not read for a
/// [`ClusterRegistry::snapshot`](crate::ClusterRegistry::snapshot).
#[cfg(feature = "postgres")]
#[derive(Debug)]
#[non_exhaustive]
pub enum ClusterError {
    /// The database URL is not a PostgreSQL connection string.
    BadUrl {
        /// The parser's complaint.
        source: BoxError,
    },
    /// No connection could be made to the server (refused, no route, unknown host).
    Unreachable {
        /// The server's hosts and ports, as the URL names them (never its password).
        server: String,
        /// The socket error.
        source: BoxError,
    },
    /// The server did not answer within the connect timeout, while connecting or while the
    /// table was being set up; or, for a snapshot, within the statement timeout (the
    /// heartbeat).
    ConnectTimeout {
        /// The server's hosts and ports.
        server: String,
        /// The timeout that ran out.
        after: Duration,
    },
    /// The table prefix is not a plain SQL identifier, so the table name cannot be written
    /// into SQL safely.
    BadTablePrefix {
        /// The prefix as given.
        prefix: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The role lacks a privilege the store needs on its table (or on the schema, to create it).
    MissingPermission {
        /// The lease table's name.
        table: String,
        /// The server's refusal.
        source: BoxError,
    },
    /// The lease cannot outlast a missed heartbeat: it must last at least three heartbeats,
    /// and a heartbeat (which is also the statement timeout) must be at least
    /// `MIN_HEARTBEAT`.
    LeaseTooShort {
        /// The lease asked for.
        lease: Duration,
        /// The heartbeat asked for.
        heartbeat: Duration,
    },
    /// The lease is longer than `MAX_LEASE`: a holder that dies would block its keys that long.
    LeaseTooLong {
        /// The lease asked for.
        lease: Duration,
        /// The longest lease accepted.
        max: Duration,
    },
    /// More local hand-offs per lease than the fencing token's low bits can count.
    TooManyHandoffs {
        /// The hand-offs asked for.
        asked: u32,
        /// The most accepted.
        max: u32,
    },
    /// The server answered the request for TLS with "no", and the URL's `sslmode` (`require`,
    /// `verify-ca` or `verify-full`) forbids plain text.
    TlsNotOffered {
        /// The server's hosts and ports.
        server: String,
        /// The `sslmode` that asked for TLS.
        mode: &'static str,
    },
    /// The server refused a connection without TLS (`sslmode=disable`): its `pg_hba.conf`
    /// lets this role in only over TLS (or not at all).
    PlainTextRefused {
        /// The server's hosts and ports.
        server: String,
        /// The server's refusal.
        source: BoxError,
    },
    /// The server's certificate did not verify under `sslmode=verify-ca` or `verify-full`:
    /// an unknown issuer, a wrong host name, an expired certificate.
    BadCertificate {
        /// The server's hosts and ports.
        server: String,
        /// What failed, in words: `unknown issuer: ...`, `wrong host name: ...`,
        /// `expired ...`.
        problem: String,
        /// The TLS library's error.
        source: BoxError,
    },
    /// The TLS handshake failed for another reason than the certificate (no protocol version
    /// or cipher in common, a malformed message).
    TlsHandshake {
        /// The server's hosts and ports.
        server: String,
        /// The TLS library's error.
        source: BoxError,
    },
    /// The root certificates named by the URL's `sslrootcert` cannot be read, or the file
    /// holds none.
    TlsRootFile {
        /// The file, as the URL names it.
        path: PathBuf,
        /// Why it cannot be used.
        source: BoxError,
    },
    /// `verify-ca` or `verify-full` without `sslrootcert` uses the platform's root
    /// certificates, and none could be loaded.
    NoSystemRoots {
        /// Why none were loaded.
        source: BoxError,
    },
    /// The TLS library refused the configuration built for the connection (its crypto
    /// provider offers no protocol version it accepts).
    TlsConfig {
        /// The TLS library's error.
        source: BoxError,
    },
    /// The lease table's keys have another number of permits than this registry's
    /// [`capacity`](crate::ClusterBuilder::capacity): every process of a table must give the
    /// same, or one would count permits another does not have.
    CapacityMismatch {
        /// The lease table's name.
        table: String,
        /// The permits per key the table was made with.
        table_capacity: u32,
        /// The permits per key this registry asked for.
        asked: u32,
    },
    /// The registry has shut down: it reads no table for a snapshot.
    Closed,
    /// Any other failure of the server: authentication, a missing database, a table of another
    /// shape, a read-only server.
    Database {
        /// What the store was doing, e.g. `creating table "keyed_locks_leases"`.
        action: String,
        /// The server's error.
        source: BoxError,
    },
}

#[cfg(feature = "postgres")]
impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterError::BadUrl { .. } => f.write_str("the database URL is not valid"),
            ClusterError::Unreachable { server, .. } => {
                write!(f, "cannot reach the postgresql server at {server}")
            }
            ClusterError::ConnectTimeout { server, after } => {
                write!(
                    f,
                    "no answer from the postgresql server at {server} within {after:?}"
                )
            }
            ClusterError::BadTablePrefix { prefix, reason } => {
                write!(f, "bad table prefix {prefix:?}: {reason}")
            }
            ClusterError::MissingPermission { table, .. } => {
                write!(
                    f,
                    "missing permission to create, read or write table {table:?}"
                )
            }
            ClusterError::LeaseTooShort { lease, heartbeat } => write!(
                f,
                "a lease of {lease:?} with a heartbeat every {heartbeat:?} is too short: \
                 the lease must last at least 3 heartbeats, and a heartbeat at least {:?}",
                MIN_HEARTBEAT
            ),
            ClusterError::LeaseTooLong { lease, max } => {
                write!(
                    f,
                    "a lease of {lease:?} is longer than the maximum, {max:?}"
                )
            }
            ClusterError::TooManyHandoffs { asked, max } => write!(
                f,
                "max_local_handoffs of {asked} is above the maximum, {max}: a fencing token \
                 counts the hand-offs under one lease in 20 bits"
            ),
            ClusterError::TlsNotOffered { server, mode } => write!(
                f,
                "the postgresql server at {server} does not offer tls, which sslmode={mode} requires"
            ),
            ClusterError::PlainTextRefused { server, .. } => write!(
                f,
                "the postgresql server at {server} refused a connection without tls \
                 (sslmode=disable); it may accept one with sslmode=require or stricter"
            ),
            ClusterError::BadCertificate {
                server, problem, ..
            } => write!(
                f,
                "the certificate of the postgresql server at {server} does not verify: {problem}"
            ),
            ClusterError::TlsHandshake { server, .. } => {
                write!(
                    f,
                    "the tls handshake with the postgresql server at {server} failed"
                )
            }
            ClusterError::TlsRootFile { path, .. } => write!(
                f,
                "cannot use the root certificates in {} (sslrootcert)",
                path.display()
            ),
            ClusterError::NoSystemRoots { .. } => f.write_str(
                "no root certificate could be loaded from the platform's store; \
                 name a file with sslrootcert",
            ),
            ClusterError::TlsConfig { .. } => {
                f.write_str("the tls library refused the connection's configuration")
            }
            ClusterError::CapacityMismatch {
                table,
                table_capacity,
                asked,
            } => write!(
                f,
                "this registry's capacity is {asked} permits per key, but the lease table \
                 {table:?} has {table_capacity}: every process sharing a table must use the same"
            ),
            ClusterError::Closed => f.write_str("the cluster registry has shut down"),
            ClusterError::Database { action, .. } => {
                write!(f, "the postgresql server failed while {action}")
            }
        }
    }
}

#[cfg(feature = "postgres")]
impl Error for ClusterError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            ClusterError::BadUrl { source }
            | ClusterError::Unreachable { source, .. }
            | ClusterError::MissingPermission { source, .. }
            | ClusterError::Database { source, .. }
            | ClusterError::PlainTextRefused { source, .. }
            | ClusterError::BadCertificate { source, .. }
            | ClusterError::TlsHandshake { source, .. }
            | ClusterError::TlsRootFile { source, .. }
            | ClusterError::NoSystemRoots { source }
            | ClusterError::TlsConfig { source } => Some(&**source),
            ClusterError::ConnectTimeout { .. }
            | ClusterError::TlsNotOffered { .. }
            | ClusterError::BadTablePrefix { .. }
            | ClusterError::LeaseTooShort { .. }
            | ClusterError::LeaseTooLong { .. }
            | ClusterError::TooManyHandoffs { .. }
            | ClusterError::CapacityMismatch { .. }
            | ClusterError::Closed => None,
        }
    }
}

/// Why one lease statement failed.
///
/// After [`ConnectionLost`](LeaseError::ConnectionLost) or [`Timeout`](LeaseError::Timeout)
/// the statement may or may not have been applied: the server can run it after the reply is
/// lost. The fence makes that harmless (see the `lease_store` module).
#[derive(Debug)]
pub(crate) enum LeaseError {
    /// The key is longer than [`MAX_KEY_BYTES`]; nothing was sent.
    KeyTooLong {
        /// The key's length in bytes.
        bytes: usize,
    },
    /// The statement connection is down and the last reconnection failed; the next one is
    /// tried by the first call after `retry_in`. Nothing was sent.
    Reconnecting {
        /// How long until a call reconnects.
        retry_in: Duration,
    },
    /// The statement connection was down and reconnecting failed. Nothing was sent.
    #[cfg(feature = "postgres")]
    Reconnect(ClusterError),
    /// The connection was lost during the statement; the next call reconnects.
    #[cfg(feature = "postgres")]
    ConnectionLost(tokio_postgres::Error),
    /// No reply within the statement timeout (the heartbeat); the connection was dropped and
    /// the next call reconnects.
    Timeout {
        /// The statement timeout.
        after: Duration,
    },
    /// A part lease asked for no permits, or for the table's whole capacity or more (the
    /// whole is a whole lease); nothing was sent.
    Permits {
        /// The permits asked for.
        requested: u32,
        /// The table's permits per key.
        capacity: u32,
    },
    /// The server refused or failed the statement; the connection is fine.
    #[cfg(feature = "postgres")]
    Statement(tokio_postgres::Error),
    /// The table returned a fence below 1, which no statement of ours writes.
    BadFence(i64),
    /// The batch this statement went in failed; each of the batch's statements gets the same
    /// error.
    Batch(Arc<LeaseError>),
    /// The task that sends this statement's batch is gone (its runtime shut down); the
    /// statement may or may not have been applied.
    BatchDropped,
    /// A batch got a different number of answers than it had statements (a bug).
    BatchAnswers {
        /// Statements in the batch.
        sent: usize,
        /// Answers.
        answered: usize,
    },
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseError::KeyTooLong { bytes } => {
                write!(
                    f,
                    "a key of {bytes} bytes is longer than the maximum, {MAX_KEY_BYTES}"
                )
            }
            LeaseError::Permits {
                requested,
                capacity,
            } => write!(
                f,
                "a part lease of {requested} permits, where a key has {capacity}: a part is \
                 below the capacity"
            ),
            LeaseError::Reconnecting { retry_in } => write!(
                f,
                "the lease store is disconnected; it reconnects on a call in {retry_in:?}"
            ),
            #[cfg(feature = "postgres")]
            LeaseError::Reconnect(_) => f.write_str("the lease store could not reconnect"),
            #[cfg(feature = "postgres")]
            LeaseError::ConnectionLost(_) => {
                f.write_str("the lease store's connection was lost during the statement")
            }
            LeaseError::Timeout { after } => {
                write!(f, "the lease statement got no reply within {after:?}")
            }
            #[cfg(feature = "postgres")]
            LeaseError::Statement(_) => f.write_str("the lease statement failed"),
            LeaseError::BadFence(fence) => {
                write!(f, "the lease table holds fence {fence}, below 1")
            }
            LeaseError::Batch(error) => write!(f, "the statement's batch failed: {error}"),
            LeaseError::BatchDropped => {
                f.write_str("the task sending the statement's batch is gone")
            }
            LeaseError::BatchAnswers { sent, answered } => write!(
                f,
                "a batch of {sent} lease statements got {answered} answers"
            ),
        }
    }
}

impl Error for LeaseError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            #[cfg(feature = "postgres")]
            LeaseError::Reconnect(source) => Some(source),
            #[cfg(feature = "postgres")]
            LeaseError::ConnectionLost(source) | LeaseError::Statement(source) => Some(source),
            LeaseError::Batch(error) => Some(error.as_ref()),
            LeaseError::KeyTooLong { .. }
            | LeaseError::Permits { .. }
            | LeaseError::Reconnecting { .. }
            | LeaseError::Timeout { .. }
            | LeaseError::BadFence(_)
            | LeaseError::BatchDropped
            | LeaseError::BatchAnswers { .. } => None,
        }
    }
}
