//! The recorded history of a run: every client operation with its invocation and completion
//! time and outcome, every stock snapshot, and every event the live watcher received.
//!
//! Every operation, snapshot and event names the tenant it belongs to: a run serves several
//! tenants with the same SKU names, and the checker judges each tenant's history on its own.
//!
//! Fields added since the first histories were written default when absent, so older
//! `history.jsonl` and `events.json` files still parse (their records are tenant `default`'s).

use std::{
    sync::{Arc, Mutex},
    time::Instant,
};

pub use inventory_testkit::outcome::Outcome;
use serde::{Deserialize, Serialize};

/// The tenant a deployment without tenants serves, and the tenant of records written before
/// histories named one.
pub const DEFAULT_TENANT: &str = "default";

fn default_tenant() -> String {
    DEFAULT_TENANT.to_owned()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    Reserve,
    /// `ConfirmReservation`: whole (no lines) or partial (lines and a key).
    Confirm,
    /// `ReleaseReservation`: whole (no lines) or partial (lines and a key).
    Release,
    Adjust,
    /// `ExtendReservation`.
    Extend,
    /// `CancelOrder`.
    Cancel,
}

/// When the operation was made: under load and faults, or afterwards to resolve unknowns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Load,
    Resolve,
}

/// One line of a `Reserve` or of a partial confirm or release, or one `AdjustStock`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    pub sku: String,
    pub quantity: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Op {
    /// The tenant whose caller made the call: its keys, orders and reservations are that
    /// tenant's alone.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    pub client: usize,
    pub replica: usize,
    pub kind: OpKind,
    pub phase: Phase,
    /// The idempotency key of a `Reserve`, an `AdjustStock`, a `CancelOrder` or a partial
    /// confirm or release; `None` for whole confirms and releases and for extends.
    pub key: Option<String>,
    /// The reservation a confirm, release or extend names, the one a `Reserve` answered with,
    /// or the first one a `CancelOrder` answered with.
    pub reservation_id: Option<String>,
    /// The order a `Reserve` or `CancelOrder` names.
    #[serde(default)]
    pub order_id: Option<String>,
    /// `Reserve`: its lines; a partial confirm or release: the units it moves (empty for a
    /// whole one); `AdjustStock`: the SKU and delta.
    pub lines: Vec<Line>,
    /// `Reserve`: the hold it asked for (part of the request a retry must repeat);
    /// `ExtendReservation`: the new lifetime.
    pub ttl_ms: Option<u64>,
    pub invoked_ms: f64,
    pub completed_ms: f64,
    pub outcome: Outcome,
    pub code: String,
    /// The reservation state the answer carried.
    pub state: Option<String>,
    /// The answered reservation's lines when OK: (sku, held, confirmed, released); for a
    /// `CancelOrder`, those of every reservation it answered with.
    #[serde(default)]
    pub units: Vec<(String, i64, i64, i64)>,
    pub message: String,
}

impl Op {
    /// A confirm or release that names the units it moves.
    pub fn is_partial(&self) -> bool {
        matches!(self.kind, OpKind::Confirm | OpKind::Release) && !self.lines.is_empty()
    }

    /// The order a `Reserve` or `CancelOrder` named: as recorded, or (in histories from before
    /// it was) the one the workload derived from a `Reserve`'s key.
    pub fn order(&self) -> String {
        self.order_id
            .clone()
            .unwrap_or_else(|| format!("order-{}", self.key.as_deref().unwrap_or("")))
    }
}

/// What `GetStock` showed at one moment.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Snapshot {
    #[serde(default = "default_tenant")]
    pub tenant: String,
    pub at_ms: f64,
    pub sku: String,
    pub on_hand: i64,
    pub reserved: i64,
    pub available: i64,
}

/// One event as `WatchEvents` delivered it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeenEvent {
    /// The tenant whose stream delivered it (each tenant's is dense on its own).
    #[serde(default = "default_tenant")]
    pub tenant: String,
    pub sequence: i64,
    pub event_id: String,
    pub event_type: String,
    pub reservation_id: Option<String>,
    pub sku: Option<String>,
    /// `StockAdjusted`: the delta.
    pub delta: Option<i64>,
    /// `ReservationChanged`: the reservation's state after the change (as "CONFIRMED").
    #[serde(default)]
    pub state: Option<String>,
    /// `ReservationChanged`: the lines (sku and quantity first reserved).
    pub lines: Vec<Line>,
    /// `ReservationChanged`: (held, confirmed, released) of each line after the change, in
    /// the order of `lines`.
    #[serde(default)]
    pub units: Vec<(i64, i64, i64)>,
    /// The stock levels after the change, of the SKUs whose stock moved: (sku, on_hand,
    /// reserved, version).
    pub levels: Vec<(String, i64, i64, i64)>,
    /// Per SKU, the movements (locations moved) of the change: the versions it took.
    #[serde(default)]
    pub steps: Vec<(String, i64)>,
    /// Every level the event carries (totals and locations) with what was promised beyond
    /// it: (sku, on_hand, reserved, backordered, backorder_limit, unsellable).
    #[serde(default)]
    pub promised: Vec<(String, i64, i64, i64, i64, i64)>,
}

/// A receipt of the stock-states load as `ListReceipts` answered it during the run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReceiptSnapshot {
    pub tenant: String,
    pub at_ms: f64,
    pub receipt_id: String,
    pub quantity: i64,
    pub received: i64,
    pub preordered: i64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct History {
    pub ops: Vec<Op>,
    pub snapshots: Vec<Snapshot>,
    /// The stock-states load's receipts, read back during the run.
    #[serde(default)]
    pub receipts: Vec<ReceiptSnapshot>,
    /// In the order the live watchers (one per tenant) received them, reconnections included.
    pub live_events: Vec<SeenEvent>,
}

impl History {
    /// What `tenant`'s callers did and saw, in the same order: the history its checks read.
    pub fn of_tenant(&self, tenant: &str) -> History {
        History {
            ops: self
                .ops
                .iter()
                .filter(|o| o.tenant == tenant)
                .cloned()
                .collect(),
            snapshots: self
                .snapshots
                .iter()
                .filter(|s| s.tenant == tenant)
                .cloned()
                .collect(),
            receipts: self
                .receipts
                .iter()
                .filter(|s| s.tenant == tenant)
                .cloned()
                .collect(),
            live_events: self
                .live_events
                .iter()
                .filter(|e| e.tenant == tenant)
                .cloned()
                .collect(),
        }
    }
}

/// Shared by every client task of a run.
#[derive(Clone, Debug)]
pub struct Recorder {
    started: Instant,
    history: Arc<Mutex<History>>,
}

impl Recorder {
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            history: Arc::default(),
        }
    }

    pub fn now_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1000.0
    }

    pub fn op(&self, op: Op) {
        self.history.lock().expect("history").ops.push(op);
    }

    pub fn snapshot(&self, snapshot: Snapshot) {
        self.history
            .lock()
            .expect("history")
            .snapshots
            .push(snapshot);
    }

    pub fn receipt(&self, snapshot: ReceiptSnapshot) {
        self.history
            .lock()
            .expect("history")
            .receipts
            .push(snapshot);
    }

    pub fn event(&self, event: SeenEvent) {
        self.history
            .lock()
            .expect("history")
            .live_events
            .push(event);
    }

    /// A copy of the operations so far.
    pub fn ops(&self) -> Vec<Op> {
        self.history.lock().expect("history").ops.clone()
    }

    /// The status code of the latest operation of `tenant` under `key` (the same key in
    /// another tenant is another key).
    pub fn last_code_of(&self, tenant: &str, key: &str) -> Option<String> {
        let history = self.history.lock().expect("history");
        history
            .ops
            .iter()
            .rev()
            .find(|o| o.tenant == tenant && o.key.as_deref() == Some(key))
            .map(|o| o.code.clone())
    }

    pub fn take(&self) -> History {
        let mut history = std::mem::take(&mut *self.history.lock().expect("history"));
        history
            .ops
            .sort_by(|a, b| a.invoked_ms.total_cmp(&b.invoked_ms));
        history
    }
}
