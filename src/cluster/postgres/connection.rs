//! Opening a connection to the lease table's server: bounded in time, with TCP keepalive, and
//! each failure named.

use std::error::Error as _;
use std::io;
use std::time::Duration;

use tokio_postgres::config::Host;
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{Client, Config, Connection, NoTls, Socket};

use crate::cluster::error::ClusterError;

/// A connection's I/O half, which must be polled for its client to get answers.
pub(crate) type PgConnection = Connection<Socket, NoTlsStream>;

/// Idle time before the first keepalive probe. With [`KEEPALIVE_INTERVAL`] and
/// [`KEEPALIVE_RETRIES`], a connection whose peer vanished without a word (a cable pulled, a NAT
/// entry dropped) is found dead in about 25 s instead of the system default's two hours and
/// more. It matters most for the listening connection, which sends nothing of its own.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// Time between unanswered keepalive probes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes before the connection is dropped.
const KEEPALIVE_RETRIES: u32 = 3;

/// A PostgreSQL server to connect to, parsed once.
#[derive(Debug, Clone)]
pub(crate) struct Server {
    /// With the connect timeout and keepalive set. Its `Debug` hides the password.
    config: Config,
    connect_timeout: Duration,
    /// Hosts and ports, for error messages (never the password).
    name: String,
}

impl Server {
    /// Parses a `postgres://` URL or `key=value` pairs.
    pub(crate) fn parse(url: &str, connect_timeout: Duration) -> Result<Server, ClusterError> {
        let mut config: Config = url.parse().map_err(|error| ClusterError::BadUrl {
            source: Box::new(error),
        })?;
        config
            .connect_timeout(connect_timeout)
            .keepalives(true)
            .keepalives_idle(KEEPALIVE_IDLE)
            .keepalives_interval(KEEPALIVE_INTERVAL)
            .keepalives_retries(KEEPALIVE_RETRIES);
        let name = describe(&config);
        Ok(Server {
            config,
            connect_timeout,
            name,
        })
    }

    /// Hosts and ports, as `host:port`, comma-separated.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The longest wait for a connection, and for the table's setup on it.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Connects, naming the connection `application_name` in `pg_stat_activity` so that an
    /// operator (or a test) can tell a store's connections apart.
    ///
    /// tokio-postgres' own connect timeout covers each socket connection attempt only; the
    /// whole of it (every address, the startup and authentication) is bounded here, so a server
    /// that accepts and then says nothing cannot hang the caller.
    pub(crate) async fn open(
        &self,
        application_name: &str,
    ) -> Result<(Client, PgConnection), ClusterError> {
        let mut config = self.config.clone();
        config.application_name(application_name);
        match tokio::time::timeout(self.connect_timeout, config.connect(NoTls)).await {
            Ok(Ok(connected)) => Ok(connected),
            Ok(Err(error)) => Err(self.failure(error)),
            Err(_elapsed) => Err(self.timed_out()),
        }
    }

    /// The error for a wait on this server that ran out.
    pub(crate) fn timed_out(&self) -> ClusterError {
        ClusterError::ConnectTimeout {
            server: self.name.clone(),
            after: self.connect_timeout,
        }
    }

    fn failure(&self, error: tokio_postgres::Error) -> ClusterError {
        let socket_error = error
            .source()
            .and_then(|source| source.downcast_ref::<io::Error>());
        match socket_error {
            Some(socket_error) if socket_error.kind() == io::ErrorKind::TimedOut => {
                self.timed_out()
            }
            Some(_) => ClusterError::Unreachable {
                server: self.name.clone(),
                source: Box::new(error),
            },
            // The server answered, and refused: authentication, an unknown database or role,
            // too many connections.
            None => ClusterError::Database {
                action: format!("connecting to {}", self.name),
                source: Box::new(error),
            },
        }
    }
}

/// `host:port` for each host, as libpq pairs them: one port for all hosts, or one each.
fn describe(config: &Config) -> String {
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(index, host)| {
            let port = ports.get(index).or(ports.first()).copied().unwrap_or(5432);
            match host {
                Host::Tcp(name) => format!("{name}:{port}"),
                #[cfg(unix)]
                Host::Unix(directory) => format!("{}/.s.PGSQL.{port}", directory.display()),
            }
        })
        .collect();
    if hosts.is_empty() {
        "<no host>".to_owned()
    } else {
        hosts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name_of(url: &str) -> Option<String> {
        Server::parse(url, Duration::from_secs(1))
            .ok()
            .map(|server| server.name().to_owned())
    }

    #[test]
    fn the_name_shows_hosts_and_ports_but_never_the_password() {
        let name = name_of("postgres://me:secret@db1:5433,db2/test");
        assert_eq!(name.as_deref(), Some("db1:5433,db2:5432"));
        let config = Server::parse("postgres://me:secret@db1/test", Duration::from_secs(1));
        assert!(!format!("{config:?}").contains("secret"));
    }

    #[test]
    fn a_url_that_does_not_parse_is_a_bad_url() {
        let parsed = Server::parse("postgres://[::1", Duration::from_secs(1));
        assert!(matches!(parsed, Err(ClusterError::BadUrl { .. })));
    }
}
