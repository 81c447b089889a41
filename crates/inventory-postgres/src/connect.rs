//! Connection configuration and the pool.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

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

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            max_size: 16,
            acquire_timeout: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(5),
        }
    }
}

/// Parses a `postgres://` URL (or key=value string) without connecting, so bad configuration
/// is reported at start-up.
pub fn parse_url(url: &str) -> Result<tokio_postgres::Config, tokio_postgres::Error> {
    url.parse()
}

/// Builds the pool. Connections are opened lazily, so this succeeds while PostgreSQL is down;
/// requests then fail with `UNAVAILABLE` until it is back.
pub fn connect(
    config: tokio_postgres::Config,
    settings: &PoolSettings,
) -> Result<Pool, deadpool_postgres::BuildError> {
    let mut config = config;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(settings.acquire_timeout);
    }
    if config.get_application_name().is_none() {
        config.application_name("inventory-server");
    }
    // A session left idle inside a transaction would also hold back the event stream, which
    // positions events only behind the oldest open transaction.
    let ms = settings.statement_timeout.as_millis().max(1);
    let ours = format!(
        "-c statement_timeout={ms} -c lock_timeout={ms} -c idle_in_transaction_session_timeout={}",
        ms * 4
    );
    let options = match config.get_options() {
        Some(theirs) => format!("{theirs} {ours}"),
        None => ours,
    };
    config.options(&options);
    config.keepalives(true);
    config.keepalives_idle(Duration::from_secs(30));
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            // Checking each connection with a query on every checkout costs a round trip per
            // request; a broken connection is noticed by the query that uses it instead.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(settings.max_size)
        .wait_timeout(Some(settings.acquire_timeout))
        .create_timeout(Some(settings.acquire_timeout))
        .recycle_timeout(Some(settings.acquire_timeout))
        .runtime(Runtime::Tokio1)
        .build()
}
