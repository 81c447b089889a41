//! The harness: [`spawn_app`] gives a test a freshly migrated database and a running server.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    sync::Arc,
    time::Duration,
};

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
use sha2::{Digest, Sha256};
use tokio::{sync::oneshot, task::JoinHandle};
use tonic::transport::Channel;

/// Advisory lock serialising template creation across test processes.
const TEMPLATE_LOCK_KEY: i64 = 0x7465_6d70_6c61_7465;

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
    let (client, connection) = config.open().await.expect("connect to PostgreSQL");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

fn migrations_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/inventory-postgres/migrations")
}

/// The template's name changes whenever a migration does, so a stale template is never used.
fn template_name() -> String {
    let mut files: Vec<_> = std::fs::read_dir(migrations_dir())
        .expect("migrations folder")
        .map(|entry| entry.expect("migration file").path())
        .collect();
    files.sort();
    let mut hash = Sha256::new();
    for file in files {
        hash.update(file.file_name().unwrap().as_encoded_bytes());
        hash.update(std::fs::read(&file).expect("read migration"));
    }
    let digest = hash.finalize();
    format!(
        "inventory_template_{}",
        digest[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

/// Creates the migrated template once (under a lock, since every test process may try), and
/// returns its name. It is built under a temporary name and renamed when complete, so a crash
/// mid-way never leaves a half-migrated template behind.
async fn ensure_template() -> String {
    let name = template_name();
    let admin = connect(&admin_config()).await;
    admin
        .execute("SELECT pg_advisory_lock($1)", &[&TEMPLATE_LOCK_KEY])
        .await
        .unwrap();
    let exists = admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await
        .unwrap()
        .is_some();
    if !exists {
        let building = format!("{name}_building");
        for statement in [
            format!("DROP DATABASE IF EXISTS {building}"),
            format!("CREATE DATABASE {building}"),
        ] {
            admin.batch_execute(&statement).await.unwrap();
        }
        let mut config = admin_config();
        config.dbname(&building);
        inventory_postgres::migrate::run(&config)
            .await
            .expect("migrate the template");
        admin
            .batch_execute(&format!("ALTER DATABASE {building} RENAME TO {name}"))
            .await
            .unwrap();
    }
    admin
        .execute("SELECT pg_advisory_unlock($1)", &[&TEMPLATE_LOCK_KEY])
        .await
        .unwrap();
    name
}

/// A new, empty database with the current schema; returns its connection settings.
pub async fn fresh_database() -> PgConfig {
    let template = ensure_template().await;
    let name = format!("inventory_test_{}", uuid::Uuid::new_v4().simple());
    connect(&admin_config())
        .await
        .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {template}"))
        .await
        .unwrap();
    let mut config = admin_config();
    config.dbname(&name);
    config
}

/// A new database with no schema at all.
pub async fn empty_database() -> PgConfig {
    let name = format!("inventory_test_{}", uuid::Uuid::new_v4().simple());
    connect(&admin_config())
        .await
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let mut config = admin_config();
    config.dbname(&name);
    config
}

/// A running server and what a test needs to observe it.
#[derive(Debug)]
pub struct TestApp {
    pub addr: SocketAddr,
    pub health_addr: Option<SocketAddr>,
    pub client: InventoryServiceClient<Channel>,
    /// Direct access to the test's database, to check what a call did (or did not) change.
    pub db: tokio_postgres::Client,
    /// The wired core, to run a sweep by hand.
    pub inventory: Arc<Service>,
    pub store: inventory_postgres::PgStore,
    pub events: inventory_server::events::EventHub,
    pub pauses: PausePoints,
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
            max_message_bytes: 262_144,
            max_connection_age: Duration::from_secs(600),
            shutdown_grace: Duration::from_secs(5),
        },
        database: DatabaseSettings {
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
        },
        upkeep: Upkeep {
            interval: Duration::from_millis(100),
            batch: 100,
            retention: Retention {
                events: Duration::from_secs(7 * 24 * 3600),
                idempotency_keys: Duration::from_secs(48 * 3600),
                reservations: Duration::from_secs(30 * 24 * 3600),
            },
        },
        auth: AuthSettings {
            authenticator: inventory_server::auth::Authenticator::disabled(),
            tokens_file: None,
        },
    }
}

pub async fn spawn_app() -> TestApp {
    let database = fresh_database().await;
    spawn_app_with(test_settings(database)).await
}

pub async fn spawn_app_with(settings: Settings) -> TestApp {
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
    let application = Application::build(settings)
        .await
        .expect("build the server");
    let addr = application.local_addr();
    let health_addr = application.health_addr();
    let inventory = application.inventory();
    let store = application.store();
    let events = application.events();
    let pauses = application.pause_points();
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
        client,
        db,
        inventory,
        store,
        events,
        pauses,
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
            .reserve(crate::reservations::reserve(key, lines))
            .await
            .unwrap()
            .into_inner()
    }

    /// The single number a `SELECT count(*) ...` query returns.
    pub async fn count(&self, sql: &str) -> i64 {
        self.db.query_one(sql, &[]).await.unwrap().get(0)
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

/// A `redis-server` process of the test's own, which it may kill, pause and restart.
#[derive(Debug)]
pub struct RedisProcess {
    port: u16,
    dir: tempdir::Dir,
    child: Option<tokio::process::Child>,
}

/// A scratch folder removed on drop.
mod tempdir {
    #[derive(Debug)]
    pub struct Dir(pub std::path::PathBuf);

    impl Dir {
        pub fn new() -> Self {
            let path = std::env::temp_dir()
                .join(format!("inventory-redis-{}", uuid::Uuid::new_v4().simple()));
            std::fs::create_dir_all(&path).unwrap();
            Self(path)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl RedisProcess {
    pub async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut process = Self {
            port,
            dir: tempdir::Dir::new(),
            child: None,
        };
        process.restart().await;
        process
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts (again) on the same port, empty: no persistence, as a cache-only Redis runs.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = tokio::process::Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir.0)
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start redis-server (make test installs it)");
        self.child = Some(child);
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("redis-server did not start on port {}", self.port);
    }

    /// SIGSTOP: the process keeps its connections but answers nothing until [`Self::resume`].
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT: a paused process reads what queued up meanwhile and answers it.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().expect("a pid");
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// SIGKILL: the process is gone at once, with everything it held.
    pub async fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().await.unwrap();
    }
}

/// A client of a server the harness did not spawn itself.
#[derive(Debug)]
pub struct TestClient(pub InventoryServiceClient<Channel>);

impl TestClient {
    pub async fn stock(&self, sku: &str, units: i64) {
        self.0
            .clone()
            .adjust_stock(inventory_server::proto::AdjustStockRequest {
                sku: sku.into(),
                delta: units,
                idempotency_key: format!("stock-{sku}-{}", uuid::Uuid::new_v4()),
                reason: "test stock".into(),
            })
            .await
            .unwrap();
    }
}

/// A TCP proxy whose forwarding can be stopped and resumed: stopped, it keeps every
/// connection open and holds the bytes in both directions, as a hung database or a network
/// that went silent does.
#[derive(Debug)]
pub struct StallProxy {
    pub port: u16,
    forwarding: tokio::sync::watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl StallProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (forwarding, watching) = tokio::sync::watch::channel(true);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pipe(client_read, server_write, watching.clone()));
                tokio::spawn(pipe(server_read, client_write, watching.clone()));
            }
        });
        Self {
            port,
            forwarding,
            task,
        }
    }

    /// Stops forwarding: nothing more passes either way until [`Self::resume`].
    pub fn stall(&self) {
        self.forwarding.send_replace(false);
    }

    pub fn resume(&self) {
        self.forwarding.send_replace(true);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut forwarding: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        if forwarding.wait_for(|on| *on).await.is_err() {
            return;
        }
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            _ = forwarding.wait_for(|on| !*on) => continue,
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Bytes read just as forwarding stopped wait for it to resume.
        if forwarding.wait_for(|on| *on).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// A free loopback port (bound, then released: the caller binds it again at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A scratch folder under the system's temporary folder, removed on drop.
#[derive(Debug)]
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(kind: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "inventory-{kind}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    /// Writes `name` in the folder; returns its path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

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
