//! Requests in: raw protobuf becomes a core command here, or an `INVALID_ARGUMENT` listing
//! every offending field at once. Nothing past this module sees an unchecked value.

use std::collections::HashMap;

use std::time::{Duration, SystemTime};

use inventory_core::{
    Error, FieldViolation,
    command::{
        AdjustStock, BatchSetStock, CancelOrder, CancelReceipt, DEFAULT_PAGE_SIZE, ExpectStock,
        ExtendReservation, GetStock, ListReceipts, ListReservations, ListStockMovements,
        MAX_BATCH_COUNTS, MAX_PAGE_SIZE, MoveStockState, ReceiveStock, ReservationFilter,
        ReservationRef, Reserve, SetStock, SetStockPolicy, Settle, SettleReservation,
        TransferStock, movement_token, page_token, receipt_token,
    },
    domain::{
        AllocationPolicy, AllocationStrategy, IdempotencyKey, Line, Location, LocationId,
        MAX_DELTA, MAX_LINES, MAX_ON_HAND, MAX_SKUS_PER_READ, OrderId, Quantity, Reason, ReceiptId,
        ReservationId, ReservationState, Scope, Sku, StockDelta, StockState, Ttl,
    },
};

use crate::{auth::Principal, proto};

/// A request that becomes a core command, for the caller who sent it: the caller scopes
/// idempotency keys, and decides which reservations a reference may reach.
pub trait Decode {
    type Command;

    fn into_command(self, who: &Principal) -> Result<Self::Command, Error>;
}

/// Collects field violations while a request is parsed.
#[derive(Debug, Default)]
pub(super) struct Violations(Vec<FieldViolation>);

impl Violations {
    pub(super) fn check<T>(
        &mut self,
        field: impl Into<String>,
        parsed: Result<T, String>,
    ) -> Option<T> {
        parsed
            .map_err(|description| self.0.push(FieldViolation::new(field, description)))
            .ok()
    }

    pub(super) fn add(&mut self, field: impl Into<String>, description: impl Into<String>) {
        self.0.push(FieldViolation::new(field, description));
    }

    /// Builds the command only if no violation was recorded (so constructors may assume a
    /// valid request), and reports every violation otherwise.
    pub(super) fn finish<T>(self, build: impl FnOnce() -> Option<T>) -> Result<T, Error> {
        if !self.0.is_empty() {
            return Err(Error::InvalidArgument(self.0));
        }
        build().ok_or_else(|| Error::internal("a request without violations did not parse"))
    }
}

impl Decode for proto::AdjustStockRequest {
    type Command = AdjustStock;

    fn into_command(self, who: &Principal) -> Result<AdjustStock, Error> {
        let request = self;
        let mut violations = Violations::default();
        let sku = violations.check("sku", Sku::parse(&request.sku));
        let delta = violations.check("delta", StockDelta::parse(request.delta));
        let idempotency_key = violations.check(
            "idempotency_key",
            IdempotencyKey::parse(&request.idempotency_key),
        );
        let reason = violations.check("reason", Reason::parse(&request.reason));
        let expected_version = expected_version(&mut violations, request.expected_version);
        let location = location_or_default(&mut violations, "location_id", &request.location_id);
        let state = stock_state(&mut violations, "state", request.state, true);
        violations.finish(|| {
            Some(AdjustStock {
                caller: who.caller().clone(),
                sku: sku?,
                delta: delta?,
                idempotency_key: idempotency_key?,
                reason: reason?,
                expected_version: expected_version?,
                location: location?,
                // Unset and SELLABLE mean the same here: one fingerprint for both.
                state: state?.filter(|s| *s != StockState::Sellable),
            })
        })
    }
}

/// A stock state: `None` for UNSPECIFIED where `unset_ok`, a violation for a value this
/// release does not know. `None` outside when the value is refused.
fn stock_state(
    violations: &mut Violations,
    field: impl Into<String>,
    raw: i32,
    unset_ok: bool,
) -> Option<Option<StockState>> {
    let state = match proto::StockState::try_from(raw) {
        Ok(proto::StockState::Unspecified) if unset_ok => return Some(None),
        Ok(proto::StockState::Sellable) => StockState::Sellable,
        Ok(proto::StockState::Damaged) => StockState::Damaged,
        Ok(proto::StockState::QualityControl) => StockState::QualityControl,
        _ => {
            violations.add(
                field,
                "must be STOCK_STATE_SELLABLE, STOCK_STATE_DAMAGED or STOCK_STATE_QUALITY_CONTROL",
            );
            return None;
        }
    };
    Some(Some(state))
}

/// A location id; empty means `default`.
fn location_or_default(
    violations: &mut Violations,
    field: impl Into<String>,
    raw: &str,
) -> Option<LocationId> {
    match raw {
        "" => Some(LocationId::default_location()),
        raw => violations.check(field, LocationId::parse(raw)),
    }
}

/// A location id that must be given.
fn location_required(
    violations: &mut Violations,
    field: impl Into<String>,
    raw: &str,
) -> Option<LocationId> {
    violations.check(field, LocationId::parse(raw))
}

/// An optional expected version: 0 (the SKU does not exist yet) or more.
fn expected_version(violations: &mut Violations, raw: Option<i64>) -> Option<Option<i64>> {
    match raw {
        Some(version) if version < 0 => {
            violations.add("expected_version", "must not be negative");
            None
        }
        raw => Some(raw),
    }
}

impl Decode for proto::SetStockRequest {
    type Command = SetStock;

    fn into_command(self, who: &Principal) -> Result<SetStock, Error> {
        let mut violations = Violations::default();
        let idempotency_key = violations.check(
            "idempotency_key",
            IdempotencyKey::parse(&self.idempotency_key),
        );
        let count = count(&self, "", idempotency_key.as_ref(), who, &mut violations);
        violations.finish(|| count)
    }
}

/// One count (of a `SetStock`, or an entry of a batch under the batch's key), its fields
/// named after `prefix`. `None` if a field is invalid (each is reported).
fn count(
    request: &proto::SetStockRequest,
    prefix: &str,
    key: Option<&IdempotencyKey>,
    who: &Principal,
    violations: &mut Violations,
) -> Option<SetStock> {
    let sku = violations.check(format!("{prefix}sku"), Sku::parse(&request.sku));
    let on_hand = violations.check(
        format!("{prefix}on_hand"),
        if (0..=MAX_ON_HAND).contains(&request.on_hand) {
            Ok(request.on_hand)
        } else {
            Err(format!("must be between 0 and {MAX_ON_HAND}"))
        },
    );
    let reason = violations.check(format!("{prefix}reason"), Reason::parse(&request.reason));
    let location = location_or_default(
        violations,
        format!("{prefix}location_id"),
        &request.location_id,
    );
    let expected_version = match request.expected_version {
        Some(version) if version < 0 => {
            violations.add(format!("{prefix}expected_version"), "must not be negative");
            None
        }
        raw => Some(raw),
    };
    let state = stock_state(violations, format!("{prefix}state"), request.state, true);
    Some(SetStock {
        state: state?,
        caller: who.caller().clone(),
        sku: sku?,
        on_hand: on_hand?,
        expected_version: expected_version?,
        idempotency_key: key?.clone(),
        reason: reason?,
        location: location?,
    })
}

impl Decode for proto::BatchSetStockRequest {
    type Command = BatchSetStock;

    fn into_command(self, who: &Principal) -> Result<BatchSetStock, Error> {
        let mut violations = Violations::default();
        let idempotency_key = violations.check(
            "idempotency_key",
            IdempotencyKey::parse(&self.idempotency_key),
        );
        if self.requests.is_empty() {
            violations.add("requests", "must have at least one count");
        }
        if self.requests.len() > MAX_BATCH_COUNTS {
            violations.add(
                "requests",
                format!("must have at most {MAX_BATCH_COUNTS} counts"),
            );
            return violations.finish(|| None);
        }
        let mut counts = Vec::with_capacity(self.requests.len());
        let mut first_seen: HashMap<(&str, &str), usize> = HashMap::new();
        for (index, request) in self.requests.iter().enumerate() {
            let prefix = format!("requests[{index}].");
            let at = match request.location_id.as_str() {
                "" => LocationId::DEFAULT,
                raw => raw,
            };
            if let Some(first) = first_seen.get(&(request.sku.as_str(), at)) {
                violations.add(
                    format!("{prefix}sku"),
                    format!("duplicates requests[{first}] (the same SKU and location)"),
                );
                continue;
            }
            first_seen.insert((&request.sku, at), index);
            let key = idempotency_key.as_ref();
            counts.extend(count(request, &prefix, key, who, &mut violations));
        }
        violations.finish(|| {
            Some(BatchSetStock {
                caller: who.caller().clone(),
                idempotency_key: idempotency_key?,
                counts,
            })
        })
    }
}

impl Decode for proto::ListStockMovementsRequest {
    type Command = ListStockMovements;

    fn into_command(self, _: &Principal) -> Result<ListStockMovements, Error> {
        let mut violations = Violations::default();
        let sku = violations.check("sku", Sku::parse(&self.sku));
        if self.after_version < 0 {
            violations.add("after_version", "must not be negative");
        }
        if self.page_size < 0 {
            violations.add("page_size", "must not be negative");
        }
        let after = match (&sku, self.page_token.as_str()) {
            (_, "") => Some(self.after_version),
            (Some(sku), token) => violations.check(
                "page_token",
                movement_token::decode(token, sku, self.after_version),
            ),
            (None, _) => None,
        };
        let page_size = match usize::try_from(self.page_size).unwrap_or(0) {
            0 => DEFAULT_PAGE_SIZE,
            size => size.min(MAX_PAGE_SIZE),
        };
        violations.finish(|| {
            Some(ListStockMovements {
                sku: sku?,
                after_version: self.after_version,
                cursor: after?,
                page_size,
            })
        })
    }
}

impl Decode for proto::GetStockRequest {
    type Command = GetStock;

    fn into_command(self, _: &Principal) -> Result<GetStock, Error> {
        let request = self;
        let mut violations = Violations::default();
        if request.skus.is_empty() {
            violations.add("skus", "must name at least one SKU");
        }
        if request.skus.len() > MAX_SKUS_PER_READ {
            violations.add(
                "skus",
                format!("must name at most {MAX_SKUS_PER_READ} SKUs"),
            );
            // Do not spend work on (or echo) an oversized list.
            return violations.finish(|| None);
        }
        let mut skus = Vec::with_capacity(request.skus.len());
        let mut first_seen: HashMap<&str, usize> = HashMap::new();
        for (index, raw) in request.skus.iter().enumerate() {
            let field = format!("skus[{index}]");
            if let Some(first) = first_seen.insert(raw, index) {
                violations.add(field, format!("duplicates skus[{first}]"));
                first_seen.insert(raw, first);
                continue;
            }
            if let Some(sku) = violations.check(field, Sku::parse(raw)) {
                skus.push(sku);
            }
        }
        let by_location = request.by_location;
        violations.finish(|| {
            let mut query = GetStock::new(skus);
            query.by_location = by_location;
            Some(query)
        })
    }
}

impl Decode for proto::ReserveRequest {
    type Command = Reserve;

    fn into_command(self, who: &Principal) -> Result<Reserve, Error> {
        let request = self;
        let mut violations = Violations::default();
        let idempotency_key = violations.check(
            "idempotency_key",
            IdempotencyKey::parse(&request.idempotency_key),
        );
        let order_id = violations.check("order_id", OrderId::parse(&request.order_id));
        let ttl = match request.ttl {
            None => Some(None),
            Some(ttl) => violations
                .check("ttl", parse_duration(ttl).and_then(Ttl::parse))
                .map(Some),
        };
        if request.lines.is_empty() {
            violations.add("lines", "must have at least one line");
        }
        let strategy = match proto::AllocationStrategy::try_from(request.strategy) {
            Ok(proto::AllocationStrategy::Unspecified | proto::AllocationStrategy::Priority) => {
                Some(AllocationStrategy::Priority)
            }
            Ok(proto::AllocationStrategy::MostAvailable) => Some(AllocationStrategy::MostAvailable),
            Err(_) => {
                violations.add("strategy", "is not an allocation strategy");
                None
            }
        };
        let Some(lines) = parse_lines(&request.lines, Distinct::Sku, &mut violations) else {
            return violations.finish(|| None);
        };
        violations.finish(|| {
            Some(
                Reserve::new(
                    who.caller().clone(),
                    idempotency_key?,
                    order_id?,
                    lines,
                    ttl?,
                )
                .with_allocation(AllocationPolicy {
                    strategy: strategy?,
                    allow_split: request.allow_split,
                    allow_backorder: request.allow_backorder,
                    allow_preorder: request.allow_preorder,
                }),
            )
        })
    }
}

/// What must differ between two lines of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Distinct {
    /// A Reserve: one line per SKU.
    Sku,
    /// A partial confirm or release: one line per SKU and location.
    SkuAndLocation,
}

/// The `sku`, `quantity` and optional `location_id` of at most [`MAX_LINES`] lines (the
/// units a line asks for; a line's other fields are output only and ignored). `None` for an
/// oversized list, which is not even looked into.
fn parse_lines(
    raw: &[proto::ReservationLine],
    distinct: Distinct,
    violations: &mut Violations,
) -> Option<Vec<Line>> {
    if raw.len() > MAX_LINES {
        violations.add("lines", format!("must have at most {MAX_LINES} lines"));
        return None;
    }
    let mut lines = Vec::with_capacity(raw.len());
    let mut first_seen: HashMap<(&str, &str), usize> = HashMap::new();
    for (index, line) in raw.iter().enumerate() {
        let sku = violations.check(format!("lines[{index}].sku"), Sku::parse(&line.sku));
        let quantity = violations.check(
            format!("lines[{index}].quantity"),
            Quantity::parse(line.quantity),
        );
        let location = match line.location_id.as_str() {
            "" => Some(None),
            raw => violations
                .check(
                    format!("lines[{index}].location_id"),
                    LocationId::parse(raw),
                )
                .map(Some),
        };
        let key = match distinct {
            Distinct::Sku => (line.sku.as_str(), ""),
            Distinct::SkuAndLocation => (line.sku.as_str(), line.location_id.as_str()),
        };
        if let Some(first) = first_seen.get(&key) {
            let what = match distinct {
                Distinct::Sku => "sku",
                Distinct::SkuAndLocation => "sku and location_id",
            };
            violations.add(
                format!("lines[{index}].sku"),
                format!("duplicates lines[{first}].{what}"),
            );
            continue;
        }
        first_seen.insert(key, index);
        if let (Some(sku), Some(quantity), Some(location)) = (sku, quantity, location) {
            lines.push(Line {
                sku,
                quantity,
                location,
            });
        }
    }
    Some(lines)
}

/// A protobuf `Duration`, if it is a valid non-negative one.
fn parse_duration(raw: prost_types::Duration) -> Result<Duration, String> {
    let nanos = u32::try_from(raw.nanos).ok().filter(|n| *n < 1_000_000_000);
    match (u64::try_from(raw.seconds), nanos) {
        (Ok(seconds), Some(nanos)) => Ok(Duration::new(seconds, nanos)),
        _ => Err("must be a positive duration".into()),
    }
}

/// The reservation a Get, Confirm or Release names, within what its caller may see: the
/// scope comes with the parse, so no reference exists without one.
fn reservation_ref(raw: &str, scope: Scope) -> Result<ReservationRef, Error> {
    let mut violations = Violations::default();
    let id = violations.check("reservation_id", ReservationId::parse(raw));
    violations.finish(|| id.map(|id| ReservationRef::new(id, scope)))
}

/// Reading reaches every reservation the caller may see.
impl Decode for proto::GetReservationRequest {
    type Command = ReservationRef;

    fn into_command(self, who: &Principal) -> Result<ReservationRef, Error> {
        reservation_ref(&self.reservation_id, who.read_scope())
    }
}

/// Settling reaches only the reservations the caller may change.
impl Decode for proto::ConfirmReservationRequest {
    type Command = SettleReservation;

    fn into_command(self, who: &Principal) -> Result<SettleReservation, Error> {
        settle(
            Settle::Confirm,
            &self.reservation_id,
            &self.lines,
            &self.idempotency_key,
            who,
        )
    }
}

impl Decode for proto::ReleaseReservationRequest {
    type Command = SettleReservation;

    fn into_command(self, who: &Principal) -> Result<SettleReservation, Error> {
        settle(
            Settle::Release,
            &self.reservation_id,
            &self.lines,
            &self.idempotency_key,
            who,
        )
    }
}

/// A confirm or release: of every held unit, or (with a key) of `lines` only.
fn settle(
    settle: Settle,
    reservation_id: &str,
    lines: &[proto::ReservationLine],
    idempotency_key: &str,
    who: &Principal,
) -> Result<SettleReservation, Error> {
    let mut violations = Violations::default();
    let id = violations.check("reservation_id", ReservationId::parse(reservation_id));
    let idempotency_key = match idempotency_key {
        "" if !lines.is_empty() => {
            violations.add(
                "idempotency_key",
                "is required with lines: a repeated partial call would act twice",
            );
            None
        }
        "" => Some(None),
        raw => violations
            .check("idempotency_key", IdempotencyKey::parse(raw))
            .map(Some),
    };
    let Some(lines) = parse_lines(lines, Distinct::SkuAndLocation, &mut violations) else {
        return violations.finish(|| None);
    };
    violations.finish(|| {
        Some(SettleReservation {
            target: ReservationRef::new(id?, who.write_scope()),
            settle,
            lines,
            idempotency_key: idempotency_key?,
            caller: who.caller().clone(),
        })
    })
}

/// Extending changes the hold: only the reservations the caller may change.
impl Decode for proto::ExtendReservationRequest {
    type Command = ExtendReservation;

    fn into_command(self, who: &Principal) -> Result<ExtendReservation, Error> {
        let mut violations = Violations::default();
        let id = violations.check("reservation_id", ReservationId::parse(&self.reservation_id));
        let ttl = match self.ttl {
            None => {
                violations.add("ttl", "is required");
                None
            }
            Some(ttl) => violations.check("ttl", parse_duration(ttl).and_then(Ttl::parse)),
        };
        violations.finish(|| {
            Some(ExtendReservation {
                target: ReservationRef::new(id?, who.write_scope()),
                ttl: ttl?,
            })
        })
    }
}

/// Cancelling changes reservations: the caller's own orders (the admin's scope is all).
impl Decode for proto::CancelOrderRequest {
    type Command = CancelOrder;

    fn into_command(self, who: &Principal) -> Result<CancelOrder, Error> {
        let mut violations = Violations::default();
        let order_id = violations.check("order_id", OrderId::parse(&self.order_id));
        let idempotency_key = violations.check(
            "idempotency_key",
            IdempotencyKey::parse(&self.idempotency_key),
        );
        let reason = violations.check("reason", Reason::parse(&self.reason));
        violations.finish(|| {
            Some(CancelOrder {
                scope: who.write_scope(),
                caller: who.caller().clone(),
                order_id: order_id?,
                idempotency_key: idempotency_key?,
                reason: reason?,
            })
        })
    }
}

/// Listing reads: the reservations the caller may see.
impl Decode for proto::ListReservationsRequest {
    type Command = ListReservations;

    fn into_command(self, who: &Principal) -> Result<ListReservations, Error> {
        let mut violations = Violations::default();
        let order_id = match self.order_id.as_str() {
            "" => Some(None),
            raw => violations.check("order_id", OrderId::parse(raw)).map(Some),
        };
        let sku = match self.sku.as_str() {
            "" => Some(None),
            raw => violations.check("sku", Sku::parse(raw)).map(Some),
        };
        let state = match proto::ReservationState::try_from(self.state) {
            Ok(proto::ReservationState::Unspecified) => Some(None),
            Ok(proto::ReservationState::Held) => Some(Some(ReservationState::Held)),
            Ok(proto::ReservationState::Confirmed) => Some(Some(ReservationState::Confirmed)),
            Ok(proto::ReservationState::Released) => Some(Some(ReservationState::Released)),
            Ok(proto::ReservationState::Expired) => Some(Some(ReservationState::Expired)),
            Err(_) => {
                violations.add("state", "is not a reservation state");
                None
            }
        };
        let page_size = match usize::try_from(self.page_size) {
            Ok(0) => Some(DEFAULT_PAGE_SIZE),
            Ok(size) => Some(size.min(MAX_PAGE_SIZE)),
            Err(_) => {
                violations.add("page_size", "must not be negative");
                None
            }
        };
        let scope = who.read_scope();
        let filter = match (order_id, state, sku) {
            (Some(order_id), Some(state), Some(sku)) => Some(ReservationFilter {
                order_id,
                state,
                sku,
            }),
            _ => None,
        };
        let after = match (&filter, self.page_token.as_str()) {
            (_, "") => Some(None),
            (Some(filter), token) => violations
                .check("page_token", page_token::decode(token, filter, &scope))
                .map(Some),
            // The filters are invalid: the token cannot be judged against them.
            (None, _) => None,
        };
        violations.finish(|| {
            Some(ListReservations {
                scope,
                filter: filter?,
                page_size: page_size?,
                after: after?,
            })
        })
    }
}

impl Decode for proto::UpsertLocationRequest {
    type Command = Location;

    fn into_command(self, _: &Principal) -> Result<Location, Error> {
        let mut violations = Violations::default();
        let id = location_required(&mut violations, "location_id", &self.location_id);
        violations.finish(|| {
            Some(Location {
                id: id?,
                priority: self.priority,
                active: self.active,
            })
        })
    }
}

impl Decode for proto::TransferStockRequest {
    type Command = TransferStock;

    fn into_command(self, who: &Principal) -> Result<TransferStock, Error> {
        let mut violations = Violations::default();
        let sku = violations.check("sku", Sku::parse(&self.sku));
        let from = location_required(&mut violations, "from_location_id", &self.from_location_id);
        let to = location_required(&mut violations, "to_location_id", &self.to_location_id);
        if from.is_some() && from == to {
            violations.add("to_location_id", "must differ from from_location_id");
        }
        let quantity = violations.check(
            "quantity",
            if (1..=MAX_DELTA).contains(&self.quantity) {
                Ok(self.quantity)
            } else {
                Err(format!("must be between 1 and {MAX_DELTA}"))
            },
        );
        let idempotency_key = violations.check(
            "idempotency_key",
            IdempotencyKey::parse(&self.idempotency_key),
        );
        let reason = violations.check("reason", Reason::parse(&self.reason));
        violations.finish(|| {
            Some(TransferStock {
                caller: who.caller().clone(),
                sku: sku?,
                from: from?,
                to: to?,
                quantity: quantity?,
                idempotency_key: idempotency_key?,
                reason: reason?,
            })
        })
    }
}

/// A policy value: 0 to [`MAX_ON_HAND`], or unset.
fn policy_value(violations: &mut Violations, field: &str, raw: Option<i64>) -> Option<Option<i64>> {
    match raw {
        Some(value) if !(0..=MAX_ON_HAND).contains(&value) => {
            violations.add(field, format!("must be between 0 and {MAX_ON_HAND}"));
            None
        }
        raw => Some(raw),
    }
}

impl Decode for proto::SetStockPolicyRequest {
    type Command = SetStockPolicy;

    fn into_command(self, who: &Principal) -> Result<SetStockPolicy, Error> {
        let mut violations = Violations::default();
        let sku = violations.check("sku", Sku::parse(&self.sku));
        let location = location_or_default(&mut violations, "location_id", &self.location_id);
        let safety_stock = policy_value(&mut violations, "safety_stock", self.safety_stock);
        let backorder_limit =
            policy_value(&mut violations, "backorder_limit", self.backorder_limit);
        if self.safety_stock.is_none() && self.backorder_limit.is_none() {
            violations.add(
                "safety_stock",
                "set safety_stock, backorder_limit or both (a policy with neither changes nothing)",
            );
        }
        let idempotency_key = violations.check(
            "idempotency_key",
            IdempotencyKey::parse(&self.idempotency_key),
        );
        let reason = violations.check("reason", Reason::parse(&self.reason));
        violations.finish(|| {
            Some(SetStockPolicy {
                caller: who.caller().clone(),
                sku: sku?,
                location: location?,
                safety_stock: safety_stock?,
                backorder_limit: backorder_limit?,
                idempotency_key: idempotency_key?,
                reason: reason?,
            })
        })
    }
}

impl Decode for proto::MoveStockStateRequest {
    type Command = MoveStockState;

    fn into_command(self, who: &Principal) -> Result<MoveStockState, Error> {
        let mut violations = Violations::default();
        let sku = violations.check("sku", Sku::parse(&self.sku));
        let location = location_or_default(&mut violations, "location_id", &self.location_id);
        let quantity = violations.check(
            "quantity",
            if (1..=MAX_DELTA).contains(&self.quantity) {
                Ok(self.quantity)
            } else {
                Err(format!("must be between 1 and {MAX_DELTA}"))
            },
        );
        let from = stock_state(&mut violations, "from_state", self.from_state, false);
        let to = stock_state(&mut violations, "to_state", self.to_state, false);
        if from.is_some() && from == to {
            violations.add("to_state", "must differ from from_state");
        }
        let idempotency_key = violations.check(
            "idempotency_key",
            IdempotencyKey::parse(&self.idempotency_key),
        );
        let reason = violations.check("reason", Reason::parse(&self.reason));
        violations.finish(|| {
            Some(MoveStockState {
                caller: who.caller().clone(),
                sku: sku?,
                location: location?,
                quantity: quantity?,
                from: from??,
                to: to??,
                idempotency_key: idempotency_key?,
                reason: reason?,
            })
        })
    }
}

/// 1 to [`MAX_DELTA`] units.
fn units(violations: &mut Violations, field: &str, raw: i64) -> Option<i64> {
    violations.check(
        field,
        if (1..=MAX_DELTA).contains(&raw) {
            Ok(raw)
        } else {
            Err(format!("must be between 1 and {MAX_DELTA}"))
        },
    )
}

impl Decode for proto::ExpectStockRequest {
    type Command = ExpectStock;

    fn into_command(self, who: &Principal) -> Result<ExpectStock, Error> {
        let mut violations = Violations::default();
        let receipt_id = violations.check("receipt_id", ReceiptId::parse(&self.receipt_id));
        let sku = violations.check("sku", Sku::parse(&self.sku));
        let location = location_or_default(&mut violations, "location_id", &self.location_id);
        let quantity = units(&mut violations, "quantity", self.quantity);
        let expected_at = match self.expected_at.map(expected_date) {
            Some(Ok(at)) => Some(at),
            Some(Err(why)) => {
                violations.add("expected_at", why);
                None
            }
            None => {
                violations.add("expected_at", "is required");
                None
            }
        };
        let idempotency_key = violations.check(
            "idempotency_key",
            IdempotencyKey::parse(&self.idempotency_key),
        );
        let reason = violations.check("reason", Reason::parse(&self.reason));
        violations.finish(|| {
            Some(ExpectStock {
                caller: who.caller().clone(),
                receipt_id: receipt_id?,
                sku: sku?,
                location: location?,
                quantity: quantity?,
                // Kept to the microsecond, as storage keeps it.
                expected_at: to_micros(expected_at?),
                idempotency_key: idempotency_key?,
                reason: reason?,
            })
        })
    }
}

/// The latest date a receipt may be expected on: the end of year 9999, the last a protobuf
/// `Timestamp` may carry.
const LATEST_EXPECTED: i64 = 253_402_300_799;

/// A receipt's expected date: a valid timestamp from the Unix epoch to the end of year 9999
/// (before the epoch, two dates would be stored as one; after 9999, no timestamp reads it).
fn expected_date(at: prost_types::Timestamp) -> Result<SystemTime, &'static str> {
    const RANGE: &str = "must be between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59Z";
    if !(0..=LATEST_EXPECTED).contains(&at.seconds) || !(0..1_000_000_000).contains(&at.nanos) {
        return Err(RANGE);
    }
    SystemTime::try_from(at).map_err(|_| RANGE)
}

/// `time` to the microsecond below.
fn to_micros(time: SystemTime) -> SystemTime {
    match time.duration_since(std::time::UNIX_EPOCH) {
        Ok(since) => {
            std::time::UNIX_EPOCH
                + Duration::from_micros(since.as_micros().min(u64::MAX as u128) as u64)
        }
        Err(_) => time,
    }
}

impl Decode for proto::ReceiveStockRequest {
    type Command = ReceiveStock;

    fn into_command(self, who: &Principal) -> Result<ReceiveStock, Error> {
        let mut violations = Violations::default();
        let receipt_id = violations.check("receipt_id", ReceiptId::parse(&self.receipt_id));
        let quantity = units(&mut violations, "quantity", self.quantity);
        let idempotency_key = violations.check(
            "idempotency_key",
            IdempotencyKey::parse(&self.idempotency_key),
        );
        let reason = violations.check("reason", Reason::parse(&self.reason));
        let state = stock_state(&mut violations, "state", self.state, true);
        violations.finish(|| {
            Some(ReceiveStock {
                caller: who.caller().clone(),
                receipt_id: receipt_id?,
                quantity: quantity?,
                idempotency_key: idempotency_key?,
                reason: reason?,
                state: state?.filter(|s| *s != StockState::Sellable),
            })
        })
    }
}

impl Decode for proto::CancelReceiptRequest {
    type Command = CancelReceipt;

    fn into_command(self, who: &Principal) -> Result<CancelReceipt, Error> {
        let mut violations = Violations::default();
        let receipt_id = violations.check("receipt_id", ReceiptId::parse(&self.receipt_id));
        let idempotency_key = violations.check(
            "idempotency_key",
            IdempotencyKey::parse(&self.idempotency_key),
        );
        let reason = violations.check("reason", Reason::parse(&self.reason));
        violations.finish(|| {
            Some(CancelReceipt {
                caller: who.caller().clone(),
                receipt_id: receipt_id?,
                idempotency_key: idempotency_key?,
                reason: reason?,
            })
        })
    }
}

impl Decode for proto::ListReceiptsRequest {
    type Command = ListReceipts;

    fn into_command(self, _: &Principal) -> Result<ListReceipts, Error> {
        let mut violations = Violations::default();
        let sku = match self.sku.as_str() {
            "" => Some(None),
            raw => violations.check("sku", Sku::parse(raw)).map(Some),
        };
        if self.page_size < 0 {
            violations.add("page_size", "must not be negative");
        }
        let after = match (&sku, self.page_token.as_str()) {
            (_, "") => Some(None),
            (Some(sku), token) => violations
                .check("page_token", receipt_token::decode(token, sku.as_ref()))
                .map(Some),
            (None, _) => None,
        };
        let page_size = match usize::try_from(self.page_size).unwrap_or(0) {
            0 => DEFAULT_PAGE_SIZE,
            size => size.min(MAX_PAGE_SIZE),
        };
        violations.finish(|| {
            Some(ListReceipts {
                sku: sku?,
                page_size,
                after: after?,
            })
        })
    }
}

impl Decode for proto::ListLocationsRequest {
    type Command = ();

    fn into_command(self, _: &Principal) -> Result<(), Error> {
        Ok(())
    }
}
