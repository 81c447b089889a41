//! Connection configuration and the pool.

use std::{
    ops::{Deref, DerefMut},
    str::FromStr,
    time::Duration,
};

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

use crate::tls::{PgTls, split_ssl_params};

/// Where PostgreSQL is and how to reach it: the driver's settings and the TLS policy of
/// `sslmode` / `sslrootcert` / `sslcert` / `sslkey`. Every connection this process opens (the
/// pool, `LISTEN`, `migrate`) is made from it. It dereferences to the driver's `Config` for
/// its setters; its `Debug` output hides the password.
#[derive(Clone, Debug)]
pub struct PgConfig {
    driver: tokio_postgres::Config,
    tls: PgTls,
}

impl PgConfig {
    pub fn tls(&self) -> &PgTls {
        &self.tls
    }

    /// Opens one connection under this configuration's TLS policy; the caller drives the
    /// returned connection.
    pub async fn open(
        &self,
    ) -> Result<(tokio_postgres::Client, Connection), tokio_postgres::Error> {
        self.driver.connect(self.tls.connector()).await
    }
}

impl Deref for PgConfig {
    type Target = tokio_postgres::Config;

    fn deref(&self) -> &Self::Target {
        &self.driver
    }
}

impl DerefMut for PgConfig {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.driver
    }
}

/// One connection, to be driven by whoever opened it.
pub type Connection = tokio_postgres::Connection<
    tokio_postgres::Socket,
    <crate::tls::MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<
        tokio_postgres::Socket,
    >>::Stream,
>;

/// A connection string that cannot be used, with what is wrong (never the string itself: it
/// may hold a password).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UrlError(String);

impl FromStr for PgConfig {
    type Err = UrlError;

    fn from_str(url: &str) -> Result<Self, UrlError> {
        parse_url(url)
    }
}

/// How the pool behaves when PostgreSQL is slow or gone.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    /// Most connections this process opens.
    pub max_size: usize,
    /// Longest a request waits for a free connection, and to open a new one.
    pub acquire_timeout: Duration,
    /// Longest one statement may run, and wait for a lock, before PostgreSQL cancels it: a
    /// stalled database turns into `UNAVAILABLE`, not a hung call holding a connection.
    pub statement_timeout: Duration,
}

impl PoolSettings {
    /// Longest one use case waits for PostgreSQL on the client side: the server gives up on
    /// a statement (or a lock) after `statement_timeout`, and its answer gets
    /// `acquire_timeout` more to arrive. Past that the server or the path to it is gone.
    pub fn operation_bound(&self) -> Duration {
        self.statement_timeout + self.acquire_timeout
    }
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            max_size: 16,
            acquire_timeout: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(5),
        }
    }
}

/// Parses a `postgres://` URL (or key=value string) without connecting, and reads the TLS
/// files it names, so bad configuration is reported at start-up.
pub fn parse_url(url: &str) -> Result<PgConfig, UrlError> {
    let (rest, params) = split_ssl_params(url).map_err(UrlError)?;
    let mut driver: tokio_postgres::Config =
        rest.parse().map_err(|error| UrlError(format!("{error}")))?;
    let tls = PgTls::from_params(&params).map_err(UrlError)?;
    driver.ssl_mode(tls.mode().driver());
    Ok(PgConfig { driver, tls })
}

/// Why a first connection failed, sorted by what start-up should do about it.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// PostgreSQL answered, and said no (pg_hba.conf, password, missing database), or the TLS
    /// handshake failed (certificate, host name, no TLS on the server): retrying cannot help,
    /// the configuration must change.
    #[error("{0}")]
    Refused(String),
    /// Nothing answered in time (down, starting, network): worth waiting for.
    #[error("{0}")]
    Unreachable(String),
}

/// Opens and closes one connection, within `timeout`, to tell a configuration PostgreSQL will
/// never accept from a database that is merely not up yet.
pub async fn probe(config: &PgConfig, timeout: Duration) -> Result<(), ProbeError> {
    let attempt = tokio::time::timeout(timeout, config.open()).await;
    let error = match attempt {
        Err(_) => {
            return Err(ProbeError::Unreachable(format!(
                "no answer within {timeout:?}"
            )));
        }
        Ok(Ok((client, connection))) => {
            drop(client);
            let _ = connection.await;
            return Ok(());
        }
        Ok(Err(error)) => error,
    };
    let message = describe(&error);
    // Refused: only what no amount of waiting changes. A server that is starting, shutting
    // down or full (57xxx, 53xxx) is merely not available yet.
    let refused_by_server = error.as_db_error().is_some_and(|db| {
        let code = db.code().code();
        code.starts_with("28") || code == "3D000" || code == "42501"
    });
    if refused_by_server || is_tls_failure(&error) {
        Err(ProbeError::Refused(message))
    } else {
        Err(ProbeError::Unreachable(message))
    }
}

/// The error with its causes, one after another.
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

/// A handshake failure: rustls refused the certificate, or the server offers no TLS.
fn is_tls_failure(error: &tokio_postgres::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(cause) = source {
        if cause.is::<rustls::Error>() {
            return true;
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
        {
            return true;
        }
        source = cause.source();
    }
    // tokio-postgres reports a server without TLS under `sslmode=require` in words only.
    error.to_string().contains("TLS")
}

/// Socket settings for every connection: a peer that stops acknowledging what was sent
/// (`TCP_USER_TIMEOUT`) or stays silent (keepalive probes) ends the connection instead of
/// leaving it half-open.
fn harden(config: &mut tokio_postgres::Config, settings: &PoolSettings) {
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(settings.acquire_timeout);
    }
    config.keepalives(true);
    config.keepalives_idle(Duration::from_secs(30));
    config.keepalives_interval(Duration::from_secs(5));
    config.keepalives_retries(3);
    config.tcp_user_timeout(settings.operation_bound());
}

impl PgConfig {
    /// The same settings, with the socket protections of the pool ([`connect`]): for the
    /// connections opened outside it (`LISTEN`).
    pub fn hardened(&self, settings: &PoolSettings) -> Self {
        let mut hardened = self.clone();
        harden(&mut hardened.driver, settings);
        if hardened.driver.get_application_name().is_none() {
            hardened.driver.application_name("inventory-server-listen");
        }
        hardened
    }
}

/// Builds the pool. Connections are opened lazily, so this succeeds while PostgreSQL is down;
/// requests then fail with `UNAVAILABLE` until it is back.
pub fn connect(
    config: PgConfig,
    settings: &PoolSettings,
) -> Result<Pool, deadpool_postgres::BuildError> {
    let PgConfig {
        driver: mut config,
        tls,
    } = config;
    if config.get_application_name().is_none() {
        config.application_name("inventory-server");
    }
    // A session left idle inside a transaction would also hold back the event stream, which
    // positions events only behind the oldest open transaction. Sent as statements on each new
    // connection, not as the startup packet's `options`: PgBouncer refuses a client that sends
    // `options` ("unsupported startup parameter").
    let ms = settings.statement_timeout.as_millis().max(1);
    let session = format!(
        "SET statement_timeout = {ms}; SET lock_timeout = {ms}; \
         SET idle_in_transaction_session_timeout = {}",
        ms * 4
    );
    harden(&mut config, settings);
    let manager = Manager::from_config(
        config,
        tls.connector(),
        ManagerConfig {
            // Checking each connection with a query on every checkout costs a round trip per
            // request; a broken connection is noticed by the query that uses it instead.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .post_create(Hook::async_fn(move |client, _| {
            let session = session.clone();
            Box::pin(async move {
                client
                    .batch_execute(&session)
                    .await
                    .map_err(HookError::Backend)
            })
        }))
        .max_size(settings.max_size)
        .wait_timeout(Some(settings.acquire_timeout))
        .create_timeout(Some(settings.acquire_timeout))
        .recycle_timeout(Some(settings.acquire_timeout))
        .runtime(Runtime::Tokio1)
        .build()
}
