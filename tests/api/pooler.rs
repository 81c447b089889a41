//! Through PgBouncer in session mode, as deployments put it between the replicas and
//! PostgreSQL: every pooled connection and the `LISTEN` connection go through it, with the
//! statement bounds in force, unless `DATABASE_LISTEN_URL` sends `LISTEN` elsewhere.
//!
//! PgBouncer reaches PostgreSQL over its Unix socket, so the sessions it opens have no client
//! address and are told from direct ones.

use std::time::Duration;

use inventory_postgres::PgConfig;
use inventory_testkit::{eventually, pgbouncer::PgBouncer};

use crate::helpers::{
    Scratch, TestApp, TestClient, connect, fresh_database, spawn_app_with, test_settings,
};

/// A fresh database, PgBouncer in front of it, and the URL of the database through it.
async fn behind_pgbouncer() -> (PgConfig, PgBouncer, PgConfig, Scratch) {
    let database = fresh_database().await;
    let direct = connect(&database).await;
    let sockets: String = direct
        .query_one("SHOW unix_socket_directories", &[])
        .await
        .unwrap()
        .get(0);
    let socket = sockets.split(',').next().unwrap().trim().to_owned();
    let scratch = Scratch::new("pgbouncer");
    // PgBouncer runs as `postgres` when the tests run as root: let it read its files.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&scratch.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bouncer = PgBouncer::start(&scratch.0, &socket, database.get_ports()[0])
        .await
        .expect("PgBouncer (make test installs Debian's pgbouncer)");
    let through: PgConfig = bouncer.url(database.get_dbname().unwrap()).parse().unwrap();
    (database, bouncer, through, scratch)
}

/// Sessions on the test's database by where they come from (through PgBouncer: no client
/// address) and what they last ran.
async fn sessions(app: &TestApp, through_pgbouncer: bool, query: &str) -> i64 {
    app.db
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND (client_addr IS NULL) = $1 AND query LIKE $2",
            &[&through_pgbouncer, &query],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn the_service_runs_through_pgbouncer_in_session_mode() {
    let (_database, _bouncer, through, _scratch) = behind_pgbouncer().await;
    let app = spawn_app_with(test_settings(through.clone())).await;
    TestClient(app.client.clone()).stock("PGB-1", 5).await;
    let hold = app.hold("k-1", &[("PGB-1", 2)]).await;
    assert_eq!(hold.lines[0].quantity, 2);
    assert_eq!(app.level("PGB-1").await, (5, 2));

    // The pool's sessions and the LISTEN one both came through PgBouncer.
    eventually(
        "LISTEN through PgBouncer",
        Duration::from_secs(10),
        || async { sessions(&app, true, "LISTEN%").await == 1 },
    )
    .await
    .unwrap();
    assert_eq!(sessions(&app, false, "LISTEN%").await, 0);
    assert!(sessions(&app, true, "%").await >= 2);

    // A pooled connection through PgBouncer carries the statement bounds.
    let settings = inventory_postgres::PoolSettings {
        statement_timeout: Duration::from_millis(1500),
        ..Default::default()
    };
    let pool = inventory_postgres::connect(through, &settings).unwrap();
    let client = pool
        .get()
        .await
        .expect("a pooled connection through PgBouncer");
    let timeout: String = client
        .query_one("SHOW statement_timeout", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(timeout, "1500ms");
    app.stop().await.unwrap();
}

#[tokio::test]
async fn database_listen_url_sends_listen_around_pgbouncer() {
    let (database, _bouncer, through, _scratch) = behind_pgbouncer().await;
    let mut settings = test_settings(through);
    let mut direct = database.clone();
    direct.application_name("inventory-listen-direct");
    settings.database.listen = Some(direct);
    let app = spawn_app_with(settings).await;
    TestClient(app.client.clone()).stock("PGB-2", 5).await;

    eventually(
        "LISTEN on the direct URL",
        Duration::from_secs(10),
        || async {
            let rows = app
                .db
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND client_addr IS NOT NULL
                   AND application_name = 'inventory-listen-direct' AND query LIKE 'LISTEN%'",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, i64>(0);
            rows == 1
        },
    )
    .await
    .unwrap();
    assert_eq!(sessions(&app, true, "LISTEN%").await, 0);
    // The calls still go through PgBouncer.
    assert!(sessions(&app, true, "%").await >= 1);
    app.stop().await.unwrap();
}
