//! What the service answers from a primary that lost its synchronous standby: the position of
//! an old primary that was frozen or cut off while its standby was promoted, for the moment
//! before its keeper demotes it. Writes wait for an acknowledgement that never comes, and so
//! do answers decided by reads alone (a replayed outcome, an unknown reservation, a repeated
//! confirm, a reused key, an unknown location): the caller gets `UNAVAILABLE` and retries, never an answer from rows a failover
//! loses. Plain reads are answered meanwhile, on fresh connections. Once the standby is back,
//! everything answers as before.
//!
//! The test's own PostgreSQL with `synchronous_commit = on`; "the standby is gone" is
//! `synchronous_standby_names` naming a standby that never connects.

use std::time::Duration;

use inventory_server::proto::AdjustStockRequest;
use inventory_testkit::postgres::{Postgres, PostgresOptions, TemplateDatabases};
use tonic::Code;

use crate::helpers::{
    Scratch, TestClient, confirm, connect, get_reservation, reserve, spawn_app_with, test_settings,
};

async fn standby_required(postgres: &Postgres, required: bool) {
    let admin = connect(&postgres.admin_config().unwrap()).await;
    let names = if required { "ANY 1 (gone)" } else { "" };
    admin
        .batch_execute(&format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{names}'"
        ))
        .await
        .unwrap();
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    // The setting reaches every session at its next statement.
    tokio::time::sleep(Duration::from_millis(200)).await;
}

fn adjust_at(location: &str) -> AdjustStockRequest {
    AdjustStockRequest {
        sku: "SYNC-1".into(),
        delta: 1,
        idempotency_key: format!("adjust-at-{location}"),
        location_id: location.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn without_its_synchronous_standby_a_primary_answers_nothing_a_failover_could_undo() {
    let scratch = Scratch::new("pg-sync");
    let options = PostgresOptions {
        settings: vec![("synchronous_commit".into(), "on".into())],
        ..Default::default()
    };
    let postgres = Postgres::start_with(&scratch.0.join("data"), &options)
        .await
        .expect("PostgreSQL (make test installs it)");
    let database = TemplateDatabases::new(postgres.admin_config().unwrap())
        .fresh_database()
        .await
        .unwrap();
    let mut settings = test_settings(database);
    settings.database.pool.acquire_timeout = Duration::from_millis(500);
    settings.database.pool.statement_timeout = Duration::from_millis(500);
    let app = spawn_app_with(settings).await;
    let mut client = app.client.clone();
    TestClient(client.clone()).stock("SYNC-1", 10).await;
    let held = app.hold("k-1", &[("SYNC-1", 2)]).await;
    let confirmed = app.hold("k-2", &[("SYNC-1", 1)]).await;
    client
        .confirm_reservation(confirm(&confirmed.reservation_id))
        .await
        .unwrap();
    let unknown = uuid::Uuid::new_v4().to_string();

    standby_required(&postgres, true).await;
    // A write: its commit waits (statement_timeout does not end that wait), so no OK.
    let write = client.reserve(reserve("k-3", &[("SYNC-1", 1)])).await;
    assert_eq!(write.unwrap_err().code(), Code::Unavailable);
    // Answers decided by reading wait the same way.
    let replay = client.reserve(reserve("k-1", &[("SYNC-1", 2)])).await;
    assert_eq!(replay.unwrap_err().code(), Code::Unavailable);
    let missing = client.confirm_reservation(confirm(&unknown)).await;
    assert_eq!(missing.unwrap_err().code(), Code::Unavailable);
    let repeat = client
        .confirm_reservation(confirm(&confirmed.reservation_id))
        .await;
    assert_eq!(repeat.unwrap_err().code(), Code::Unavailable);
    // So do refusals decided by reads: a key used for another request, a location that
    // does not exist.
    let reused = client.reserve(reserve("k-1", &[("SYNC-1", 1)])).await;
    assert_eq!(reused.unwrap_err().code(), Code::Unavailable);
    let nowhere = client.adjust_stock(adjust_at("nowhere")).await;
    assert_eq!(nowhere.unwrap_err().code(), Code::Unavailable);
    // A plain read is answered (it may lag, and nothing is decided by it), on a connection
    // of its own: the ones whose requests never got an answer were dropped from the pool.
    let read = client
        .get_reservation(get_reservation(&held.reservation_id))
        .await
        .expect("a read on a fresh connection")
        .into_inner();
    assert_eq!(read.reservation_id, held.reservation_id);

    standby_required(&postgres, false).await;
    let replay = client
        .reserve(reserve("k-1", &[("SYNC-1", 2)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replay.reservation_id, held.reservation_id);
    let missing = client.confirm_reservation(confirm(&unknown)).await;
    assert_eq!(missing.unwrap_err().code(), Code::NotFound);
    let repeat = client
        .confirm_reservation(confirm(&confirmed.reservation_id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(repeat.reservation_id, confirmed.reservation_id);
    let reused = client.reserve(reserve("k-1", &[("SYNC-1", 1)])).await;
    assert_eq!(reused.unwrap_err().code(), Code::AlreadyExists);
    let nowhere = client.adjust_stock(adjust_at("nowhere")).await;
    assert_eq!(nowhere.unwrap_err().code(), Code::NotFound);
    // The write that waited committed once the standby was no longer required: its key
    // replays it, whichever way its first call ended.
    let retried = client
        .reserve(reserve("k-3", &[("SYNC-1", 1)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(retried.lines[0].quantity, 1);
    assert_eq!(app.level("SYNC-1").await, (9, 3));
    app.stop().await.unwrap();
    postgres.stop().await;
}
