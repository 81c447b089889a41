//! The Redis client and its fail-fast configuration.

use std::{path::PathBuf, sync::Arc, time::Duration};

use fred::{
    prelude::{
        ClientLike, Config, ConnectionConfig, PerformanceConfig, ReconnectPolicy, TcpConfig,
    },
    types::config::{TlsConfig, UnresponsiveConfig},
};
use rustls::{
    ClientConfig, RootCertStore,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
};

use crate::keys::KeyPrefix;

/// How the client behaves when Redis is slow or gone.
#[derive(Clone, Debug)]
pub struct RedisSettings {
    pub key_prefix: KeyPrefix,
    /// Upper bound on every command. A command that times out may still run later on Redis:
    /// a timeout is an unknown outcome, never a success.
    pub command_timeout: Duration,
    /// Upper bound on opening a connection (TCP, TLS, AUTH).
    pub connect_timeout: Duration,
}

/// A connected (or reconnecting) client and the key namespace.
#[derive(Clone, Debug)]
pub struct Redis {
    client: fred::clients::Client,
    /// A second connection, in subscribe mode, for lease-release messages.
    subscriber: fred::clients::SubscriberClient,
    prefix: KeyPrefix,
    command_timeout: Duration,
}

/// TLS material for a `rediss://` URL: the CA that signed the server's certificate (unset:
/// the operating system's roots) and an optional client certificate.
#[derive(Clone, Debug, Default)]
pub struct RedisTlsFiles {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl RedisTlsFiles {
    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }
}

const SCHEMES: &[&str] = &[
    "redis://",
    "rediss://",
    "redis-sentinel://",
    "rediss-sentinel://",
    "redis-cluster://",
    "rediss-cluster://",
];

/// Parses a `redis://`, `rediss://`, `redis-sentinel://` or `redis-cluster://` URL (the
/// `rediss` forms speak TLS) without connecting, so bad configuration is reported at
/// start-up. A URL with `user:password@` authenticates as that ACL user.
pub fn parse_url(url: &str) -> Result<Config, fred::error::Error> {
    parse_url_with_tls(url, &RedisTlsFiles::default())
}

/// [`parse_url`], with the TLS files read now. A `rediss` URL gets a rustls configuration
/// that checks the server's certificate against `files.ca` (or the system's roots); TLS files
/// with a plaintext URL are refused, so nobody believes a plaintext link is encrypted.
pub fn parse_url_with_tls(url: &str, files: &RedisTlsFiles) -> Result<Config, fred::error::Error> {
    let config_error =
        |message: String| fred::error::Error::new(fred::error::ErrorKind::Config, message);
    if !SCHEMES.iter().any(|scheme| url.starts_with(scheme)) {
        return Err(config_error(format!(
            "the scheme must be one of {}",
            SCHEMES.join(", ")
        )));
    }
    let wants_tls = url.starts_with("rediss");
    let mut config = Config::from_url(url)?;
    if !wants_tls {
        if !files.is_empty() {
            return Err(config_error(
                "REDIS_TLS_CA_FILE, REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE need a rediss:// URL"
                    .into(),
            ));
        }
        return Ok(config);
    }
    // fred only warns, and connects in the clear, when a build without TLS reads `rediss`.
    let Some(tls) = config.tls.take() else {
        return Err(config_error(
            "the URL asks for TLS, which this build cannot speak to Redis".into(),
        ));
    };
    let client = client_config(files).map_err(config_error)?;
    config.tls = Some(TlsConfig {
        connector: client.into(),
        hostnames: tls.hostnames,
    });
    Ok(config)
}

fn client_config(files: &RedisTlsFiles) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    match &files.ca {
        Some(path) => {
            for certificate in read_certificates("REDIS_TLS_CA_FILE", path)? {
                roots
                    .add(certificate)
                    .map_err(|error| format!("REDIS_TLS_CA_FILE {}: {error}", path.display()))?;
            }
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|error| error.to_string())?
            .with_root_certificates(roots);
    match (&files.cert, &files.key) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(cert), Some(key)) => {
            let chain = read_certificates("REDIS_TLS_CERT_FILE", cert)?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|error| format!("REDIS_TLS_KEY_FILE {}: {error}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|error| format!("REDIS_TLS_CERT_FILE/REDIS_TLS_KEY_FILE: {error}"))
        }
        _ => Err("REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE must be set together".into()),
    }
}

fn read_certificates(
    setting: &str,
    path: &std::path::Path,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
        .map_err(|error| format!("{setting} {}: {error}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!(
            "{setting} {}: no PEM certificate in the file",
            path.display()
        ));
    }
    Ok(certificates)
}

/// Why a first connection failed, sorted by what start-up should do about it.
#[derive(Debug, thiserror::Error)]
pub enum RedisProbeError {
    /// Redis answered and refused (password, ACL), or the TLS handshake failed: only a
    /// configuration change helps.
    #[error("{0}")]
    Refused(String),
    /// Nothing answered in time: Redis may come up later.
    #[error("{0}")]
    Unreachable(String),
}

/// Connects once, with no retry, within `timeout`, and says whether a failure is one that
/// waiting can cure. The service's own client then connects (and reconnects) as usual.
pub async fn probe(
    config: &Config,
    settings: &RedisSettings,
    timeout: Duration,
) -> Result<(), RedisProbeError> {
    let client = fred::types::Builder::from_config(config.clone())
        .with_connection_config(|connection: &mut ConnectionConfig| {
            connection.connection_timeout = settings.connect_timeout;
            connection.internal_command_timeout = settings.connect_timeout;
        })
        .build()
        .map_err(|error| RedisProbeError::Refused(error.to_string()))?;
    let outcome = tokio::time::timeout(timeout, async {
        client.init().await?;
        client.ping::<()>(None).await
    })
    .await;
    let _ = client.quit().await;
    match outcome {
        Ok(Ok(())) => Ok(()),
        Err(_) => Err(RedisProbeError::Unreachable(format!(
            "no answer within {timeout:?}"
        ))),
        Ok(Err(error)) => {
            let message = error.to_string();
            let lower = message.to_ascii_lowercase();
            let refused = matches!(
                error.kind(),
                fred::error::ErrorKind::Auth
                    | fred::error::ErrorKind::Tls
                    | fred::error::ErrorKind::Config
            ) || [
                "certificate",
                "handshake",
                "tls",
                "wrongpass",
                "noperm",
                "noauth",
            ]
            .iter()
            .any(|word| lower.contains(word));
            if refused {
                Err(RedisProbeError::Refused(message))
            } else {
                Err(RedisProbeError::Unreachable(message))
            }
        }
    }
}

impl Redis {
    /// Builds the client and starts connecting in the background. Returns at once: the
    /// service starts while Redis is down and `Reserve` fails closed until it is reachable.
    pub fn connect(
        mut config: Config,
        settings: &RedisSettings,
    ) -> Result<Self, fred::error::Error> {
        // Keep reconnecting forever (max_attempts 0): giving up would leave the service
        // failing closed until a restart.
        config.fail_fast = true;
        let mut builder = fred::types::Builder::from_config(config);
        builder
            .with_connection_config(|connection: &mut ConnectionConfig| {
                connection.connection_timeout = settings.connect_timeout;
                connection.internal_command_timeout = settings.connect_timeout;
                // A command in flight when the connection broke is not re-sent: the lease
                // script is not idempotent, and the caller has a deadline anyway.
                connection.max_command_attempts = 1;
                // Commands issued while disconnected queue here; bound them so a long outage
                // turns into errors rather than memory.
                connection.max_command_buffer_len = 10_000;
                connection.unresponsive = UnresponsiveConfig {
                    max_timeout: Some(settings.command_timeout * 4),
                    interval: settings.command_timeout.max(Duration::from_millis(100)),
                };
                connection.tcp = TcpConfig {
                    nodelay: Some(true),
                    ..TcpConfig::default()
                };
            })
            .with_performance_config(|performance: &mut PerformanceConfig| {
                performance.default_command_timeout = settings.command_timeout;
            })
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 1_000, 2));
        let client = builder.build()?;
        let subscriber = builder.build_subscriber_client()?;
        // The handles end only when the clients quit; errors are reported through events.
        let _connection_task = client.connect();
        let _subscriber_task = subscriber.connect();
        let _resubscribe_task = subscriber.manage_subscriptions();
        Ok(Self {
            client,
            subscriber,
            prefix: settings.key_prefix.clone(),
            command_timeout: settings.command_timeout,
        })
    }

    /// Waits until the first connection is up, at most `timeout`; `false` if it is not.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        matches!(
            tokio::time::timeout(timeout, self.client.wait_for_connect()).await,
            Ok(Ok(()))
        )
    }

    pub(crate) fn client(&self) -> &fred::clients::Client {
        &self.client
    }

    pub(crate) fn subscriber(&self) -> &fred::clients::SubscriberClient {
        &self.subscriber
    }

    pub fn is_connected(&self) -> bool {
        self.client.is_connected()
    }

    pub fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    pub fn prefix(&self) -> &KeyPrefix {
        &self.prefix
    }

    /// The same connections, with the keys of `tenant`: `<prefix>:<tenant>:{<sku>}:...`.
    /// Tenant `default` keeps the bare prefix, so its keys are the ones every release before
    /// tenants used and a rolling upgrade never has two lease keys for one SKU.
    pub fn for_tenant(&self, tenant: &inventory_core::domain::Tenant) -> Self {
        let mut redis = self.clone();
        redis.prefix = self.prefix.for_tenant(tenant);
        redis
    }

    pub async fn ping(&self) -> Result<(), fred::error::Error> {
        self.client.ping::<()>(None).await
    }

    /// Closes the connection, sending `QUIT` if Redis is reachable.
    pub async fn quit(&self) {
        let _ = self.subscriber.quit().await;
        let _ = self.client.quit().await;
    }
}
