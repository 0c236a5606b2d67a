//! TLS for every connection to the lease table's server: the rustls configuration each
//! `sslmode` asks for, built once per store (the roots are read at connect, and every
//! reconnection uses the same configuration), and the handshake's failures named.
//!
//! What libpq's modes check, and how:
//! - `require` (and `prefer`, when the server offers TLS): encrypted, certificate not checked
//!   ([`HostNameUnchecked`] without roots): it stops a passive eavesdropper, not a server in the middle;
//! - `verify-ca`: the chain must reach a trusted root, whatever host name it was issued for
//!   ([`HostNameUnchecked`] with the roots);
//! - `verify-full`: rustls' own verifier, chain and host name.
//!
//! The crypto provider is `ring`, named here rather than taken from rustls' process-wide
//! default: a process whose other crates enable `aws-lc-rs` too would otherwise panic on the
//! ambiguity when the first connection is made.

use std::error::Error as _;
use std::fs;
use std::io;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WebPkiServerVerifier, verify_server_cert_signed_by_trust_anchor};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::cluster::error::ClusterError;
use crate::cluster::postgres::sslmode::{RootCertificates, SslMode, TlsParameters};

/// The connector for `parameters`; `custom`, when the application built its own configuration,
/// is used as it is (the mode then says only whether TLS is used).
///
/// # Errors
///
/// The roots cannot be read (`verify-ca` and `verify-full` only), or rustls refuses the
/// configuration.
pub(crate) fn connector(
    parameters: &TlsParameters,
    custom: Option<&Arc<ClientConfig>>,
) -> Result<MakeRustlsConnect, ClusterError> {
    if let Some(custom) = custom {
        return Ok(MakeRustlsConnect::new(ClientConfig::clone(custom)));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|source| ClusterError::TlsConfig {
            source: Box::new(source),
        })?;
    let config = match parameters.mode {
        // Under `disable` the configuration is never used; one that checks nothing costs no
        // file read.
        SslMode::Disable | SslMode::Prefer | SslMode::Require => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(HostNameUnchecked {
                roots: None,
                provider,
            }))
            .with_no_client_auth(),
        SslMode::VerifyCa => {
            let roots = Arc::new(roots(&parameters.roots)?);
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(HostNameUnchecked {
                    roots: Some(roots),
                    provider,
                }))
                .with_no_client_auth()
        }
        SslMode::VerifyFull => {
            let roots = Arc::new(roots(&parameters.roots)?);
            let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|source| ClusterError::TlsConfig {
                    source: Box::new(source),
                })?;
            builder.with_webpki_verifier(verifier).with_no_client_auth()
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

/// The trusted roots: the file's certificates, or the platform's.
fn roots(source: &RootCertificates) -> Result<RootCertStore, ClusterError> {
    let mut store = RootCertStore::empty();
    match source {
        RootCertificates::File(path) => {
            let refuse = |source: io::Error| ClusterError::TlsRootFile {
                path: path.clone(),
                source: Box::new(source),
            };
            let pem = fs::read(path).map_err(refuse)?;
            for certificate in CertificateDer::pem_slice_iter(&pem) {
                let certificate = certificate
                    .map_err(|error| refuse(io::Error::new(io::ErrorKind::InvalidData, error)))?;
                store
                    .add(certificate)
                    .map_err(|error| refuse(io::Error::new(io::ErrorKind::InvalidData, error)))?;
            }
            if store.is_empty() {
                // An empty file would refuse every server, each time for an "unknown issuer":
                // say at connect what is really wrong.
                return Err(refuse(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "no PEM certificate in the file",
                )));
            }
        }
        RootCertificates::System => {
            let found = rustls_native_certs::load_native_certs();
            // Unreadable entries of a store that still yields roots are skipped, as a browser
            // does; only a store with none at all is an error.
            let (added, _unparsable) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                let reason = found.errors.first().map_or_else(
                    || "the platform's store holds no certificate".to_owned(),
                    ToString::to_string,
                );
                return Err(ClusterError::NoSystemRoots {
                    source: reason.into(),
                });
            }
        }
    }
    Ok(store)
}

/// The error a failed connection attempt is, if TLS is what failed: the server refused TLS,
/// its certificate did not verify, or the handshake broke down. `None` for anything else.
pub(crate) fn handshake_failure(
    error: &tokio_postgres::Error,
    server: &str,
    mode: SslMode,
) -> Option<ClusterError> {
    let cause = error.source()?;
    // tokio-rustls reports rustls' errors inside an `io::Error`, whose own `source` skips them.
    if let Some(tls_error) = cause
        .downcast_ref::<io::Error>()
        .and_then(io::Error::get_ref)
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        return Some(match tls_error {
            rustls::Error::InvalidCertificate(problem) => ClusterError::BadCertificate {
                server: server.to_owned(),
                problem: certificate_problem(problem),
                source: Box::new(tls_error.clone()),
            },
            _ => ClusterError::TlsHandshake {
                server: server.to_owned(),
                source: Box::new(tls_error.clone()),
            },
        });
    }
    // tokio-postgres' only way of saying the server answered the TLS request with "no": an
    // error of its own kind, whose text is all there is to tell it by.
    if cause.to_string() == "server does not support TLS" {
        return Some(ClusterError::TlsNotOffered {
            server: server.to_owned(),
            mode: mode.as_str(),
        });
    }
    None
}

/// What is wrong with a certificate, in words for the error message.
fn certificate_problem(problem: &CertificateError) -> String {
    match problem {
        CertificateError::UnknownIssuer => {
            "unknown issuer: no trusted root certificate vouches for it (see sslrootcert)"
                .to_owned()
        }
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            format!("wrong host name: it was not issued for the host connected to ({problem})")
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            format!("expired ({problem})")
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            format!("not valid yet ({problem})")
        }
        CertificateError::Revoked => "revoked".to_owned(),
        other => other.to_string(),
    }
}

/// The verifier of the two modes that never check the host name: libpq's `require` (`roots`
/// `None`: any certificate) and `verify-ca` (`roots` given: the chain must reach one of them
/// and be valid now, whatever host name it was issued for, so a server reached by an address
/// its certificate does not name still passes). In both the handshake's signatures are checked,
/// so the server holds the key of the certificate it shows.
#[derive(Debug)]
struct HostNameUnchecked {
    roots: Option<Arc<RootCertStore>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for HostNameUnchecked {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let certificate = ParsedCertificate::try_from(end_entity)?;
            verify_server_cert_signed_by_trust_anchor(
                &certificate,
                roots,
                intermediates,
                now,
                self.provider.signature_verification_algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            signature,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            signature,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn parameters(mode: SslMode, roots: RootCertificates) -> TlsParameters {
        TlsParameters { mode, roots }
    }

    #[test]
    fn a_root_file_that_cannot_be_read_or_holds_no_certificate_is_named() {
        let missing = PathBuf::from("/nonexistent/keyed-locks/root.crt");
        let refused = connector(
            &parameters(SslMode::VerifyFull, RootCertificates::File(missing.clone())),
            None,
        );
        assert!(
            matches!(&refused, Err(ClusterError::TlsRootFile { path, .. }) if *path == missing)
        );
        let empty =
            std::env::temp_dir().join(format!("keyed-locks-empty-{}.pem", std::process::id()));
        fs::write(&empty, "not a certificate\n").expect("writes the temporary file");
        let refused = connector(
            &parameters(SslMode::VerifyCa, RootCertificates::File(empty.clone())),
            None,
        );
        let _ = fs::remove_file(&empty);
        assert!(matches!(refused, Err(ClusterError::TlsRootFile { .. })));
    }

    #[test]
    fn modes_that_do_not_verify_read_no_root_file() {
        let missing = RootCertificates::File(PathBuf::from("/nonexistent/root.crt"));
        for mode in [SslMode::Disable, SslMode::Prefer, SslMode::Require] {
            assert!(connector(&parameters(mode, missing.clone()), None).is_ok());
        }
    }

    #[test]
    fn each_certificate_problem_is_named() {
        assert!(
            certificate_problem(&CertificateError::UnknownIssuer).starts_with("unknown issuer")
        );
        assert!(
            certificate_problem(&CertificateError::NotValidForName).starts_with("wrong host name")
        );
        assert!(certificate_problem(&CertificateError::Expired).starts_with("expired"));
    }
}
