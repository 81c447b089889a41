//! `CancelOrder`, one transaction: claim the key (or replay), take the order's lock
//! exclusively and write its tombstone (see `orders`), release every live hold of the order,
//! store the outcome, and answer every reservation of the order as it now is.

use inventory_core::{
    Error,
    command::CancelOrder,
    domain::{Reservation, ReservationState, Scope},
};
use serde::{Deserialize, Serialize};

use crate::{
    PgStore, durable,
    error::{from_db, from_pool},
    expiry::end_holds,
    idempotency,
    ledger::Cause,
    orders,
    outcome::CANCEL_ORDER,
    reservations,
};

/// The stored outcome of a `CancelOrder`: its reservations are read again on a replay (they
/// may have moved on since, which a replay then shows).
#[derive(Debug, Serialize, Deserialize)]
struct CancelOutcome {
    callers: Vec<String>,
}

impl PgStore {
    #[tracing::instrument(name = "sql.cancel_order", skip_all, fields(order_id = command.order_id.as_str()))]
    pub(crate) async fn cancel(&self, command: &CancelOrder) -> Result<Vec<Reservation>, Error> {
        self.bounded(async {
            let mut client = self.pool().get().await.map_err(from_pool)?;
            let decided = async {
                let tx = client.transaction().await.map_err(from_db)?;
                if let Some(outcome) = idempotency::claim(
                    &tx,
                    &self.pauses,
                    command.caller.as_str(),
                    &command.idempotency_key,
                    CANCEL_ORDER,
                    &command.fingerprint(),
                )
                .await?
                .stored::<CancelOutcome>()?
                {
                    let answer = self.order_now(&tx, command, &outcome.callers).await;
                    drop(tx);
                    return durable::answer(&client, answer).await;
                }
                // Whose order: the caller's own; for the admin, every caller's, read once the
                // order's lock is held (a Reserve in flight has committed by then, or will read
                // the admin's tombstone).
                let tombstone_of = match &command.scope {
                    Scope::Own(caller) => caller.as_str(),
                    Scope::All => orders::EVERY_CALLER,
                };
                orders::cancel(
                    &tx,
                    tombstone_of,
                    &command.order_id,
                    command.reason.as_str(),
                )
                .await
                .map_err(from_db)?;
                let callers: Vec<String> = match &command.scope {
                    Scope::Own(caller) => vec![caller.as_str().to_owned()],
                    Scope::All => reservations::callers_of_order(&tx, &command.order_id)
                        .await
                        .map_err(from_db)?,
                };
                let names: Vec<&str> = callers.iter().map(String::as_str).collect();
                let mut live =
                    reservations::lock_live_of_order(&tx, &command.order_id, &names).await?;
                if !live.is_empty() {
                    let cause = Cause::call(
                        command.caller.as_str(),
                        command.reason.as_str(),
                        Some(command.idempotency_key.as_str()),
                    );
                    end_holds(&tx, &mut live, ReservationState::Released, cause).await?;
                }
                let outcome = CancelOutcome {
                    callers: callers.clone(),
                };
                idempotency::record(
                    &tx,
                    command.caller.as_str(),
                    &command.idempotency_key,
                    &outcome,
                )
                .await?;
                let answer = self.order_now(&tx, command, &callers).await?;
                tx.commit().await.map_err(from_db)?;
                if !live.is_empty() {
                    self.outbox_written();
                    let metrics = crate::metrics::store();
                    metrics.reservations.add(
                        live.len() as u64,
                        &[opentelemetry::KeyValue::new("outcome", "RELEASED")],
                    );
                }
                Ok(answer)
            }
            .await;
            durable::refused_by_reads(&client, decided).await
        })
        .await
    }

    /// Every reservation of the order among `callers`', oldest first.
    async fn order_now(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        command: &CancelOrder,
        callers: &[String],
    ) -> Result<Vec<Reservation>, Error> {
        let names: Vec<&str> = callers.iter().map(String::as_str).collect();
        reservations::all_of_order(tx, &command.order_id, &names).await
    }
}
