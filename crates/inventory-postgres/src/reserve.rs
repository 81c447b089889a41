//! The reservation use cases of [`PgStore`](crate::PgStore): each is one transaction that
//! reads, asks the core ([`rules`]) and writes what it decided.

use std::time::Duration;

use deadpool_postgres::Transaction;
use inventory_core::{
    Error,
    command::{
        CancelOrder, ExtendReservation, ListReservations, ReservationPage, ReservationRef, Reserve,
        Settle, SettleReservation,
    },
    domain::{
        FenceToken, Line, MovementKind, Reservation, ReservationId, ReservationLine,
        ReservationState, Sku, StockLevel, Ttl,
    },
    events::ReservationEvent,
    pause::PausePoint,
    ports::{Answers, ReservationStore, ReserveGroup, WriteOutcome},
    rules::{self, LineRefusal, LinesVerdict, SettleStep},
};

use crate::{
    PgStore,
    error::{from_db, from_pool},
    idempotency,
    ledger::{self, Cause, NewMovement},
    orders, outbox,
    outcome::{RESERVE, ReserveOutcome},
    reservations::{self, NewReservation},
    stock,
};

/// The conditional update of every line, in SKU order; the lines that did not apply are read
/// back and the core judges the reservation from them.
async fn hold_lines(
    tx: &Transaction<'_>,
    lines: &[(&Line, FenceToken)],
) -> Result<(LinesVerdict, Vec<StockLevel>), Error> {
    let mut levels = Vec::with_capacity(lines.len());
    let mut refusals = Vec::new();
    for (line, fence) in lines {
        let units = line.quantity.get();
        if let Some(level) = stock::reserve(tx, &line.sku, units, *fence)
            .await
            .map_err(from_db)?
        {
            levels.push(level);
            continue;
        }
        let found = stock::read_with_fence(tx, &line.sku)
            .await
            .map_err(from_db)?;
        let refusal = rules::line_refusal(line, *fence, found.as_ref().map(|(l, f)| (l, *f)));
        match &refusal {
            LineRefusal::Fenced(..) => crate::metrics::store().fence_rejected.add(1, &[]),
            LineRefusal::Short(_) => crate::metrics::store().insufficient.add(1, &[]),
            LineRefusal::UnknownSku(_) => {}
        }
        refusals.push(refusal);
    }
    Ok((rules::judge_lines(refusals), levels))
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

            let started = std::time::Instant::now();
            let mut client = self.pool().get().await.map_err(from_pool)?;
            let mut tx = client.transaction().await.map_err(from_db)?;
            let fingerprint = command.fingerprint();
            if let Some(outcome) = idempotency::claim(
                &tx,
                &self.pauses,
                command.caller.as_str(),
                &command.idempotency_key,
                RESERVE,
                &fingerprint,
            )
            .await?
            .stored::<ReserveOutcome>()?
            {
                return Ok(WriteOutcome::Answered(outcome.into_result()?));
            }

            // The order's lock (shared) before any stock row: a cancel of this order either
            // committed already (its tombstone is read here) or waits for this commit.
            let order = [(command.caller.as_str(), command.order_id.as_str())];
            let cancelled = !orders::lock_and_read_cancelled(&tx, &order)
                .await?
                .is_empty();
            self.pauses.reach(PausePoint::OrderChecked).await;
            let result = if cancelled {
                Err(Error::OrderCancelled {
                    order_id: command.order_id.clone(),
                })
            } else {
                // The line updates run under a savepoint: a refusal undoes them but keeps the
                // claim, so the refusal itself is stored and replayed.
                let savepoint = tx.savepoint("lines").await.map_err(from_db)?;
                let (verdict, levels) = hold_lines(&savepoint, &lines).await?;
                match verdict {
                    LinesVerdict::Fenced(lines) => {
                        // Dropping the transaction rolls back the claim too: a lost lease is
                        // transient and must not be stored.
                        return Ok(WriteOutcome::Fenced(lines));
                    }
                    LinesVerdict::Refused(error) => {
                        savepoint.rollback().await.map_err(from_db)?;
                        Err(error)
                    }
                    LinesVerdict::Held => {
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
                            lines: lines
                                .iter()
                                .map(|(line, _)| ReservationLine::new_hold(line))
                                .collect(),
                            created_at,
                            expires_at,
                        };
                        outbox::append_reservation_event(
                            &tx,
                            ReservationEvent::Held,
                            &reservation,
                            &levels,
                        )
                        .await
                        .map_err(from_db)?;
                        let cause = Cause::call(
                            command.caller.as_str(),
                            "",
                            Some(command.idempotency_key.as_str()),
                        )
                        .of_reservation(id, &command.order_id);
                        // `levels` are in SKU order, like `lines`.
                        let movements: Vec<NewMovement<'_>> = levels
                            .iter()
                            .zip(&lines)
                            .map(|(level, (line, _))| {
                                NewMovement::of_units(
                                    MovementKind::Held,
                                    level,
                                    line.quantity.get(),
                                )
                                .because(cause)
                            })
                            .collect();
                        ledger::append(&tx, &movements).await.map_err(from_db)?;
                        Ok(reservation)
                    }
                }
            };
            idempotency::record(
                &tx,
                command.caller.as_str(),
                &command.idempotency_key,
                &ReserveOutcome::of(&result),
            )
            .await?;
            let committing = std::time::Instant::now();
            tx.commit().await.map_err(from_db)?;
            crate::metrics::reserve_committed(false, started, committing);
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

    #[tracing::instrument(
        name = "sql.settle",
        skip_all,
        fields(reservation_id = %command.target.id, action = command.settle.action(), lines = command.lines.len())
    )]
    async fn settle(&self, command: &SettleReservation) -> Result<Reservation, Error> {
        self.bounded(self.settle_units(command)).await
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

    #[tracing::instrument(name = "sql.list_reservations", skip_all, fields(page_size = query.page_size))]
    async fn list_reservations(&self, query: &ListReservations) -> Result<ReservationPage, Error> {
        self.bounded(async {
            let client = self.pool().get().await.map_err(from_pool)?;
            reservations::list(&client, query).await
        })
        .await
    }

    #[tracing::instrument(name = "sql.extend", skip_all, fields(reservation_id = %command.target.id))]
    async fn extend(
        &self,
        command: &ExtendReservation,
        max_hold: Duration,
    ) -> Result<Reservation, Error> {
        self.bounded(async {
            let target = &command.target;
            let mut client = self.pool().get().await.map_err(from_pool)?;
            let tx = client.transaction().await.map_err(from_db)?;
            let header = reservations::header(&tx, target, true)
                .await?
                .ok_or(Error::UnknownReservation(target.id))?;
            let lines = reservations::lines(&tx, target.id).await?;
            let now = header.read_at;
            let mut reservation = header.with_lines(lines);
            let expires_at = rules::extend(&reservation, now, command.ttl, max_hold)?;
            // Judged again by the statement: the hold may have run out since it was read.
            if !reservations::extend_hold(&tx, target.id, expires_at)
                .await
                .map_err(from_db)?
            {
                return Err(Error::WrongState {
                    id: target.id,
                    state: ReservationState::Expired,
                    action: "extend",
                });
            }
            reservation.expires_at = expires_at;
            outbox::append_extended_event(&tx, &reservation)
                .await
                .map_err(from_db)?;
            tx.commit().await.map_err(from_db)?;
            self.outbox_written();
            Ok(reservation)
        })
        .await
    }

    async fn cancel_order(&self, command: &CancelOrder) -> Result<Vec<Reservation>, Error> {
        self.cancel(command).await
    }

    async fn expire_due(&self, batch: usize) -> Result<usize, Error> {
        self.expire(batch).await
    }
}

/// The stored outcome of a confirm or release made with a key: a repeat reads the
/// reservation again and answers it as it now is (later calls may have moved it on).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Settled {}

impl PgStore {
    /// Confirm or release: claim the key if there is one (a repeat answers the reservation
    /// as it now is), lock the reservation, let the core decide what moves, move the stock
    /// of the lines it names in SKU order, write the lines' counts and the state, append the
    /// event. A refusal rolls the claim back with everything else: the reservation's held
    /// units only ever shrink, so the same request is refused again.
    async fn settle_units(&self, command: &SettleReservation) -> Result<Reservation, Error> {
        let target = &command.target;
        let mut client = self.pool().get().await.map_err(from_pool)?;
        let tx = client.transaction().await.map_err(from_db)?;
        if let Some(key) = &command.idempotency_key
            && let idempotency::Claim::Replay(_) = idempotency::claim(
                &tx,
                &self.pauses,
                command.caller.as_str(),
                key,
                command.operation(),
                &command.fingerprint(),
            )
            .await?
        {
            let header = reservations::header(&tx, target, false)
                .await?
                .ok_or(Error::UnknownReservation(target.id))?;
            let lines = reservations::lines(&tx, target.id).await?;
            return Ok(header.with_lines(lines));
        }
        let header = reservations::header(&tx, target, true)
            .await?
            .ok_or(Error::UnknownReservation(target.id))?;
        let stored_lines = reservations::lines(&tx, target.id).await?;
        let reservation = header.with_lines(stored_lines);
        let change = match command.settle.step(&reservation, &command.lines)? {
            SettleStep::Repeat => return Ok(reservation),
            SettleStep::Apply(change) => change,
        };
        // Judged again now that the row is ours: the lock may have been waited for past the
        // hold's expiry, and a hold that expired is the sweeper's, not ours.
        if !reservations::settle_hold(&tx, target.id, change.after.state)
            .await
            .map_err(from_db)?
        {
            drop(tx);
            return command
                .settle
                .expired_meanwhile(reservation, &command.lines);
        }
        let mut levels = Vec::with_capacity(change.moves.len());
        for (sku, units) in &change.moves {
            let level = match command.settle {
                Settle::Confirm => stock::ship(&tx, sku, *units).await,
                Settle::Release => stock::unreserve(&tx, sku, *units, 1).await,
            };
            levels.push(level.map_err(from_db)?);
        }
        if change.write_lines {
            reservations::update_lines(&tx, &[&change.after])
                .await
                .map_err(from_db)?;
        }
        outbox::append_reservation_event(&tx, change.event, &change.after, &levels)
            .await
            .map_err(from_db)?;
        let cause = Cause::call(
            command.caller.as_str(),
            "",
            command.idempotency_key.as_ref().map(|k| k.as_str()),
        )
        .of_reservation(target.id, &reservation.order_id);
        let kind = match command.settle {
            Settle::Confirm => MovementKind::Confirmed,
            Settle::Release => MovementKind::Released,
        };
        let movements: Vec<NewMovement<'_>> = levels
            .iter()
            .zip(&change.moves)
            .map(|(level, (_, units))| NewMovement::of_units(kind, level, *units).because(cause))
            .collect();
        ledger::append(&tx, &movements).await.map_err(from_db)?;
        if let Some(key) = &command.idempotency_key {
            idempotency::record(&tx, command.caller.as_str(), key, &Settled {}).await?;
        }
        tx.commit().await.map_err(from_db)?;
        self.outbox_written();
        crate::metrics::reservation(change.event.as_str().trim_start_matches("RESERVATION_"));
        Ok(change.after)
    }
}
