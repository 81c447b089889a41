use super::*;

#[test]
fn a_mismatch_names_the_sku_and_both_sides() {
    let mismatch = LevelMismatch {
        sku: "S-1".into(),
        on_hand: 10,
        reserved: 3,
        held: 2,
    };
    assert_eq!(
        mismatch.to_string(),
        "S-1: reserved 3, held rows 2, on_hand 10"
    );
}

/// A fresh, migrated database of the suite's PostgreSQL (`DATABASE_URL`), and its name.
async fn fresh() -> (
    crate::postgres::TemplateDatabases,
    tokio_postgres::Client,
    String,
) {
    let url = std::env::var("DATABASE_URL").expect(
        "DATABASE_URL is not set: run the suite with `make test`, which starts PostgreSQL and Redis",
    );
    let databases = crate::postgres::TemplateDatabases::new(url.parse().expect("a valid URL"));
    let config = databases.fresh_database().await.expect("a fresh database");
    let name = config.get_dbname().expect("a name").to_owned();
    let client = crate::postgres::connect(&config).await.expect("connect");
    (databases, client, name)
}

/// Stores a reservation of one line of SKU "A": `state`, expiring `expires` from now (an
/// interval), with the line's `confirmed` and `released` columns.
async fn store(
    db: &tokio_postgres::Client,
    n: u8,
    state: &str,
    expires: &str,
    (quantity, confirmed, released): (i64, i64, i64),
) {
    let id = format!("00000000-0000-0000-0000-{n:012}");
    db.execute(
        "INSERT INTO reservations
             (reservation_id, order_id, state, idempotency_key, created_at, expires_at)
         VALUES ($1::text::uuid, 'order-' || $2::text, $3, $2::text,
                 now() + $4::text::interval - interval '1 hour', now() + $4::text::interval)",
        &[&id, &format!("k{n}"), &state, &expires],
    )
    .await
    .unwrap();
    db.execute(
        "INSERT INTO reservation_lines
             (reservation_id, sku, quantity, fence_token, confirmed, released)
         VALUES ($1::text::uuid, 'A', $2, $3, $4, $5)",
        &[&id, &quantity, &i64::from(n), &confirmed, &released],
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn the_audit_reads_units_where_the_stored_state_puts_them() {
    let (databases, db, name) = fresh().await;
    db.batch_execute("INSERT INTO stock (sku, on_hand, reserved) VALUES ('A', 20, 3)")
        .await
        .unwrap();
    // A live hold with one unit confirmed in part; an overdue one with one released in part,
    // not yet swept; a confirm and an expiry in one step (zeros); a hold settled in parts.
    store(&db, 1, "HELD", "1 hour", (3, 1, 0)).await;
    store(&db, 2, "HELD", "-1 minute", (2, 0, 1)).await;
    store(&db, 3, "CONFIRMED", "-1 minute", (2, 0, 0)).await;
    store(&db, 4, "EXPIRED", "-1 minute", (1, 0, 0)).await;
    store(&db, 5, "CONFIRMED", "-1 minute", (3, 1, 2)).await;

    let rows = reservations(&db, Some("order-k")).await.unwrap();
    let units: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r.key.as_str(),
                r.order_id.as_str(),
                r.state.as_str(),
                r.units[0],
            )
        })
        .collect();
    assert_eq!(
        units,
        [
            ("k1", "order-k1", "HELD", (2, 1, 0)),
            ("k2", "order-k2", "HELD", (0, 0, 2)),
            ("k3", "order-k3", "CONFIRMED", (0, 2, 0)),
            ("k4", "order-k4", "EXPIRED", (0, 0, 1)),
            ("k5", "order-k5", "CONFIRMED", (0, 1, 2)),
        ]
    );
    assert_eq!(rows[0].lines, [("A".to_owned(), 3, 1)]);

    // Stored HELD rows hold what is neither confirmed nor released: 2 + 1, overdue or not.
    assert_eq!(reserved_against_holds(&db, None).await.unwrap(), []);
    db.batch_execute("UPDATE stock SET reserved = 5")
        .await
        .unwrap();
    assert_eq!(
        reserved_against_holds(&db, Some(&["A".to_owned()]))
            .await
            .unwrap(),
        [LevelMismatch {
            sku: "A".into(),
            on_hand: 20,
            reserved: 5,
            held: 3,
        }]
    );
    drop(db);
    databases.drop_database(&name).await.unwrap();
}
