//! Several processes increment one counter under a cluster-wide lock, and a fencing token keeps
//! a stale holder's write out.
//!
//! ```text
//! cluster [--database-url URL] [--prefix P] --key K --increments N [--hold-ms H] [--lease-ms L]
//! ```
//!
//! Run it in two terminals against the same PostgreSQL (it needs `--features postgres`):
//!
//! ```text
//! cargo run --features postgres --example cluster -- --key account:42 --increments 100
//! ```
//!
//! Each increment locks the key, reads the counter, holds the lock for `H` ms (default 10),
//! then writes `value + 1` with the guard's fencing token, only if the row's fence is lower:
//! a process that lost its lease while paused (stop one with Ctrl-Z past the lease, then `fg`)
//! finds its write fenced off. It prints one line per event, flushed as it happens:
//!
//! ```text
//! granted key=account:42 token=1048576
//! wrote key=account:42 token=1048576 value=1
//! ...
//! done key=account:42 wrote=100 fenced=0
//! ```
//!
//! If the server goes away mid-increment (a restart), the increment is given up, not repeated
//! (whether its write landed is unknown), with `failed key=K token=T error=...`, and the demo's
//! connection is made again; the registry reconnects on its own.
//!
//! The database URL defaults to the `DATABASE_URL` environment variable, else
//! `postgres://postgres@127.0.0.1:5432/test`. The tables are `{prefix}leases` (the registry's)
//! and `{prefix}counters` (the demo's), both created if missing; `--prefix` defaults to
//! `keyed_locks_demo_`. `--lease-ms` (default 2000) is the lease time.
//!
//! TLS: the URL's `sslmode` works as in libpq for both connections; the demo's own connection
//! takes `disable`, `prefer` and `require` (encrypted, certificate not checked), the registry's
//! also `verify-ca` and `verify-full`.

use std::io::Write as _;
use std::time::Duration;

use clap::Parser;
use keyed_locks::ClusterRegistry;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_postgres::error::SqlState;
use tokio_postgres_rustls::MakeRustlsConnect;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Several processes increment one counter under a cluster-wide lock, and a fencing token
/// keeps a stale holder's write out.
#[derive(Debug, Parser)]
#[command(args_override_self = true)]
struct Options {
    /// The PostgreSQL server (the `DATABASE_URL` environment variable, if set)
    #[arg(long, value_name = "URL", default_value_t = default_database_url())]
    database_url: String,
    /// The tables' prefix: `{P}leases` (the registry's) and `{P}counters` (the demo's)
    #[arg(long, value_name = "P", default_value = "keyed_locks_demo_")]
    prefix: String,
    /// The key to lock, and the counter's
    #[arg(long, value_name = "K")]
    key: String,
    /// How many increments to make
    #[arg(long, value_name = "N")]
    increments: u64,
    /// How long to hold the lock between reading the counter and writing it, in milliseconds
    #[arg(long, value_name = "H", default_value_t = 10)]
    hold_ms: u64,
    /// The lease time, in milliseconds
    #[arg(long, value_name = "L", default_value_t = 2000)]
    lease_ms: u64,
}

fn default_database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The demo's counters table, on a connection of its own, made again after the server went away.
struct Counters {
    database_url: String,
    table: String,
    client: tokio::sync::Mutex<tokio_postgres::Client>,
}

impl Counters {
    async fn connect(options: &Options) -> Result<Counters, Error> {
        let client = open(&options.database_url).await?;
        let table = format!("\"{}counters\"", options.prefix);
        let created = client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {table} \
                 (key text PRIMARY KEY, value bigint NOT NULL, fence bigint NOT NULL)"
            ))
            .await;
        match created {
            Ok(()) => {}
            // Another process created it at the same moment: `IF NOT EXISTS` does not guard
            // against a concurrent creator, which fails on the catalog's unique index or on its
            // type's name instead.
            Err(error)
                if error.code() == Some(&SqlState::UNIQUE_VIOLATION)
                    || error.code() == Some(&SqlState::DUPLICATE_TABLE)
                    || error.code() == Some(&SqlState::DUPLICATE_OBJECT) => {}
            Err(error) => return Err(error.into()),
        }
        client
            .execute(
                &format!("INSERT INTO {table} (key, value, fence) VALUES ($1, 0, 0) ON CONFLICT DO NOTHING"),
                &[&options.key],
            )
            .await?;
        Ok(Counters {
            database_url: options.database_url.clone(),
            table,
            client: tokio::sync::Mutex::new(client),
        })
    }

    async fn read(&self, key: &str) -> Result<i64, Error> {
        let statement = format!("SELECT value FROM {} WHERE key = $1", self.table);
        let row = self
            .client
            .lock()
            .await
            .query_one(&statement, &[&key])
            .await?;
        Ok(row.get(0))
    }

    /// Writes `value` under `token` if no higher token wrote before: the fencing check.
    async fn write(&self, key: &str, value: i64, token: u64) -> Result<bool, Error> {
        let statement = format!(
            "UPDATE {} SET value = $2, fence = $3 WHERE key = $1 AND fence < $3",
            self.table
        );
        let fence = i64::try_from(token)?;
        let written = self
            .client
            .lock()
            .await
            .execute(&statement, &[&key, &value, &fence])
            .await?;
        Ok(written == 1)
    }

    /// Connects again, trying every 200 ms until the server answers.
    async fn reconnect(&self) {
        loop {
            match open(&self.database_url).await {
                Ok(client) => {
                    *self.client.lock().await = client;
                    return;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}

async fn open(database_url: &str) -> Result<tokio_postgres::Client, Error> {
    // tokio-postgres reads `sslmode` (TLS or not); the configuration says what is checked.
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    let connecting = tokio_postgres::connect(database_url, MakeRustlsConnect::new(tls));
    let (client, connection) = connecting.await?;
    tokio::spawn(connection);
    Ok(client)
}

/// libpq's `sslmode=require`: encrypted, any certificate, the handshake's signatures checked.
#[derive(Debug)]
struct AnyCertificate(std::sync::Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        verify_tls12_signature(message, cert, signature, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        verify_tls13_signature(message, cert, signature, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Prints one line and flushes it, so that a reader of a pipe sees each event as it happens.
fn say(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    // A usage error exits 2 (clap's code); `--help` exits 0.
    let options = Options::parse();
    let registry = ClusterRegistry::<String>::builder(&options.database_url)
        .table_prefix(&options.prefix)
        .lease(Duration::from_millis(options.lease_ms))
        .connect()
        .await?;

    // The demo's own data, on a connection of its own. The prefix was checked by `connect`.
    let counters = Counters::connect(&options).await?;
    let key = &options.key;
    let (mut wrote, mut fenced) = (0u64, 0u64);
    for _ in 0..options.increments {
        let guard = registry.lock(key.clone()).await?;
        let token = guard.fencing_token();
        say(format_args!("granted key={key} token={token}"));
        let increment = async {
            let value = counters.read(key).await?;
            tokio::time::sleep(Duration::from_millis(options.hold_ms)).await;
            if guard.is_lost() {
                // Still write: this process plays the stale holder the fence must stop.
                say(format_args!("lost key={key} token={token}"));
            }
            let written = counters.write(key, value + 1, token).await?;
            Ok::<_, Error>((written, value + 1))
        };
        match increment.await {
            Ok((true, value)) => {
                wrote += 1;
                say(format_args!("wrote key={key} token={token} value={value}"));
            }
            Ok((false, _)) => {
                fenced += 1;
                say(format_args!("fenced key={key} token={token}"));
            }
            Err(error) => {
                // The server went away (a restart, say): whether the write landed is unknown,
                // so the increment is given up, not repeated, and the connection made again.
                say(format_args!("failed key={key} token={token} error={error}"));
                counters.reconnect().await;
            }
        }
        drop(guard);
    }
    registry.shutdown().await;
    say(format_args!("done key={key} wrote={wrote} fenced={fenced}"));
    Ok(())
}
