//! The cluster view's read of the lease table: one SELECT of the live rows, on a connection of
//! its own, into [`LeaseSnapshot`]s.
//!
//! # Why a connection of its own
//!
//! The store's statement connection carries every acquisition, renewal and release of the
//! process, pipelined: replies come in order, so a scan on it would hold back every renewal
//! queued behind it, and a scan that ran past the statement timeout would drop the
//! connection under them. The view's connection is opened at the first view (a process never
//! asked for one has none), kept for the next, made again after a loss, and closed at
//! shutdown.
//!
//! # What it costs
//!
//! One statement, which reads every row of the table: the table keeps a row per key ever
//! locked, and no index could find the live ones without slowing every lease write (an
//! index on `expires_at`, which every renewal changes, would stop PostgreSQL's in-place
//! updates of the row). The server sorts the live rows and cuts them to the limit, so only
//! those cross the wire. Times left are the server's clock read once for the statement, so
//! the clients' clocks do not matter.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use crate::cluster::error::{ClusterError, LeaseError};
use crate::cluster::owner::LeaseOwner;
use crate::cluster::postgres::config::LeaseTable;
use crate::cluster::postgres::connection::Server;
use crate::cluster::postgres::link::StatementLink;
use crate::cluster::snapshot::{LeaseHolder, LeaseSnapshot, WaitingRequest};
use crate::pure::snapshot::KeyHold;

/// Reads a store's lease table for the cluster view.
pub(crate) struct LeaseView {
    link: StatementLink,
    /// `$1` the most rows to return, NULL for all. See [`live_rows_statement`].
    statement: String,
    owner: LeaseOwner,
    /// The owner's name, as its rows hold it.
    owner_name: String,
    table: String,
    server: String,
    capacity: NonZeroU32,
    /// Set at shutdown: the view reads nothing after it, and opens no connection.
    closed: AtomicBool,
}

impl LeaseView {
    /// The view of `table` on `server` for the store of `owner`, whose keys have `capacity`
    /// permits; each read is bounded by `statement_timeout`, as the store's statements are.
    pub(crate) fn new(
        server: Server,
        table: &LeaseTable,
        owner: LeaseOwner,
        capacity: NonZeroU32,
        statement_timeout: Duration,
    ) -> Self {
        let owner_name = owner.to_string();
        // Within PostgreSQL's 63 bytes (see `LeaseOwner::MAX_LEN`).
        let application_name = format!("keyed-locks view {owner_name}");
        LeaseView {
            statement: live_rows_statement(table),
            table: table.name().to_owned(),
            server: server.name().to_owned(),
            link: StatementLink::unopened(server, application_name, statement_timeout),
            owner,
            owner_name,
            capacity,
            closed: AtomicBool::new(false),
        }
    }

    /// The owner whose rows are "ours".
    pub(crate) fn owner(&self) -> &LeaseOwner {
        &self.owner
    }

    /// The table's live rows, at most `limit`: the keys a request waits for first, then the
    /// ones whose leases run out soonest, then by key.
    ///
    /// # Errors
    ///
    /// [`ClusterError::Closed`] after [`close`](Self::close); else the server's failure, as
    /// [`view_error`](Self::view_error) names it.
    pub(crate) async fn live_rows(
        &self,
        limit: Option<usize>,
    ) -> Result<Vec<LeaseSnapshot>, ClusterError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(ClusterError::Closed);
        }
        let limit: Option<i64> = limit.map(|limit| i64::try_from(limit).unwrap_or(i64::MAX));
        let rows = self
            .link
            .query(&self.statement, &[(&limit, Type::INT8)])
            .await
            .map_err(|error| self.view_error(error))?;
        rows.iter()
            .map(|row| self.lease_of(row))
            .collect::<Result<_, _>>()
            .map_err(|error| self.view_error(LeaseError::Statement(error)))
    }

    /// Closes the connection and refuses every later read.
    pub(crate) async fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.link.close().await;
    }

    /// One row of [`live_rows_statement`]'s answer.
    fn lease_of(&self, row: &Row) -> Result<LeaseSnapshot, tokio_postgres::Error> {
        let time_left = |micros: i64| Duration::from_micros(micros.max(0).cast_unsigned());
        // The columns' CHECK keeps fences positive and the statements keep permits so; a
        // table edited by hand might not, and shows as 0 rather than failing the view.
        let fence = |fence: i64| u64::try_from(fence).unwrap_or(0);
        let permits = |permits: i32| u32::try_from(permits).unwrap_or(0);
        let mut holders = Vec::new();
        let whole: Option<String> = row.try_get("owner")?;
        let held_whole = whole.is_some();
        if let Some(owner_name) = whole {
            holders.push(self.holder(
                owner_name,
                fence(row.try_get("fence")?),
                self.capacity.get(),
                time_left(row.try_get("expires_in_us")?),
            ));
        }
        let part_owners: Vec<String> = row.try_get("part_owners")?;
        let part_fences: Vec<i64> = row.try_get("part_fences")?;
        let part_permits: Vec<i32> = row.try_get("part_permits")?;
        let part_left: Vec<i64> = row.try_get("part_expires_in_us")?;
        for (((owner_name, part_fence), part_permits), left) in part_owners
            .into_iter()
            .zip(part_fences)
            .zip(part_permits)
            .zip(part_left)
        {
            holders.push(self.holder(
                owner_name,
                fence(part_fence),
                permits(part_permits),
                time_left(left),
            ));
        }
        let hold = if held_whole {
            KeyHold::Exclusive
        } else if holders.is_empty() {
            KeyHold::NotHeld
        } else {
            KeyHold::Shared {
                permits: holders.iter().map(|holder| holder.permits).sum(),
                capacity: self.capacity.get(),
            }
        };
        let waiting_left: Option<i64> = row.try_get("waiting_expires_in_us")?;
        let waiting = waiting_left.map(|left| -> Result<_, tokio_postgres::Error> {
            Ok(WaitingRequest {
                // 0 in a row marked before the column had the request's size.
                permits: Some(permits(row.try_get("waiting_permits")?)).filter(|&asked| asked > 0),
                expires_in: time_left(left),
            })
        });
        Ok(LeaseSnapshot {
            key: row.try_get("key")?,
            hold,
            ours: holders.iter().any(|holder| holder.ours),
            holders,
            waiting: waiting.transpose()?,
        })
    }

    fn holder(
        &self,
        owner_name: String,
        fence: u64,
        permits: u32,
        expires_in: Duration,
    ) -> LeaseHolder {
        LeaseHolder {
            owner: LeaseOwner::parse(&owner_name),
            ours: owner_name == self.owner_name,
            owner_name,
            fence,
            permits,
            expires_in,
        }
    }

    /// The [`ClusterError`] for a read that failed: as connecting names it when the
    /// connection could not be made, [`ClusterError::Unreachable`] when it was lost,
    /// [`ClusterError::ConnectTimeout`] when the server did not answer within the statement
    /// timeout, and the server's refusal otherwise.
    fn view_error(&self, error: LeaseError) -> ClusterError {
        let server = self.server.clone();
        match error {
            LeaseError::Reconnect(cause) => cause,
            LeaseError::Timeout { after } => ClusterError::ConnectTimeout { server, after },
            LeaseError::ConnectionLost(cause) => ClusterError::Unreachable {
                server,
                source: Box::new(cause),
            },
            // The last attempt failed, and the next waits for its backoff: say so.
            reconnecting @ LeaseError::Reconnecting { .. } => ClusterError::Unreachable {
                server,
                source: Box::new(reconnecting),
            },
            LeaseError::Statement(cause)
                if cause.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) =>
            {
                ClusterError::MissingPermission {
                    table: self.table.clone(),
                    source: Box::new(cause),
                }
            }
            other => ClusterError::Database {
                action: format!("reading the live rows of {:?}", self.table),
                source: Box::new(other),
            },
        }
    }
}

impl std::fmt::Debug for LeaseView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseView")
            .field("owner", &self.owner_name)
            .field("table", &self.table)
            .field("link", &self.link)
            .finish_non_exhaustive()
    }
}

/// The statement that reads `table`'s live rows: `$1` the most rows, NULL for all.
///
/// A row is live while its whole lease is (owner set and `expires_at` ahead), one of its part
/// leases is (its `until` ahead), or its waiting mark counts (`waiting_until` ahead): the
/// store's invariants 1, 6 and 7. The server's clock is read once (`now`, materialized), so
/// every row is judged at one instant, and times left are computed there, in microseconds.
/// The parts come in their arrays' order, which is the order granted.
fn live_rows_statement(table: &LeaseTable) -> String {
    let table = table.quoted();
    let micros_left = |at: &str| format!("(extract(epoch FROM {at} - now.at) * 1000000)::bigint");
    let parts = "unnest(held.part_owners, held.part_fences, held.part_permits, \
                 held.part_until) WITH ORDINALITY \
                 AS part(owner, fence, permits, until, position)";
    let live_parts = |column: &str| {
        format!(
            "ARRAY(SELECT {column} FROM {parts} WHERE part.until > now.at \
             ORDER BY part.position)"
        )
    };
    let whole_live = "(held.owner IS NOT NULL AND held.expires_at > now.at)";
    let waiting_live = "coalesce(held.waiting_until > now.at, false)";
    let parts_live = "EXISTS (SELECT FROM unnest(held.part_until) AS part(until) \
                      WHERE part.until > now.at)";
    format!(
        "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS at) \
         SELECT held.key, held.fence, \
                CASE WHEN {whole_live} THEN held.owner END AS owner, \
                {expires_in} AS expires_in_us, \
                {owners} AS part_owners, {fences} AS part_fences, \
                {permits} AS part_permits, {parts_left} AS part_expires_in_us, \
                CASE WHEN {waiting_live} THEN {waiting_left} END AS waiting_expires_in_us, \
                held.waiting_permits \
         FROM now, {table} AS held \
         WHERE {whole_live} OR {waiting_live} OR {parts_live} \
         ORDER BY {waiting_live} DESC, \
                  LEAST(CASE WHEN {whole_live} THEN held.expires_at END, \
                        (SELECT min(part.until) FROM unnest(held.part_until) AS part(until) \
                         WHERE part.until > now.at)) NULLS LAST, \
                  held.key COLLATE \"C\" \
         LIMIT $1",
        expires_in = micros_left("held.expires_at"),
        owners = live_parts("part.owner"),
        fences = live_parts("part.fence"),
        permits = live_parts("part.permits"),
        parts_left = live_parts(&micros_left("part.until")),
        waiting_left = micros_left("held.waiting_until"),
    )
}
