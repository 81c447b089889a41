//! The coalesced `Reserve`: the batches of several SKUs (each many single-line requests) in
//! one transaction.
//!
//! The transaction takes four round trips whatever its size, because each step sends its
//! statements together (tokio-postgres pipelines queries issued concurrently on one
//! connection) and every per-request statement is one array statement (`unnest`):
//!
//! 1. `BEGIN`
//! 2. claim every idempotency key, read the outcomes stored for keys already used, lock the
//!    stock rows (`FOR UPDATE`, in SKU order) — in this order, the same order as the
//!    one-request path (keys, then stock), with keys sorted, so two transactions never wait on
//!    each other in a cycle;
//! 3. set fenced groups aside (their claims are deleted again), decide each request in batch
//!    order in memory, then write: one conditional update per SKU guarded by its group's fence,
//!    the reservations, their lines, their outbox events and every request's outcome;
//! 4. `COMMIT`.

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, SystemTime},
};

use deadpool_postgres::Transaction;
use inventory_core::{
    Dependency, Error,
    command::Reserve,
    domain::{FenceToken, Reservation, ReservationId, ReservationState, Sku, StockLevel},
    error::Shortfall,
    ports::{Answers, ReserveGroup, WriteOutcome},
};

use crate::{
    PgStore,
    error::{from_db, from_pool},
    outbox,
    reserve::{RESERVE, ReserveOutcome},
};

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

/// Rows are locked as the sort returns them: in SKU order, like every other writer. Byte
/// order (`COLLATE "C"`), as Rust sorts SKUs, whatever the database's collation.
/// The clock is read per row once its lock is held (outside the locking scan), so a hold
/// that waited for the lock is dated from when it could act.
const LOCK_STOCK: &str = "
    WITH locked AS MATERIALIZED (
        SELECT sku, on_hand, reserved, version, fence_token FROM stock
        WHERE sku = ANY($1) ORDER BY sku COLLATE \"C\" FOR UPDATE)
    SELECT sku, clock_timestamp(), on_hand, reserved, version, fence_token FROM locked
    ORDER BY sku COLLATE \"C\"";

const UNCLAIM: &str = "
    DELETE FROM idempotency_keys k USING unnest($1::text[], $2::text[]) AS u(caller, key)
    WHERE k.caller = u.caller AND k.key = u.key";

/// Every hold of every SKU at once. The guards repeat what the locked rows already showed:
/// should they ever not hold, fewer rows change and the transaction is abandoned.
const HOLD: &str = "
    UPDATE stock s
    SET reserved = s.reserved + u.units, fence_token = u.fence, version = s.version + u.holds,
        updated_at = clock_timestamp()
    FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) AS u(sku, units, fence, holds)
    WHERE s.sku = u.sku AND s.fence_token < u.fence AND s.on_hand - s.reserved >= u.units";

const INSERT_RESERVATIONS: &str = "
    INSERT INTO reservations
        (reservation_id, order_id, state, caller, idempotency_key, created_at, expires_at)
    SELECT u.id, u.order_id, 'HELD', u.caller, u.key, u.created_at, u.expires_at
    FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::timestamptz[],
                $6::timestamptz[])
        AS u(id, order_id, caller, key, expires_at, created_at)";

const INSERT_LINES: &str = "
    INSERT INTO reservation_lines (reservation_id, sku, quantity, fence_token)
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::bigint[])";

const APPEND_EVENTS: &str = "
    INSERT INTO outbox (event_id, event_type, reservation_id, payload)
    SELECT u.event_id, 'RESERVATION_HELD', u.reservation_id, u.payload
    FROM unnest($1::uuid[], $2::uuid[], $3::jsonb[]) AS u(event_id, reservation_id, payload)";

const RECORD_OUTCOMES: &str = "
    UPDATE idempotency_keys k SET outcome = u.outcome
    FROM unnest($1::text[], $2::text[], $3::jsonb[]) AS u(caller, key, outcome)
    WHERE k.caller = u.caller AND k.key = u.key";

/// A stock row as locked, and the transaction's clock.
struct Locked {
    now: SystemTime,
    level: StockLevel,
    fence: FenceToken,
}

/// A hold decided in memory, to be written.
struct Hold<'a> {
    command: &'a Reserve,
    reservation: Reservation,
    fence: FenceToken,
    /// The SKU's level right after this hold.
    level: StockLevel,
}

type Key = (String, String);

/// A request's answer, and whether this transaction executed it (so stores its outcome).
type Decided = (Result<Reservation, Error>, bool);

fn key_of(command: &Reserve) -> Key {
    (
        command.caller.as_str().to_owned(),
        command.idempotency_key.as_str().to_owned(),
    )
}

impl PgStore {
    #[tracing::instrument(name = "sql.reserve_batch", skip_all, fields(skus = groups.len(), batch))]
    pub(crate) async fn write_groups(
        &self,
        groups: &[ReserveGroup],
    ) -> Result<Vec<WriteOutcome<Answers>>, Error> {
        let requests: usize = groups.iter().map(|g| g.batch.len()).sum();
        tracing::Span::current().record("batch", requests);
        let started = std::time::Instant::now();
        let mut client = self.pool().get().await.map_err(from_pool)?;
        let tx = client.transaction().await.map_err(from_db)?;
        let (claim, read, lock) = tokio::try_join!(
            tx.prepare_cached(CLAIM_MANY),
            tx.prepare_cached(READ_STORED),
            tx.prepare_cached(LOCK_STOCK),
        )
        .map_err(from_db)?;

        // Keys in sorted order: the order their row locks are taken in.
        let mut keys: Vec<(&str, &str, Vec<u8>)> = groups
            .iter()
            .flat_map(|g| &g.batch)
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
        let skus: Vec<&str> = groups.iter().map(|g| g.sku.as_str()).collect();

        let claim_params: [Param<'_>; 4] = [&callers, &names, &operations, &fingerprints];
        let read_params: [Param<'_>; 2] = [&callers, &names];
        let lock_params: [Param<'_>; 1] = [&skus];
        let (claimed, stored, rows) = tokio::try_join!(
            tx.query(&claim, &claim_params),
            tx.query(&read, &read_params),
            tx.query(&lock, &lock_params),
        )
        .map_err(from_db)?;
        let mut claimed: HashSet<Key> = claimed
            .iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(Error::internal)?;
        let mut stored: HashMap<Key, (Vec<u8>, serde_json::Value)> = stored
            .iter()
            .map(|row| {
                Ok((
                    (row.try_get(0)?, row.try_get(1)?),
                    (row.try_get(2)?, row.try_get(3)?),
                ))
            })
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(Error::internal)?;
        let mut locked: HashMap<String, Locked> = HashMap::new();
        for row in &rows {
            let sku: String = row.try_get(0).map_err(Error::internal)?;
            let level = StockLevel {
                sku: Sku::parse(&sku).map_err(Error::internal)?,
                on_hand: row.try_get(2).map_err(Error::internal)?,
                reserved: row.try_get(3).map_err(Error::internal)?,
                version: row.try_get(4).map_err(Error::internal)?,
            };
            let entry = Locked {
                now: row.try_get(1).map_err(Error::internal)?,
                level,
                fence: FenceToken::new(row.try_get(5).map_err(Error::internal)?),
            };
            locked.insert(sku, entry);
        }

        let metrics = crate::metrics::store();
        let mut outcomes: Vec<WriteOutcome<Answers>> = Vec::with_capacity(groups.len());
        let mut holds: Vec<Hold<'_>> = Vec::new();
        let mut unclaim: Vec<&Reserve> = Vec::new();
        let mut records: Vec<(&Reserve, serde_json::Value)> = Vec::new();
        for group in groups {
            let row = locked.get(group.sku.as_str());
            if let Some(row) = row
                && row.fence >= group.fence
            {
                metrics.fence_rejected.add(1, &[]);
                // A lost lease is transient: this group's claims are undone, nothing stored.
                unclaim.extend(
                    group
                        .batch
                        .iter()
                        .map(|(c, _)| c)
                        .filter(|c| claimed.contains(&key_of(c))),
                );
                outcomes.push(WriteOutcome::Fenced(vec![(group.sku.clone(), row.fence)]));
                continue;
            }
            let mut answers = Vec::with_capacity(group.batch.len());
            for ((command, _), (answer, executed)) in
                group
                    .batch
                    .iter()
                    .zip(decide(group, &mut claimed, &mut stored, row, &mut holds)?)
            {
                if executed {
                    let value = serde_json::to_value(ReserveOutcome::of(&answer))
                        .map_err(Error::internal)?;
                    records.push((command, value));
                }
                answers.push(answer);
            }
            outcomes.push(WriteOutcome::Answered(answers));
        }
        write_decisions(&tx, &holds, &records, &unclaim).await?;
        let committing = std::time::Instant::now();
        tx.commit().await.map_err(from_db)?;
        metrics
            .commit_duration
            .record(committing.elapsed().as_secs_f64(), &[]);
        metrics
            .batch_duration
            .record(started.elapsed().as_secs_f64(), &[]);

        metrics.batch_size.record(requests as u64, &[]);
        if !holds.is_empty() {
            self.outbox_written();
        }
        for outcome in &outcomes {
            if let WriteOutcome::Answered(answers) = outcome {
                for answer in answers {
                    crate::metrics::reservation(if answer.is_ok() { "HELD" } else { "REFUSED" });
                }
            }
        }
        Ok(outcomes)
    }
}

/// Step 3: every write of the transaction, sent together.
async fn write_decisions(
    tx: &Transaction<'_>,
    holds: &[Hold<'_>],
    records: &[(&Reserve, serde_json::Value)],
    unclaim: &[&Reserve],
) -> Result<(), Error> {
    let (hold, reservations, lines, events, record, undo) = tokio::try_join!(
        tx.prepare_cached(HOLD),
        tx.prepare_cached(INSERT_RESERVATIONS),
        tx.prepare_cached(INSERT_LINES),
        tx.prepare_cached(APPEND_EVENTS),
        tx.prepare_cached(RECORD_OUTCOMES),
        tx.prepare_cached(UNCLAIM),
    )
    .map_err(from_db)?;

    // Per SKU: units, fence and number of holds, for the one UPDATE.
    let mut per_sku: Vec<(&str, i64, i64, i64)> = Vec::new();
    for h in holds {
        let sku = h.reservation.lines[0].sku.as_str();
        let units = h.reservation.lines[0].quantity.get();
        match per_sku.iter_mut().find(|(s, ..)| *s == sku) {
            Some(entry) => {
                entry.1 += units;
                entry.3 += 1;
            }
            None => per_sku.push((sku, units, h.fence.get(), 1)),
        }
    }
    let hold_skus: Vec<&str> = per_sku.iter().map(|p| p.0).collect();
    let hold_units: Vec<i64> = per_sku.iter().map(|p| p.1).collect();
    let hold_fences: Vec<i64> = per_sku.iter().map(|p| p.2).collect();
    let hold_counts: Vec<i64> = per_sku.iter().map(|p| p.3).collect();

    let ids: Vec<uuid::Uuid> = holds.iter().map(|h| h.reservation.id.as_uuid()).collect();
    let order_ids: Vec<&str> = holds
        .iter()
        .map(|h| h.reservation.order_id.as_str())
        .collect();
    let callers: Vec<&str> = holds.iter().map(|h| h.command.caller.as_str()).collect();
    let keys: Vec<&str> = holds
        .iter()
        .map(|h| h.command.idempotency_key.as_str())
        .collect();
    let expires: Vec<SystemTime> = holds.iter().map(|h| h.reservation.expires_at).collect();
    let created: Vec<SystemTime> = holds.iter().map(|h| h.reservation.created_at).collect();
    let line_skus: Vec<&str> = holds
        .iter()
        .map(|h| h.reservation.lines[0].sku.as_str())
        .collect();
    let quantities: Vec<i64> = holds
        .iter()
        .map(|h| h.reservation.lines[0].quantity.get())
        .collect();
    let line_fences: Vec<i64> = holds.iter().map(|h| h.fence.get()).collect();
    let event_ids: Vec<uuid::Uuid> = holds.iter().map(|_| uuid::Uuid::new_v4()).collect();
    let payloads: Vec<serde_json::Value> = holds
        .iter()
        .map(|h| outbox::reservation_payload(&h.reservation, std::slice::from_ref(&h.level)))
        .collect();
    let record_callers: Vec<&str> = records.iter().map(|(c, _)| c.caller.as_str()).collect();
    let record_keys: Vec<&str> = records
        .iter()
        .map(|(c, _)| c.idempotency_key.as_str())
        .collect();
    let record_values: Vec<&serde_json::Value> = records.iter().map(|(_, v)| v).collect();
    let undo_callers: Vec<&str> = unclaim.iter().map(|c| c.caller.as_str()).collect();
    let undo_keys: Vec<&str> = unclaim.iter().map(|c| c.idempotency_key.as_str()).collect();

    let hold_params: [Param<'_>; 4] = [&hold_skus, &hold_units, &hold_fences, &hold_counts];
    let reservation_params: [Param<'_>; 6] =
        [&ids, &order_ids, &callers, &keys, &expires, &created];
    let line_params: [Param<'_>; 4] = [&ids, &line_skus, &quantities, &line_fences];
    let event_params: [Param<'_>; 3] = [&event_ids, &ids, &payloads];
    let record_params: [Param<'_>; 3] = [&record_callers, &record_keys, &record_values];
    let undo_params: [Param<'_>; 2] = [&undo_callers, &undo_keys];
    let write_holds = async {
        if holds.is_empty() {
            return Ok(0);
        }
        let (updated, ..) = tokio::try_join!(
            tx.execute(&hold, &hold_params),
            tx.execute(&reservations, &reservation_params),
            tx.execute(&lines, &line_params),
            tx.execute(&events, &event_params),
        )?;
        Ok(updated)
    };
    let write_records = async {
        if records.is_empty() {
            return Ok(0);
        }
        tx.execute(&record, &record_params).await
    };
    let undo_claims = async {
        if unclaim.is_empty() {
            return Ok(0);
        }
        tx.execute(&undo, &undo_params).await
    };
    let (updated, ..) =
        tokio::try_join!(write_holds, write_records, undo_claims).map_err(from_db)?;
    if updated != per_sku.len() as u64 {
        return Err(Error::internal(
            "the locked stock rows no longer matched their guards",
        ));
    }
    Ok(())
}

/// Decides every request of one SKU's batch in order: replay, refusal or hold, the way each
/// would have gone alone after the ones before it. Holds are appended to `holds`. Each answer
/// comes with whether this transaction executed the request (claimed its key), so that its
/// outcome is to be stored; a claimed key is used up by the first request that has it.
fn decide<'a>(
    group: &'a ReserveGroup,
    claimed: &mut HashSet<Key>,
    stored: &mut HashMap<Key, (Vec<u8>, serde_json::Value)>,
    locked: Option<&Locked>,
    holds: &mut Vec<Hold<'a>>,
) -> Result<Vec<Decided>, Error> {
    let metrics = crate::metrics::store();
    let sku = &group.sku;
    let mut level = locked.map(|l| l.level.clone());
    let mut answers = Vec::with_capacity(group.batch.len());
    for (command, ttl) in &group.batch {
        let key = key_of(command);
        if let Some((fingerprint, outcome)) = stored.remove(&key) {
            if fingerprint != command.fingerprint().as_bytes() {
                metrics
                    .conflicts
                    .add(1, &crate::metrics::operation(RESERVE));
                answers.push((Err(Error::IdempotencyKeyReused), false));
            } else {
                metrics.replays.add(1, &crate::metrics::operation(RESERVE));
                let outcome: ReserveOutcome =
                    serde_json::from_value(outcome).map_err(Error::internal)?;
                answers.push((outcome.into_result()?, false));
            }
            continue;
        }
        if !claimed.remove(&key) {
            // Neither claimed nor stored: retention removed the record between the claim and
            // the read. The key is free now, and nothing was written for this call: a retry
            // with the same key settles it.
            answers.push((
                Err(Error::unavailable(
                    Dependency::Postgres,
                    "the idempotency record was pruned while this call claimed it",
                )),
                false,
            ));
            continue;
        }
        let line = &command.lines()[0];
        debug_assert_eq!(&line.sku, sku, "a group holds one SKU");
        let (Some(level), Some(locked)) = (level.as_mut(), locked) else {
            answers.push((Err(Error::UnknownSkus(vec![sku.clone()])), true));
            continue;
        };
        let units = line.quantity.get();
        if units > level.available() {
            metrics.insufficient.add(1, &[]);
            let shortfall = Shortfall {
                sku: sku.clone(),
                requested: units,
                available: level.available(),
            };
            answers.push((Err(Error::InsufficientStock(vec![shortfall])), true));
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
        answers.push((Ok(reservation.clone()), true));
        holds.push(Hold {
            command,
            reservation,
            fence: group.fence,
            level: level.clone(),
        });
    }
    Ok(answers)
}
