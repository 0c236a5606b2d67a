//! What a PostgreSQL lease store is told, checked before anything reaches the server: the table
//! prefix, which goes into SQL text and so must be a plain identifier, and the lease, which must
//! outlast a missed heartbeat.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;

use crate::cluster::error::ClusterError;
use crate::cluster::limits::{MAX_LEASE, MIN_HEARTBEAT};
use crate::cluster::postgres::connection::{Server, server_name};

/// The table prefix when none is given: the table is `keyed_locks_leases`.
pub(crate) const DEFAULT_TABLE_PREFIX: &str = "keyed_locks_";

/// PostgreSQL's longest identifier, in bytes (`NAMEDATALEN - 1`); longer names are cut short
/// silently, and two prefixes could then name one table.
const MAX_IDENTIFIER_BYTES: usize = 63;

/// What the table's name adds to the prefix.
const TABLE_SUFFIX: &str = "leases";

/// How to reach the lease table, and the lease's timing.
#[derive(Clone)]
pub(crate) struct PgLeaseConfig {
    /// The server, as a `postgres://` URL or `key=value` pairs (tokio-postgres' `Config`
    /// syntax), with libpq's `sslmode` and `sslrootcert` understood (see `sslmode`).
    pub url: String,
    /// The lease table is `{table_prefix}leases`, beside `{table_prefix}fences` and
    /// `{table_prefix}run`, in the first schema of the role's `search_path`: ASCII letters,
    /// digits and underscores, not starting with a digit. The names are always quoted, so
    /// capitals are kept.
    pub table_prefix: String,
    /// How long an acquisition or a renewal holds the key.
    pub lease: Duration,
    /// How often the holder renews; at most a third of the lease, at least [`MIN_HEARTBEAT`].
    pub heartbeat: Duration,
    /// The longest wait for the server when connecting or reconnecting.
    pub connect_timeout: Duration,
    /// The application's own TLS configuration, used instead of the one `sslmode` asks for.
    pub tls_config: Option<Arc<ClientConfig>>,
    /// Permits per key; every store of a table must give the table's.
    pub capacity: NonZeroU32,
}

impl PgLeaseConfig {
    /// A configuration for the server at `url`, with the default table prefix, a 30 s lease
    /// renewed every 10 s, and a 5 s connect timeout.
    pub(crate) fn new(url: impl Into<String>) -> Self {
        PgLeaseConfig {
            url: url.into(),
            table_prefix: DEFAULT_TABLE_PREFIX.to_owned(),
            lease: Duration::from_secs(30),
            heartbeat: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            tls_config: None,
            capacity: NonZeroU32::MIN,
        }
    }

    /// Checks everything that can be checked without the server.
    pub(crate) fn check(&self) -> Result<Checked, ClusterError> {
        let table = LeaseTable::new(&self.table_prefix)?;
        check_timing(self.lease, self.heartbeat)?;
        let server = Server::parse(&self.url, self.connect_timeout, self.tls_config.as_ref())?;
        Ok(Checked {
            server,
            table,
            lease: self.lease,
            heartbeat: self.heartbeat,
            capacity: self.capacity,
        })
    }
}

impl fmt::Debug for PgLeaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL can hold a password: only the parsed form, which hides it, is shown.
        let server = server_name(&self.url);
        f.debug_struct("PgLeaseConfig")
            .field("server", &server.as_deref().unwrap_or("<invalid url>"))
            .field("table_prefix", &self.table_prefix)
            .field("lease", &self.lease)
            .field("heartbeat", &self.heartbeat)
            .field("connect_timeout", &self.connect_timeout)
            .field("tls_config", &self.tls_config.is_some())
            .field("capacity", &self.capacity)
            .finish()
    }
}

/// A configuration that passed every check.
#[derive(Debug)]
pub(crate) struct Checked {
    pub(crate) server: Server,
    pub(crate) table: LeaseTable,
    pub(crate) lease: Duration,
    pub(crate) heartbeat: Duration,
    pub(crate) capacity: NonZeroU32,
}

/// Lease timing: a renewal that fails (or times out, after a heartbeat) leaves time for the next
/// heartbeat's renewal, on a new connection if need be, before the lease runs out.
fn check_timing(lease: Duration, heartbeat: Duration) -> Result<(), ClusterError> {
    if heartbeat < MIN_HEARTBEAT || lease < heartbeat.saturating_mul(3) {
        return Err(ClusterError::LeaseTooShort { lease, heartbeat });
    }
    if lease > MAX_LEASE {
        return Err(ClusterError::LeaseTooLong {
            lease,
            max: MAX_LEASE,
        });
    }
    Ok(())
}

/// The name of a lease table, checked to be a plain identifier. It is also the name of the
/// NOTIFY channel on which releases are announced (channels and tables do not share names).
/// Two tables go with it, named with the same prefix (see `postgres`): `{prefix}fences` and
/// `{prefix}run`, whose suffixes are no longer than "leases".
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseTable {
    prefix: String,
    name: String,
}

impl LeaseTable {
    /// `{prefix}leases`, if the prefix is a plain SQL identifier and the name fits PostgreSQL's
    /// identifier length.
    pub(crate) fn new(prefix: &str) -> Result<Self, ClusterError> {
        let refuse = |reason| {
            Err(ClusterError::BadTablePrefix {
                prefix: prefix.to_owned(),
                reason,
            })
        };
        let Some(first) = prefix.chars().next() else {
            return refuse("it is empty");
        };
        if !(first.is_ascii_alphabetic() || first == '_') {
            return refuse("it must start with an ASCII letter or an underscore");
        }
        // Only these characters: nothing can end the quoted identifier or the string literal.
        if !prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return refuse("it may hold only ASCII letters, digits and underscores");
        }
        if prefix.len() + TABLE_SUFFIX.len() > MAX_IDENTIFIER_BYTES {
            return refuse("with \"leases\" it is longer than PostgreSQL's 63-byte identifiers");
        }
        Ok(LeaseTable {
            prefix: prefix.to_owned(),
            name: format!("{prefix}{TABLE_SUFFIX}"),
        })
    }

    /// The bare name: the NOTIFY channel, and what error messages show.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The name as an SQL identifier. Quoting keeps capitals and makes reserved words safe;
    /// the name holds no quote (checked in [`new`](Self::new)).
    pub(crate) fn quoted(&self) -> String {
        format!("\"{}\"", self.name)
    }

    /// The bare name of the table that goes with this one under `suffix` (at most as long as
    /// "leases", so that it fits wherever the lease table's name does).
    pub(crate) fn companion(&self, suffix: &str) -> String {
        debug_assert!(suffix.len() <= TABLE_SUFFIX.len());
        format!("{}{suffix}", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(prefix: &str) -> Option<&'static str> {
        match LeaseTable::new(prefix) {
            Err(ClusterError::BadTablePrefix { reason, .. }) => Some(reason),
            _ => None,
        }
    }

    #[test]
    fn plain_identifiers_pass_and_name_the_table() {
        for prefix in ["kl_", "_x", "Kl9_", &"a".repeat(57)] {
            let table = LeaseTable::new(prefix);
            assert_eq!(
                table.map(|t| t.quoted()).ok(),
                Some(format!("\"{prefix}leases\""))
            );
        }
    }

    #[test]
    fn anything_but_a_plain_identifier_is_refused() {
        for prefix in [
            "",
            "9a_",
            "bad-name; drop",
            "a\"b",
            "a'b",
            "a b",
            "é_",
            "a\0",
            &"a".repeat(58),
        ] {
            assert!(refusal(prefix).is_some(), "{prefix:?} passed");
        }
    }

    #[test]
    fn a_lease_shorter_than_three_heartbeats_or_a_heartbeat_below_the_floor_is_refused() {
        let ms = Duration::from_millis;
        assert!(check_timing(ms(300), ms(100)).is_ok());
        assert!(matches!(
            check_timing(ms(299), ms(100)),
            Err(ClusterError::LeaseTooShort { .. })
        ));
        assert!(matches!(
            check_timing(ms(1000), ms(49)),
            Err(ClusterError::LeaseTooShort { .. })
        ));
        // Three heartbeats of `Duration::MAX` saturate instead of overflowing.
        assert!(matches!(
            check_timing(Duration::MAX, Duration::MAX),
            Err(ClusterError::LeaseTooLong { .. })
        ));
        assert!(matches!(
            check_timing(MAX_LEASE + ms(1), ms(100)),
            Err(ClusterError::LeaseTooLong { .. })
        ));
    }
}
