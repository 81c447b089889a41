//! TLS on the gRPC port, with material that can be replaced while the server runs.
//!
//! tonic's own TLS takes its certificate once, at start-up. Here connections are accepted and
//! handshaken by tokio-rustls with the [`ServerTls`] in force at that moment, and handed to
//! tonic already encrypted; tonic still sees the client certificate (`Request::peer_certs`),
//! so mutual TLS identifies callers as before. Swapping the configuration affects only
//! connections accepted afterwards: calls in flight keep theirs.

use std::{io, net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context as _;
use arc_swap::ArcSwap;
use rustls::{
    RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
    server::WebPkiClientVerifier,
};
use secrecy::ExposeSecret as _;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_stream::wrappers::ReceiverStream;

use crate::config::TlsSettings;

/// Longest a client may take over its TLS handshake before the connection is dropped, so
/// half-open connections cannot pile up.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS configuration new connections are accepted with.
#[derive(Clone)]
pub struct ServerTls(Arc<ArcSwap<TlsAcceptor>>);

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Checks the material (certificate, key, client CA) now, so start-up fails on a bad one.
    pub fn new(material: &TlsSettings) -> anyhow::Result<Self> {
        Ok(Self(Arc::new(ArcSwap::from_pointee(acceptor(material)?))))
    }

    /// Replaces the material for connections accepted from now on; a bad one is refused and
    /// the old kept.
    pub fn replace(&self, material: &TlsSettings) -> anyhow::Result<()> {
        self.0.store(Arc::new(acceptor(material)?));
        Ok(())
    }

    /// Accepts connections on `listener`, each handshaken on its own task so a slow client
    /// never holds up the others. Ends when the returned stream is dropped.
    pub fn incoming(
        &self,
        listener: TcpListener,
    ) -> ReceiverStream<Result<TlsStream<TcpStream>, io::Error>> {
        let (ready, incoming) = mpsc::channel(64);
        let current = Arc::clone(&self.0);
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(error) => {
                            // Out of file descriptors and the like: back off, do not spin.
                            tracing::warn!(%error, "cannot accept a connection");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                    () = ready.closed() => return,
                };
                let _ = tcp.set_nodelay(true);
                let acceptor = current.load_full();
                let ready = ready.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = ready.send(Ok(stream)).await;
                        }
                        Ok(Err(error)) => handshake_failed(peer, &error.to_string()),
                        Err(_) => handshake_failed(peer, "timed out"),
                    }
                });
            }
        });
        ReceiverStream::new(incoming)
    }
}

fn handshake_failed(peer: SocketAddr, why: &str) {
    tracing::debug!(%peer, why, "TLS handshake failed");
}

fn acceptor(material: &TlsSettings) -> anyhow::Result<TlsAcceptor> {
    let acceptor = TlsAcceptor::from(Arc::new(server_config(material)?));
    record_expiry(material);
    Ok(acceptor)
}

/// `inventory_tls_certificate_not_after_seconds{certificate}`: when the server's certificate
/// (`server`, the first of its chain) and the earliest client CA (`client_ca`) expire, as
/// Unix time, for an alert weeks ahead. Recorded whenever the material is (re)loaded.
fn record_expiry(material: &TlsSettings) {
    let gauge = opentelemetry::global::meter("inventory-server")
        .i64_gauge("inventory.tls.certificate.not_after")
        .with_unit("s")
        .with_description("When the gRPC port's certificate (server) and its earliest client CA (client_ca) expire, as Unix time")
        .build();
    let not_after = |pem: &[u8]| {
        CertificateDer::pem_slice_iter(pem)
            .filter_map(Result::ok)
            .filter_map(|der| {
                x509_parser::parse_x509_certificate(&der)
                    .ok()
                    .map(|(_, certificate)| certificate.validity().not_after.timestamp())
            })
            .collect::<Vec<i64>>()
    };
    if let Some(leaf) = not_after(&material.cert_pem).first() {
        gauge.record(
            *leaf,
            &[opentelemetry::KeyValue::new("certificate", "server")],
        );
    }
    if let Some(ca) = &material.client_ca_pem
        && let Some(earliest) = not_after(ca).into_iter().min()
    {
        gauge.record(
            earliest,
            &[opentelemetry::KeyValue::new("certificate", "client_ca")],
        );
    }
}

fn server_config(material: &TlsSettings) -> anyhow::Result<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = CertificateDer::pem_slice_iter(&material.cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .context("TLS_CERT_FILE is not PEM")?;
    anyhow::ensure!(!chain.is_empty(), "TLS_CERT_FILE holds no certificate");
    let key = PrivateKeyDer::from_pem_slice(material.key_pem.expose_secret())
        .context("TLS_KEY_FILE holds no PEM private key")?;
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?;
    let builder = match &material.client_ca_pem {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for certificate in CertificateDer::pem_slice_iter(ca) {
                roots
                    .add(certificate.context("TLS_CLIENT_CA_FILE is not PEM")?)
                    .context("TLS_CLIENT_CA_FILE")?;
            }
            anyhow::ensure!(!roots.is_empty(), "TLS_CLIENT_CA_FILE holds no certificate");
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .context("TLS_CLIENT_CA_FILE")?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .context("TLS_CERT_FILE and TLS_KEY_FILE do not form a usable pair")?;
    // gRPC is HTTP/2 only.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}
