//! The reservation use cases of [`PgStore`](crate::PgStore): each is one transaction that
//! reads, asks the core ([`rules`]) and writes what it decided.

use std::time::{Duration, SystemTime};

use deadpool_postgres::Transaction;

use inventory_core::{
    Error,
    allocation::Placement,
    command::{
        CancelOrder, ExtendReservation, ListReservations, ReservationPage, ReservationRef, Reserve,
        Settle, SettleReservation,
    },
    domain::{
        Caller, FenceToken, IdempotencyKey, Line, MovementKind, Reservation, ReservationLine,
        ReservationState, Sku, Ttl,
    },
    pause::PausePoint,
    ports::{Answers, ReservationStore, ReserveGroup, WriteOutcome},
    quota::Holdings,
    rules::{self, LinesVerdict, SettleStep},
};

use crate::{
    PgStore,
    plumbing::error::{from_db, from_pool},
    tables::idempotency::outcome::{RESERVE, ReserveOutcome},
    tables::ledger::{self, Cause, NewMovement},
    tables::locations,
    tables::orders,
    tables::outbox,
    tables::receipts,
    tables::reservations,
    tables::stock::{self, StockMove},
    usecases::holds::{self, Hold, Record},
    usecases::keyed::{Commit, Key, Step, Timed, Unread},
};
use tokio_postgres::types::Json;

impl ReservationStore for PgStore {
    #[tracing::instrument(name = "sql.reserve", skip_all, fields(order_id = command.order_id.as_str()))]
    async fn reserve(
        &self,
        command: &Reserve,
        ttl: Ttl,
        fences: &[(Sku, FenceToken)],
    ) -> Result<WriteOutcome, Error> {
        let lines: Vec<(&Line, FenceToken)> = command
            .lines_by_sku()
            .into_iter()
            .zip(fences)
            .map(|(line, (sku, fence))| {
                debug_assert_eq!(&line.sku, sku, "one fence per line, in SKU order");
                (line, *fence)
            })
            .collect();

        let key = Key::new(
            &command.caller,
            &command.idempotency_key,
            RESERVE,
            command.fingerprint(),
        );
        let timed = Some(Timed {
            started: std::time::Instant::now(),
        });
        let replay = async |stored: ReserveOutcome, _: &Transaction<'_>| {
            Ok(WriteOutcome::replayed(stored.into_result()?))
        };
        self.keyed(key, timed, replay, async |tx| {
            // The order's lock (shared) before any stock row: a cancel of this order either
            // committed already (its tombstone is read here) or waits for this commit.
            let order = [(command.caller.as_str(), command.order_id.as_str())];
            let cancelled = !orders::lock_and_read_cancelled(tx, self.order_lock_space(), &order)
                .await?
                .is_empty();
            self.pauses.reach(PausePoint::OrderChecked).await;
            // Every SKU's row locked in SKU order, then its location rows (which that lock
            // covers), and the locations as they are configured: what allocation is decided on.
            let skus: Vec<&str> = lines.iter().map(|(line, _)| line.sku.as_str()).collect();
            let (mut stock, configured) = tokio::try_join!(
                biased;
                stock::lock_many(tx, &skus),
                locations::all(tx),
            )?;
            // What a line that may pre-order may be pegged to: the open receipts, and the
            // closed ones whose pre-orders still wait (they count as backorders), read under
            // the SKU rows' locks (every writer of a receipt holds its SKU's). A backorder
            // needs them only where pre-ordered units wait.
            let at_risk_possible = command.allocation.allow_backorder
                && stock.values().any(|s| s.total.states.preordered > 0);
            // A pre-order waits no longer than the horizon: no receipt due after it.
            for sku in stock.values_mut() {
                sku.waits_until = Some(sku.now + self.wait_horizon);
            }
            if command.allocation.allow_preorder || at_risk_possible {
                let wanted: Vec<Sku> = stock.keys().cloned().collect();
                for receipt in receipts::counted_of(tx, &wanted).await? {
                    if let Some(sku) = stock.get_mut(&receipt.sku) {
                        sku.receipts.push(receipt);
                    }
                }
            }
            let metrics = crate::plumbing::metrics::store();
            let result = if cancelled {
                Err(Error::OrderCancelled {
                    order_id: command.order_id.clone(),
                })
            } else {
                match rules::place_lines(&lines, &mut stock, command.allocation, &configured) {
                    LinesVerdict::Fenced(lines) => {
                        metrics.fence_rejected.add(1, &[]);
                        // Dropping the transaction rolls back the claim too: a lost lease is
                        // transient and must not be stored.
                        return Ok(Step::Abandon(WriteOutcome::Fenced(lines)));
                    }
                    LinesVerdict::Refused(error) => {
                        if let Error::InsufficientStock(_) = &error {
                            metrics.insufficient.add(1, &[]);
                        }
                        Err(error)
                    }
                    LinesVerdict::Held(placed) => {
                        // Dated by the clock once the last of its rows was locked: when it
                        // acted, however long it waited for those locks.
                        let now = lines
                            .iter()
                            .filter_map(|(line, _)| stock.get(&line.sku).map(|s| s.now))
                            .max()
                            .ok_or_else(|| Error::internal("a placed line without its stock"))?;
                        let horizon = self.wait_horizon;
                        Ok(write_hold(tx, command, ttl, now, horizon, &lines, placed).await?)
                    }
                }
            };
            // A hold stored its outcome with its event; a refusal stores it here.
            let refused = result.is_err().then(|| ReserveOutcome::of(&result));
            let unknown = inventory_core::ports::unknown_skus(&result).to_vec();
            let answer = Ok(WriteOutcome::decided(result, unknown));
            match refused {
                None => Commit::stored(answer).wrote(true).counting("HELD", 1),
                Some(outcome) => Commit::storing(answer, &outcome)?.counting("REFUSED", 1),
            }
            .step()
        })
        .await
    }

    async fn reserve_groups(
        &self,
        groups: &[ReserveGroup],
        committing: &(dyn Fn() + Sync),
    ) -> Result<Vec<WriteOutcome<Answers>>, Error> {
        self.bounded(async { self.write_groups(groups, committing).await })
            .await
    }

    #[tracing::instrument(
        name = "sql.settle",
        skip_all,
        fields(reservation_id = %command.target.id, action = command.settle.action(), lines = command.lines.len())
    )]
    async fn settle(&self, command: &SettleReservation) -> Result<Reservation, Error> {
        let target = &command.target;
        let key = command.idempotency_key.as_ref().map(|key| {
            Key::new(
                &command.caller,
                key,
                command.operation(),
                command.fingerprint(),
            )
        });
        // A repeat answers the reservation as it now is.
        let replay =
            async |_: Unread, tx: &Transaction<'_>| match reservations::header(tx, target, false)
                .await?
            {
                Some(header) => Ok(header.with_lines(reservations::lines(tx, target.id).await?)),
                None => Err(Error::UnknownReservation(target.id)),
            };
        self.keyed(key, None, replay, async |tx| {
            self.settle_units(tx, command).await
        })
        .await
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
        let target = &command.target;
        self.unkeyed(async |tx| {
            let Some(header) = reservations::header(tx, target, true).await? else {
                return Ok(Step::Read(Err(Error::UnknownReservation(target.id))));
            };
            let lines = reservations::lines(tx, target.id).await?;
            let now = header.read_at;
            let mut reservation = header.with_lines(lines);
            let expires_at = match rules::extend(&reservation, now, command.ttl, max_hold) {
                // A hold that waits for stock keeps the wait horizon: nothing to write.
                Ok(expires_at) if expires_at == reservation.expires_at => {
                    return Ok(Step::Read(Ok(reservation)));
                }
                Ok(expires_at) => expires_at,
                Err(refusal) => return Ok(Step::Read(Err(refusal))),
            };
            // Judged again by the statement: the hold may have run out since it was read.
            if !reservations::extend_hold(tx, target.id, expires_at)
                .await
                .map_err(from_db)?
            {
                return Ok(Step::Read(Err(Error::WrongState {
                    id: target.id,
                    state: ReservationState::Expired,
                    action: "extend",
                })));
            }
            reservation.expires_at = expires_at;
            outbox::append_extended_event(tx, &reservation)
                .await
                .map_err(from_db)?;
            Commit::stored(Ok(reservation)).wrote(true).step()
        })
        .await
    }

    async fn cancel_order(&self, command: &CancelOrder) -> Result<Vec<Reservation>, Error> {
        self.cancel(command).await
    }

    async fn expire_due(&self, batch: usize) -> Result<usize, Error> {
        self.expire(batch).await
    }

    async fn refill_waiting(&self, batch: usize) -> Result<u64, Error> {
        self.refill(batch).await
    }

    async fn holdings(&self, caller: &Caller, key: &IdempotencyKey) -> Result<Holdings, Error> {
        self.bounded(async {
            let client = self.pool().get().await.map_err(from_pool)?;
            reservations::holdings(&client, Some(caller), key).await
        })
        .await
    }

    async fn tenant_holdings(
        &self,
        caller: &Caller,
        key: &IdempotencyKey,
    ) -> Result<Holdings, Error> {
        self.bounded(async {
            let client = self.pool().get().await.map_err(from_pool)?;
            let mut holdings = reservations::holdings(&client, None, key).await?;
            holdings.key_used = reservations::holdings(&client, Some(caller), key)
                .await?
                .key_used;
            Ok(holdings)
        })
        .await
    }
}

/// The stored outcome of a confirm or release made with a key: a repeat reads the
/// reservation again and answers it as it now is (later calls may have moved it on).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Settled {}

impl PgStore {
    /// Confirm or release, under the key if there is one: lock the reservation, let the core
    /// decide what moves, move the stock of the lines it names in SKU order, write the lines'
    /// counts and the state, append the event. A refusal rolls the claim back with everything
    /// else: the reservation's held units only ever shrink, so the same request is refused
    /// again.
    async fn settle_units(
        &self,
        tx: &Transaction<'_>,
        command: &SettleReservation,
    ) -> Result<Step<Reservation>, Error> {
        let target = &command.target;
        let Some(header) = reservations::header(tx, target, true).await? else {
            return Ok(Step::Read(Err(Error::UnknownReservation(target.id))));
        };
        let stored_lines = reservations::lines(tx, target.id).await?;
        let reservation = header.with_lines(stored_lines);
        let keyed = command.idempotency_key.is_some();
        let change = match command.settle.step(&reservation, &command.lines, keyed) {
            Ok(SettleStep::Apply(change)) => change,
            // Decided by what was read: a repeat, or a refusal.
            Ok(SettleStep::Repeat) => return Ok(Step::Read(Ok(reservation))),
            Err(refusal) => return Ok(Step::Read(Err(refusal))),
        };
        // Judged again now that the row is ours: the lock may have been waited for past the
        // hold's expiry, and a hold that expired is the sweeper's, not ours.
        let waiting: i64 = change
            .after
            .lines
            .iter()
            .map(ReservationLine::waiting)
            .sum();
        if !reservations::settle_hold(tx, target.id, change.after.state, waiting)
            .await
            .map_err(from_db)?
        {
            let answer = command
                .settle
                .expired_meanwhile(reservation, &command.lines);
            return Ok(Step::Read(answer));
        }
        let moves: Vec<StockMove<'_>> = change
            .moves
            .iter()
            .map(|m| StockMove {
                sku: &m.sku,
                location: &m.location,
                // Confirmed units leave the stock: both columns drop, `available` stays.
                on_hand: match command.settle {
                    Settle::Confirm => -m.units,
                    Settle::Release => 0,
                },
                reserved: -m.units,
                // Waiting units given up leave the location's waiting counts.
                states: m.waiting.negated(),
            })
            .collect();
        let moved = stock::apply(tx, &moves, &[], false).await?;
        receipts::unpeg(tx, &super::fill::unpegged(&change.moves)).await?;
        if change.write_lines {
            reservations::update_lines(tx, &[&change.after])
                .await
                .map_err(from_db)?;
        }
        outbox::append_reservation_event(
            tx,
            change.event,
            &change.after,
            &stock::levels_after(&moved),
        )
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
        let movements: Vec<NewMovement<'_>> = moved
            .iter()
            .zip(&change.moves)
            .map(|(m, units)| super::fill::settled(kind, m, units).because(cause))
            .collect();
        ledger::append(tx, &movements).await.map_err(from_db)?;
        // Released units go to holds waiting there; a confirm's fill catches a waiting hold
        // an earlier fill skipped while this one held it.
        let _ = super::fill::fill(tx, &super::fill::location_levels(&moved), None, cause).await?;
        let counted = change.event.as_str().trim_start_matches("RESERVATION_");
        Commit::storing(Ok(change.after), &Settled {})?
            .wrote(true)
            .counting(counted, 1)
            .step()
    }
}

/// Writes the hold the core placed, as the coalesced path writes its holds
/// ([`holds::write`]): the stock rows moved under the lines' fences, the reservation and its
/// lines, its event, its movements and the outcome stored on the key, in one round trip.
async fn write_hold(
    tx: &Transaction<'_>,
    command: &Reserve,
    ttl: Ttl,
    now: SystemTime,
    horizon: Duration,
    lines: &[(&Line, FenceToken)],
    placed: Vec<Vec<Placement>>,
) -> Result<Reservation, Error> {
    let held: Vec<ReservationLine> = lines
        .iter()
        .zip(&placed)
        .map(|((line, _), placements)| {
            ReservationLine::new_hold(line, rules::allocations(placements))
        })
        .collect();
    let hold = Hold {
        command,
        reservation: rules::committed(rules::new_hold(command, held, now, ttl), horizon),
        fences: lines.iter().map(|(_, fence)| *fence).collect(),
        placements: placed.into_iter().flatten().collect(),
    };
    let record: Record<'_> = (
        command.caller.as_str(),
        command.idempotency_key.as_str(),
        Json(ReserveOutcome::held(&hold.reservation)),
    );
    holds::write(tx, std::slice::from_ref(&hold), &[record], &[]).await?;
    Ok(hold.reservation)
}
