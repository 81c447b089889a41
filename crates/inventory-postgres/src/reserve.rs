//! The reservation use cases of [`PgStore`](crate::PgStore): each is one transaction.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_postgres::Transaction;
use inventory_core::{
    Error,
    command::{ReservationRef, Reserve},
    domain::{
        FenceToken, Line, OrderId, Quantity, Reservation, ReservationId, ReservationState, Sku,
        StockLevel, Ttl,
    },
    error::Shortfall,
    ports::{Answers, ReservationStore, ReserveGroup, WriteOutcome},
};
use serde::{Deserialize, Serialize};

use crate::{
    PgStore,
    error::{from_db, from_pool},
    idempotency, outbox,
    reservations::{self, NewReservation},
    stock,
};

pub(crate) const RESERVE: &str = "Reserve";

/// The stored outcome of a `Reserve`: what a retry with the same key gets back.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(crate) enum ReserveOutcome {
    Held { reservation: StoredReservation },
    UnknownSkus { skus: Vec<String> },
    InsufficientStock { shortfalls: Vec<StoredShortfall> },
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoredReservation {
    reservation_id: uuid::Uuid,
    order_id: String,
    lines: Vec<(String, i64)>,
    created_at_micros: i64,
    expires_at_micros: i64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoredShortfall {
    sku: String,
    requested: i64,
    available: i64,
}

impl ReserveOutcome {
    pub(crate) fn of(result: &Result<Reservation, Error>) -> Self {
        match result {
            Ok(reservation) => Self::Held {
                reservation: StoredReservation {
                    reservation_id: reservation.id.as_uuid(),
                    order_id: reservation.order_id.as_str().to_owned(),
                    lines: reservation
                        .lines
                        .iter()
                        .map(|l| (l.sku.as_str().to_owned(), l.quantity.get()))
                        .collect(),
                    created_at_micros: micros(reservation.created_at),
                    expires_at_micros: micros(reservation.expires_at),
                },
            },
            Err(Error::UnknownSkus(skus)) => Self::UnknownSkus {
                skus: skus.iter().map(|s| s.as_str().to_owned()).collect(),
            },
            Err(Error::InsufficientStock(shortfalls)) => Self::InsufficientStock {
                shortfalls: shortfalls
                    .iter()
                    .map(|s| StoredShortfall {
                        sku: s.sku.as_str().to_owned(),
                        requested: s.requested,
                        available: s.available,
                    })
                    .collect(),
            },
            Err(other) => unreachable!("only final outcomes are stored, not {other:?}"),
        }
    }

    pub(crate) fn into_result(self) -> Result<Result<Reservation, Error>, Error> {
        let sku = |raw: String| Sku::parse(&raw).map_err(Error::internal);
        Ok(match self {
            Self::Held { reservation } => Ok(Reservation {
                id: ReservationId::from_uuid(reservation.reservation_id),
                order_id: OrderId::parse(&reservation.order_id).map_err(Error::internal)?,
                // The outcome as it was: the reservation was held when it was made.
                state: ReservationState::Held,
                lines: reservation
                    .lines
                    .into_iter()
                    .map(|(raw, quantity)| {
                        Ok(Line {
                            sku: sku(raw)?,
                            quantity: Quantity::parse(quantity).map_err(Error::internal)?,
                        })
                    })
                    .collect::<Result<_, Error>>()?,
                created_at: from_micros(reservation.created_at_micros),
                expires_at: from_micros(reservation.expires_at_micros),
            }),
            Self::UnknownSkus { skus } => Err(Error::UnknownSkus(
                skus.into_iter().map(sku).collect::<Result<_, _>>()?,
            )),
            Self::InsufficientStock { shortfalls } => Err(Error::InsufficientStock(
                shortfalls
                    .into_iter()
                    .map(|s| {
                        Ok(Shortfall {
                            sku: sku(s.sku)?,
                            requested: s.requested,
                            available: s.available,
                        })
                    })
                    .collect::<Result<_, Error>>()?,
            )),
        })
    }
}

fn micros(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

fn from_micros(micros: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(micros.max(0) as u64)
}

/// What the fenced updates of one reservation came to.
enum LinesOutcome {
    Held(Vec<StockLevel>),
    Refused(Error),
    Fenced(Vec<(Sku, FenceToken)>),
}

/// The conditional update of every line, in SKU order. Lines that cannot be held are all
/// named, and so are all lines with a stale fence (which outrank every other outcome: the
/// holder must not write at all, and a lagging counter is repaired for every SKU at once).
async fn hold_lines(
    tx: &Transaction<'_>,
    lines: &[(&Line, FenceToken)],
) -> Result<LinesOutcome, Error> {
    let mut levels = Vec::with_capacity(lines.len());
    let mut unknown = Vec::new();
    let mut short = Vec::new();
    let mut fenced = Vec::new();
    for (line, fence) in lines {
        let units = line.quantity.get();
        if let Some(level) = stock::reserve(tx, &line.sku, units, *fence)
            .await
            .map_err(from_db)?
        {
            levels.push(level);
            continue;
        }
        match stock::read_with_fence(tx, &line.sku)
            .await
            .map_err(from_db)?
        {
            None => unknown.push(line.sku.clone()),
            Some((_, stored)) if stored >= *fence => {
                crate::metrics::store().fence_rejected.add(1, &[]);
                fenced.push((line.sku.clone(), stored));
            }
            Some((level, _)) => short.push({
                crate::metrics::store().insufficient.add(1, &[]);
                Shortfall {
                    sku: line.sku.clone(),
                    requested: units,
                    available: level.available(),
                }
            }),
        }
    }
    Ok(if !fenced.is_empty() {
        LinesOutcome::Fenced(fenced)
    } else if !unknown.is_empty() {
        LinesOutcome::Refused(Error::UnknownSkus(unknown))
    } else if !short.is_empty() {
        LinesOutcome::Refused(Error::InsufficientStock(short))
    } else {
        LinesOutcome::Held(levels)
    })
}

impl ReservationStore for PgStore {
    #[tracing::instrument(name = "sql.reserve", skip_all, fields(order_id = command.order_id.as_str()))]
    async fn reserve(
        &self,
        command: &Reserve,
        ttl: Ttl,
        fences: &[(Sku, FenceToken)],
    ) -> Result<WriteOutcome, Error> {
        self.bounded(async {
            let lines: Vec<(&Line, FenceToken)> = command
                .lines_by_sku()
                .into_iter()
                .zip(fences)
                .map(|(line, (sku, fence))| {
                    debug_assert_eq!(&line.sku, sku, "one fence per line, in SKU order");
                    (line, *fence)
                })
                .collect();

            let mut client = self.pool().get().await.map_err(from_pool)?;
            let mut tx = client.transaction().await.map_err(from_db)?;
            let fingerprint = command.fingerprint();
            if let idempotency::Claim::Replay(outcome) = idempotency::claim(
                &tx,
                &self.pauses,
                command.caller.as_str(),
                &command.idempotency_key,
                RESERVE,
                &fingerprint,
            )
            .await?
            {
                let outcome: ReserveOutcome =
                    serde_json::from_value(outcome).map_err(Error::internal)?;
                return Ok(WriteOutcome::Answered(outcome.into_result()?));
            }

            // The line updates run under a savepoint: a refusal undoes them but keeps the claim,
            // so the refusal itself is stored and replayed.
            let savepoint = tx.savepoint("lines").await.map_err(from_db)?;
            let result = match hold_lines(&savepoint, &lines).await? {
                LinesOutcome::Fenced(lines) => {
                    // Dropping the transaction rolls back the claim too: a lost lease is
                    // transient and must not be stored.
                    return Ok(WriteOutcome::Fenced(lines));
                }
                LinesOutcome::Refused(error) => {
                    savepoint.rollback().await.map_err(from_db)?;
                    Err(error)
                }
                LinesOutcome::Held(levels) => {
                    savepoint.commit().await.map_err(from_db)?;
                    let id = ReservationId::new_random();
                    let (created_at, expires_at) = reservations::insert(
                        &tx,
                        &NewReservation {
                            id,
                            order_id: &command.order_id,
                            caller: command.caller.as_str(),
                            idempotency_key: command.idempotency_key.as_str(),
                            ttl,
                        },
                    )
                    .await
                    .map_err(from_db)?;
                    reservations::insert_lines(&tx, id, &lines)
                        .await
                        .map_err(from_db)?;
                    let reservation = Reservation {
                        id,
                        order_id: command.order_id.clone(),
                        state: ReservationState::Held,
                        lines: lines.iter().map(|(line, _)| (*line).clone()).collect(),
                        created_at,
                        expires_at,
                    };
                    outbox::append_reservation_event(&tx, &reservation, &levels)
                        .await
                        .map_err(from_db)?;
                    Ok(reservation)
                }
            };
            let outcome =
                serde_json::to_value(ReserveOutcome::of(&result)).map_err(Error::internal)?;
            idempotency::record_outcome(
                &tx,
                command.caller.as_str(),
                &command.idempotency_key,
                &outcome,
            )
            .await
            .map_err(from_db)?;
            tx.commit().await.map_err(from_db)?;
            if result.is_ok() {
                self.outbox_written();
                crate::metrics::reservation("HELD");
            } else {
                crate::metrics::reservation("REFUSED");
            }
            Ok(WriteOutcome::Answered(result))
        })
        .await
    }

    async fn reserve_groups(
        &self,
        groups: &[ReserveGroup],
    ) -> Result<Vec<WriteOutcome<Answers>>, Error> {
        self.bounded(async { self.write_groups(groups).await })
            .await
    }

    #[tracing::instrument(name = "sql.confirm", skip_all, fields(reservation_id = %target.id))]
    async fn confirm(&self, target: ReservationRef) -> Result<Reservation, Error> {
        self.transition(target, Transition::Confirm).await
    }

    #[tracing::instrument(name = "sql.release", skip_all, fields(reservation_id = %target.id))]
    async fn release(&self, target: ReservationRef) -> Result<Reservation, Error> {
        self.transition(target, Transition::Release).await
    }

    async fn get_reservation(&self, target: ReservationRef) -> Result<Reservation, Error> {
        self.bounded(async {
            let client = self.pool().get().await.map_err(from_pool)?;
            let header = reservations::header(&client, &target, false)
                .await?
                .ok_or(Error::UnknownReservation(target.id))?;
            let lines = reservations::lines(&client, target.id).await?;
            Ok(header.with_lines(lines))
        })
        .await
    }

    #[tracing::instrument(name = "sql.sweep", skip_all, fields(expired))]
    async fn expire_due(&self, batch: usize) -> Result<usize, Error> {
        self.bounded(async {
            let mut client = self.pool().get().await.map_err(from_pool)?;
            let tx = client.transaction().await.map_err(from_db)?;
            let batch = i64::try_from(batch).unwrap_or(i64::MAX);
            let mut due = reservations::lock_due(&tx, batch).await?;
            if due.is_empty() {
                return Ok(0);
            }
            // Return the stock SKU by SKU in one fixed order, as every other writer does.
            let mut per_sku: Vec<(Sku, i64, i64)> = Vec::new();
            for line in due.iter().flat_map(|r| &r.lines) {
                match per_sku.iter_mut().find(|(sku, _, _)| sku == &line.sku) {
                    Some((_, units, holds)) => {
                        *units += line.quantity.get();
                        *holds += 1;
                    }
                    None => per_sku.push((line.sku.clone(), line.quantity.get(), 1)),
                }
            }
            per_sku.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
            // Each SKU's level before the batch; every expiry then moves it by its own lines and
            // one version, so each event carries the level its own change produced.
            let mut running = Vec::with_capacity(per_sku.len());
            for (sku, units, holds) in &per_sku {
                let after = stock::unreserve(&tx, sku, *units, *holds)
                    .await
                    .map_err(from_db)?;
                running.push(StockLevel {
                    reserved: after.reserved + units,
                    version: after.version - holds,
                    ..after
                });
            }
            let ids: Vec<uuid::Uuid> = due.iter().map(|r| r.id.as_uuid()).collect();
            reservations::mark_expired(&tx, &ids)
                .await
                .map_err(from_db)?;
            for reservation in &mut due {
                reservation.state = ReservationState::Expired;
                let mut own = Vec::with_capacity(reservation.lines.len());
                for line in &reservation.lines {
                    let level = running
                        .iter_mut()
                        .find(|level| level.sku == line.sku)
                        .expect("every line's SKU was unreserved");
                    level.reserved -= line.quantity.get();
                    level.version += 1;
                    own.push(level.clone());
                }
                outbox::append_reservation_event(&tx, reservation, &own)
                    .await
                    .map_err(from_db)?;
            }
            tx.commit().await.map_err(from_db)?;
            self.outbox_written();
            let metrics = crate::metrics::store();
            metrics.swept.add(due.len() as u64, &[]);
            metrics.reservations.add(
                due.len() as u64,
                &[opentelemetry::KeyValue::new("outcome", "EXPIRED")],
            );
            Ok(due.len())
        })
        .await
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transition {
    Confirm,
    Release,
}

impl PgStore {
    /// Confirm or release: lock the reservation, decide from its state, move its stock.
    async fn transition(
        &self,
        target: ReservationRef,
        transition: Transition,
    ) -> Result<Reservation, Error> {
        self.bounded(async {
            let mut client = self.pool().get().await.map_err(from_pool)?;
            let tx = client.transaction().await.map_err(from_db)?;
            let header = reservations::header(&tx, &target, true)
                .await?
                .ok_or(Error::UnknownReservation(target.id))?;
            let lines = reservations::lines(&tx, target.id).await?;
            let (action, target_state) = match transition {
                Transition::Confirm => ("confirm", ReservationState::Confirmed),
                Transition::Release => ("release", ReservationState::Released),
            };
            match (transition, header.state) {
                // Repeats are no-ops that return the reservation as it is.
                (Transition::Confirm, ReservationState::Confirmed)
                | (Transition::Release, ReservationState::Released | ReservationState::Expired) => {
                    return Ok(header.with_lines(lines));
                }
                (_, ReservationState::Held) => {}
                (_, state) => {
                    return Err(Error::WrongState {
                        id: target.id,
                        state,
                        action,
                    });
                }
            }
            debug_assert_eq!(header.stored_state, ReservationState::Held);
            // Judged again now that the row is ours: the lock may have been waited for past the
            // hold's expiry, and a hold that expired is the sweeper's, not ours.
            if !reservations::settle_hold(&tx, target.id, target_state)
                .await
                .map_err(from_db)?
            {
                drop(tx);
                let mut expired = header.with_lines(lines);
                expired.state = ReservationState::Expired;
                return match transition {
                    Transition::Release => Ok(expired),
                    Transition::Confirm => Err(Error::WrongState {
                        id: target.id,
                        state: ReservationState::Expired,
                        action,
                    }),
                };
            }
            let mut levels = Vec::with_capacity(lines.len());
            for line in &lines {
                let units = line.quantity.get();
                let level = match transition {
                    Transition::Confirm => stock::ship(&tx, &line.sku, units).await,
                    Transition::Release => stock::unreserve(&tx, &line.sku, units, 1).await,
                };
                levels.push(level.map_err(from_db)?);
            }
            let mut reservation = header.with_lines(lines);
            reservation.state = target_state;
            outbox::append_reservation_event(&tx, &reservation, &levels)
                .await
                .map_err(from_db)?;
            tx.commit().await.map_err(from_db)?;
            self.outbox_written();
            crate::metrics::reservation(target_state.as_str());
            Ok(reservation)
        })
        .await
    }
}
