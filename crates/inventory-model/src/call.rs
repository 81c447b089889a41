//! The calls a run is made of. Names are symbolic and short (`MUG`, `north`, `k7`): the
//! runner puts each run in a [`Namespace`] of its own, so many runs (and every attempt of a
//! shrink) share one server without seeing each other. A reservation is named by the key of
//! the `Reserve` that made it, and a receipt by its id, so a call keeps its meaning when
//! shrinking removes the calls around it.

use std::fmt;

use inventory_proto as proto;

/// A state of units on the shelf (`StockState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    Sellable,
    Damaged,
    QualityControl,
}

impl State {
    pub fn proto(self) -> proto::StockState {
        match self {
            State::Sellable => proto::StockState::Sellable,
            State::Damaged => proto::StockState::Damaged,
            State::QualityControl => proto::StockState::QualityControl,
        }
    }
}

/// One line of a `Reserve`, or of a partial confirm or release.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LineSpec {
    pub sku: String,
    pub quantity: i64,
    /// A pinned location (Reserve) or the allocation to take units from (confirm, release).
    pub location: Option<String>,
}

/// One call of a run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Call {
    UpsertLocation {
        location: String,
        priority: i32,
        active: bool,
    },
    AdjustStock {
        key: String,
        sku: String,
        location: String,
        delta: i64,
        state: Option<State>,
    },
    SetStock {
        key: String,
        sku: String,
        location: String,
        on_hand: i64,
    },
    SetStockPolicy {
        key: String,
        sku: String,
        location: String,
        safety_stock: Option<i64>,
        backorder_limit: Option<i64>,
    },
    MoveStockState {
        key: String,
        sku: String,
        location: String,
        quantity: i64,
        from: State,
        to: State,
    },
    Reserve {
        key: String,
        order: String,
        lines: Vec<LineSpec>,
        allow_split: bool,
        allow_backorder: bool,
        allow_preorder: bool,
    },
    /// Confirm the reservation made by the `Reserve` under `reservation` (its key).
    Confirm {
        reservation: String,
        key: Option<String>,
        lines: Vec<LineSpec>,
    },
    Release {
        reservation: String,
        key: Option<String>,
        lines: Vec<LineSpec>,
    },
    /// Let a hold run out: `ExtendReservation` to one second, wait until it has passed, and
    /// let the sweeper return it.
    Lapse {
        reservation: String,
    },
    GetReservation {
        reservation: String,
    },
    CancelOrder {
        key: String,
        order: String,
    },
    ExpectStock {
        key: String,
        receipt: String,
        sku: String,
        location: String,
        quantity: i64,
        /// Day of 2030 the receipt is due (1: 1 January).
        day: u32,
    },
    ReceiveStock {
        key: String,
        receipt: String,
        quantity: i64,
        /// The state the units arrive in (`None`: unset, sellable).
        state: Option<State>,
    },
    CancelReceipt {
        key: String,
        receipt: String,
    },
}

impl Call {
    /// The idempotency key the call carries, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            Call::AdjustStock { key, .. }
            | Call::SetStock { key, .. }
            | Call::SetStockPolicy { key, .. }
            | Call::MoveStockState { key, .. }
            | Call::Reserve { key, .. }
            | Call::CancelOrder { key, .. }
            | Call::ExpectStock { key, .. }
            | Call::ReceiveStock { key, .. }
            | Call::CancelReceipt { key, .. } => Some(key),
            Call::Confirm { key, .. } | Call::Release { key, .. } => key.as_deref(),
            Call::UpsertLocation { .. } | Call::Lapse { .. } | Call::GetReservation { .. } => None,
        }
    }

    /// The same call under another key (a key replayed with a different request).
    pub fn with_key(&self, new: &str) -> Call {
        let mut call = self.clone();
        match &mut call {
            Call::AdjustStock { key, .. }
            | Call::SetStock { key, .. }
            | Call::SetStockPolicy { key, .. }
            | Call::MoveStockState { key, .. }
            | Call::Reserve { key, .. }
            | Call::CancelOrder { key, .. }
            | Call::ExpectStock { key, .. }
            | Call::ReceiveStock { key, .. }
            | Call::CancelReceipt { key, .. } => *key = new.to_owned(),
            Call::Confirm { key, .. } | Call::Release { key, .. } => *key = Some(new.to_owned()),
            Call::UpsertLocation { .. } | Call::Lapse { .. } | Call::GetReservation { .. } => {}
        }
        call
    }

    /// The same call with one field changed (a quantity, a count, a flag), under its key: a
    /// retry that is not quite the request it retries. `None` for calls with nothing to
    /// change that the generator varies.
    pub fn variant(&self) -> Option<Call> {
        let mut call = self.clone();
        match &mut call {
            Call::AdjustStock { delta, .. } => *delta += 1,
            Call::SetStock { on_hand, .. } => *on_hand += 1,
            Call::SetStockPolicy { safety_stock, .. } => {
                *safety_stock = Some(safety_stock.unwrap_or(0) + 1);
            }
            Call::MoveStockState { quantity, .. }
            | Call::ExpectStock { quantity, .. }
            | Call::ReceiveStock { quantity, .. } => *quantity += 1,
            Call::Reserve { lines, .. } => lines.first_mut()?.quantity += 1,
            Call::Confirm { lines, .. } | Call::Release { lines, .. } => {
                lines.first_mut()?.quantity += 1;
            }
            Call::CancelOrder { order, .. } => order.push('x'),
            Call::CancelReceipt { receipt, .. } => receipt.push('x'),
            Call::UpsertLocation { .. } | Call::Lapse { .. } | Call::GetReservation { .. } => {
                return None;
            }
        }
        Some(call)
    }

    /// What the request is, without its key: two calls under one key are the same request
    /// exactly when these are equal.
    pub fn fingerprint(&self) -> String {
        let mut call = self.with_key("");
        // An AdjustStock or a ReceiveStock without a state is of sellable units: the same
        // request.
        if let Call::AdjustStock { state, .. } | Call::ReceiveStock { state, .. } = &mut call
            && *state == Some(State::Sellable)
        {
            *state = None;
        }
        format!("{call:?}")
    }

    /// The reservation (the key of its `Reserve`) the call is about.
    pub fn reservation(&self) -> Option<&str> {
        match self {
            Call::Confirm { reservation, .. }
            | Call::Release { reservation, .. }
            | Call::Lapse { reservation }
            | Call::GetReservation { reservation } => Some(reservation),
            _ => None,
        }
    }

    /// The RPC's name.
    pub fn method(&self) -> &'static str {
        match self {
            Call::UpsertLocation { .. } => "UpsertLocation",
            Call::AdjustStock { .. } => "AdjustStock",
            Call::SetStock { .. } => "SetStock",
            Call::SetStockPolicy { .. } => "SetStockPolicy",
            Call::MoveStockState { .. } => "MoveStockState",
            Call::Reserve { .. } => "Reserve",
            Call::Confirm { .. } => "ConfirmReservation",
            Call::Release { .. } => "ReleaseReservation",
            Call::Lapse { .. } => "ExtendReservation",
            Call::GetReservation { .. } => "GetReservation",
            Call::CancelOrder { .. } => "CancelOrder",
            Call::ExpectStock { .. } => "ExpectStock",
            Call::ReceiveStock { .. } => "ReceiveStock",
            Call::CancelReceipt { .. } => "CancelReceipt",
        }
    }

    /// The request sent for this call in `ns`; `reservation_id` is the id the server gave the
    /// reservation this call is about.
    pub fn request(&self, ns: &Namespace, reservation_id: &str) -> Request {
        let key = |k: &str| ns.name(k);
        match self {
            Call::UpsertLocation {
                location,
                priority,
                active,
            } => Request::UpsertLocation(proto::UpsertLocationRequest {
                location_id: ns.location(location),
                priority: *priority,
                active: *active,
            }),
            Call::AdjustStock {
                key: k,
                sku,
                location,
                delta,
                state,
            } => Request::AdjustStock(proto::AdjustStockRequest {
                sku: ns.name(sku),
                delta: *delta,
                idempotency_key: key(k),
                reason: String::new(),
                expected_version: None,
                location_id: ns.location(location),
                state: state.map_or(0, |s| s.proto() as i32),
            }),
            Call::SetStock {
                key: k,
                sku,
                location,
                on_hand,
            } => Request::SetStock(proto::SetStockRequest {
                sku: ns.name(sku),
                on_hand: *on_hand,
                expected_version: None,
                idempotency_key: key(k),
                reason: String::new(),
                location_id: ns.location(location),
                state: 0,
            }),
            Call::SetStockPolicy {
                key: k,
                sku,
                location,
                safety_stock,
                backorder_limit,
            } => Request::SetStockPolicy(proto::SetStockPolicyRequest {
                sku: ns.name(sku),
                location_id: ns.location(location),
                safety_stock: *safety_stock,
                backorder_limit: *backorder_limit,
                idempotency_key: key(k),
                reason: String::new(),
            }),
            Call::MoveStockState {
                key: k,
                sku,
                location,
                quantity,
                from,
                to,
            } => Request::MoveStockState(proto::MoveStockStateRequest {
                sku: ns.name(sku),
                location_id: ns.location(location),
                quantity: *quantity,
                from_state: from.proto() as i32,
                to_state: to.proto() as i32,
                idempotency_key: key(k),
                reason: String::new(),
            }),
            Call::Reserve {
                key: k,
                order,
                lines,
                allow_split,
                allow_backorder,
                allow_preorder,
            } => Request::Reserve(proto::ReserveRequest {
                idempotency_key: key(k),
                order_id: ns.name(order),
                lines: lines.iter().map(|l| ns.line(l)).collect(),
                // Long: a hold ends only when a `Lapse` says so.
                ttl: Some(prost_types::Duration {
                    seconds: 3600,
                    nanos: 0,
                }),
                strategy: 0,
                allow_split: *allow_split,
                allow_backorder: *allow_backorder,
                allow_preorder: *allow_preorder,
            }),
            Call::Confirm { key: k, lines, .. } => {
                Request::Confirm(proto::ConfirmReservationRequest {
                    reservation_id: reservation_id.to_owned(),
                    lines: lines.iter().map(|l| ns.line(l)).collect(),
                    idempotency_key: k.as_deref().map(key).unwrap_or_default(),
                })
            }
            Call::Release { key: k, lines, .. } => {
                Request::Release(proto::ReleaseReservationRequest {
                    reservation_id: reservation_id.to_owned(),
                    lines: lines.iter().map(|l| ns.line(l)).collect(),
                    idempotency_key: k.as_deref().map(key).unwrap_or_default(),
                })
            }
            Call::Lapse { .. } => Request::Extend(proto::ExtendReservationRequest {
                reservation_id: reservation_id.to_owned(),
                ttl: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
            }),
            Call::GetReservation { .. } => Request::GetReservation(proto::GetReservationRequest {
                reservation_id: reservation_id.to_owned(),
            }),
            Call::CancelOrder { key: k, order } => {
                Request::CancelOrder(proto::CancelOrderRequest {
                    order_id: ns.name(order),
                    idempotency_key: key(k),
                    reason: String::new(),
                })
            }
            Call::ExpectStock {
                key: k,
                receipt,
                sku,
                location,
                quantity,
                day,
            } => Request::ExpectStock(proto::ExpectStockRequest {
                receipt_id: ns.name(receipt),
                sku: ns.name(sku),
                location_id: ns.location(location),
                quantity: *quantity,
                expected_at: Some(due(*day)),
                idempotency_key: key(k),
                reason: String::new(),
            }),
            Call::ReceiveStock {
                key: k,
                receipt,
                quantity,
                state,
            } => Request::ReceiveStock(proto::ReceiveStockRequest {
                receipt_id: ns.name(receipt),
                quantity: *quantity,
                idempotency_key: key(k),
                reason: String::new(),
                state: state.map_or(0, |s| s.proto() as i32),
            }),
            Call::CancelReceipt { key: k, receipt } => {
                Request::CancelReceipt(proto::CancelReceiptRequest {
                    receipt_id: ns.name(receipt),
                    idempotency_key: key(k),
                    reason: String::new(),
                })
            }
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// When a receipt due on `day` of 2030 (1: 1 January) is due.
pub fn due(day: u32) -> prost_types::Timestamp {
    // 2030-01-01T00:00:00Z.
    const FIRST: i64 = 1_893_456_000;
    prost_types::Timestamp {
        seconds: FIRST + i64::from(day.saturating_sub(1)) * 86_400,
        nanos: 0,
    }
}

/// A request of one of the RPCs the model drives.
#[derive(Debug, Clone)]
pub enum Request {
    UpsertLocation(proto::UpsertLocationRequest),
    AdjustStock(proto::AdjustStockRequest),
    SetStock(proto::SetStockRequest),
    SetStockPolicy(proto::SetStockPolicyRequest),
    MoveStockState(proto::MoveStockStateRequest),
    Reserve(proto::ReserveRequest),
    Confirm(proto::ConfirmReservationRequest),
    Release(proto::ReleaseReservationRequest),
    Extend(proto::ExtendReservationRequest),
    GetReservation(proto::GetReservationRequest),
    CancelOrder(proto::CancelOrderRequest),
    ExpectStock(proto::ExpectStockRequest),
    ReceiveStock(proto::ReceiveStockRequest),
    CancelReceipt(proto::CancelReceiptRequest),
}

/// The prefix that keeps one run's names apart from every other run's on one server: SKUs,
/// order ids, keys and receipt ids start with `<prefix>-`, locations other than `default`
/// with `<prefix>-` in lower case. The empty namespace is the names as they are (a
/// reproduction against a fresh `make run`).
#[derive(Debug, Clone, Default)]
pub struct Namespace {
    prefix: String,
}

impl Namespace {
    /// `prefix`: 1 to 20 characters of `a-z 0-9` that sort after `default`, so that a
    /// run's locations keep their order against `default` (locations of equal priority are
    /// allocated from in id order).
    pub fn new(prefix: &str) -> Self {
        assert!(
            prefix.is_empty() || prefix > "default",
            "a namespace sorts after `default`: {prefix}"
        );
        Self {
            prefix: prefix.to_owned(),
        }
    }

    pub fn name(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{}-{name}", self.prefix)
        }
    }

    pub fn location(&self, location: &str) -> String {
        if location == "default" {
            String::new()
        } else {
            self.name(location)
        }
    }

    /// The symbolic name of a name the server answered in this namespace.
    pub fn strip<'a>(&self, name: &'a str) -> &'a str {
        if self.prefix.is_empty() {
            return name;
        }
        name.strip_prefix(&self.prefix)
            .and_then(|rest| rest.strip_prefix('-'))
            .unwrap_or(name)
    }

    /// The symbolic location of a location id the server answered.
    pub fn strip_location<'a>(&self, location: &'a str) -> &'a str {
        if location.is_empty() {
            "default"
        } else {
            self.strip(location)
        }
    }

    fn line(&self, line: &LineSpec) -> proto::ReservationLine {
        proto::ReservationLine {
            sku: self.name(&line.sku),
            quantity: line.quantity,
            // Named even when it is `default`: an empty one pins nothing.
            location_id: line
                .location
                .as_deref()
                .map(|l| {
                    if l == "default" {
                        l.to_owned()
                    } else {
                        self.name(l)
                    }
                })
                .unwrap_or_default(),
            ..Default::default()
        }
    }
}
