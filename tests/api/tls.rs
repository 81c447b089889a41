//! TLS and mutual TLS on the gRPC port, and the plaintext health port beside them.

use std::{path::Path, time::Duration};

use inventory_server::{
    config::TlsSettings, proto::inventory_service_client::InventoryServiceClient,
};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::helpers::{TestApp, fresh_database, get_stock, spawn_app_with, test_settings};

/// A throwaway CA, a server certificate for localhost and a client certificate, as PEM.
struct Pki {
    ca: String,
    server: (String, String),
    client: (String, String),
    /// A client certificate from a CA the server does not trust.
    stranger: (String, String),
}

pub(crate) fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

pub(crate) fn leaf(names: &[&str], issuer: &CertifiedIssuer<'static, KeyPair>) -> (String, String) {
    let params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn pki() -> Pki {
    let authority = ca("inventory test CA");
    let other = ca("someone else");
    Pki {
        ca: authority.pem(),
        server: leaf(&["localhost"], &authority),
        client: leaf(&["order-service"], &authority),
        stranger: leaf(&["order-service"], &other),
    }
}

async fn spawn_tls_app(pki: &Pki, mutual: bool) -> (TestApp, std::net::SocketAddr) {
    let mut settings = test_settings(fresh_database().await);
    settings.server.tls = Some(TlsSettings {
        cert_pem: pki.server.0.clone().into_bytes(),
        key_pem: pki.server.1.clone().into_bytes().into(),
        client_ca_pem: mutual.then(|| pki.ca.clone().into_bytes()),
    });
    settings.server.health_listen_addr = Some("127.0.0.1:0".parse().unwrap());
    let app = spawn_app_with(settings).await;
    let health = app.health_addr.expect("a health listener");
    (app, health)
}

async fn tls_channel(
    app: &TestApp,
    pki: &Pki,
    identity: Option<&(String, String)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Endpoint::from_shared(format!("https://{}", app.addr))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

async fn call(channel: Channel) -> Result<(), tonic::Status> {
    let result = InventoryServiceClient::new(channel)
        .get_stock(get_stock(&["NONE"]))
        .await;
    match result {
        // The SKU does not exist: reaching the service is what counts.
        Err(status) if status.code() == tonic::Code::NotFound => Ok(()),
        Err(status) => Err(status),
        Ok(_) => Ok(()),
    }
}

#[tokio::test]
async fn a_tls_server_refuses_plaintext_and_serves_tls() {
    let pki = pki();
    let (app, health) = spawn_tls_app(&pki, false).await;

    let plain = Endpoint::from_shared(format!("http://{}", app.addr))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await;
    let refused = match plain {
        Err(_) => true,
        Ok(channel) => call(channel).await.is_err(),
    };
    assert!(refused, "a plaintext client gets nothing from a TLS port");

    let channel = tls_channel(&app, &pki, None).await.expect("TLS handshake");
    call(channel).await.expect("served over TLS");

    // Probes speak plaintext to the health port.
    let mut probe = HealthClient::new(
        Endpoint::from_shared(format!("http://{health}"))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let status = probe
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(status.into_inner().status(), ServingStatus::Serving);
}

#[tokio::test]
async fn mutual_tls_requires_a_client_certificate_from_the_trusted_ca() {
    let pki = pki();
    let (app, _) = spawn_tls_app(&pki, true).await;

    for identity in [None, Some(&pki.stranger)] {
        let refused = match tls_channel(&app, &pki, identity).await {
            Err(_) => true,
            Ok(channel) => call(channel).await.is_err(),
        };
        assert!(refused, "refused without a trusted client certificate");
    }
    let channel = tls_channel(&app, &pki, Some(&pki.client))
        .await
        .expect("handshake with a trusted client certificate");
    call(channel).await.expect("served over mutual TLS");
}

#[test]
fn tls_files_are_checked_at_start_up() {
    let dir = std::env::temp_dir().join(format!("inventory-tls-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").unwrap();
    let missing = Path::new("/nonexistent/cert.pem");

    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_inventory-server"))
            .arg("serve")
            .args(args)
            .env_clear()
            .env("DATABASE_URL", "postgres://127.0.0.1:1/none")
            .env("REDIS_URL", "redis://127.0.0.1:1")
            .env("LISTEN_ADDR", "127.0.0.1:0")
            .env("AUTH_DISABLED", "true")
            .output()
            .unwrap()
    };
    let cases: [(&[&str], &str); 3] = [
        (
            &[
                "--tls-cert-file",
                missing.to_str().unwrap(),
                "--tls-key-file",
                missing.to_str().unwrap(),
            ],
            "TLS_CERT_FILE",
        ),
        (
            &["--tls-cert-file", garbage.to_str().unwrap()],
            "must be set together",
        ),
        (
            &[
                "--tls-cert-file",
                garbage.to_str().unwrap(),
                "--tls-key-file",
                garbage.to_str().unwrap(),
            ],
            "invalid TLS material",
        ),
    ];
    for (args, expected) in cases {
        let output = run(args);
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_pinned_client_certificate_stands_in_for_a_token() {
    use rustls_pki_types::{CertificateDer, pem::PemObject as _};
    let pki = pki();
    let der = CertificateDer::from_pem_slice(pki.client.0.as_bytes()).unwrap();
    let mut settings = test_settings(fresh_database().await);
    settings.server.tls = Some(TlsSettings {
        cert_pem: pki.server.0.clone().into_bytes(),
        key_pem: pki.server.1.clone().into_bytes().into(),
        client_ca_pem: Some(pki.ca.clone().into_bytes()),
    });
    settings.auth.authenticator = inventory_server::auth::Authenticator::parse(&format!(
        "checkout reader cert-sha256:{}\n",
        inventory_server::auth::digest_hex(der.as_ref())
    ))
    .unwrap();
    let app = spawn_app_with(settings).await;

    let channel = tls_channel(&app, &pki, Some(&pki.client)).await.unwrap();
    call(channel.clone()).await.expect("a reader may read");
    let status = InventoryServiceClient::new(channel)
        .reserve(crate::helpers::reserve("k", &[("SKU-1", 1)]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
}
