//! Parsed requests. Each mutating command carries the fingerprint that idempotency compares:
//! a key replayed with a request of a different fingerprint is refused, never executed.

use std::time::SystemTime;

use sha2::{Digest, Sha256};

use crate::domain::{
    AllocationPolicy, AllocationStrategy, Caller, IdempotencyKey, Line, LocationId, OrderId,
    Reason, Receipt, ReceiptId, Reservation, ReservationId, ReservationState, Scope, Sku,
    StockDelta, StockLevel, StockState, Ttl, micros,
};

/// SHA-256 over a canonical encoding of a command (operation name and every field that
/// changes its meaning), so that equal requests, and only they, share a fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// Builds a fingerprint from length-prefixed fields, so that ("ab", "c") and ("a", "bc")
/// never collide.
#[derive(Debug)]
struct FingerprintBuilder(Sha256);

impl FingerprintBuilder {
    fn new(operation: &str) -> Self {
        let mut builder = Self(Sha256::new());
        builder.field(operation.as_bytes());
        builder
    }

    fn field(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.update((bytes.len() as u64).to_be_bytes());
        self.0.update(bytes);
        self
    }

    fn finish(self) -> Fingerprint {
        Fingerprint(self.0.finalize().into())
    }
}

/// Add (positive delta) or remove units of one SKU.
#[derive(Clone, Debug)]
pub struct AdjustStock {
    /// Scopes the idempotency key; not part of the fingerprint.
    pub caller: Caller,
    pub sku: Sku,
    pub delta: StockDelta,
    pub idempotency_key: IdempotencyKey,
    pub reason: Reason,
    /// Only while the SKU is at this version (0: it does not exist yet).
    pub expected_version: Option<i64>,
    /// Where the units change (`default` unless the request names one).
    pub location: LocationId,
    /// The state of the units added or removed (`None`: sellable).
    pub state: Option<StockState>,
}

/// A state other than the default joins a fingerprint, so keys stored before states
/// existed still replay.
fn state_field(builder: &mut FingerprintBuilder, state: Option<StockState>) {
    if let Some(state) = state {
        builder.field(b"state").field(state.as_str().as_bytes());
    }
}

/// A location other than `default` joins a fingerprint; `default` leaves it as it was before
/// locations existed, so keys stored by an earlier version of the service still replay.
fn location_field(builder: &mut FingerprintBuilder, location: &LocationId) {
    if location.as_str() != LocationId::DEFAULT {
        builder
            .field(b"location")
            .field(location.as_str().as_bytes());
    }
}

impl AdjustStock {
    /// A request without an expected version has the fingerprint it always had, so a key
    /// stored by an earlier version of the service still replays.
    pub fn fingerprint(&self) -> Fingerprint {
        let mut builder = FingerprintBuilder::new("AdjustStock");
        builder
            .field(self.sku.as_str().as_bytes())
            .field(&self.delta.get().to_be_bytes())
            .field(self.reason.as_str().as_bytes());
        if let Some(version) = self.expected_version {
            builder.field(&version.to_be_bytes());
        }
        location_field(&mut builder, &self.location);
        state_field(&mut builder, self.state);
        builder.finish()
    }
}

/// Set a SKU's `on_hand` to an absolute count.
#[derive(Clone, Debug)]
pub struct SetStock {
    /// Scopes the idempotency key; not part of the fingerprint.
    pub caller: Caller,
    pub sku: Sku,
    /// 0 to [`MAX_ON_HAND`](crate::domain::MAX_ON_HAND).
    pub on_hand: i64,
    /// Only while the SKU is at this version (0: it does not exist yet).
    pub expected_version: Option<i64>,
    pub idempotency_key: IdempotencyKey,
    pub reason: Reason,
    /// The location counted (`default` unless the request names one).
    pub location: LocationId,
    /// `None`: `on_hand` is the location's whole count. A state: the count of the units in
    /// that state (sellable: `on_hand` less the unsellable units), and `on_hand` moves by the
    /// difference.
    pub state: Option<StockState>,
}

impl SetStock {
    pub fn fingerprint(&self) -> Fingerprint {
        let mut builder = FingerprintBuilder::new("SetStock");
        builder
            .field(self.sku.as_str().as_bytes())
            .field(&self.on_hand.to_be_bytes())
            .field(self.reason.as_str().as_bytes())
            .field(&self.expected_version.map_or(-1, |v| v).to_be_bytes());
        location_field(&mut builder, &self.location);
        state_field(&mut builder, self.state);
        builder.finish()
    }
}

/// Set a (SKU, location)'s policy: what it keeps back from sale and how far it may be
/// backordered. `None` leaves a value as it is.
#[derive(Clone, Debug)]
pub struct SetStockPolicy {
    /// Scopes the idempotency key; not part of the fingerprint.
    pub caller: Caller,
    pub sku: Sku,
    pub location: LocationId,
    pub safety_stock: Option<i64>,
    pub backorder_limit: Option<i64>,
    pub idempotency_key: IdempotencyKey,
    pub reason: Reason,
}

impl SetStockPolicy {
    pub fn fingerprint(&self) -> Fingerprint {
        let mut builder = FingerprintBuilder::new("SetStockPolicy");
        builder
            .field(self.sku.as_str().as_bytes())
            .field(self.location.as_str().as_bytes())
            .field(&self.safety_stock.unwrap_or(-1).to_be_bytes())
            .field(&self.backorder_limit.unwrap_or(-1).to_be_bytes())
            .field(self.reason.as_str().as_bytes());
        builder.finish()
    }
}

/// Move units of a SKU at a location from one state to another; `on_hand` stays.
#[derive(Clone, Debug)]
pub struct MoveStockState {
    /// Scopes the idempotency key; not part of the fingerprint.
    pub caller: Caller,
    pub sku: Sku,
    pub location: LocationId,
    /// 1 to [`MAX_DELTA`](crate::domain::MAX_DELTA).
    pub quantity: i64,
    pub from: StockState,
    /// Never `from`.
    pub to: StockState,
    pub idempotency_key: IdempotencyKey,
    pub reason: Reason,
}

impl MoveStockState {
    pub fn fingerprint(&self) -> Fingerprint {
        let mut builder = FingerprintBuilder::new("MoveStockState");
        builder
            .field(self.sku.as_str().as_bytes())
            .field(self.location.as_str().as_bytes())
            .field(&self.quantity.to_be_bytes())
            .field(self.from.as_str().as_bytes())
            .field(self.to.as_str().as_bytes())
            .field(self.reason.as_str().as_bytes());
        builder.finish()
    }
}

/// Record an incoming receipt: `quantity` units of a SKU expected at a location.
#[derive(Clone, Debug)]
pub struct ExpectStock {
    /// Scopes the idempotency key; not part of the fingerprint.
    pub caller: Caller,
    pub receipt_id: ReceiptId,
    pub sku: Sku,
    pub location: LocationId,
    /// 1 to [`MAX_DELTA`](crate::domain::MAX_DELTA).
    pub quantity: i64,
    pub expected_at: SystemTime,
    pub idempotency_key: IdempotencyKey,
    pub reason: Reason,
}

impl ExpectStock {
    pub fn fingerprint(&self) -> Fingerprint {
        let mut builder = FingerprintBuilder::new("ExpectStock");
        builder
            .field(self.receipt_id.as_str().as_bytes())
            .field(self.sku.as_str().as_bytes())
            .field(self.location.as_str().as_bytes())
            .field(&self.quantity.to_be_bytes())
            .field(&micros(self.expected_at).to_be_bytes())
            .field(self.reason.as_str().as_bytes());
        builder.finish()
    }
}

/// Units of a receipt arrived: from `incoming` to `on_hand`.
#[derive(Clone, Debug)]
pub struct ReceiveStock {
    /// Scopes the idempotency key; not part of the fingerprint.
    pub caller: Caller,
    pub receipt_id: ReceiptId,
    /// 1 to [`MAX_DELTA`](crate::domain::MAX_DELTA).
    pub quantity: i64,
    pub idempotency_key: IdempotencyKey,
    pub reason: Reason,
    /// The state the units arrive in (`None`: sellable).
    pub state: Option<crate::domain::StockState>,
}

impl ReceiveStock {
    /// Covers the receipt, the units, the reason and (when not sellable) their state: a
    /// receive stored before states could be named keeps its fingerprint.
    pub fn fingerprint(&self) -> Fingerprint {
        let mut builder = FingerprintBuilder::new("ReceiveStock");
        builder
            .field(self.receipt_id.as_str().as_bytes())
            .field(&self.quantity.to_be_bytes())
            .field(self.reason.as_str().as_bytes());
        if let Some(state) = self.state {
            builder.field(state.as_str().as_bytes());
        }
        builder.finish()
    }
}

/// A receipt will not bring what it has still to bring.
#[derive(Clone, Debug)]
pub struct CancelReceipt {
    /// Scopes the idempotency key; not part of the fingerprint.
    pub caller: Caller,
    pub receipt_id: ReceiptId,
    pub idempotency_key: IdempotencyKey,
    pub reason: Reason,
}

impl CancelReceipt {
    pub fn fingerprint(&self) -> Fingerprint {
        let mut builder = FingerprintBuilder::new("CancelReceipt");
        builder
            .field(self.receipt_id.as_str().as_bytes())
            .field(self.reason.as_str().as_bytes());
        builder.finish()
    }
}

/// A page of receipts (of one SKU, or all), by id.
#[derive(Clone, Debug)]
pub struct ListReceipts {
    pub sku: Option<Sku>,
    pub page_size: usize,
    /// Resume after this id (from the previous page's token).
    pub after: Option<ReceiptId>,
}

/// One page of receipts, and the id the next one starts after.
#[derive(Clone, Debug)]
pub struct ReceiptPage {
    pub receipts: Vec<Receipt>,
    pub next: Option<ReceiptId>,
}

/// A page of receipts as answered: the token of the next page is empty on the last.
#[derive(Clone, Debug)]
pub struct ReceiptList {
    pub receipts: Vec<Receipt>,
    pub next_page_token: String,
}

/// A receipt after a change, and the SKU's total after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceiptChanged {
    pub receipt: Receipt,
    pub level: StockLevel,
}

/// Move available units of a SKU between two distinct locations.
#[derive(Clone, Debug)]
pub struct TransferStock {
    /// Scopes the idempotency key; not part of the fingerprint.
    pub caller: Caller,
    pub sku: Sku,
    pub from: LocationId,
    pub to: LocationId,
    /// 1 to [`MAX_DELTA`](crate::domain::MAX_DELTA).
    pub quantity: i64,
    pub idempotency_key: IdempotencyKey,
    pub reason: Reason,
}

impl TransferStock {
    pub fn fingerprint(&self) -> Fingerprint {
        let mut builder = FingerprintBuilder::new("TransferStock");
        builder
            .field(self.sku.as_str().as_bytes())
            .field(self.from.as_str().as_bytes())
            .field(self.to.as_str().as_bytes())
            .field(&self.quantity.to_be_bytes())
            .field(self.reason.as_str().as_bytes());
        builder.finish()
    }
}

/// A transfer's outcome: the SKU's total and both locations' levels (from, then to).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transferred {
    pub total: crate::domain::StockLevel,
    pub from: crate::domain::StockLevel,
    pub to: crate::domain::StockLevel,
}

/// Most counts one `BatchSetStock` may carry.
pub const MAX_BATCH_COUNTS: usize = 1_000;

/// Up to [`MAX_BATCH_COUNTS`] counts of distinct SKUs, all or none, under one key (each
/// count's own key is the batch's).
#[derive(Clone, Debug)]
pub struct BatchSetStock {
    /// Scopes the idempotency key; not part of the fingerprint.
    pub caller: Caller,
    pub idempotency_key: IdempotencyKey,
    pub counts: Vec<SetStock>,
}

impl BatchSetStock {
    pub fn fingerprint(&self) -> Fingerprint {
        let mut builder = FingerprintBuilder::new("BatchSetStock");
        for count in &self.counts {
            builder.field(count.fingerprint().as_bytes());
        }
        builder.finish()
    }
}

/// A page of a SKU's movements, in version order.
#[derive(Clone, Debug)]
pub struct ListStockMovements {
    pub sku: Sku,
    /// The request's `after_version`: what page tokens are bound to.
    pub after_version: i64,
    /// Where this page starts: movements with a version above this one (`after_version`, or
    /// the last version of the previous page).
    pub cursor: i64,
    /// 1 to [`MAX_PAGE_SIZE`].
    pub page_size: usize,
}

/// One page of movements, and the version the next page starts after (`None`: the last).
#[derive(Clone, Debug)]
pub struct MovementPage {
    pub movements: Vec<crate::domain::Movement>,
    pub next: Option<i64>,
}

/// A page of movements as the caller gets it.
#[derive(Clone, Debug)]
pub struct MovementList {
    pub movements: Vec<crate::domain::Movement>,
    pub next_page_token: String,
}

/// Page tokens of `ListStockMovements`: the last version listed, bound to the SKU and the
/// `after_version` the listing began with, with a checksum.
pub mod movement_token {
    use super::*;

    const VERSION: u8 = 1;
    const LEN: usize = 1 + 8 + 8 + 8;

    fn binding(sku: &Sku, after_version: i64) -> [u8; 8] {
        let mut builder = FingerprintBuilder::new("ListStockMovements");
        builder
            .field(sku.as_str().as_bytes())
            .field(&after_version.to_be_bytes());
        let full = builder.finish();
        let mut short = [0; 8];
        short.copy_from_slice(&full.as_bytes()[..8]);
        short
    }

    pub fn encode(last_version: i64, sku: &Sku, after_version: i64) -> String {
        let mut body = Vec::with_capacity(LEN - 8);
        body.push(VERSION);
        body.extend_from_slice(&last_version.to_be_bytes());
        body.extend_from_slice(&binding(sku, after_version));
        page_token::seal(body)
    }

    /// The last version listed, for a token issued for this SKU and `after_version`.
    pub fn decode(token: &str, sku: &Sku, after_version: i64) -> Result<i64, String> {
        let body = page_token::open(token, LEN, VERSION)?;
        if body[9..17] != binding(sku, after_version) {
            return Err("belongs to a request with other filters".into());
        }
        Ok(i64::from_be_bytes(body[1..9].try_into().expect("8 bytes")))
    }
}

/// The page token of `ListReceipts`: the last receipt id listed, bound to the SKU filter it
/// was issued for.
pub mod receipt_token {
    use super::*;

    const VERSION: u8 = 1;
    const ID: usize = 64;
    const LEN: usize = 1 + 1 + ID + 8 + 8;

    fn binding(sku: Option<&Sku>) -> [u8; 8] {
        let mut builder = FingerprintBuilder::new("ListReceipts");
        builder.field(sku.map_or("", Sku::as_str).as_bytes());
        let full = builder.finish();
        let mut short = [0; 8];
        short.copy_from_slice(&full.as_bytes()[..8]);
        short
    }

    pub fn encode(last: &ReceiptId, sku: Option<&Sku>) -> String {
        let id = last.as_str().as_bytes();
        let mut body = Vec::with_capacity(LEN - 8);
        body.push(VERSION);
        body.push(id.len() as u8);
        body.extend_from_slice(id);
        body.resize(2 + ID, 0);
        body.extend_from_slice(&binding(sku));
        page_token::seal(body)
    }

    /// The last receipt listed, for a token issued for this SKU filter.
    pub fn decode(token: &str, sku: Option<&Sku>) -> Result<ReceiptId, String> {
        let body = page_token::open(token, LEN, VERSION)?;
        if body[2 + ID..] != binding(sku) {
            return Err("belongs to a request with other filters".into());
        }
        let len = usize::from(body[1]).min(ID);
        let raw = std::str::from_utf8(&body[2..2 + len]).map_err(|e| e.to_string())?;
        ReceiptId::parse(raw)
    }
}

/// Read the levels of distinct SKUs, answered in request order.
#[derive(Clone, Debug)]
pub struct GetStock {
    skus: Vec<Sku>,
    /// Also read each SKU's level per location.
    pub by_location: bool,
}

/// What a `GetStock` answers: the totals in request order and, when asked, the levels per
/// location (by SKU in request order, then location id).
#[derive(Clone, Debug, Default)]
pub struct StockLevels {
    pub totals: Vec<crate::domain::StockLevel>,
    pub by_location: Vec<crate::domain::StockLevel>,
    /// Per total, then per location level (in the same orders): what may be promised by
    /// each date open receipts are expected on (see
    /// [`available_to_promise`](crate::rules::available_to_promise)).
    pub promises: Vec<Vec<Promise>>,
    pub location_promises: Vec<Vec<Promise>>,
}

/// One step of `available_to_promise`: from `at` on, `units` may be promised (over any
/// number of orders), and one line of a Reserve may get `one_line` of them (a pre-order
/// waits for one receipt, never several, so it may be fewer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Promise {
    pub at: SystemTime,
    pub units: i64,
    pub one_line: i64,
}

impl GetStock {
    /// `skus` must be non-empty, distinct and at most
    /// [`MAX_SKUS_PER_READ`](crate::domain::MAX_SKUS_PER_READ); the boundary checks this and
    /// reports each offending field, so here it is only asserted.
    pub fn new(skus: Vec<Sku>) -> Self {
        debug_assert!(!skus.is_empty() && skus.len() <= crate::domain::MAX_SKUS_PER_READ);
        Self {
            skus,
            by_location: false,
        }
    }

    pub fn skus(&self) -> &[Sku] {
        &self.skus
    }
}

/// Hold stock for every line of an order, all lines or none.
#[derive(Clone, Debug)]
pub struct Reserve {
    /// Scopes the idempotency key; not part of the fingerprint.
    pub caller: Caller,
    pub idempotency_key: IdempotencyKey,
    pub order_id: OrderId,
    lines: Vec<Line>,
    /// `None`: the service's default hold.
    pub ttl: Option<Ttl>,
    /// How lines that do not pin a location are placed.
    pub allocation: AllocationPolicy,
}

impl Reserve {
    /// `lines` must be non-empty, at most [`MAX_LINES`](crate::domain::MAX_LINES), with
    /// distinct SKUs; the boundary checks and reports each offending field.
    pub fn new(
        caller: Caller,
        idempotency_key: IdempotencyKey,
        order_id: OrderId,
        lines: Vec<Line>,
        ttl: Option<Ttl>,
    ) -> Self {
        debug_assert!(!lines.is_empty() && lines.len() <= crate::domain::MAX_LINES);
        Self {
            caller,
            idempotency_key,
            order_id,
            lines,
            ttl,
            allocation: AllocationPolicy::default(),
        }
    }

    /// The same request, placed by `policy`.
    pub fn with_allocation(mut self, policy: AllocationPolicy) -> Self {
        self.allocation = policy;
        self
    }

    /// The lines in request order.
    pub fn lines(&self) -> &[Line] {
        &self.lines
    }

    /// The lines ordered by SKU: the order every lock and lease is taken in, so two carts
    /// with the same SKUs in opposite orders never wait on each other in a cycle.
    pub fn lines_by_sku(&self) -> Vec<&Line> {
        let mut lines: Vec<&Line> = self.lines.iter().collect();
        lines.sort_by(|a, b| a.sku.cmp(&b.sku));
        lines
    }

    /// Covers the order, the lines as a set (their order does not change the request), the
    /// requested hold and how lines are placed. A request with no pinned line and the
    /// default placement has the fingerprint it had before locations existed.
    pub fn fingerprint(&self) -> Fingerprint {
        let mut builder = FingerprintBuilder::new("Reserve");
        builder.field(self.order_id.as_str().as_bytes());
        for line in self.lines_by_sku() {
            builder
                .field(line.sku.as_str().as_bytes())
                .field(&line.quantity.get().to_be_bytes());
            if let Some(location) = &line.location {
                builder.field(b"pin").field(location.as_str().as_bytes());
            }
        }
        let ttl_nanos = self.ttl.map_or(0, |ttl| ttl.get().as_nanos());
        builder.field(&ttl_nanos.to_be_bytes());
        if self.allocation != AllocationPolicy::default() {
            let strategy: &[u8] = match self.allocation.strategy {
                AllocationStrategy::Priority => b"priority",
                AllocationStrategy::MostAvailable => b"most-available",
            };
            builder
                .field(strategy)
                .field(&[u8::from(self.allocation.allow_split)]);
            // Only when asked: keys stored before stock states still replay.
            if self.allocation.may_wait() {
                builder.field(b"wait").field(&[
                    u8::from(self.allocation.allow_backorder),
                    u8::from(self.allocation.allow_preorder),
                ]);
            }
        }
        builder.finish()
    }
}

/// Names one reservation (confirm, release, read), as seen by one caller.
#[derive(Clone, Debug)]
pub struct ReservationRef {
    pub id: ReservationId,
    /// Whose reservations the call may touch. A reservation outside the scope is treated
    /// exactly like one that does not exist.
    pub scope: Scope,
}

impl ReservationRef {
    pub fn new(id: ReservationId, scope: Scope) -> Self {
        Self { id, scope }
    }
}

/// Settling held units: confirming them (they leave the stock) or releasing them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    Confirm,
    Release,
}

/// Confirm or release a reservation's held units: all of them, or only `lines`.
#[derive(Clone, Debug)]
pub struct SettleReservation {
    pub target: ReservationRef,
    pub settle: Settle,
    /// Empty: every unit still held. Otherwise distinct SKUs, in request order.
    pub lines: Vec<Line>,
    /// Required with `lines` (the boundary checks it): repeating a partial call must not act
    /// twice.
    pub idempotency_key: Option<IdempotencyKey>,
    /// Scopes the idempotency key; not part of the fingerprint.
    pub caller: Caller,
}

impl SettleReservation {
    /// The name idempotency records carry.
    pub fn operation(&self) -> &'static str {
        match self.settle {
            Settle::Confirm => "ConfirmReservation",
            Settle::Release => "ReleaseReservation",
        }
    }

    /// Covers the reservation and the lines as a set.
    pub fn fingerprint(&self) -> Fingerprint {
        let mut builder = FingerprintBuilder::new(self.operation());
        builder.field(self.target.id.as_uuid().as_bytes());
        let mut lines: Vec<&Line> = self.lines.iter().collect();
        lines.sort_by(|a, b| (&a.sku, &a.location).cmp(&(&b.sku, &b.location)));
        for line in lines {
            builder
                .field(line.sku.as_str().as_bytes())
                .field(&line.quantity.get().to_be_bytes());
            if let Some(location) = &line.location {
                builder.field(b"at").field(location.as_str().as_bytes());
            }
        }
        builder.finish()
    }
}

/// Cancel an order for good: release every held unit of its reservations and refuse every
/// later `Reserve` for it, including one already in flight.
#[derive(Clone, Debug)]
pub struct CancelOrder {
    /// Whose order: the caller's own, or for `Scope::All` (admin) every caller's.
    pub scope: Scope,
    /// Scopes the idempotency key; not part of the fingerprint.
    pub caller: Caller,
    pub order_id: OrderId,
    pub idempotency_key: IdempotencyKey,
    pub reason: Reason,
}

impl CancelOrder {
    pub fn fingerprint(&self) -> Fingerprint {
        let mut builder = FingerprintBuilder::new("CancelOrder");
        builder
            .field(self.order_id.as_str().as_bytes())
            .field(self.reason.as_str().as_bytes());
        builder.finish()
    }
}

/// Move a live hold's expiry to `ttl` after the moment the change is made.
#[derive(Clone, Debug)]
pub struct ExtendReservation {
    pub target: ReservationRef,
    pub ttl: Ttl,
}

/// The default and the largest page of `ListReservations`.
pub const DEFAULT_PAGE_SIZE: usize = 50;
pub const MAX_PAGE_SIZE: usize = 500;

/// Which reservations a `ListReservations` asks for: every filter set must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReservationFilter {
    pub order_id: Option<OrderId>,
    /// The state as every reader sees it (a hold past its expiry is `Expired`).
    pub state: Option<ReservationState>,
    /// Reservations with a line of this SKU.
    pub sku: Option<Sku>,
}

impl ReservationFilter {
    /// What a page token is bound to: the filters, and whose reservations they reach.
    fn fingerprint(&self, scope: &Scope) -> [u8; 8] {
        let mut builder = FingerprintBuilder::new("ListReservations");
        let text = |value: Option<&str>| value.unwrap_or("\u{0}").as_bytes().to_vec();
        builder
            .field(&text(scope.owner().map(Caller::as_str)))
            .field(&text(self.order_id.as_ref().map(OrderId::as_str)))
            .field(&text(self.state.map(|s| s.as_str())))
            .field(&text(self.sku.as_ref().map(Sku::as_str)));
        let full = builder.finish();
        let mut short = [0; 8];
        short.copy_from_slice(&full.as_bytes()[..8]);
        short
    }
}

/// Where a page ended: the last reservation listed, in listing order (creation, then id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    pub created_at: SystemTime,
    pub id: ReservationId,
}

/// A page of reservations, in creation order (then id), and where the next one starts.
#[derive(Clone, Debug)]
pub struct ListReservations {
    pub scope: Scope,
    pub filter: ReservationFilter,
    /// 1 to [`MAX_PAGE_SIZE`].
    pub page_size: usize,
    /// `None`: from the first.
    pub after: Option<Cursor>,
}

/// One page, and the cursor to ask for the next with (`None`: this was the last).
#[derive(Clone, Debug)]
pub struct ReservationPage {
    pub reservations: Vec<Reservation>,
    pub next: Option<Cursor>,
}

/// A page as the caller gets it: the token of the next page is empty on the last one.
#[derive(Clone, Debug)]
pub struct ReservationList {
    pub reservations: Vec<Reservation>,
    pub next_page_token: String,
}

/// Opaque page tokens: the cursor, bound to the filters and scope it was issued for, with a
/// checksum, so a token of other filters, or a damaged or made-up one, is refused rather than
/// silently listing something else. Not secret (the checksum has no key): a forged token can
/// only move where the caller's own listing starts.
pub mod page_token {
    use super::*;

    const VERSION: u8 = 1;
    const LEN: usize = 1 + 8 + 16 + 8 + 8;

    pub fn encode(cursor: &Cursor, filter: &ReservationFilter, scope: &Scope) -> String {
        let micros = crate::domain::micros(cursor.created_at);
        let mut body = Vec::with_capacity(LEN - 8);
        body.push(VERSION);
        body.extend_from_slice(&micros.to_be_bytes());
        body.extend_from_slice(cursor.id.as_uuid().as_bytes());
        body.extend_from_slice(&filter.fingerprint(scope));
        seal(body)
    }

    /// The cursor of a token issued for these filters and scope.
    pub fn decode(
        token: &str,
        filter: &ReservationFilter,
        scope: &Scope,
    ) -> Result<Cursor, String> {
        let body = open(token, LEN, VERSION)?;
        if body[25..33] != filter.fingerprint(scope) {
            return Err("belongs to a request with other filters".into());
        }
        let micros = i64::from_be_bytes(body[1..9].try_into().expect("8 bytes"));
        let id = uuid::Uuid::from_slice(&body[9..25]).map_err(|_| INVALID.to_string())?;
        Ok(Cursor {
            created_at: crate::domain::from_micros(micros),
            id: ReservationId::from_uuid(id),
        })
    }

    const INVALID: &str = "is not a page token issued for this request";

    /// A token's text: `body` (its format version first) and a checksum, in hex.
    pub(super) fn seal(mut body: Vec<u8>) -> String {
        let sum = checksum(&body);
        body.extend_from_slice(&sum);
        body.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The body of a token of `len` bytes (checksum included) in format `version`, if the
    /// checksum holds.
    pub(super) fn open(token: &str, len: usize, version: u8) -> Result<Vec<u8>, String> {
        if token.len() != len * 2 || !token.is_ascii() {
            return Err(INVALID.into());
        }
        let mut bytes: Vec<u8> = (0..len)
            .map(|i| u8::from_str_radix(&token[2 * i..2 * i + 2], 16))
            .collect::<Result<_, _>>()
            .map_err(|_| INVALID.to_string())?;
        let sum = bytes.split_off(len - 8);
        if sum != checksum(&bytes) || bytes[0] != version {
            return Err(INVALID.into());
        }
        Ok(bytes)
    }

    fn checksum(body: &[u8]) -> [u8; 8] {
        let mut builder = FingerprintBuilder::new("PageToken");
        builder.field(body);
        let full = builder.finish();
        let mut short = [0; 8];
        short.copy_from_slice(&full.as_bytes()[..8]);
        short
    }
}

/// Follow the event stream from a cursor.
#[derive(Clone, Debug)]
pub struct WatchEvents {
    /// Events with a position above this one are sent; 0 starts from the oldest kept.
    pub after: i64,
    /// The epoch `after` belongs to (the one of the event read last); `None` from clients
    /// that do not send it.
    pub epoch: Option<crate::events::EpochId>,
    /// Only the events it passes, with heartbeats; `None`: every event, no heartbeats.
    pub filter: Option<crate::events::EventFilter>,
    /// Read this subscription (its cursor and filter) instead.
    pub subscription: Option<crate::events::SubscriptionName>,
}

impl WatchEvents {
    pub fn parse(after: i64) -> Result<Self, String> {
        if after < 0 {
            return Err("must not be negative".into());
        }
        Ok(Self {
            after,
            epoch: None,
            filter: None,
            subscription: None,
        })
    }
}

#[cfg(test)]
mod tests;
