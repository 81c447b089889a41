//! A multi-host `DATABASE_URL` whose first host is a frozen primary: it completes TCP
//! connects from its listen backlog and never answers the startup packet. Every connection
//! (the pool's, `LISTEN`, the first one at start-up) passes over it within `connect_timeout`
//! and reaches the next host; the host that answered is tried first from then on.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use inventory_postgres::{PgConfig, PoolSettings};
use tokio::net::TcpListener;

use crate::helpers::{TestClient, fresh_database, spawn_app_with, test_settings};

/// A host that accepts connections and never says a word: what a SIGSTOPped PostgreSQL looks
/// like to a client. Counts the connections it accepted.
struct SilentHost {
    port: u16,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl SilentHost {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(socket);
            }
        });
        Self {
            port,
            accepted,
            task,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for SilentHost {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `database`, listed second behind `silent`, as a deployment lists primary and standby.
fn behind(silent: &SilentHost, database: &PgConfig) -> PgConfig {
    format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user={} dbname={} connect_timeout=1 \
         target_session_attrs=read-write",
        silent.port,
        database.get_ports()[0],
        database.get_user().unwrap(),
        database.get_dbname().unwrap(),
    )
    .parse()
    .unwrap()
}

/// Bounds a step that used to hang forever, so a regression fails instead of stalling.
async fn within<T>(what: &str, step: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(15), step)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish"))
}

#[tokio::test]
async fn a_frozen_first_host_is_passed_over_and_the_answering_one_remembered() {
    let database = fresh_database().await;
    let silent = SilentHost::start().await;
    let config = behind(&silent, &database);

    let (client, connection) = within("the first connection", config.open())
        .await
        .expect("the second host answers");
    tokio::spawn(connection);
    let name: String = client
        .query_one("SELECT current_database()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(name, database.get_dbname().unwrap());
    assert_eq!(silent.accepted(), 1, "the first host was tried first");

    // The next connection, from any clone of the configuration, starts at the host that
    // answered.
    let again = config.clone();
    let (client, connection) = within("the second connection", again.open()).await.unwrap();
    tokio::spawn(connection);
    client.simple_query("SELECT 1").await.unwrap();
    assert_eq!(silent.accepted(), 1, "the frozen host was not tried again");
}

#[tokio::test]
async fn the_pool_reaches_the_second_host_within_its_create_timeout() {
    let database = fresh_database().await;
    let silent = SilentHost::start().await;
    // The pool's create timeout (1 s) is no longer than one host's connect timeout: it must
    // stretch to cover passing over the first host.
    let settings = PoolSettings {
        acquire_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let pool = inventory_postgres::connect(behind(&silent, &database), &settings).unwrap();
    let client = within("a pooled connection", pool.get())
        .await
        .expect("a pooled connection from the second host");
    let timeout: String = client
        .query_one("SHOW statement_timeout", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        timeout, "5s",
        "the session settings reached the second host"
    );
    assert_eq!(silent.accepted(), 1);
}

#[tokio::test]
async fn the_service_runs_with_its_first_host_frozen() {
    let database = fresh_database().await;
    let silent = SilentHost::start().await;
    let app = within(
        "start-up",
        spawn_app_with(test_settings(behind(&silent, &database))),
    )
    .await;
    TestClient(app.client.clone()).stock("MH-1", 4).await;
    let hold = within("a reservation", app.hold("k-mh", &[("MH-1", 3)])).await;
    assert_eq!(hold.lines[0].quantity, 3);
    assert_eq!(app.level("MH-1").await, (4, 3));
}
