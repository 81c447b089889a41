//! The stock-state use cases of [`PgStore`]: a (SKU, location)'s policy, its units moved
//! between states, and its incoming receipts (expected, received, cancelled, listed). Each
//! write is one keyed transaction that locks the SKU's row, reads its row at the location,
//! lets the core decide, and writes the change with its movement and its
//! `STOCK_STATE_CHANGED` event.

use deadpool_postgres::Transaction;
use inventory_core::{
    Error,
    command::{
        CancelReceipt, ExpectStock, ListReceipts, MoveStockState, ReceiptChanged, ReceiptPage,
        ReceiveStock, SetStockPolicy,
    },
    domain::{LocationId, MovementKind, Receipt, ReceiptId, ReceiptState, Sku, StockLevel},
    events::{Change, ReservationEvent},
    rules::{self, StatesChange},
};
use serde_json::json;

use crate::{
    PgStore,
    plumbing::error::{from_db, from_pool},
    tables::idempotency::outcome::{
        CANCEL_RECEIPT, EXPECT_STOCK, MOVE_STOCK_STATE, RECEIVE_STOCK, ReceiptOutcome,
        SET_STOCK_POLICY, StatesOutcome, Stored,
    },
    tables::ledger::{self, Cause, NewMovement},
    tables::outbox,
    tables::receipts,
    tables::reservations,
    tables::stock::{self, Moved, StockMove},
    usecases::keyed::{Commit, Key},
};

impl PgStore {
    #[tracing::instrument(name = "sql.set_stock_policy", skip_all, fields(sku = %command.sku))]
    pub(crate) async fn set_policy(&self, command: &SetStockPolicy) -> Result<StockLevel, Error> {
        let key = Key::new(
            &command.caller,
            &command.idempotency_key,
            SET_STOCK_POLICY,
            command.fingerprint(),
        );
        let cause = call_cause(&command.caller, &command.reason, &command.idempotency_key);
        self.keyed_change::<StatesOutcome, _>(key, async |tx| {
            super::stock::known_locations(tx, [&command.location]).await?;
            change_states(
                tx,
                &command.sku,
                &command.location,
                |total, at| Ok(rules::set_policy(total, at, command)),
                StateChange::new(MovementKind::PolicySet, cause),
            )
            .await
        })
        .await
    }

    #[tracing::instrument(name = "sql.move_stock_state", skip_all, fields(sku = %command.sku, quantity = command.quantity))]
    pub(crate) async fn move_state(&self, command: &MoveStockState) -> Result<StockLevel, Error> {
        let key = Key::new(
            &command.caller,
            &command.idempotency_key,
            MOVE_STOCK_STATE,
            command.fingerprint(),
        );
        let cause = call_cause(&command.caller, &command.reason, &command.idempotency_key);
        self.keyed_change::<StatesOutcome, _>(key, async |tx| {
            super::stock::known_locations(tx, [&command.location]).await?;
            let mut change = StateChange::new(MovementKind::StateMoved, cause);
            change.moved = (command.quantity, Some(command.from), Some(command.to));
            change_states(
                tx,
                &command.sku,
                &command.location,
                |total, at| rules::move_state(total, at, command).map(Some),
                change,
            )
            .await
        })
        .await
    }

    #[tracing::instrument(name = "sql.expect_stock", skip_all, fields(receipt_id = %command.receipt_id))]
    pub(crate) async fn expect(&self, command: &ExpectStock) -> Result<ReceiptChanged, Error> {
        let key = Key::new(
            &command.caller,
            &command.idempotency_key,
            EXPECT_STOCK,
            command.fingerprint(),
        );
        self.keyed_change::<ReceiptOutcome, _>(key, async |tx| {
            super::stock::known_locations(tx, [&command.location]).await?;
            expect_receipt(tx, command).await
        })
        .await
    }

    #[tracing::instrument(name = "sql.receive_stock", skip_all, fields(receipt_id = %command.receipt_id, quantity = command.quantity))]
    pub(crate) async fn receive(&self, command: &ReceiveStock) -> Result<ReceiptChanged, Error> {
        let key = Key::new(
            &command.caller,
            &command.idempotency_key,
            RECEIVE_STOCK,
            command.fingerprint(),
        );
        let cause = call_cause(&command.caller, &command.reason, &command.idempotency_key);
        self.keyed_change::<ReceiptOutcome, _>(key, async |tx| {
            change_receipt(
                tx,
                &command.receipt_id,
                MovementKind::Received,
                cause,
                |total, at, receipt| {
                    rules::receive(total, at, receipt, command.quantity, command.state)
                },
            )
            .await
        })
        .await
    }

    #[tracing::instrument(name = "sql.cancel_receipt", skip_all, fields(receipt_id = %command.receipt_id))]
    pub(crate) async fn cancel_receipt_of(
        &self,
        command: &CancelReceipt,
    ) -> Result<ReceiptChanged, Error> {
        let key = Key::new(
            &command.caller,
            &command.idempotency_key,
            CANCEL_RECEIPT,
            command.fingerprint(),
        );
        let cause = call_cause(&command.caller, &command.reason, &command.idempotency_key);
        self.keyed_change::<ReceiptOutcome, _>(key, async |tx| {
            change_receipt(
                tx,
                &command.receipt_id,
                MovementKind::ReceiptCancelled,
                cause,
                rules::cancel_receipt,
            )
            .await
        })
        .await
    }

    pub(crate) async fn receipts_page(&self, query: &ListReceipts) -> Result<ReceiptPage, Error> {
        self.bounded(async {
            let client = self.pool().get().await.map_err(from_pool)?;
            receipts::page(&client, query).await
        })
        .await
    }

    /// The shape of every write here: the key claimed (or its stored outcome replayed), the
    /// body, and its final outcome stored with the key, a refusal included.
    async fn keyed_change<O, T>(
        &self,
        key: Key<'_>,
        body: impl AsyncFnOnce(&Transaction<'_>) -> Result<Result<T, Error>, Error>,
    ) -> Result<T, Error>
    where
        O: Stored<T>,
    {
        let replay = async |stored: O, _: &Transaction<'_>| stored.into_result();
        self.keyed(key, None, replay, async |tx| {
            let result = body(tx).await?;
            let outcome = O::of(&result).expect("only final outcomes come back");
            let wrote = result.is_ok();
            Commit::storing(result, &outcome)?.wrote(wrote).step()
        })
        .await
    }
}

/// A call's caller, reason and key, as its movements record them.
fn call_cause<'a>(
    caller: &'a inventory_core::domain::Caller,
    reason: &'a inventory_core::domain::Reason,
    key: &'a inventory_core::domain::IdempotencyKey,
) -> Cause<'a> {
    Cause::call(caller.as_str(), reason.as_str(), Some(key.as_str()))
}

/// A new receipt: the SKU's row locked (it must exist), the id taken, its units incoming.
async fn expect_receipt(
    tx: &Transaction<'_>,
    command: &ExpectStock,
) -> Result<Result<ReceiptChanged, Error>, Error> {
    let sku = &command.sku;
    let Some(total) = stock::lock(tx, sku).await.map_err(from_db)? else {
        return Ok(Err(Error::UnknownSkus(vec![sku.clone()])));
    };
    let new = Receipt {
        id: command.receipt_id.clone(),
        sku: sku.clone(),
        location: command.location.clone(),
        quantity: command.quantity,
        received: 0,
        preordered: 0,
        expected_at: command.expected_at,
        state: ReceiptState::Open,
        created_at: command.expected_at,
    };
    let Some(receipt) = receipts::insert(tx, &new, command.reason.as_str()).await? else {
        return Ok(Err(Error::ReceiptExists(command.receipt_id.clone())));
    };
    let at = stock::read_at(tx, sku, &command.location)
        .await
        .map_err(from_db)?;
    let decided = rules::expect(&total, at.as_ref(), command);
    let cause = call_cause(&command.caller, &command.reason, &command.idempotency_key);
    let mut record = StateChange::new(MovementKind::ReceiptExpected, cause);
    record.receipt = Some(receipt.id.as_str());
    let moved = write_states(tx, sku, &command.location, at.as_ref(), &decided, &record).await?;
    Ok(Ok(ReceiptChanged {
        level: moved.total,
        receipt,
    }))
}

/// A change of an existing receipt: its SKU's row locked, the receipt read under that lock,
/// the core's decision written with the receipt's new counts.
async fn change_receipt(
    tx: &Transaction<'_>,
    id: &inventory_core::domain::ReceiptId,
    kind: MovementKind,
    cause: Cause<'_>,
    decide: impl FnOnce(
        &StockLevel,
        Option<&StockLevel>,
        &Receipt,
    ) -> Result<(StatesChange, Receipt), Error>,
) -> Result<Result<ReceiptChanged, Error>, Error> {
    // Its SKU never changes, so the unlocked read finds the row to lock.
    let Some(peek) = receipts::read(tx, id).await? else {
        return Ok(Err(Error::UnknownReceipt(id.clone())));
    };
    let total = stock::lock(tx, &peek.sku)
        .await
        .map_err(from_db)?
        .ok_or_else(|| Error::internal("a receipt of a SKU without a stock row"))?;
    let receipt = receipts::read(tx, id)
        .await?
        .ok_or_else(|| Error::internal("a receipt vanished under its SKU's lock"))?;
    let at = stock::read_at(tx, &receipt.sku, &receipt.location)
        .await
        .map_err(from_db)?;
    // A cancel of a cancelled receipt answers it as it is.
    if kind == MovementKind::ReceiptCancelled && receipt.state == ReceiptState::Cancelled {
        let level = stock::worked_out(tx, total).await?;
        return Ok(Ok(ReceiptChanged { receipt, level }));
    }
    let (decided, after) = match decide(&total, at.as_ref(), &receipt) {
        Err(refusal) => return Ok(Err(refusal)),
        Ok(decided) => decided,
    };
    let mut record = StateChange::new(kind, cause);
    record.receipt = Some(receipt.id.as_str());
    // Units that arrived sellable go to the receipt's own pre-orders first; ones that
    // arrived unsellable (into quality control, damaged) fill nothing until they pass.
    if kind == MovementKind::Received && decided.delta.unsellable() == 0 {
        record.received = Some((&receipt.id, after.received - receipt.received));
    }
    // The stock first, and the fill (which unpegs what it fills), then the receipt's counts.
    let moved = write_states(
        tx,
        &receipt.sku,
        &receipt.location,
        at.as_ref(),
        &decided,
        &record,
    )
    .await?;
    receipts::update(tx, &after).await?;
    if kind == MovementKind::ReceiptCancelled {
        at_risk(tx, &receipt.id).await?;
    }
    let receipt = receipts::read(tx, id)
        .await?
        .ok_or_else(|| Error::internal("a receipt vanished under its SKU's lock"))?;
    Ok(Ok(ReceiptChanged {
        receipt,
        level: moved.total,
    }))
}

/// A `RESERVATION_PREORDER_AT_RISK` event for every live hold with units pegged to the
/// cancelled receipt `id`: they keep waiting, and the order service decides.
async fn at_risk(tx: &Transaction<'_>, id: &ReceiptId) -> Result<(), Error> {
    let holds = reservations::pegged_to(tx, id).await?;
    let events: Vec<_> = holds
        .iter()
        .map(|r| (ReservationEvent::PreorderAtRisk, r, Vec::new()))
        .collect();
    outbox::append_reservation_events(tx, &events)
        .await
        .map_err(from_db)?;
    Ok(())
}

/// What a change of states records besides its levels: its kind and cause, and for a state
/// move its units and states.
pub(crate) struct StateChange<'a> {
    pub kind: MovementKind,
    pub cause: Cause<'a>,
    pub moved: (
        i64,
        Option<inventory_core::domain::StockState>,
        Option<inventory_core::domain::StockState>,
    ),
    pub receipt: Option<&'a str>,
    /// Units of this receipt just received: its pre-orders are filled first.
    pub received: Option<(&'a ReceiptId, i64)>,
}

impl<'a> StateChange<'a> {
    pub fn new(kind: MovementKind, cause: Cause<'a>) -> Self {
        Self {
            kind,
            cause,
            moved: (0, None, None),
            receipt: None,
            received: None,
        }
    }
}

/// Locks the SKU's row, reads its row at `location`, lets `decide` judge, and writes what it
/// decided (see [`write_states`]). `None` from `decide`: nothing to change, and the total
/// is answered as it is. An unknown SKU is refused.
pub(crate) async fn change_states(
    tx: &Transaction<'_>,
    sku: &Sku,
    location: &LocationId,
    decide: impl FnOnce(&StockLevel, Option<&StockLevel>) -> Result<Option<StatesChange>, Error>,
    record: StateChange<'_>,
) -> Result<Result<StockLevel, Error>, Error> {
    let Some(total) = stock::lock(tx, sku).await.map_err(from_db)? else {
        return Ok(Err(Error::UnknownSkus(vec![sku.clone()])));
    };
    let at = stock::read_at(tx, sku, location).await.map_err(from_db)?;
    let decided = match decide(&total, at.as_ref()) {
        Err(refusal) => return Ok(Err(refusal)),
        Ok(None) => return Ok(Ok(stock::worked_out(tx, total).await?)),
        Ok(Some(decided)) => decided,
    };
    let moved = write_states(tx, sku, location, at.as_ref(), &decided, &record).await?;
    Ok(Ok(moved.total))
}

/// Writes a decided change of a locked SKU's states at `location` (whose row was `at`,
/// given one first if it had none): the move (`on_hand` by the location's change, the
/// states by the decided delta), the movement and the event.
pub(crate) async fn write_states(
    tx: &Transaction<'_>,
    sku: &Sku,
    location: &LocationId,
    at: Option<&StockLevel>,
    decided: &StatesChange,
    record: &StateChange<'_>,
) -> Result<Moved, Error> {
    if at.is_none() {
        stock::add_location(tx, sku, location)
            .await
            .map_err(from_db)?;
    }
    let on_hand = decided.on_hand(at);
    let moves = [StockMove {
        sku,
        location,
        on_hand,
        reserved: 0,
        states: decided.delta,
    }];
    let moved = stock::apply(tx, &moves, &[], true).await?.remove(0);
    debug_assert_eq!(
        (&moved.total.summed(), &moved.level),
        (&decided.total, &decided.at),
        "the stored levels are the decided ones"
    );
    record_state_change(tx, &moved, on_hand, decided.delta, record).await?;
    // Units that arrived, passed out of quality control or left the safety stock go to the
    // holds waiting there; the answer is the total after them.
    let filled = super::fill::fill(
        tx,
        std::slice::from_ref(&moved.level),
        record.received,
        record.cause,
    )
    .await?;
    Ok(Moved {
        total: super::fill::after_fills(moved.total, &filled),
        level: moved.level,
        active: moved.active,
    })
}

/// The movement and the `STOCK_STATE_CHANGED` event of one change of states.
pub(crate) async fn record_state_change(
    tx: &Transaction<'_>,
    moved: &Moved,
    on_hand: i64,
    delta: inventory_core::domain::States,
    record: &StateChange<'_>,
) -> Result<(), Error> {
    let (quantity, from, to) = record.moved;
    let mut payload = json!({
        "kind": record.kind.as_str(),
        "reason": record.cause.reason,
        "level": outbox::level_payload(&moved.total),
        "location": outbox::level_payload(&moved.level),
    });
    if quantity != 0 {
        payload["quantity"] = json!(quantity);
    }
    if let Some(from) = from {
        payload["from"] = json!(from.as_str());
    }
    if let Some(to) = to {
        payload["to"] = json!(to.as_str());
    }
    if let Some(receipt) = record.receipt {
        payload["receipt_id"] = json!(receipt);
    }
    outbox::append_sku_event(tx, outbox::STOCK_STATE_CHANGED, &moved.total.sku, &payload)
        .await
        .map_err(from_db)?;
    let mut movement = NewMovement::new(record.kind, moved, on_hand, 0)
        .with_states(delta)
        .because(record.cause);
    if let Some(receipt) = record.receipt {
        movement = movement.of_receipt(receipt);
    }
    ledger::append(tx, &[movement]).await.map_err(from_db)
}

/// A stored `STOCK_STATE_CHANGED` payload, read back.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct StateChangedPayload {
    kind: String,
    #[serde(default)]
    reason: String,
    level: serde_json::Value,
    location: serde_json::Value,
    #[serde(default)]
    quantity: i64,
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    to: Option<String>,
    #[serde(default)]
    receipt_id: Option<String>,
}

impl StateChangedPayload {
    /// The change, its levels read by `level`.
    pub(crate) fn change(
        self,
        sku: Sku,
        level: impl Fn(serde_json::Value) -> Result<StockLevel, String>,
    ) -> Result<Change, String> {
        let state = |raw: Option<String>| {
            raw.map(|raw| {
                inventory_core::domain::StockState::parse(&raw)
                    .ok_or_else(|| format!("unknown stock state {raw:?}"))
            })
            .transpose()
        };
        Ok(Change::StockStateChanged {
            sku,
            kind: MovementKind::parse(&self.kind)
                .ok_or_else(|| format!("unknown movement kind {:?}", self.kind))?,
            reason: self.reason,
            level: level(self.level)?,
            location_level: level(self.location)?,
            quantity: self.quantity,
            from: state(self.from)?,
            to: state(self.to)?,
            receipt_id: self.receipt_id,
        })
    }
}
