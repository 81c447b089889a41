//! `CancelOrder`, one transaction: claim the key (or replay), take the order's lock
//! exclusively and write its tombstone (see `orders`), release every live hold of the order,
//! store the outcome, and answer every reservation of the order as it now is.

use deadpool_postgres::Transaction;
use inventory_core::{
    Error,
    command::CancelOrder,
    domain::{Reservation, ReservationState, Scope},
};
use serde::{Deserialize, Serialize};

use crate::{
    PgStore,
    plumbing::error::from_db,
    tables::idempotency::outcome::CANCEL_ORDER,
    tables::ledger::Cause,
    tables::orders,
    tables::reservations,
    usecases::{
        expiry::end_holds,
        keyed::{Commit, Key},
    },
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
        let key = Key::new(
            &command.caller,
            &command.idempotency_key,
            CANCEL_ORDER,
            command.fingerprint(),
        );
        let replay = async |stored: CancelOutcome, tx: &Transaction<'_>| {
            order_now(tx, command, &stored.callers).await
        };
        self.keyed(key, None, replay, async |tx| {
            // Whose order: the caller's own; for the admin, every caller's, read once the
            // order's lock is held (a Reserve in flight has committed by then, or will read
            // the admin's tombstone).
            let tombstone_of = match &command.scope {
                Scope::Own(caller) => caller.as_str(),
                Scope::All => orders::EVERY_CALLER,
            };
            orders::cancel(
                tx,
                self.order_lock_space(),
                tombstone_of,
                &command.order_id,
                command.reason.as_str(),
            )
            .await
            .map_err(from_db)?;
            let callers: Vec<String> = match &command.scope {
                Scope::Own(caller) => vec![caller.as_str().to_owned()],
                Scope::All => reservations::callers_of_order(tx, &command.order_id)
                    .await
                    .map_err(from_db)?,
            };
            let names: Vec<&str> = callers.iter().map(String::as_str).collect();
            let mut live = reservations::lock_live_of_order(tx, &command.order_id, &names).await?;
            if !live.is_empty() {
                let cause = Cause::call(
                    command.caller.as_str(),
                    command.reason.as_str(),
                    Some(command.idempotency_key.as_str()),
                );
                end_holds(tx, &mut live, ReservationState::Released, cause, false).await?;
            }
            let answer = order_now(tx, command, &callers).await?;
            let commit = Commit::storing(Ok(answer), &CancelOutcome { callers })?;
            if live.is_empty() {
                return commit.step();
            }
            commit
                .wrote(true)
                .counting("RELEASED", live.len() as u64)
                .step()
        })
        .await
    }
}

/// Every reservation of the order among `callers`', oldest first.
async fn order_now(
    tx: &Transaction<'_>,
    command: &CancelOrder,
    callers: &[String],
) -> Result<Vec<Reservation>, Error> {
    let names: Vec<&str> = callers.iter().map(String::as_str).collect();
    reservations::all_of_order(tx, &command.order_id, &names).await
}
