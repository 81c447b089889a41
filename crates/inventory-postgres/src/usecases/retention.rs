//! Retention: what is deleted once it is old enough, so no table grows forever.
//!
//! Each pass deletes at most `batch` rows per table, oldest first, in its own short
//! statement; the sweeper calls [`PgStore::prune`] again while a pass was full, so pruning
//! keeps up with any write rate. Held reservations are never pruned; a final reservation goes
//! with its lines, while its events (until their own retention) and the stored outcome of its
//! key (likewise) keep what happened.

use inventory_core::Error;

use crate::{
    PgStore,
    plumbing::error::{from_db, from_pool},
};

pub use inventory_core::upkeep::{Pruned, Retention};

/// The oldest positioned events, as long as they are past retention and every subscription
/// that is not idle (an acknowledgement within `$3` seconds) acknowledged them: a contiguous
/// prefix of the stream, so no hole is ever left below a kept event. `pruned_through` records
/// the highest position removed; a cursor below it is known to have missed events.
const PRUNE_EVENTS: &str = "
    WITH held AS (
        SELECT min(acked_position) AS position FROM event_subscriptions
        WHERE lost IS NULL AND acked_at >= clock_timestamp() - make_interval(secs => $3)
    ), oldest AS (
        SELECT sequence, position, occurred_at FROM outbox
        WHERE position IS NOT NULL ORDER BY position LIMIT $2
    ), first_kept AS (
        SELECT min(position) AS position FROM oldest
        WHERE occurred_at >= now() - make_interval(secs => $1)
    ), gone AS (
        DELETE FROM outbox o USING oldest
        WHERE o.sequence = oldest.sequence
          AND oldest.position < coalesce((SELECT position FROM first_kept), 9223372036854775807)
          AND oldest.position <= coalesce((SELECT position FROM held), 9223372036854775807)
        RETURNING oldest.position
    ), recorded AS (
        UPDATE event_stream
        SET pruned_through = greatest(pruned_through, (SELECT max(position) FROM gone))
        WHERE id = 1 AND EXISTS (SELECT 1 FROM gone)
        RETURNING 1
    )
    SELECT count(*) FROM gone";

/// Subscriptions retention went past are lost, and say so to their next reader, never
/// skipping silently. Only idle ones: the others hold retention back, and one created while
/// a pass ran (which did not see it) is not lost for it.
const LOSE_SUBSCRIPTIONS: &str = "
    UPDATE event_subscriptions s
    SET lost = format('no acknowledgement since %s; events through %s were pruned at %s',
                      s.acked_at, e.pruned_through, clock_timestamp())
    FROM event_stream e
    WHERE e.id = 1 AND s.lost IS NULL AND s.acked_position < e.pruned_through
      AND s.acked_at < clock_timestamp() - make_interval(secs => $1)
    RETURNING s.name";

const PRUNE_KEYS: &str = "
    DELETE FROM idempotency_keys WHERE ctid IN (
        SELECT ctid FROM idempotency_keys
        WHERE created_at < now() - make_interval(secs => $1) LIMIT $2)";

const PRUNE_RESERVATIONS: &str = "
    DELETE FROM reservations WHERE reservation_id IN (
        SELECT reservation_id FROM reservations
        WHERE state <> 'HELD' AND updated_at < clock_timestamp() - make_interval(secs => $1)
        ORDER BY updated_at LIMIT $2)";

/// Tombstones live as long as final reservations (at least as long as idempotency keys, which
/// the configuration checks): a retried `Reserve` with a new key stays refused that long.
const PRUNE_CANCELLED_ORDERS: &str = "
    DELETE FROM cancelled_orders WHERE (caller, order_id) IN (
        SELECT caller, order_id FROM cancelled_orders
        WHERE cancelled_at < clock_timestamp() - make_interval(secs => $1)
        ORDER BY cancelled_at LIMIT $2)";

/// The oldest movements past retention, only ever a prefix of a SKU's versions, and never
/// its latest (so the total's version keeps its movement, and the versions left stay dense);
/// `ledger_pruned` records through which version each SKU was pruned. A location that has not
/// changed since may lose every movement (verify then checks it only through the SKU's total),
/// so one idle location never holds back the pruning of its SKU.
const PRUNE_MOVEMENTS: &str = "
    WITH gone AS (
        DELETE FROM stock_movements WHERE (sku, version) IN (
            SELECT m.sku, m.version FROM stock_movements m
            WHERE m.occurred_at < clock_timestamp() - make_interval(secs => $1)
              AND m.version < (SELECT s.version FROM stock s WHERE s.sku = m.sku)
            ORDER BY m.occurred_at, m.sku, m.version LIMIT $2)
        RETURNING sku, version
    ), recorded AS (
        INSERT INTO ledger_pruned (sku, through_version)
        SELECT sku, max(version) FROM gone GROUP BY sku
        ON CONFLICT (sku) DO UPDATE
        SET through_version = greatest(ledger_pruned.through_version, excluded.through_version)
        RETURNING 1
    )
    SELECT count(*) FROM gone";

impl PgStore {
    /// One pass: up to `batch` of each kind of row past its retention.
    pub async fn prune(&self, retention: &Retention, batch: usize) -> Result<Pruned, Error> {
        self.bounded(async {
            let client = self.pool().get().await.map_err(from_pool)?;
            let limit = i64::try_from(batch).unwrap_or(i64::MAX);
            let statement = client.prepare_cached(PRUNE_EVENTS).await.map_err(from_db)?;
            let events: i64 = client
                .query_one(
                    &statement,
                    &[
                        &retention.events.as_secs_f64(),
                        &limit,
                        &retention.subscription_idle.as_secs_f64(),
                    ],
                )
                .await
                .map_err(from_db)?
                .get(0);
            if events > 0 {
                let statement = client
                    .prepare_cached(LOSE_SUBSCRIPTIONS)
                    .await
                    .map_err(from_db)?;
                let idle = retention.subscription_idle.as_secs_f64();
                for row in client.query(&statement, &[&idle]).await.map_err(from_db)? {
                    let name: &str = row.get(0);
                    tracing::warn!(
                        subscription = name,
                        "subscription idle past SUBSCRIPTION_IDLE_LIMIT lost events to \
                         retention; its reader is told so"
                    );
                }
            }
            let statement = client.prepare_cached(PRUNE_KEYS).await.map_err(from_db)?;
            let idempotency_keys = client
                .execute(
                    &statement,
                    &[&retention.idempotency_keys.as_secs_f64(), &limit],
                )
                .await
                .map_err(from_db)?;
            let statement = client
                .prepare_cached(PRUNE_RESERVATIONS)
                .await
                .map_err(from_db)?;
            let reservations = client
                .execute(&statement, &[&retention.reservations.as_secs_f64(), &limit])
                .await
                .map_err(from_db)?;
            let statement = client
                .prepare_cached(PRUNE_CANCELLED_ORDERS)
                .await
                .map_err(from_db)?;
            let cancelled_orders = client
                .execute(&statement, &[&retention.reservations.as_secs_f64(), &limit])
                .await
                .map_err(from_db)?;
            let movements: i64 = match retention.ledger {
                None => 0,
                Some(ledger) => {
                    let statement = client
                        .prepare_cached(PRUNE_MOVEMENTS)
                        .await
                        .map_err(from_db)?;
                    client
                        .query_one(&statement, &[&ledger.as_secs_f64(), &limit])
                        .await
                        .map_err(from_db)?
                        .get(0)
                }
            };
            Ok(Pruned {
                events: u64::try_from(events).unwrap_or(0),
                idempotency_keys,
                reservations,
                cancelled_orders,
                movements: u64::try_from(movements).unwrap_or(0),
            })
        })
        .await
    }
}
