//! Connection configuration and the pool.

use std::{
    ops::{Deref, DerefMut},
    str::FromStr,
    time::Duration,
};

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

use crate::{
    plumbing::hosts::{self, Attempts, HostOrder},
    plumbing::tls::{PgTls, split_ssl_params},
};

/// Where PostgreSQL is and how to reach it: the driver's settings and the TLS policy of
/// `sslmode` / `sslrootcert` / `sslcert` / `sslkey`. Every connection this process opens (the
/// pool, `LISTEN`, `migrate`) is made from it. It dereferences to the driver's `Config` for
/// its setters; its `Debug` output hides the password. Its clones share which of several
/// hosts answered last ([`PgConfig::open`]).
#[derive(Clone, Debug)]
pub struct PgConfig {
    driver: tokio_postgres::Config,
    tls: PgTls,
    order: HostOrder,
    /// The schema this configuration's connections work in (a tenant's), when not the
    /// database's default `search_path`.
    schema: Option<Schema>,
}

/// The PostgreSQL schema one tenant's tables live in: `public` for tenant `default` (so a
/// database from before tenants is tenant `default` as it stands), `tenant_<name>` for every
/// other. Tenant names are `[a-z][a-z0-9_]{0,30}`, so the name is a plain identifier.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Schema(String);

impl Schema {
    pub fn public() -> Self {
        Self("public".to_owned())
    }

    /// The schema of `tenant` (a name `inventory_core::domain::Tenant` accepted).
    pub fn of_tenant(tenant: &inventory_core::domain::Tenant) -> Self {
        if tenant.is_default() {
            Self::public()
        } else {
            Self(format!("tenant_{}", tenant.as_str()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_public(&self) -> bool {
        self.0 == "public"
    }

    /// The `NOTIFY` channel the schema's event sequencer announces new positions on.
    pub fn positions_channel(&self) -> String {
        if self.is_public() {
            crate::usecases::events::POSITIONS_CHANNEL.to_owned()
        } else {
            format!("{}_{}", crate::usecases::events::POSITIONS_CHANNEL, self.0)
        }
    }

    /// `SET search_path` to this schema alone: a table of another schema cannot be named by
    /// accident, and a missing table is an error, never a fall-back to `public`.
    pub fn set_search_path(&self) -> String {
        format!("SET search_path = {}", self.0)
    }
}

impl std::fmt::Display for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl PgConfig {
    /// The same database, every connection working in `schema` (set on each new connection
    /// as a statement, like the session timeouts: PgBouncer refuses the `options` startup
    /// parameter).
    pub fn in_schema(mut self, schema: Schema) -> Self {
        self.schema = (!schema.is_public()).then_some(schema);
        self
    }

    /// The schema set by [`PgConfig::in_schema`]; `public` when none was.
    pub fn schema(&self) -> Schema {
        self.schema.clone().unwrap_or_else(Schema::public)
    }

    /// Puts an opened connection in this configuration's schema (connections the pool opens
    /// are, already).
    pub async fn enter_schema(
        &self,
        client: &tokio_postgres::Client,
    ) -> Result<(), tokio_postgres::Error> {
        match &self.schema {
            Some(schema) => client.batch_execute(&schema.set_search_path()).await,
            None => Ok(()),
        }
    }

    pub fn tls(&self) -> &PgTls {
        &self.tls
    }

    /// Opens one connection under this configuration's TLS policy; the caller drives the
    /// returned connection.
    ///
    /// With several hosts, each is tried alone, the host that answered last first, and each
    /// but the last gets `connect_timeout` for the whole handshake (see [`crate::plumbing::hosts`]): a
    /// frozen primary that still accepts TCP connects is passed over for the next host.
    pub async fn open(
        &self,
    ) -> Result<(tokio_postgres::Client, Connection), tokio_postgres::Error> {
        let Some(Attempts { mut hosts, bound }) = Attempts::plan(&self.driver, &self.order) else {
            return self.driver.connect(self.tls.connector()).await;
        };
        let (last, last_config) = hosts.pop().expect("a plan lists at least two hosts");
        for (index, host) in hosts {
            let attempt = host.connect(self.tls.connector());
            let outcome = match bound {
                Some(bound) => match tokio::time::timeout(bound, attempt).await {
                    Ok(outcome) => outcome,
                    Err(_) => {
                        tracing::warn!(
                            host = index,
                            ?bound,
                            "PostgreSQL host did not complete the handshake in time; trying the next"
                        );
                        continue;
                    }
                },
                None => attempt.await,
            };
            match outcome {
                Ok(opened) => {
                    self.order
                        .answered(index, self.driver.get_load_balance_hosts());
                    return Ok(opened);
                }
                Err(error) => {
                    tracing::debug!(host = index, %error, "PostgreSQL host refused; trying the next");
                }
            }
        }
        let opened = last_config.connect(self.tls.connector()).await?;
        self.order
            .answered(last, self.driver.get_load_balance_hosts());
        Ok(opened)
    }

    /// How long [`PgConfig::open`] may take before it has tried every host: `floor`, or
    /// `connect_timeout` for each host when that is longer. A caller that bounds `open` by
    /// less would give up on a frozen first host before the next one is tried.
    pub fn open_bound(&self, floor: Duration) -> Duration {
        let per_host = self.driver.get_connect_timeout().copied().unwrap_or(floor);
        let hosts = hosts::host_count(&self.driver).unwrap_or(1);
        floor.max(per_host * u32::try_from(hosts).unwrap_or(u32::MAX))
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
    <crate::plumbing::tls::MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<
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
    Ok(PgConfig {
        driver,
        tls,
        order: HostOrder::default(),
        schema: None,
    })
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

/// Opens and closes one connection, within `timeout` (stretched to pass over every host of a
/// multi-host configuration, [`PgConfig::open_bound`]), to tell a configuration PostgreSQL
/// will never accept from a database that is merely not up yet.
pub async fn probe(config: &PgConfig, timeout: Duration) -> Result<(), ProbeError> {
    let timeout = config.open_bound(timeout);
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
    let mut config = config;
    if config.driver.get_application_name().is_none() {
        config.driver.application_name("inventory-server");
    }
    // A session left idle inside a transaction would also hold back the event stream, which
    // positions events only behind the oldest open transaction. Sent as statements on each new
    // connection, not as the startup packet's `options`: PgBouncer refuses a client that sends
    // `options` ("unsupported startup parameter").
    let ms = settings.statement_timeout.as_millis().max(1);
    let mut session = format!(
        "SET statement_timeout = {ms}; SET lock_timeout = {ms}; \
         SET idle_in_transaction_session_timeout = {}",
        ms * 4
    );
    if let Some(schema) = &config.schema {
        session.push_str("; ");
        session.push_str(&schema.set_search_path());
    }
    harden(&mut config.driver, settings);
    // Opening may pass over every host but the last after `connect_timeout` each.
    let create_timeout = config.open_bound(settings.acquire_timeout);
    let manager = Manager::from_connect(
        config.driver.clone(),
        Opener(config),
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
        .create_timeout(Some(create_timeout))
        .recycle_timeout(Some(settings.acquire_timeout))
        .runtime(Runtime::Tokio1)
        .build()
}

/// The pool's way to open a connection: [`PgConfig::open`], so pooled connections pass over
/// a frozen host like every other connection does.
struct Opener(PgConfig);

impl deadpool_postgres::Connect for Opener {
    fn connect(
        &self,
        _: &tokio_postgres::Config,
    ) -> futures::future::BoxFuture<
        '_,
        Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
    > {
        Box::pin(async move {
            let (client, connection) = self.0.open().await?;
            let driver = tokio::spawn(async move {
                if let Err(error) = connection.await {
                    tracing::warn!(%error, "PostgreSQL connection failed");
                }
            });
            Ok((client, driver))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_is_bounded_long_enough_to_try_every_host() {
        let floor = Duration::from_secs(2);
        let one = parse_url("postgres://u@a/d?connect_timeout=5").unwrap();
        assert_eq!(one.open_bound(floor), Duration::from_secs(5));
        let three = parse_url("postgres://u@a,b,c/d?connect_timeout=3").unwrap();
        assert_eq!(three.open_bound(floor), Duration::from_secs(9));
        // No connect_timeout: each host gets the floor (what `harden` sets it to).
        let two = parse_url("postgres://u@a,b/d").unwrap();
        assert_eq!(two.open_bound(floor), Duration::from_secs(4));
        let short = parse_url("postgres://u@a/d?connect_timeout=1").unwrap();
        assert_eq!(short.open_bound(floor), floor);
    }
}
