//! The statement connection: one client shared by every call (tokio-postgres pipelines
//! concurrent statements on one connection), its I/O driven by a task of its own, and made
//! again by the first call after it is lost.
//!
//! # Why reconnect on a call, and fail the call that finds the loss
//!
//! A store that stayed dead after one network blip would turn a second of outage into a process
//! restart; a store that retried statements itself would hide from its caller that a statement
//! may have been applied without a reply. So:
//!
//! - a call that finds the connection *already* known lost (its driver saw it end) reconnects
//!   first and then runs: nothing was sent, nothing can be doubled;
//! - a call whose statement was sent when the connection broke, or got no reply within the
//!   statement timeout, fails with [`LeaseError::ConnectionLost`] or [`LeaseError::Timeout`]
//!   (its caller decides whether to repeat it; every lease statement is safe to repeat), and
//!   the connection is forgotten, so the next call reconnects;
//! - a reconnection that fails makes calls fail at once, without a try, until a backoff
//!   ([`Backoff`]) has passed: during an outage each caller learns of it without waiting, and
//!   the server is not asked for a connection by every call.
//!
//! Reconnections are made one at a time (the state's lock is held across the attempt), so that
//! calls arriving together share one connection instead of opening one each. A new connection
//! runs the store's `on_connect` statement before any call uses it: a server that restarted
//! (after which every connection is new) gets checked before the first lease statement.
//!
//! The statement timeout is the heartbeat: the lease outlasts three of them, so a renewal that
//! times out leaves time for the next one, on a new connection, before the lease runs out.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_postgres::error::{Severity, SqlState};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row, Statement};

use crate::cluster::error::LeaseError;
use crate::cluster::postgres::backoff::Backoff;
use crate::cluster::postgres::connection::{PgConnection, Server};

/// The statement connection, made again on the first call after it is lost.
pub(crate) struct StatementLink {
    server: Server,
    application_name: String,
    statement_timeout: Duration,
    /// Run on each new connection before any call (simple protocol, no parameters); empty,
    /// nothing is.
    on_connect: String,
    state: Mutex<LinkState>,
}

struct LinkState {
    connection: Option<Driven>,
    /// With no connection: the first call at or after this instant reconnects.
    retry_at: Instant,
    backoff: Backoff,
}

/// A client and the task that drives its connection.
struct Driven {
    session: Arc<Session>,
    driver: AbortHandle,
}

/// A connection's client and the statements prepared on it, by their text.
struct Session {
    client: Arc<Client>,
    prepared: std::sync::Mutex<HashMap<String, Statement>>,
}

impl Session {
    /// `text` prepared on this connection with the types of `params`: once per connection, so
    /// that the server parses and plans each statement once, not at every call.
    async fn prepared(
        &self,
        text: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Statement, tokio_postgres::Error> {
        let known = self
            .prepared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(text)
            .cloned();
        if let Some(statement) = known {
            return Ok(statement);
        }
        let types: Vec<Type> = params.iter().map(|(_, kind)| kind.clone()).collect();
        let statement = self.client.prepare_typed(text, &types).await?;
        self.prepared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(text.to_owned(), statement.clone());
        Ok(statement)
    }

    async fn query(
        &self,
        text: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(value, _)| *value).collect();
        let statement = self.prepared(text, params).await?;
        match self.client.query(&statement, &values).await {
            // Gone from the server (a `DEALLOCATE ALL` on a shared connection): prepare it
            // again, once.
            Err(error) if error.code() == Some(&SqlState::INVALID_SQL_STATEMENT_NAME) => {
                self.prepared
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(text);
                let statement = self.prepared(text, params).await?;
                self.client.query(&statement, &values).await
            }
            answer => answer,
        }
    }
}

impl Driven {
    fn spawn(client: Client, connection: PgConnection) -> Driven {
        let driver = tokio::spawn(async move {
            // It ends with `Ok` when every client is gone, with `Err` when the connection
            // broke; then the client reports `is_closed`, which the next call checks.
            if let Err(error) = connection.await {
                tracing::debug!(%error, "lease store: statement connection lost");
            }
        });
        Driven {
            session: Arc::new(Session {
                client: Arc::new(client),
                prepared: std::sync::Mutex::default(),
            }),
            driver: driver.abort_handle(),
        }
    }
}

impl StatementLink {
    /// Takes over a connection that has just been made, and drives it; returns its client too,
    /// for the store to set up its tables (and run `on_connect` itself) before any call.
    pub(crate) fn start(
        server: Server,
        application_name: String,
        statement_timeout: Duration,
        on_connect: String,
        client: Client,
        connection: PgConnection,
    ) -> (Self, Arc<Client>) {
        let driven = Driven::spawn(client, connection);
        let client = Arc::clone(&driven.session.client);
        let state = LinkState {
            connection: Some(driven),
            retry_at: Instant::now(),
            backoff: Backoff::default(),
        };
        let link = StatementLink {
            server,
            application_name,
            statement_timeout,
            on_connect,
            state: Mutex::new(state),
        };
        (link, client)
    }

    /// A link that opens its connection at its first call, with no `on_connect` statement:
    /// for a connection that only reads and is seldom used (the cluster view), which a store
    /// then does not open unless it is asked to.
    pub(crate) fn unopened(
        server: Server,
        application_name: String,
        statement_timeout: Duration,
    ) -> Self {
        StatementLink {
            server,
            application_name,
            statement_timeout,
            on_connect: String::new(),
            state: Mutex::new(LinkState {
                connection: None,
                retry_at: Instant::now(),
                backoff: Backoff::default(),
            }),
        }
    }

    /// Closes the connection, if open; the next call opens another.
    pub(crate) async fn close(&self) {
        let mut state = self.state.lock().await;
        if let Some(driven) = state.connection.take() {
            driven.driver.abort();
        }
    }

    /// Runs one statement with typed parameters, prepared on the connection the first time it
    /// runs there (a pooler in transaction mode must forward prepared statements: PgBouncer
    /// 1.21 or later, with `max_prepared_statements` set).
    pub(crate) async fn query(
        &self,
        statement: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, LeaseError> {
        let session = self.session().await?;
        let reply = tokio::time::timeout(self.statement_timeout, session.query(statement, params));
        match reply.await {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(error)) if connection_is_gone(&error) || session.client.is_closed() => {
                self.forget(&session).await;
                Err(LeaseError::ConnectionLost(error))
            }
            Ok(Err(error)) => Err(LeaseError::Statement(error)),
            Err(_elapsed) => {
                // A connection that stalls one statement stalls every one behind it (replies
                // come in order): drop it, and the next call starts afresh.
                self.forget(&session).await;
                Err(LeaseError::Timeout {
                    after: self.statement_timeout,
                })
            }
        }
    }

    /// The live connection, after reconnecting if it is known lost.
    async fn session(&self) -> Result<Arc<Session>, LeaseError> {
        let mut state = self.state.lock().await;
        if let Some(driven) = &state.connection {
            if !driven.session.client.is_closed() {
                return Ok(Arc::clone(&driven.session));
            }
            // The driver saw it end: the first attempt after a loss is made at once.
            state.connection = None;
            state.retry_at = Instant::now();
        }
        let now = Instant::now();
        if now < state.retry_at {
            return Err(LeaseError::Reconnecting {
                retry_in: state.retry_at - now,
            });
        }
        match self.open().await {
            Ok(driven) => {
                tracing::debug!(server = self.server.name(), "lease store: reconnected");
                let session = Arc::clone(&driven.session);
                state.connection = Some(driven);
                state.backoff.reset();
                Ok(session)
            }
            Err(error) => {
                state.retry_at = Instant::now() + state.backoff.next_delay();
                Err(error)
            }
        }
    }

    /// A new connection, driven, once `on_connect` has run on it.
    async fn open(&self) -> Result<Driven, LeaseError> {
        let (client, connection) = self
            .server
            .open(&self.application_name)
            .await
            .map_err(LeaseError::Reconnect)?;
        let driven = Driven::spawn(client, connection);
        if let Err(error) = self.set_up(&driven.session).await {
            // The connection is not kept: a later call opens another and tries again.
            driven.driver.abort();
            return Err(error);
        }
        Ok(driven)
    }

    /// Runs `on_connect` on `session`, within the statement timeout.
    async fn set_up(&self, session: &Session) -> Result<(), LeaseError> {
        if self.on_connect.is_empty() {
            return Ok(());
        }
        let setup = session.client.batch_execute(&self.on_connect);
        match tokio::time::timeout(self.statement_timeout, setup).await {
            Ok(answer) => answer.map_err(LeaseError::Statement),
            Err(_elapsed) => Err(LeaseError::Timeout {
                after: self.statement_timeout,
            }),
        }
    }

    /// Runs `on_connect` again on the live connection: for a caller that found the state it
    /// sets up missing (a pooler in between can hide a server restart from this link).
    pub(crate) async fn run_on_connect(&self) -> Result<(), LeaseError> {
        let session = self.session().await?;
        let ran = self.set_up(&session).await;
        if matches!(ran, Err(LeaseError::Timeout { .. })) {
            // As after any statement that timed out: replies come in order, so drop it.
            self.forget(&session).await;
        }
        ran
    }

    /// Drops the connection of `session`, unless another call has already replaced it.
    async fn forget(&self, session: &Arc<Session>) {
        let mut state = self.state.lock().await;
        if state
            .connection
            .as_ref()
            .is_some_and(|driven| Arc::ptr_eq(&driven.session, session))
        {
            if let Some(driven) = state.connection.take() {
                driven.driver.abort();
            }
            state.retry_at = Instant::now();
        }
    }

    /// Runs `statements` on the live connection, as something else sharing it could (tests).
    #[cfg(test)]
    pub(crate) async fn run_beside(&self, statements: &str) -> Result<(), LeaseError> {
        let session = self.session().await?;
        session
            .client
            .batch_execute(statements)
            .await
            .map_err(LeaseError::Statement)
    }

    /// Whether the connection is known lost (its driver saw it end, or a call dropped it).
    #[cfg(test)]
    pub(crate) async fn is_known_lost(&self) -> bool {
        let state = self.state.lock().await;
        state
            .connection
            .as_ref()
            .is_none_or(|driven| driven.session.client.is_closed())
    }
}

/// Whether `error` ended the connection: tokio-postgres saw it close, or the server sent a
/// FATAL error (a terminated backend, a shutdown), after which it closes.
fn connection_is_gone(error: &tokio_postgres::Error) -> bool {
    error.is_closed()
        || error.as_db_error().is_some_and(|db_error| {
            matches!(
                db_error.parsed_severity(),
                Some(Severity::Fatal | Severity::Panic)
            )
        })
}

impl fmt::Debug for StatementLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatementLink")
            .field("server", &self.server.name())
            .field("application_name", &self.application_name)
            .field("statement_timeout", &self.statement_timeout)
            .finish_non_exhaustive()
    }
}
