//! What the cluster examples share: a connection of their own to the demo's tables, with TLS
//! as the URL's `sslmode` asks, and creating a table that another process may be creating at
//! the same moment. Included by each example with `#[path]`; not an example itself.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_postgres::error::SqlState;
use tokio_postgres_rustls::MakeRustlsConnect;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The `DATABASE_URL` environment variable, else the local test server.
pub fn default_database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Runs `statement` (a `CREATE TABLE IF NOT EXISTS`), which another process may run at the
/// same moment.
pub async fn create(client: &tokio_postgres::Client, statement: &str) -> Result<(), Error> {
    match client.batch_execute(statement).await {
        Ok(()) => Ok(()),
        // Another process created it at the same moment: `IF NOT EXISTS` does not guard
        // against a concurrent creator, which fails on the catalog's unique index or on its
        // type's name instead.
        Err(error)
            if error.code() == Some(&SqlState::UNIQUE_VIOLATION)
                || error.code() == Some(&SqlState::DUPLICATE_TABLE)
                || error.code() == Some(&SqlState::DUPLICATE_OBJECT) =>
        {
            Ok(())
        }
        Err(error) => Err(error.into()),
    }
}

pub async fn open(database_url: &str) -> Result<tokio_postgres::Client, Error> {
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
