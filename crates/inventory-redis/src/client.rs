//! The Redis client and its fail-fast configuration.

use std::time::Duration;

use fred::{
    prelude::{
        ClientLike, Config, ConnectionConfig, PerformanceConfig, ReconnectPolicy, TcpConfig,
    },
    types::config::UnresponsiveConfig,
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
    prefix: KeyPrefix,
    command_timeout: Duration,
}

/// Parses a `redis://`, `rediss://`, `redis-sentinel://` or `redis-cluster://` URL without
/// connecting, so bad configuration is reported at start-up.
pub fn parse_url(url: &str) -> Result<Config, fred::error::Error> {
    const SCHEMES: &[&str] = &[
        "redis://",
        "rediss://",
        "redis-sentinel://",
        "rediss-sentinel://",
        "redis-cluster://",
        "rediss-cluster://",
    ];
    if !SCHEMES.iter().any(|scheme| url.starts_with(scheme)) {
        return Err(fred::error::Error::new(
            fred::error::ErrorKind::Config,
            format!("the scheme must be one of {}", SCHEMES.join(", ")),
        ));
    }
    Config::from_url(url)
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
        let client = fred::types::Builder::from_config(config)
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
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 1_000, 2))
            .build()?;
        // The handle ends only when the client quits; errors are reported through events.
        let _connection_task = client.connect();
        Ok(Self {
            client,
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

    pub fn is_connected(&self) -> bool {
        self.client.is_connected()
    }

    pub fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    pub fn prefix(&self) -> &KeyPrefix {
        &self.prefix
    }

    pub async fn ping(&self) -> Result<(), fred::error::Error> {
        self.client.ping::<()>(None).await
    }

    /// Closes the connection, sending `QUIT` if Redis is reachable.
    pub async fn quit(&self) {
        let _ = self.client.quit().await;
    }
}
