//! Cluster mode over TLS: every connection a registry opens (the statement connection and the
//! listener, at connect and after a reconnect) is as encrypted and as checked as the URL's
//! `sslmode` says, and each TLS failure is a named error at `connect`. Against the real local
//! server, with Debian's snakeoil certificate (`CN=localhost`) and the role that
//! `.ci/postgres-tls-setup` admits only over TLS.

use std::time::Duration;

use keyed_locks::{ClusterError, ClusterRegistry};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{Instant, timeout};

use crate::cluster_registry::{database_url, fresh_prefix};

/// The server's own certificate, self-signed: the root for `verify-ca` and `verify-full`.
const SERVER_CERTIFICATE: &str = "/etc/ssl/certs/ssl-cert-snakeoil.pem";
/// The role `.ci/postgres-tls-setup` lets in only over TLS.
const TLS_ONLY_ROLE: &str = "keyed_locks_tls_only";
/// Generous: the machine is small and shared, and the server is real.
const BOUND: Duration = Duration::from_secs(30);

/// `url` with `parameters` added to its query.
pub(crate) fn with_parameters(url: &str, parameters: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{parameters}")
}

async fn admin() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
        .await
        .expect("PostgreSQL must be up for the cluster tests (see .ci/run)");
    tokio::spawn(connection);
    client
}

async fn connect(url: &str, prefix: &str) -> Result<ClusterRegistry<String>, ClusterError> {
    ClusterRegistry::builder(url)
        .table_prefix(prefix)
        .lease(Duration::from_secs(5))
        .connect()
        .await
}

/// The backends of the registry on `prefix`'s tables, each as (pid, which connection, TLS on).
/// The listener's last statement is its LISTEN on the table's channel, the statement
/// connection's a lease statement on the table: both name the prefix.
async fn backends(admin: &tokio_postgres::Client, prefix: &str) -> Vec<(i32, String, bool)> {
    let rows = admin
        .query(
            "SELECT a.pid, a.application_name, s.ssl \
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name LIKE 'keyed-locks %' AND strpos(a.query, $1) > 0 \
             ORDER BY a.application_name",
            &[&prefix],
        )
        .await
        .expect("reads pg_stat_activity");
    rows.iter()
        .map(|row| {
            let name: String = row.get(1);
            let role = name.split(' ').nth(1).unwrap_or_default().to_owned();
            (row.get(0), role, row.get(2))
        })
        .collect()
}

/// Waits until the registry on `prefix` has its listener and statement connection on the
/// server, none of them among `gone`; returns them.
async fn both_backends(
    admin: &tokio_postgres::Client,
    prefix: &str,
    registry: &ClusterRegistry<String>,
    gone: &[i32],
) -> Vec<(i32, String, bool)> {
    let deadline = Instant::now() + BOUND;
    loop {
        // A lock puts a lease statement on the statement connection, and makes it again if
        // it was lost (the first call after a loss may fail: it finds the loss).
        if let Ok(guard) = registry.lock("k".to_owned()).await {
            drop(guard);
        }
        let found = backends(admin, prefix).await;
        let roles: Vec<&str> = found.iter().map(|(_, role, _)| role.as_str()).collect();
        if roles == ["listener", "statements"] && found.iter().all(|(pid, ..)| !gone.contains(pid))
        {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "the registry's two connections did not show up: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_require_every_connection_is_encrypted_and_stays_so_after_a_reconnect() {
    let prefix = fresh_prefix("kl_test_tls_require_").await;
    let admin = admin().await;
    let url = with_parameters(&database_url(), "sslmode=require");
    let registry = connect(&url, &prefix).await.expect("connects over TLS");
    let first = both_backends(&admin, &prefix, &registry, &[]).await;
    assert!(
        first.iter().all(|(.., ssl)| *ssl),
        "not all encrypted: {first:?}"
    );

    let pids: Vec<i32> = first.iter().map(|(pid, ..)| *pid).collect();
    for pid in &pids {
        admin
            .execute("SELECT pg_terminate_backend($1)", &[pid])
            .await
            .expect("terminates the backend");
    }
    let again = both_backends(&admin, &prefix, &registry, &pids).await;
    assert!(
        again.iter().all(|(.., ssl)| *ssl),
        "a reconnection dropped TLS: {again:?}"
    );
    registry.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_ca_with_the_servers_certificate_as_root_connects_and_locks() {
    let prefix = fresh_prefix("kl_test_tls_verify_ca_").await;
    let url = with_parameters(
        &database_url(),
        &format!("sslmode=verify-ca&sslrootcert={SERVER_CERTIFICATE}"),
    );
    let registry = connect(&url, &prefix).await.expect("the chain verifies");
    let guard = timeout(BOUND, registry.lock("k".to_owned())).await;
    assert!(matches!(guard, Ok(Ok(_))), "locks over TLS");
    registry.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_checks_the_host_name_against_the_certificate() {
    let prefix = fresh_prefix("kl_test_tls_verify_full_").await;
    let roots = format!("sslmode=verify-full&sslrootcert={SERVER_CERTIFICATE}");
    // The certificate names `localhost`, not the address 127.0.0.1.
    let by_address = "postgres://postgres@127.0.0.1:5432/test";
    match connect(&with_parameters(by_address, &roots), &prefix).await {
        Err(ClusterError::BadCertificate { problem, .. }) => {
            assert!(problem.starts_with("wrong host name"), "{problem}");
        }
        other => panic!("expected a wrong host name, got {other:?}"),
    }
    let by_name = "postgres://postgres@localhost:5432/test";
    let registry = connect(&with_parameters(by_name, &roots), &prefix).await;
    registry.expect("the name matches").shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_the_system_roots_is_refused_at_connect_with_a_certificate_error() {
    let prefix = fresh_prefix("kl_test_tls_system_roots_").await;
    let url = with_parameters(&database_url(), "sslmode=verify-full");
    match connect(&url, &prefix).await {
        // Unknown issuer where the platform's store lacks the snakeoil certificate; the wrong
        // host name where (as on Debian, by its hash link in /etc/ssl/certs) it has it.
        Err(error @ ClusterError::BadCertificate { .. }) => {
            let message = error.to_string();
            assert!(
                message.contains("unknown issuer") || message.contains("wrong host name"),
                "{message}"
            );
        }
        other => panic!("expected a certificate error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_ca_with_roots_that_did_not_issue_the_certificate_names_an_unknown_issuer() {
    let prefix = fresh_prefix("kl_test_tls_other_roots_").await;
    // The public roots: none of them signed the self-signed snakeoil certificate.
    let url = with_parameters(
        &database_url(),
        "sslmode=verify-ca&sslrootcert=/etc/ssl/certs/ca-certificates.crt",
    );
    match connect(&url, &prefix).await {
        Err(ClusterError::BadCertificate { problem, .. }) => {
            assert!(problem.starts_with("unknown issuer"), "{problem}");
        }
        other => panic!("expected an unknown issuer, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_file_that_cannot_be_read_is_refused_at_connect() {
    let url = with_parameters(
        &database_url(),
        "sslmode=verify-full&sslrootcert=/nonexistent/keyed-locks/root.crt",
    );
    let refused = connect(&url, "kl_test_tls_no_roots_").await;
    assert!(
        matches!(&refused, Err(ClusterError::TlsRootFile { path, .. }) if path.ends_with("root.crt")),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_against_a_server_that_offers_no_tls_is_refused_not_sent_in_clear() {
    // A server that answers the TLS request with "N", as one built without TLS does.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds a port");
    let port = listener.local_addr().expect("has an address").port();
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accepts");
        let mut request = [0u8; 8];
        socket
            .read_exact(&mut request)
            .await
            .expect("reads the TLS request");
        socket.write_all(b"N").await.expect("answers no");
        // Whatever comes next would be the startup message in clear: there must be none.
        let mut after = Vec::new();
        let _ = socket.read_to_end(&mut after).await;
        after
    });
    let url = format!("postgres://postgres@127.0.0.1:{port}/test?sslmode=require");
    let refused = connect(&url, "kl_test_tls_none_").await;
    assert!(
        matches!(
            &refused,
            Err(ClusterError::TlsNotOffered {
                mode: "require",
                ..
            })
        ),
        "{refused:?}"
    );
    let sent_after = timeout(BOUND, server).await.expect("the client hung up");
    assert_eq!(
        sent_after.expect("the server task ran"),
        b"",
        "sent in clear after the no"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_against_a_server_that_admits_the_role_only_over_tls_is_a_clear_error() {
    let admin = admin().await;
    let rule = admin
        .query_one(
            "SELECT count(*) FROM pg_hba_file_rules WHERE type = 'hostnossl' \
             AND $1 = ANY(user_name) AND auth_method = 'reject'",
            &[&TLS_ONLY_ROLE],
        )
        .await
        .expect("reads pg_hba_file_rules");
    assert_eq!(
        rule.get::<_, i64>(0),
        1,
        "the server does not admit {TLS_ONLY_ROLE} only over TLS: run .ci/postgres-tls-setup"
    );
    let prefix = fresh_prefix("kl_test_tls_only_role_").await;
    let as_role = format!("postgres://{TLS_ONLY_ROLE}@127.0.0.1:5432/test");
    let refused = connect(&with_parameters(&as_role, "sslmode=disable"), &prefix).await;
    match refused {
        Err(error @ ClusterError::PlainTextRefused { .. }) => {
            assert!(error.to_string().contains("without tls"), "{error}");
        }
        other => panic!("expected a refusal of plain text, got {other:?}"),
    }
    // The same role over TLS gets in: the refusal was about TLS, not the role.
    let registry = connect(&with_parameters(&as_role, "sslmode=require"), &prefix).await;
    registry
        .expect("the role connects over TLS")
        .shutdown()
        .await;
}
