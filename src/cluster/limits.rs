//! The bounds cluster mode accepts, below every module that checks them or reports them in an
//! error, so that the errors name them without importing their users.

use std::time::Duration;

/// The shortest heartbeat. The heartbeat is also the statement timeout (see `postgres::link`),
/// and a statement with its commit must fit in it on a loaded server.
pub(crate) const MIN_HEARTBEAT: Duration = Duration::from_millis(50);

/// The longest lease. A holder that dies blocks its keys until its leases run out; a day is far
/// beyond any heartbeat's need, and keeps `now + lease` within PostgreSQL's timestamps.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest key a store takes, in bytes. PostgreSQL indexes a key of at most about 2,700
/// bytes (after compression) and sends a NOTIFY payload of at most 8,000: below both, every
/// key that can be acquired can also be released and announced.
pub(crate) const MAX_KEY_BYTES: usize = 2048;
