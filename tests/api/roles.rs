//! The database roles of `deploy/sql/roles.sql`, on a database of their own: `migrate` as the
//! role that owns the schema, `serve` as one that may only read and write rows, `verify` as
//! one that only reads. Everything the service does works so, and each role is refused what
//! it must not do.

use std::{collections::HashSet, path::Path, process::Command, time::Duration};

use inventory_postgres::PgConfig;
use inventory_server::proto::{CancelOrderRequest, EventType, ReserveRequest, WatchEventsRequest};
use inventory_testkit::process::eventually;
use tokio_postgres::error::SqlState;
use tokio_stream::StreamExt as _;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::helpers::{
    confirm, connect, empty_database, release, reserve, spawn_app_with, stock, test_settings,
};

/// This test's names for the script's three roles: roles belong to the whole cluster, which
/// every test database shares, so each run gets its own.
struct Roles {
    migrator: String,
    server: String,
    verifier: String,
}

impl Roles {
    fn new() -> Self {
        let run = &uuid::Uuid::new_v4().simple().to_string()[..12];
        Self {
            migrator: format!("inventory_migrator_{run}"),
            server: format!("inventory_server_{run}"),
            verifier: format!("inventory_verifier_{run}"),
        }
    }

    /// `deploy/sql/roles.sql` with this run's role names.
    fn script(&self) -> String {
        let script = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/sql/roles.sql"),
        )
        .unwrap();
        assert!(script.contains("inventory_server") && script.contains("inventory_verifier"));
        script
            .replace("inventory_migrator", &self.migrator)
            .replace("inventory_server", &self.server)
            .replace("inventory_verifier", &self.verifier)
    }

    fn all(&self) -> [&str; 3] {
        [&self.migrator, &self.server, &self.verifier]
    }
}

/// Drops the test's database and roles when the test ends, passed or failed: roles outlive
/// databases, in the cluster every test shares.
struct DropAfterwards {
    database: String,
    roles: Vec<String>,
}

impl Drop for DropAfterwards {
    fn drop(&mut self) {
        let database = std::mem::take(&mut self.database);
        let roles = std::mem::take(&mut self.roles).join(", ");
        // Its own thread and runtime: the test's runtime may be the one unwinding.
        let dropped = std::thread::spawn(move || {
            tokio::runtime::Runtime::new().unwrap().block_on(async {
                let cluster = connect(&crate::helpers::admin_config()).await;
                cluster
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
                    .await?;
                cluster
                    .batch_execute(&format!("DROP ROLE IF EXISTS {roles}"))
                    .await
            })
        })
        .join();
        if !std::thread::panicking() {
            dropped.unwrap().unwrap();
        }
    }
}

/// `database`, connecting as `role`.
fn as_role(database: &PgConfig, role: &str) -> PgConfig {
    let mut config = database.clone();
    config.user(role);
    config
}

/// Runs `inventory-server <command> --database-url <url of config>`: `(success, stdout +
/// stderr)`.
async fn run(command: &'static str, config: &PgConfig) -> (bool, String) {
    let url = inventory_testkit::postgres::url(config);
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_inventory-server"))
            .args([command, "--database-url", &url])
            // A second tenant: its schema is created and migrated by the migrator, served and
            // verified like public.
            .env("TENANTS", TENANTS)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// The tenants the commands and the server work with.
const TENANTS: &str = "default,brand_r";

/// Asserts that each statement is refused for lack of privilege.
async fn refused(client: &tokio_postgres::Client, who: &str, statements: &[&str]) {
    for statement in statements {
        match client.batch_execute(statement).await {
            Ok(()) => panic!("{who} may run {statement:?}"),
            Err(error) => assert_eq!(
                error.code(),
                Some(&SqlState::INSUFFICIENT_PRIVILEGE),
                "{who}: {statement:?} failed otherwise: {error:?}"
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_serve_and_verify_each_work_with_only_their_own_role() {
    let roles = Roles::new();
    let database = empty_database().await;
    let _drop_afterwards = DropAfterwards {
        database: database.get_dbname().unwrap().to_owned(),
        roles: roles.all().map(str::to_owned).to_vec(),
    };
    let admin = connect(&database).await;
    // Twice: running it again (after an upgrade, to repair grants) changes nothing.
    admin.batch_execute(&roles.script()).await.unwrap();
    admin.batch_execute(&roles.script()).await.unwrap();
    let migrator = as_role(&database, &roles.migrator);
    let server = as_role(&database, &roles.server);
    let verifier = as_role(&database, &roles.verifier);

    // The migrate initContainer's command, as the migrating role: it owns what it creates.
    let (ok, log) = run("migrate", &migrator).await;
    assert!(ok, "migrate as {}: {log}", roles.migrator);
    let foreign: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'public' AND c.relkind IN ('r', 'S', 'i')
               AND pg_get_userbyid(c.relowner) <> $1",
            &[&roles.migrator],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        foreign, 0,
        "every table, index and sequence is the migrator's"
    );
    let tenant_tables: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_tables
             WHERE schemaname = 'tenant_brand_r' AND tableowner = $1",
            &[&roles.migrator],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        tenant_tables > 10,
        "the tenant's schema is migrated by its owner"
    );
    // The default privileges granted the server writes on the schema's own records as the
    // first migrate created them; migrate took them back (checked with the refusals below),
    // with no second run of the script.

    // Serving as the DML-only role: readiness (the schema check reads the migrations' history
    // and the floor), every kind of write, and the background work: the sequencer positions
    // events and adopts the cluster's identity, the listener wakes the stream, the sweeper
    // expires a hold.
    let mut settings = test_settings(server.clone());
    settings.server.health_listen_addr = Some("127.0.0.1:0".parse().unwrap());
    settings.tenants = inventory_server::tenants::TenantSettings::parse(
        TENANTS,
        inventory_server::tenants::TenantLimits::default(),
    )
    .unwrap();
    let app = spawn_app_with(settings).await;
    let health = app.health_addr.unwrap();
    eventually(
        "readiness turns SERVING as the serving role",
        Duration::from_secs(10),
        || async move {
            let endpoint =
                tonic::transport::Endpoint::from_shared(format!("http://{health}")).unwrap();
            let Ok(channel) = endpoint.connect().await else {
                return false;
            };
            HealthClient::new(channel)
                .check(HealthCheckRequest {
                    service: "inventory.v1.InventoryService".into(),
                })
                .await
                .is_ok_and(|answer| answer.into_inner().status() == ServingStatus::Serving)
        },
    )
    .await
    .unwrap();
    let mut events = app
        .client
        .clone()
        .watch_events(WatchEventsRequest {
            after_sequence: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();

    stock(&app, "MUG", 10).await;
    let confirmed = app.hold("role-confirm", &[("MUG", 2)]).await;
    app.client
        .clone()
        .confirm_reservation(confirm(&confirmed.reservation_id))
        .await
        .unwrap();
    let released = app.hold("role-release", &[("MUG", 3)]).await;
    app.client
        .clone()
        .release_reservation(release(&released.reservation_id))
        .await
        .unwrap();
    app.client
        .clone()
        .reserve(ReserveRequest {
            ttl: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            ..reserve("role-expire", &[("MUG", 4)])
        })
        .await
        .unwrap();
    app.hold("role-cancel", &[("MUG", 1)]).await;
    app.client
        .clone()
        .cancel_order(CancelOrderRequest {
            order_id: "order-role-cancel".into(),
            idempotency_key: "role-cancel-order".into(),
            reason: "shopper gave up".into(),
        })
        .await
        .unwrap();
    // The sweeper returns the expired hold's units: 2 shipped, nothing held.
    eventually(
        "the sweeper expired the hold",
        Duration::from_secs(10),
        || async { app.level("MUG").await == (8, 0) },
    )
    .await
    .unwrap();
    let expired = app
        .count("SELECT count(*) FROM reservations WHERE state = 'EXPIRED'")
        .await;
    assert_eq!(expired, 1);

    let wanted: HashSet<EventType> = [
        EventType::StockAdjusted,
        EventType::ReservationHeld,
        EventType::ReservationConfirmed,
        EventType::ReservationReleased,
        EventType::ReservationExpired,
    ]
    .into();
    let mut seen = HashSet::new();
    while !wanted.is_subset(&seen) {
        let event = tokio::time::timeout(Duration::from_secs(20), events.next())
            .await
            .unwrap_or_else(|_| panic!("the stream stalled; saw {seen:?}"))
            .expect("the stream stays open")
            .expect("no error");
        seen.insert(event.r#type());
    }
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE position IS NULL")
            .await,
        0,
        "every event positioned"
    );
    assert!(
        app.count("SELECT count(*) FROM stream_epochs WHERE system_identifier IS NOT NULL")
            .await
            >= 1,
        "the sequencer read the cluster's identity as the serving role"
    );
    app.stop().await.unwrap();

    // Retention, as the serving role too: a replica that keeps nothing prunes everything it
    // may (each SKU's latest movement stays).
    let mut settings = test_settings(server.clone());
    settings.upkeep.retention.events = Duration::ZERO;
    settings.upkeep.retention.idempotency_keys = Duration::ZERO;
    settings.upkeep.retention.reservations = Duration::ZERO;
    settings.upkeep.retention.ledger = Some(Duration::ZERO);
    let app = spawn_app_with(settings).await;
    let left = || async {
        let row = app
            .db
            .query_one(
                "SELECT (SELECT count(*) FROM idempotency_keys), (SELECT count(*) FROM reservations),
                        (SELECT count(*) FROM outbox), (SELECT count(*) FROM cancelled_orders),
                        (SELECT count(*) FROM stock_movements)",
                &[],
            )
            .await
            .unwrap();
        (0..5).map(|i| row.get::<_, i64>(i)).collect::<Vec<_>>()
    };
    // Keys, reservations, events, cancelled orders; the ledger down to MUG's latest movement.
    let pruned = eventually("retention pruned", Duration::from_secs(10), || async {
        left().await == [0, 0, 0, 0, 1]
    })
    .await;
    if let Err(error) = pruned {
        panic!("{error:#}; left: {:?}", left().await);
    }
    assert!(app.count("SELECT count(*) FROM ledger_pruned").await >= 1);
    app.stop().await.unwrap();

    // The CronJob's command, as the read-only role.
    let (ok, report) = run("verify", &verifier).await;
    assert!(ok, "verify as {}: {report}", roles.verifier);
    assert!(report.contains(": 0 drift(s)"), "{report}");
    // And once more as the migrator: nothing left to apply.
    let (ok, log) = run("migrate", &migrator).await;
    assert!(ok, "{log}");

    // What the serving role must never do: change the schema, or become the role that may.
    let serving = connect(&server).await;
    refused(
        &serving,
        &roles.server,
        &[
            "DROP TABLE stock_movements",
            "ALTER TABLE stock ADD COLUMN note text",
            "ALTER TABLE reservations DROP CONSTRAINT reservations_pkey",
            "TRUNCATE stock_movements",
            "CREATE INDEX ON stock (on_hand)",
            "CREATE TABLE intruder (x int)",
            "CREATE TEMPORARY TABLE intruder (x int)",
            "CREATE FUNCTION intruder() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            "DROP FUNCTION inventory_writer_gate(integer)",
            "CREATE OR REPLACE FUNCTION inventory_writer_gate(writer integer) RETURNS boolean
                 LANGUAGE sql AS 'SELECT true'",
            "UPDATE schema_floor SET floor = 1",
            "DELETE FROM refinery_schema_history",
            &format!("SET ROLE {}", roles.migrator),
        ],
    )
    .await;
    // The same in a tenant's schema; rows there are the server's to write, and schemas are
    // the migrator's to create.
    let serving_tenant = connect(&server).await;
    serving_tenant
        .batch_execute(
            "SET search_path = tenant_brand_r;
             UPDATE stock SET on_hand = on_hand WHERE false;
             DELETE FROM reservations WHERE false",
        )
        .await
        .unwrap();
    refused(
        &serving_tenant,
        &roles.server,
        &[
            "DROP TABLE stock_movements",
            "ALTER TABLE stock ADD COLUMN note text",
            "CREATE TABLE intruder (x int)",
            "UPDATE schema_floor SET floor = 1",
            "DELETE FROM refinery_schema_history",
            "CREATE SCHEMA tenant_intruder",
        ],
    )
    .await;
    let reading = connect(&verifier).await;
    refused(
        &reading,
        &roles.verifier,
        &[
            "INSERT INTO locations (location_id) VALUES ('intruder')",
            "UPDATE stock SET on_hand = 0",
            "DELETE FROM stock_movements",
            "DROP TABLE stock",
        ],
    )
    .await;

    // A later migration's table, sequence and function: granted as the migrator creates them.
    let migrating = connect(&migrator).await;
    migrating
        .batch_execute(
            "CREATE TABLE later_migration (
                 id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text NOT NULL);
             CREATE FUNCTION later_migration_count() RETURNS bigint LANGUAGE sql
                 AS 'SELECT count(*) FROM later_migration';",
        )
        .await
        .unwrap();
    let id: i64 = serving
        .query_one(
            "INSERT INTO later_migration (note) VALUES ('new') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(id, 1);
    let counted: i64 = serving
        .query_one("SELECT later_migration_count()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(counted, 1);
    let read: i64 = reading
        .query_one("SELECT count(*) FROM later_migration", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(read, 1);
    refused(
        &reading,
        &roles.verifier,
        &["INSERT INTO later_migration (note) VALUES ('no')"],
    )
    .await;
}
