//! The harness: [`spawn_app`] gives a test a freshly migrated database and a running server.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use inventory_postgres::{PgConfig, PoolSettings};
use inventory_redis::{KeyPrefix, RedisSettings};
use inventory_server::{
    config::Settings, proto::inventory_service_client::InventoryServiceClient, startup::Application,
};
use sha2::{Digest, Sha256};
use tokio::{sync::oneshot, task::JoinHandle};
use tokio_postgres::NoTls;
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
    let (client, connection) = config.connect(NoTls).await.expect("connect to PostgreSQL");
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
    pub client: InventoryServiceClient<Channel>,
    /// Direct access to the test's database, to check what a call did (or did not) change.
    pub db: tokio_postgres::Client,
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
        let _ = self.shutdown.take().expect("running").send(());
        self.server.take().expect("running").await?
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

/// Settings for a test server on an ephemeral port.
pub fn test_settings(database: PgConfig) -> Settings {
    Settings {
        listen_addr: "127.0.0.1:0".parse().unwrap(),
        database,
        pool: PoolSettings {
            max_size: 8,
            acquire_timeout: Duration::from_secs(2),
        },
        redis: inventory_redis::parse_url(&redis_url()).expect("REDIS_URL is valid"),
        redis_settings: RedisSettings {
            key_prefix: KeyPrefix::parse(&format!("test:{}", uuid::Uuid::new_v4().simple()))
                .unwrap(),
            command_timeout: Duration::from_millis(250),
            connect_timeout: Duration::from_secs(1),
        },
        shutdown_grace: Duration::from_secs(5),
    }
}

pub async fn spawn_app() -> TestApp {
    let database = fresh_database().await;
    spawn_app_with(test_settings(database)).await
}

pub async fn spawn_app_with(settings: Settings) -> TestApp {
    let db = connect(&settings.database).await;
    let application = Application::build(settings)
        .await
        .expect("build the server");
    let addr = application.local_addr();
    let (shutdown, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(application.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let client = InventoryServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to the test server");
    TestApp {
        addr,
        client,
        db,
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
