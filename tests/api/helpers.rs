//! The harness: [`spawn_app`] gives a test a freshly migrated database and a running server;
//! [`requests`] builds the requests the tests send and sets up their stock.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use fred::prelude::{ClientLike as _, KeysInterface as _};
use inventory_core::{domain::Ttl, pause::PausePoints, service::InventoryConfig};
use inventory_postgres::{PgConfig, PoolSettings, retention::Retention};
use inventory_redis::{KeyPrefix, LeaseSettings, RedisSettings};
use inventory_server::{
    Service,
    config::{AuthSettings, DatabaseSettings, RedisConnection, ServerSettings, Settings},
    proto::inventory_service_client::InventoryServiceClient,
    startup::Application,
    upkeep::Upkeep,
};
pub use inventory_testkit::Scratch;
use inventory_testkit::postgres::TemplateDatabases;
use tokio::{sync::oneshot, task::JoinHandle};
use tonic::transport::Channel;

mod requests;
pub use requests::*;

pub fn admin_url() -> String {
    std::env::var("DATABASE_URL").expect(
        "DATABASE_URL is not set: run the suite with `make test`, which starts PostgreSQL and Redis",
    )
}

pub fn redis_url() -> String {
    std::env::var("REDIS_URL").expect(
        "REDIS_URL is not set: run the suite with `make test`, which starts PostgreSQL and Redis",
    )
}

pub fn admin_config() -> PgConfig {
    admin_url().parse().expect("DATABASE_URL is a valid URL")
}

/// Connects to a database and drives the connection in the background.
pub async fn connect(config: &PgConfig) -> tokio_postgres::Client {
    inventory_testkit::postgres::connect(config)
        .await
        .expect("connect to PostgreSQL")
}

/// The suite's databases: each a copy of the migrated template.
fn databases() -> TemplateDatabases {
    TemplateDatabases::new(admin_config())
}

/// A new, empty database with the current schema; returns its connection settings.
pub async fn fresh_database() -> PgConfig {
    databases()
        .fresh_database()
        .await
        .expect("a fresh database from the migrated template")
}

/// A new database with no schema at all.
pub async fn empty_database() -> PgConfig {
    databases()
        .empty_database()
        .await
        .expect("an empty database")
}

/// A running server and what a test needs to observe it.
#[derive(Debug)]
pub struct TestApp {
    pub addr: SocketAddr,
    pub health_addr: Option<SocketAddr>,
    /// The admin port (`/metrics`), when the settings asked for one.
    pub admin_addr: Option<SocketAddr>,
    /// The internal peer port, when forwarding is on.
    pub peer_addr: Option<SocketAddr>,
    pub client: InventoryServiceClient<Channel>,
    /// Direct access to the test's database, to check what a call did (or did not) change.
    pub db: tokio_postgres::Client,
    /// The wired core, to run a sweep by hand.
    pub inventory: Arc<Service>,
    pub store: inventory_postgres::PgStore,
    pub events: inventory_server::events::EventHub,
    pub pauses: PausePoints,
    /// Every tenant's core, for tests of a tenant other than `default`.
    pub tenants: inventory_server::tenants::Tenants,
    /// The app's Redis key prefix and a client of the same Redis, to inspect or damage keys.
    pub key_prefix: KeyPrefix,
    pub redis: fred::clients::Client,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<anyhow::Result<()>>>,
}

impl TestApp {
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .expect("connect to the test server")
    }

    /// Stops the server and waits for it to finish draining.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.begin_stop();
        self.server.take().expect("running").await?
    }

    /// Sends the shutdown signal without waiting for the drain ([`Self::stop`] then waits).
    pub fn begin_stop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }

    /// Row counts of every table a mutating call writes, to prove a call changed nothing.
    pub async fn row_counts(&self) -> Vec<(String, i64)> {
        let mut counts = Vec::new();
        for table in [
            "stock",
            "idempotency_keys",
            "reservations",
            "reservation_lines",
            "outbox",
            "cancelled_orders",
            "stock_movements",
        ] {
            let row = self
                .db
                .query_one(&format!("SELECT count(*) FROM {table}"), &[])
                .await
                .unwrap();
            counts.push((table.to_string(), row.get(0)));
        }
        counts
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

/// Settings for a test server on an ephemeral port, against the suite's Redis.
pub fn test_settings(database: PgConfig) -> Settings {
    test_settings_with_redis(database, &redis_url())
}

/// Settings for a test server on an ephemeral port, against the Redis at `redis_url`.
pub fn test_settings_with_redis(database: PgConfig, redis_url: &str) -> Settings {
    Settings {
        server: ServerSettings {
            listen_addr: "127.0.0.1:0".parse().unwrap(),
            health_listen_addr: None,
            admin_listen_addr: None,
            tls: None,
            tls_files: None,
            max_in_flight: 1024,
            max_watchers: 256,
            watch_heartbeat_interval: Duration::from_millis(200),
            max_message_bytes: 262_144,
            max_connection_age: Duration::from_secs(600),
            shutdown_grace: Duration::from_secs(5),
            // Off unless a test reads it: the test binary's stdout is the test report.
            access_log: inventory_server::access::AccessLogSettings {
                enabled: false,
                ..Default::default()
            },
        },
        database: DatabaseSettings {
            listen: None,
            config: database,
            pool: PoolSettings {
                max_size: 8,
                acquire_timeout: Duration::from_secs(2),
                statement_timeout: Duration::from_secs(10),
            },
        },
        redis: RedisConnection {
            config: inventory_redis::parse_url(redis_url).expect("a valid Redis URL"),
            client: RedisSettings {
                key_prefix: KeyPrefix::parse(&format!("test:{}", uuid::Uuid::new_v4().simple()))
                    .unwrap(),
                command_timeout: Duration::from_millis(250),
                connect_timeout: Duration::from_secs(1),
            },
            leases: LeaseSettings::default(),
        },
        inventory: InventoryConfig {
            default_ttl: Ttl::parse(Duration::from_secs(900)).unwrap(),
            coalesce: inventory_core::coalesce::CoalesceConfig::default(),
            // Generous: races of a hundred callers on one SKU must end in stock outcomes, not
            // in lease timeouts, even on a loaded two-core machine.
            lease_wait: Duration::from_secs(20),
            max_hold: Duration::from_secs(24 * 3600),
            // The longest: the tests' receipts are due in 2030.
            wait_horizon: inventory_core::domain::MAX_WAIT_HORIZON,
            tenant_caps: None,
        },
        upkeep: Upkeep {
            interval: Duration::from_millis(100),
            batch: 100,
            retention: Retention {
                events: Duration::from_secs(7 * 24 * 3600),
                subscription_idle: Duration::from_secs(7 * 24 * 3600),
                idempotency_keys: Duration::from_secs(48 * 3600),
                reservations: Duration::from_secs(30 * 24 * 3600),
                ledger: None,
            },
        },
        auth: AuthSettings {
            authenticator: inventory_server::auth::Authenticator::disabled(),
            sources: None,
        },
        peer: None,
        tenants: inventory_server::tenants::TenantSettings::default(),
    }
}

pub async fn spawn_app() -> TestApp {
    let database = fresh_database().await;
    spawn_app_with(test_settings(database)).await
}

pub async fn spawn_app_with(settings: Settings) -> TestApp {
    spawn_app_exporting(settings, prometheus::Registry::new()).await
}

/// An app whose admin `/metrics` serves `registry` (the one `telemetry::init` filled).
pub async fn spawn_app_exporting(settings: Settings, registry: prometheus::Registry) -> TestApp {
    let db = connect(&settings.database.config).await;
    let key_prefix = settings.redis.client.key_prefix.clone();
    // Bounded and reconnecting, so a test that kills its Redis never hangs on this client.
    let redis = fred::types::Builder::from_config(settings.redis.config.clone())
        .with_performance_config(|performance| {
            performance.default_command_timeout = Duration::from_secs(2);
        })
        .set_policy(fred::types::config::ReconnectPolicy::new_constant(0, 50))
        .build()
        .unwrap();
    redis.init().await.expect("connect to the test Redis");
    let application = Application::build_with_registry(settings, registry)
        .await
        .expect("build the server");
    let addr = application.local_addr();
    let health_addr = application.health_addr();
    let admin_addr = application.admin_addr();
    let peer_addr = application.peer_addr();
    let inventory = application.inventory();
    let store = application.store();
    let events = application.events();
    let pauses = application.pause_points();
    let tenants = application.tenants();
    let (shutdown, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(application.run_until_stopped(async {
        let _ = stopped.await;
    }));
    // Lazy: a TLS test server would refuse this plaintext client's handshake.
    let client = InventoryServiceClient::new(
        Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy(),
    );
    TestApp {
        addr,
        health_addr,
        admin_addr,
        peer_addr,
        client,
        db,
        inventory,
        store,
        events,
        pauses,
        tenants,
        key_prefix,
        redis,
        shutdown: Some(shutdown),
        server: Some(server),
    }
}

/// The `BadRequest` field names of an `INVALID_ARGUMENT` status.
pub fn violated_fields(status: &tonic::Status) -> Vec<String> {
    use tonic_types::StatusExt as _;
    assert_eq!(
        status.code(),
        tonic::Code::InvalidArgument,
        "expected INVALID_ARGUMENT, got {status:?}"
    );
    status
        .get_details_bad_request()
        .expect("BadRequest details")
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect()
}

/// The `ErrorInfo.reason` of a status.
pub fn error_reason(status: &tonic::Status) -> String {
    use tonic_types::StatusExt as _;
    status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("ErrorInfo details in {status:?}"))
        .reason
}

/// The path of the grpcurl binary `make test` installs.
pub fn grpcurl() -> PathBuf {
    std::env::var_os("GRPCURL")
        .map(PathBuf::from)
        .expect("GRPCURL is not set: run the suite with `make test`, which installs grpcurl")
}

impl TestApp {
    /// The fence counter Redis holds for `sku` (0 when the key is missing).
    pub async fn redis_fence(&self, sku: &str) -> i64 {
        let sku = inventory_core::domain::Sku::parse(sku).unwrap();
        let value: Option<i64> = self.redis.get(self.key_prefix.fence(&sku)).await.unwrap();
        value.unwrap_or(0)
    }

    pub fn lease_key(&self, sku: &str) -> String {
        self.key_prefix
            .lease(&inventory_core::domain::Sku::parse(sku).unwrap())
    }

    pub fn fence_key(&self, sku: &str) -> String {
        self.key_prefix
            .fence(&inventory_core::domain::Sku::parse(sku).unwrap())
    }

    /// A `Reserve` that must succeed.
    pub async fn hold(
        &self,
        key: &str,
        lines: &[(&str, i64)],
    ) -> inventory_server::proto::Reservation {
        self.client
            .clone()
            .reserve(reserve(key, lines))
            .await
            .unwrap()
            .into_inner()
    }

    /// The single number a `SELECT count(*) ...` query returns.
    pub async fn count(&self, sql: &str) -> i64 {
        self.db.query_one(sql, &[]).await.unwrap().get(0)
    }

    /// Waits until every committed event has its stream position; answers the head.
    pub async fn positioned(&self) -> i64 {
        inventory_testkit::process::eventually(
            "every committed event is positioned",
            Duration::from_secs(20),
            || async {
                self.count("SELECT count(*) FROM outbox WHERE position IS NULL")
                    .await
                    == 0
            },
        )
        .await
        .unwrap();
        self.count("SELECT head FROM event_stream").await
    }

    /// The fence PostgreSQL last accepted for `sku`.
    pub async fn stored_fence(&self, sku: &str) -> i64 {
        self.db
            .query_one("SELECT fence_token FROM stock WHERE sku = $1", &[&sku])
            .await
            .unwrap()
            .get(0)
    }

    /// `(on_hand, reserved)` of `sku` as stored.
    pub async fn level(&self, sku: &str) -> (i64, i64) {
        let row = self
            .db
            .query_one(
                "SELECT on_hand, reserved FROM stock WHERE sku = $1",
                &[&sku],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    }
}

/// A client of a server the harness did not spawn itself.
#[derive(Debug)]
pub struct TestClient(pub InventoryServiceClient<Channel>);

impl TestApp {
    /// Connection settings of the test's own database, for a session of the test's own.
    pub async fn database_config(&self) -> PgConfig {
        let name: String = self
            .db
            .query_one("SELECT current_database()", &[])
            .await
            .unwrap()
            .get(0);
        let mut config = admin_config();
        config.dbname(&name);
        config
    }

    /// A URL of this test's database, for tools that take one (the load generator's audit).
    pub async fn database_url(&self) -> String {
        let name = self
            .database_config()
            .await
            .get_dbname()
            .unwrap()
            .to_owned();
        let admin = admin_url();
        let (base, _) = admin.rsplit_once('/').expect("a URL with a database");
        format!("{base}/{name}")
    }
}

/// Retention that prunes every stock movement it may (each SKU's latest is always kept) and
/// nothing else.
pub fn ledger_only_retention() -> Retention {
    Retention {
        events: Duration::from_secs(86_400),
        subscription_idle: Duration::from_secs(86_400),
        idempotency_keys: Duration::from_secs(86_400),
        reservations: Duration::from_secs(86_400),
        ledger: Some(Duration::ZERO),
    }
}

/// An app whose background sweeper never runs during the test, for tests that sweep by hand
/// and count what their sweep expired.
pub async fn spawn_app_without_sweeper() -> TestApp {
    let mut settings = test_settings(fresh_database().await);
    settings.upkeep.interval = Duration::from_secs(3600);
    spawn_app_with(settings).await
}
