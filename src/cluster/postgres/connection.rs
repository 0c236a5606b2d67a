//! Opening a connection to the lease table's server: bounded in time, with TCP keepalive, TLS
//! as the URL's `sslmode` asks, and each failure named.

use std::error::Error as _;
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use tokio_postgres::config::Host;
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config, Connection, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::cluster::error::ClusterError;
use crate::cluster::postgres::sslmode::{self, SslMode, TlsParameters};
use crate::cluster::postgres::tls;

/// A connection's I/O half, which must be polled for its client to get answers. The stream is
/// TLS or plain text as the server and the mode agreed (tokio-postgres wraps either).
pub(crate) type PgConnection =
    Connection<Socket, <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream>;

/// Idle time before the first keepalive probe. With [`KEEPALIVE_INTERVAL`] and
/// [`KEEPALIVE_RETRIES`], a connection whose peer vanished without a word (a cable pulled, a NAT
/// entry dropped) is found dead in about 25 s instead of the system default's two hours and
/// more. It matters most for the listening connection, which sends nothing of its own.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// Time between unanswered keepalive probes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes before the connection is dropped.
const KEEPALIVE_RETRIES: u32 = 3;

/// A PostgreSQL server to connect to, parsed once, with the TLS configuration every connection
/// to it uses (the first and each reconnection alike).
#[derive(Clone)]
pub(crate) struct Server {
    /// With the connect timeout, keepalive and the wire's `sslmode` set.
    config: Config,
    connect_timeout: Duration,
    /// Hosts and ports, for error messages (never the password).
    name: String,
    mode: SslMode,
    tls: MakeRustlsConnect,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the `Config`: the name says where, and nothing can show the password.
        f.debug_struct("Server")
            .field("name", &self.name)
            .field("sslmode", &self.mode.as_str())
            .field("connect_timeout", &self.connect_timeout)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Parses a `postgres://` URL or `key=value` pairs, and builds its TLS configuration:
    /// `tls_config` if the application gave one, else the one `sslmode` asks for, whose roots
    /// (for `verify-ca` and `verify-full`) are read here.
    pub(crate) fn parse(
        url: &str,
        connect_timeout: Duration,
        tls_config: Option<&Arc<ClientConfig>>,
    ) -> Result<Server, ClusterError> {
        let (config, parameters) = parse_url(url)?;
        let tls = tls::connector(&parameters, tls_config)?;
        Ok(Server::configured(
            config,
            connect_timeout,
            parameters.mode,
            tls,
        ))
    }

    fn configured(
        mut config: Config,
        connect_timeout: Duration,
        mode: SslMode,
        tls: MakeRustlsConnect,
    ) -> Server {
        config
            .ssl_mode(mode.wire())
            .connect_timeout(connect_timeout)
            .keepalives(true)
            .keepalives_idle(KEEPALIVE_IDLE)
            .keepalives_interval(KEEPALIVE_INTERVAL)
            .keepalives_retries(KEEPALIVE_RETRIES);
        let name = describe(&config);
        Server {
            config,
            connect_timeout,
            name,
            mode,
            tls,
        }
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
        let connecting = config.connect(self.tls.clone());
        match tokio::time::timeout(self.connect_timeout, connecting).await {
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
        // Before the socket errors: a certificate that does not verify comes as an I/O error,
        // and would otherwise pass for an unreachable server, to be retried in vain.
        if let Some(tls_failure) = tls::handshake_failure(&error, &self.name, self.mode) {
            return tls_failure;
        }
        if self.mode == SslMode::Disable
            && error.code() == Some(&SqlState::INVALID_AUTHORIZATION_SPECIFICATION)
        {
            return ClusterError::PlainTextRefused {
                server: self.name.clone(),
                source: Box::new(error),
            };
        }
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

/// The URL without its TLS parameters, parsed by tokio-postgres, and those parameters.
fn parse_url(url: &str) -> Result<(Config, TlsParameters), ClusterError> {
    let (rest, parameters) = sslmode::split(url).map_err(|error| ClusterError::BadUrl {
        source: Box::new(error),
    })?;
    let config: Config = rest.parse().map_err(|error| ClusterError::BadUrl {
        source: Box::new(error),
    })?;
    Ok((config, parameters))
}

/// The hosts and ports of `url`, as errors name them, without reading anything (for `Debug`).
pub(crate) fn server_name(url: &str) -> Result<String, ClusterError> {
    parse_url(url).map(|(config, _)| describe(&config))
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
        Server::parse(url, Duration::from_secs(1), None)
            .ok()
            .map(|server| server.name().to_owned())
    }

    #[test]
    fn the_name_shows_hosts_and_ports_but_never_the_password() {
        let name = name_of("postgres://me:secret@db1:5433,db2/test");
        assert_eq!(name.as_deref(), Some("db1:5433,db2:5432"));
        let config = Server::parse(
            "postgres://me:secret@db1/test",
            Duration::from_secs(1),
            None,
        );
        assert!(!format!("{config:?}").contains("secret"));
    }

    #[test]
    fn a_url_that_does_not_parse_is_a_bad_url() {
        let parsed = Server::parse("postgres://[::1", Duration::from_secs(1), None);
        assert!(matches!(parsed, Err(ClusterError::BadUrl { .. })));
    }
}
