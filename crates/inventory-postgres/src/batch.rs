//! The coalesced `Reserve`: many single-line requests of one SKU in one transaction.
//!
//! The transaction takes four round trips whatever the batch size, because each step sends
//! its statements together (tokio-postgres pipelines queries issued concurrently on one
//! connection) and every per-request statement is one array statement (`unnest`):
//!
//! 1. `BEGIN`
//! 2. claim every idempotency key, read the outcomes stored for keys already used, lock the
//!    stock row (`FOR UPDATE`) — in this order, the same order as the one-request path (keys,
//!    then stock), with keys sorted, so two transactions never wait on each other in a cycle;
//! 3. decide each request in batch order in memory, then write: one conditional update of the
//!    stock row guarded by the fence, the reservations, their lines, their outbox events and
//!    every request's outcome;
//! 4. `COMMIT`.

use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use deadpool_postgres::Transaction;
use inventory_core::{
    Error,
    command::Reserve,
    domain::{FenceToken, Reservation, ReservationId, ReservationState, Sku, StockLevel, Ttl},
    error::Shortfall,
    ports::WriteOutcome,
};

use crate::{
    PgStore,
    error::{from_db, from_pool},
    outbox,
    reserve::{RESERVE, ReserveOutcome},
};

/// One answer per request of a batch, in batch order.
type Answers = Vec<Result<Reservation, Error>>;

type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync + 'a);

const CLAIM_MANY: &str = "
    INSERT INTO idempotency_keys (caller, key, operation, fingerprint)
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[])
    ON CONFLICT (caller, key) DO NOTHING
    RETURNING caller, key";

/// Outcomes committed by earlier requests; this transaction's own claims have none yet.
const READ_STORED: &str = "
    SELECT k.caller, k.key, k.fingerprint, k.outcome
    FROM idempotency_keys k
    JOIN unnest($1::text[], $2::text[]) AS u(caller, key) USING (caller, key)
    WHERE k.outcome IS NOT NULL";

const LOCK_STOCK: &str = "
    SELECT now(), on_hand, reserved, version, fence_token FROM stock WHERE sku = $1 FOR UPDATE";

/// Every hold of the batch at once. The guards repeat what the locked row already showed:
/// should they ever not hold, no row comes back and the transaction is abandoned.
const HOLD: &str = "
    UPDATE stock
    SET reserved = reserved + $2, fence_token = $3, version = version + $4, updated_at = now()
    WHERE sku = $1 AND fence_token < $3 AND on_hand - reserved >= $2";

const INSERT_RESERVATIONS: &str = "
    INSERT INTO reservations
        (reservation_id, order_id, state, caller, idempotency_key, created_at, expires_at)
    SELECT u.id, u.order_id, 'HELD', u.caller, u.key, now(), u.expires_at
    FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::timestamptz[])
        AS u(id, order_id, caller, key, expires_at)";

const INSERT_LINES: &str = "
    INSERT INTO reservation_lines (reservation_id, sku, quantity, fence_token)
    SELECT u.id, $2, u.quantity, $3 FROM unnest($1::uuid[], $4::bigint[]) AS u(id, quantity)";

const APPEND_EVENTS: &str = "
    INSERT INTO outbox (event_id, event_type, reservation_id, payload)
    SELECT u.event_id, 'RESERVATION_HELD', u.reservation_id, u.payload
    FROM unnest($1::uuid[], $2::uuid[], $3::jsonb[]) AS u(event_id, reservation_id, payload)";

const RECORD_OUTCOMES: &str = "
    UPDATE idempotency_keys k SET outcome = u.outcome
    FROM unnest($1::text[], $2::text[], $3::jsonb[]) AS u(caller, key, outcome)
    WHERE k.caller = u.caller AND k.key = u.key";

/// The stock row as locked, and the transaction's clock.
struct Locked {
    now: SystemTime,
    level: StockLevel,
    fence: FenceToken,
}

/// A hold decided in memory, to be written.
struct Hold<'a> {
    command: &'a Reserve,
    reservation: Reservation,
    /// The SKU's level right after this hold.
    level: StockLevel,
}

impl PgStore {
    #[tracing::instrument(name = "sql.reserve_batch", skip_all, fields(%sku, batch = batch.len()))]
    pub(crate) async fn write_batch(
        &self,
        sku: &Sku,
        fence: FenceToken,
        batch: &[(&Reserve, Ttl)],
    ) -> Result<WriteOutcome<Answers>, Error> {
        let mut client = self.pool().get().await.map_err(from_pool)?;
        let tx = client.transaction().await.map_err(from_db)?;
        let (claim, read, lock) = tokio::try_join!(
            tx.prepare_cached(CLAIM_MANY),
            tx.prepare_cached(READ_STORED),
            tx.prepare_cached(LOCK_STOCK),
        )
        .map_err(from_db)?;

        // Keys in sorted order: the order their row locks are taken in.
        let mut keys: Vec<(&str, &str, Vec<u8>)> = batch
            .iter()
            .map(|(c, _)| {
                (
                    c.caller.as_str(),
                    c.idempotency_key.as_str(),
                    c.fingerprint().as_bytes().to_vec(),
                )
            })
            .collect();
        keys.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        let callers: Vec<&str> = keys.iter().map(|k| k.0).collect();
        let names: Vec<&str> = keys.iter().map(|k| k.1).collect();
        let fingerprints: Vec<&[u8]> = keys.iter().map(|k| k.2.as_slice()).collect();
        let operations = vec![RESERVE; keys.len()];

        let sku_name = sku.as_str();
        let claim_params: [Param<'_>; 4] = [&callers, &names, &operations, &fingerprints];
        let read_params: [Param<'_>; 2] = [&callers, &names];
        let lock_params: [Param<'_>; 1] = [&sku_name];
        let (claimed, stored, row) = tokio::try_join!(
            tx.query(&claim, &claim_params),
            tx.query(&read, &read_params),
            tx.query_opt(&lock, &lock_params),
        )
        .map_err(from_db)?;
        let locked = row.map(|row| Locked {
            now: row.get(0),
            level: StockLevel {
                sku: sku.clone(),
                on_hand: row.get(1),
                reserved: row.get(2),
                version: row.get(3),
            },
            fence: FenceToken::new(row.get(4)),
        });
        if let Some(locked) = &locked
            && locked.fence >= fence
        {
            crate::metrics::store().fence_rejected.add(1, &[]);
            // Dropping the transaction rolls back the claims: a lost lease is transient.
            return Ok(WriteOutcome::Fenced(vec![(sku.clone(), locked.fence)]));
        }
        let claimed: Vec<(String, String)> = claimed
            .iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(Error::internal)?;
        let mut stored: HashMap<(String, String), (Vec<u8>, serde_json::Value)> = stored
            .iter()
            .map(|row| {
                Ok((
                    (row.try_get(0)?, row.try_get(1)?),
                    (row.try_get(2)?, row.try_get(3)?),
                ))
            })
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(Error::internal)?;

        let (answers, holds) = decide(sku, batch, &claimed, &mut stored, locked.as_ref())?;
        let outcomes: Vec<(&Reserve, serde_json::Value)> = batch
            .iter()
            .zip(&answers)
            .filter(|((command, _), _)| {
                claimed.iter().any(|(caller, key)| {
                    caller == command.caller.as_str() && key == command.idempotency_key.as_str()
                })
            })
            .map(|((command, _), answer)| {
                serde_json::to_value(ReserveOutcome::of(answer))
                    .map(|value| (*command, value))
                    .map_err(Error::internal)
            })
            .collect::<Result<_, _>>()?;
        self.write_decisions(&tx, sku, fence, &holds, &outcomes)
            .await?;
        tx.commit().await.map_err(from_db)?;

        let metrics = crate::metrics::store();
        metrics.batch_size.record(batch.len() as u64, &[]);
        if !holds.is_empty() {
            self.outbox_written();
        }
        for answer in &answers {
            crate::metrics::reservation(if answer.is_ok() { "HELD" } else { "REFUSED" });
        }
        Ok(WriteOutcome::Answered(answers))
    }

    /// Step 3: every write of the batch, sent together.
    async fn write_decisions(
        &self,
        tx: &Transaction<'_>,
        sku: &Sku,
        fence: FenceToken,
        holds: &[Hold<'_>],
        outcomes: &[(&Reserve, serde_json::Value)],
    ) -> Result<(), Error> {
        let (hold, reservations, lines, events, record) = tokio::try_join!(
            tx.prepare_cached(HOLD),
            tx.prepare_cached(INSERT_RESERVATIONS),
            tx.prepare_cached(INSERT_LINES),
            tx.prepare_cached(APPEND_EVENTS),
            tx.prepare_cached(RECORD_OUTCOMES),
        )
        .map_err(from_db)?;
        let units: i64 = holds
            .iter()
            .map(|h| h.reservation.lines[0].quantity.get())
            .sum();
        let ids: Vec<uuid::Uuid> = holds.iter().map(|h| h.reservation.id.as_uuid()).collect();
        let order_ids: Vec<&str> = holds
            .iter()
            .map(|h| h.reservation.order_id.as_str())
            .collect();
        let hold_callers: Vec<&str> = holds.iter().map(|h| h.command.caller.as_str()).collect();
        let hold_keys: Vec<&str> = holds
            .iter()
            .map(|h| h.command.idempotency_key.as_str())
            .collect();
        let expires: Vec<SystemTime> = holds.iter().map(|h| h.reservation.expires_at).collect();
        let quantities: Vec<i64> = holds
            .iter()
            .map(|h| h.reservation.lines[0].quantity.get())
            .collect();
        let event_ids: Vec<uuid::Uuid> = holds.iter().map(|_| uuid::Uuid::new_v4()).collect();
        let payloads: Vec<serde_json::Value> = holds
            .iter()
            .map(|h| outbox::reservation_payload(&h.reservation, std::slice::from_ref(&h.level)))
            .collect();
        let outcome_callers: Vec<&str> = outcomes.iter().map(|(c, _)| c.caller.as_str()).collect();
        let outcome_keys: Vec<&str> = outcomes
            .iter()
            .map(|(c, _)| c.idempotency_key.as_str())
            .collect();
        let outcome_values: Vec<&serde_json::Value> = outcomes.iter().map(|(_, v)| v).collect();
        let held = holds.len() as i64;
        let fence = fence.get();

        let sku_name = sku.as_str();
        let hold_params: [Param<'_>; 4] = [&sku_name, &units, &fence, &held];
        let reservation_params: [Param<'_>; 5] =
            [&ids, &order_ids, &hold_callers, &hold_keys, &expires];
        let line_params: [Param<'_>; 4] = [&ids, &sku_name, &fence, &quantities];
        let event_params: [Param<'_>; 3] = [&event_ids, &ids, &payloads];
        let record_params: [Param<'_>; 3] = [&outcome_callers, &outcome_keys, &outcome_values];
        let write_holds = async {
            if holds.is_empty() {
                return Ok(1);
            }
            let (updated, ..) = tokio::try_join!(
                tx.execute(&hold, &hold_params),
                tx.execute(&reservations, &reservation_params),
                tx.execute(&lines, &line_params),
                tx.execute(&events, &event_params),
            )?;
            Ok(updated)
        };
        let (updated, _) =
            tokio::try_join!(write_holds, tx.execute(&record, &record_params)).map_err(from_db)?;
        if updated != 1 {
            return Err(Error::internal(
                "the locked stock row no longer matched its guards",
            ));
        }
        Ok(())
    }
}

/// Decides every request of the batch in order: replay, refusal or hold, the way each would
/// have gone alone after the ones before it.
fn decide<'a>(
    sku: &Sku,
    batch: &[(&'a Reserve, Ttl)],
    claimed: &[(String, String)],
    stored: &mut HashMap<(String, String), (Vec<u8>, serde_json::Value)>,
    locked: Option<&Locked>,
) -> Result<(Answers, Vec<Hold<'a>>), Error> {
    let metrics = crate::metrics::store();
    let mut level = locked.map(|l| l.level.clone());
    let mut answers = Vec::with_capacity(batch.len());
    let mut holds = Vec::new();
    for (command, ttl) in batch {
        let key = (
            command.caller.as_str().to_owned(),
            command.idempotency_key.as_str().to_owned(),
        );
        if let Some((fingerprint, outcome)) = stored.remove(&key) {
            if fingerprint != command.fingerprint().as_bytes() {
                metrics
                    .conflicts
                    .add(1, &crate::metrics::operation(RESERVE));
                answers.push(Err(Error::IdempotencyKeyReused));
            } else {
                metrics.replays.add(1, &crate::metrics::operation(RESERVE));
                let outcome: ReserveOutcome =
                    serde_json::from_value(outcome).map_err(Error::internal)?;
                answers.push(outcome.into_result()?);
            }
            continue;
        }
        if !claimed.contains(&key) {
            // Neither claimed nor stored: retention removed the record in between, or the
            // batch held the key twice. Retrying the request settles it.
            answers.push(Err(Error::internal(
                "idempotency key neither claimed nor stored",
            )));
            continue;
        }
        let line = &command.lines()[0];
        debug_assert_eq!(&line.sku, sku, "a batch holds one SKU");
        let (Some(level), Some(locked)) = (level.as_mut(), locked) else {
            answers.push(Err(Error::UnknownSkus(vec![sku.clone()])));
            continue;
        };
        let units = line.quantity.get();
        if units > level.available() {
            metrics.insufficient.add(1, &[]);
            answers.push(Err(Error::InsufficientStock(vec![Shortfall {
                sku: sku.clone(),
                requested: units,
                available: level.available(),
            }])));
            continue;
        }
        level.reserved += units;
        level.version += 1;
        // PostgreSQL keeps microseconds: what is answered is exactly what is stored.
        let ttl = Duration::from_micros(u64::try_from(ttl.get().as_micros()).unwrap_or(u64::MAX));
        let reservation = Reservation {
            id: ReservationId::new_random(),
            order_id: command.order_id.clone(),
            state: ReservationState::Held,
            lines: vec![line.clone()],
            created_at: locked.now,
            expires_at: locked.now + ttl,
        };
        answers.push(Ok(reservation.clone()));
        holds.push(Hold {
            command,
            reservation,
            level: level.clone(),
        });
    }
    Ok((answers, holds))
}
