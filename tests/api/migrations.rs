//! The schema: concurrent migration runs, and the constraints that are the last line of defence.

use crate::helpers::{connect, empty_database, fresh_database};

#[tokio::test]
async fn two_concurrent_migration_runs_apply_each_migration_once() {
    let config = empty_database().await;
    let (a, b) = tokio::join!(
        inventory_postgres::migrate::run(&config),
        inventory_postgres::migrate::run(&config)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    // One run applied everything, the other waited for the lock and found nothing to do.
    assert!(a.is_empty() != b.is_empty(), "applied: {a:?} and {b:?}");

    let db = connect(&config).await;
    let versions: Vec<i32> = db
        .query(
            "SELECT version FROM refinery_schema_history ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(versions.len(), a.len().max(b.len()));
    assert!(
        inventory_postgres::migrate::run(&config)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn the_schema_refuses_negative_availability_whatever_the_sql() {
    let db = connect(&fresh_database().await).await;
    db.execute("INSERT INTO stock (sku, on_hand) VALUES ('SKU-1', 5)", &[])
        .await
        .unwrap();
    for statement in [
        "UPDATE stock SET reserved = 6 WHERE sku = 'SKU-1'",
        "UPDATE stock SET on_hand = -1 WHERE sku = 'SKU-1'",
        "UPDATE stock SET reserved = -1 WHERE sku = 'SKU-1'",
        "INSERT INTO stock (sku, on_hand) VALUES ('bad sku', 1)",
    ] {
        let error = db.execute(statement, &[]).await.unwrap_err();
        assert_eq!(
            error.code(),
            Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION),
            "{statement}"
        );
    }
}

/// The cluster's identity, which starts a stream epoch after a restore, reads as NULLs where
/// the server does not let the user read it (so the sequencer goes on positioning), and as the
/// system identifier and timeline where it does.
#[tokio::test]
async fn the_cluster_identity_is_null_where_the_user_may_not_read_it() {
    let db = connect(&fresh_database().await).await;
    let cluster = async || -> (Option<i64>, Option<i32>) {
        let row = db
            .query_one(
                "SELECT system_identifier, timeline FROM inventory_cluster()",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    let (system, timeline) = cluster().await;
    assert!(system.is_some() && timeline.is_some_and(|t| t >= 1));

    let role = format!("plain_{}", uuid::Uuid::new_v4().simple());
    db.batch_execute(&format!(
        "CREATE ROLE {role};
         REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC;
         SET ROLE {role};"
    ))
    .await
    .unwrap();
    assert_eq!(cluster().await, (None, None));
    db.batch_execute(&format!("RESET ROLE; DROP ROLE {role};"))
        .await
        .unwrap();
}
