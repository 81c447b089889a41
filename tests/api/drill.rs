//! The restore drill, as the operations guide's runbook runs it: a base backup and WAL
//! archiving from a live PostgreSQL under traffic, a point-in-time recovery into a new cluster,
//! and the service started on it. What was acknowledged before the point is there and
//! replays as it answered; what came after is gone, and retrying its key settles it; the
//! ledger verifies; and a consumer that read past the point is told its history was cut.

use std::time::Duration;

use inventory_client::{ClientConfig, InventoryClient};
use inventory_server::proto::{Reservation, WatchEventsRequest};
use inventory_testkit::postgres::{Postgres, TemplateDatabases};
use tokio_stream::StreamExt as _;
use tonic::Code;

use crate::helpers::{
    Scratch, TestApp, confirm, connect, error_reason, get_reservation, reserve, spawn_app_with,
    stock, test_settings,
};

/// Holds `count` single units of `sku` with keys `<prefix>-<i>`, each acknowledged.
async fn holds(app: &TestApp, prefix: &str, sku: &str, count: usize) -> Vec<(String, Reservation)> {
    let mut made = Vec::with_capacity(count);
    for i in 0..count {
        let key = format!("{prefix}-{i}");
        let held = app.hold(&key, &[(sku, 1)]).await;
        made.push((key, held));
    }
    made
}

#[tokio::test]
async fn a_point_in_time_restore_keeps_what_was_acknowledged_before_the_point_and_says_so() {
    let scratch = Scratch::new("restore-drill");
    let postgres = Postgres::start(&scratch.0.join("data"))
        .await
        .expect("PostgreSQL (make test installs it)");
    let archive = postgres.archive_wal().await.unwrap();
    let database = TemplateDatabases::new(postgres.admin_config().unwrap())
        .fresh_database()
        .await
        .unwrap();
    let name = database.get_dbname().unwrap().to_owned();
    let app = spawn_app_with(test_settings(database)).await;
    stock(&app, "DRILL", 1000).await;
    let early = holds(&app, "early", "DRILL", 3).await;

    // The base backup is taken while calls keep coming.
    let load = {
        let mut client = app.client.clone();
        tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            for i in 0..40 {
                let key = format!("load-{i}");
                if let Ok(held) = client.reserve(reserve(&key, &[("DRILL", 1)])).await {
                    acknowledged.push((key, held.into_inner()));
                }
            }
            acknowledged
        })
    };
    let backup = postgres.base_backup("base-backup").await.unwrap();
    let mut before = early;
    before.extend(load.await.unwrap());
    before.extend(holds(&app, "before", "DRILL", 3).await);
    let confirmed = &before[0].1;
    app.client
        .clone()
        .confirm_reservation(confirm(&confirmed.reservation_id))
        .await
        .unwrap();
    assert!(before.len() > 6, "the load made holds during the backup");

    // The point to restore to, then calls the restore will not have.
    let admin = connect(&postgres.admin_config().unwrap()).await;
    admin
        .batch_execute("SELECT pg_create_restore_point('drill')")
        .await
        .unwrap();
    let after = holds(&app, "after", "DRILL", 3).await;
    // A consumer reads everything, past the point.
    let mut stream = app
        .client
        .clone()
        .watch_events(WatchEventsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let head = app.count("SELECT head FROM event_stream").await;
    let last = loop {
        let event = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("the consumer reaches the head")
            .unwrap()
            .unwrap();
        if event.sequence >= head {
            break event;
        }
    };
    postgres.flush_archive().await.unwrap();
    drop(stream);
    app.stop().await.unwrap();

    // Point-in-time recovery into a new cluster, and the service on it.
    let restored = postgres
        .restore(&backup, &archive, "drill", "restored")
        .await
        .unwrap();
    let mut config = restored.admin_config().unwrap();
    config.dbname(&name);
    let app = spawn_app_with(test_settings(config.clone())).await;

    // The ledger and the stock rows agree.
    let mut db = connect(&config).await;
    let report = inventory_postgres::verify::verify(&mut db).await.unwrap();
    assert!(report.drifts.is_empty(), "{:?}", report.drifts);
    assert_eq!(report.skus, 1);

    // Acknowledged before the point: there, and a retry of its key answers as before.
    let mut client = app.client.clone();
    for (key, held) in &before {
        let replay = client
            .reserve(reserve(key, &[("DRILL", 1)]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(replay.reservation_id, held.reservation_id, "{key}");
    }
    let read = client
        .get_reservation(get_reservation(&confirmed.reservation_id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        read.state(),
        inventory_server::proto::ReservationState::Confirmed
    );

    // After the point: gone. To its caller the outcome is unknown, and what the client kit
    // does with an unknown outcome (call again with the same key) settles it.
    let kit = InventoryClient::connect_lazy(ClientConfig {
        endpoint: format!("http://{}", app.addr),
        ..ClientConfig::default()
    })
    .unwrap();
    for (key, lost) in &after {
        let missing = client
            .get_reservation(get_reservation(&lost.reservation_id))
            .await
            .unwrap_err();
        assert_eq!(missing.code(), Code::NotFound, "{key}");
        let settled = kit.reserve(reserve(key, &[("DRILL", 1)])).await.unwrap();
        assert_ne!(settled.reservation_id, lost.reservation_id);
        let again = kit.reserve(reserve(key, &[("DRILL", 1)])).await.unwrap();
        assert_eq!(again.reservation_id, settled.reservation_id, "settled once");
    }
    let units = i64::try_from(before.len() + after.len()).unwrap();
    assert_eq!(app.level("DRILL").await, (999, units - 1));

    // The stream: a new epoch began at the restored head (a new timeline), and the consumer
    // that read past the point is refused, told the epoch and head to go on from.
    inventory_testkit::process::eventually("a new epoch", Duration::from_secs(20), || async {
        app.count("SELECT count(*) FROM stream_epochs").await == 2
    })
    .await
    .unwrap();
    let reason: String = db
        .query_one(
            "SELECT reason FROM stream_epochs ORDER BY seq DESC LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(reason.starts_with("timeline 1 -> "), "{reason}");
    let refused = client
        .watch_events(WatchEventsRequest {
            after_sequence: last.sequence,
            epoch: last.epoch.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::OutOfRange, "{refused:?}");
    assert_eq!(error_reason(&refused), "CURSOR_NOT_IN_HISTORY");
    use tonic_types::StatusExt as _;
    let details = refused.get_error_details();
    let info = details.error_info().unwrap();
    assert_ne!(info.metadata["epoch"], last.epoch, "a new epoch");
    app.stop().await.unwrap();
    restored.stop().await;
    postgres.stop().await;
}
