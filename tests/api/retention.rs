//! Tables do not grow forever: keys, events and final reservations past their retention are
//! pruned, faster than they are written.

use std::time::Duration;

use crate::helpers::{fresh_database, spawn_app_with, test_settings};

#[tokio::test]
async fn a_backlog_many_batches_deep_is_pruned_within_one_round_and_holds_are_kept() {
    let mut settings = test_settings(fresh_database().await);
    settings.upkeep.batch = 100;
    // One round a second: one batch a round would need 30 rounds for this backlog.
    settings.upkeep.interval = Duration::from_secs(1);
    settings.upkeep.retention.reservations = Duration::from_secs(24 * 3600);
    let app = spawn_app_with(settings).await;
    app.db
        .batch_execute(
            "INSERT INTO stock (sku, on_hand, reserved) VALUES ('OLD-1', 10, 1), ('NEW-1', 10, 0);
             INSERT INTO idempotency_keys (caller, key, operation, fingerprint, outcome, created_at)
             SELECT '', 'old-' || i, 'reserve', decode(repeat('00', 32), 'hex'), '{}',
                    clock_timestamp() - interval '3 days'
             FROM generate_series(1, 3000) AS i;
             INSERT INTO reservations
                 (reservation_id, order_id, state, caller, idempotency_key,
                  created_at, expires_at, updated_at)
             SELECT gen_random_uuid(), 'order-' || i,
                    (ARRAY['CONFIRMED', 'RELEASED', 'EXPIRED'])[1 + i % 3], '', 'gone-' || i,
                    clock_timestamp() - interval '40 days',
                    clock_timestamp() - interval '39 days',
                    clock_timestamp() - interval '39 days'
             FROM generate_series(1, 3000) AS i;
             INSERT INTO reservation_lines (reservation_id, sku, quantity, fence_token)
             SELECT reservation_id, 'OLD-1', 1, 1 FROM reservations;
             -- Kept: a hold (however old), and a final reservation inside retention.
             INSERT INTO reservations
                 (reservation_id, order_id, state, caller, idempotency_key,
                  created_at, expires_at, updated_at)
             VALUES (gen_random_uuid(), 'still-held', 'HELD', '', 'held-1',
                     clock_timestamp() - interval '40 days', clock_timestamp() + interval '1 hour',
                     clock_timestamp() - interval '40 days'),
                    (gen_random_uuid(), 'recent', 'CONFIRMED', '', 'recent-1',
                     clock_timestamp() - interval '1 hour', clock_timestamp(),
                     clock_timestamp() - interval '1 hour');",
        )
        .await
        .unwrap();

    inventory_testkit::process::eventually_ok(
        "the backlog is pruned",
        Duration::from_secs(10),
        || async {
            let keys = app.count("SELECT count(*) FROM idempotency_keys").await;
            let finals = app
                .count("SELECT count(*) FROM reservations WHERE order_id LIKE 'order-%'")
                .await;
            if keys == 0 && finals == 0 {
                Ok(())
            } else {
                Err(format!("{keys} keys, {finals} reservations left"))
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        app.count("SELECT count(*) FROM reservation_lines").await,
        0,
        "lines go with their reservations"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM reservations WHERE order_id IN ('still-held', 'recent')")
            .await,
        2,
        "holds and recent reservations stay"
    );
}
