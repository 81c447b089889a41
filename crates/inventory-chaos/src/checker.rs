//! The checker: after a run, the recorded history, the event stream read back from the start
//! and PostgreSQL's rows must agree on every guarantee. Each check names what it examined and,
//! when it fails, the first offenders.
//!
//! A reservation's units move in steps: a hold, then any number of partial confirms and
//! releases and extensions, then one end (confirm, release, cancel or expiry of the rest).
//! Every `ReservationChanged` event carries each line's held, confirmed and released units
//! after its step, so the checks replay stock and units from the stream itself, in commit
//! order.
//!
//! One module per guarantee, each a function of what it needs that returns its [`Check`];
//! [`check`] runs them all, in the order the report lists them.
//!
//! A run serves several tenants with the same SKU names, and the guarantees hold per tenant:
//! [`check`] runs once for each, on that tenant's history (`History::of_tenant`), its event
//! stream and the rows of its own schema, and every check it returns names the tenant.
//! [`tenants_isolated`] then looks across them: nothing of one tenant is in another's rows,
//! stream or answers.

use std::collections::{BTreeMap, HashMap};

pub use inventory_testkit::audit::{LevelMismatch, ReservationRow};
use serde::Serialize;

use crate::history::{History, Line, Op, OpKind, SeenEvent};
use crate::workload::waits;

mod adjusts_and_cancels_kept;
mod events_gap_free;
mod events_in_commit_order;
mod failures_left_nothing;
mod fences_increase;
mod indeterminate_resolved;
mod live_stream_consistent;
mod never_overpromised;
mod never_oversold;
mod no_phantoms;
mod resumed_after_faults;
mod retryable_during_failover;
mod settled_never_lost;
mod stock_returned_once;
mod successes_exist_once;
mod tenants_isolated;
mod unavailable_while_redis_down;
mod units_settled_once;

use adjusts_and_cancels_kept::adjusts_and_cancels_kept;
use events_gap_free::events_gap_free;
use events_in_commit_order::events_in_commit_order;
use failures_left_nothing::failures_left_nothing;
use fences_increase::fences_increase;
use indeterminate_resolved::indeterminate_resolved;
use live_stream_consistent::live_stream_consistent;
use never_overpromised::never_overpromised;
use never_oversold::never_oversold;
use no_phantoms::no_phantoms;
use resumed_after_faults::resumed_after_faults;
use retryable_during_failover::retryable_during_failover;
use settled_never_lost::settled_never_lost;
use stock_returned_once::stock_returned_once;
use successes_exist_once::successes_exist_once;
pub use tenants_isolated::{TenantRows, tenants_isolated};
use unavailable_while_redis_down::unavailable_while_redis_down;
use units_settled_once::units_settled_once;

#[derive(Clone, Debug, Serialize)]
pub struct StockRow {
    pub sku: String,
    pub on_hand: i64,
    pub reserved: i64,
    pub version: i64,
}

#[derive(Clone, Debug, Serialize)]
pub struct OutboxRow {
    pub position: Option<i64>,
    pub event_id: String,
    pub event_type: String,
    /// The writing transaction.
    pub tx_id: String,
}

/// A receipt as PostgreSQL holds it at the end, with the pre-ordered units of the live holds
/// pegged to it.
#[derive(Clone, Debug, Serialize)]
pub struct ReceiptRow {
    pub receipt_id: String,
    pub quantity: i64,
    pub received: i64,
    pub preordered: i64,
    pub pegged: i64,
}

/// What PostgreSQL holds once the run is over.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Facts {
    pub reservations: Vec<ReservationRow>,
    pub stock: Vec<StockRow>,
    pub outbox: Vec<OutboxRow>,
    pub head: i64,
    /// SKUs whose `reserved` column is not what their HELD rows hold (the row audit).
    pub level_mismatches: Vec<LevelMismatch>,
    /// Reservations of a cancelled order created after the cancel, or held past it.
    pub cancel_violations: Vec<String>,
    /// The idempotency keys of the stored `ADJUSTED` movements.
    pub adjust_keys: Vec<String>,
    /// The orders stored as cancelled.
    pub cancelled_orders: Vec<String>,
    /// Every caller the rows name: of reservations, idempotency keys, cancelled orders (but an
    /// admin's `*`) and the ledger's movements (`actor`, but the sweeper's empty one).
    #[serde(default)]
    pub callers: Vec<String>,
    /// The receipts (the stock-states load's).
    #[serde(default)]
    pub receipts: Vec<ReceiptRow>,
    /// Per SKU with waiting demand or incoming units, every unit promised at the end.
    #[serde(default)]
    pub demand: Vec<DemandRow>,
}

/// A SKU's promises at the end of a run: what holds have, what backorders wait for and what
/// pre-orders wait for from open receipts, against what is on hand, the backorder limit and
/// what open receipts bring.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DemandRow {
    pub sku: String,
    pub held: i64,
    pub backordered: i64,
    pub preordered_open: i64,
    pub on_hand: i64,
    pub backorder_limit: i64,
    pub incoming: i64,
}

/// Whether an event is about the stock-states load's SKU (its holds wait, which the
/// reservation checks' unit replay does not model: `never_overpromised` judges them).
fn of_waiting_load(e: &SeenEvent) -> bool {
    e.sku.as_deref().is_some_and(waits)
        || e.lines.iter().any(|l| waits(&l.sku))
        || e.levels.iter().any(|l| waits(&l.0))
}

/// A fault healed at this moment; the `Reserve` calls that must succeed again soon after are
/// those for these SKUs (any, when `None`).
#[derive(Clone, Debug, Serialize)]
pub struct Heal {
    pub fault: String,
    pub healed_ms: f64,
    pub skus: Option<Vec<String>>,
    /// When the next PostgreSQL failover after it began, if one did.
    pub next_failover_ms: Option<f64>,
}

/// A span during which Redis could not grant a lease for these SKUs (all, when `None`).
#[derive(Clone, Debug, Serialize)]
pub struct Outage {
    pub fault: String,
    pub start_ms: f64,
    pub end_ms: f64,
    pub skus: Option<Vec<String>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    /// The tenant whose history, stream and rows it judged; `None`: the run as a whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub passed: bool,
    pub examined: usize,
    pub detail: String,
}

/// How soon after a fault heals a `Reserve` must succeed again.
pub const RESUME_WITHIN_MS: f64 = 10_000.0;

struct Verdict {
    name: &'static str,
    examined: usize,
    problems: Vec<String>,
    note: String,
}

impl Verdict {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            examined: 0,
            problems: Vec::new(),
            note: String::new(),
        }
    }

    fn fail(&mut self, problem: String) {
        self.problems.push(problem);
    }

    fn done(self) -> Check {
        let passed = self.problems.is_empty();
        let detail = if passed {
            self.note
        } else {
            let shown: Vec<_> = self.problems.iter().take(5).cloned().collect();
            format!(
                "{} problem(s): {}{}",
                self.problems.len(),
                shown.join("; "),
                if self.problems.len() > 5 { "; …" } else { "" }
            )
        };
        Check {
            name: self.name,
            tenant: None,
            passed,
            examined: self.examined,
            detail,
        }
    }
}

fn sorted_lines(lines: &[Line]) -> Vec<(String, i64)> {
    let mut lines: Vec<_> = lines.iter().map(|l| (l.sku.clone(), l.quantity)).collect();
    lines.sort();
    lines
}

/// Every guarantee of one tenant, judged on its own history, stream and rows.
pub fn check_tenant(
    tenant: &str,
    history: &History,
    stream: &[SeenEvent],
    facts: &Facts,
    (outages, heals): (&[Outage], &[Heal]),
    failovers: &[Outage],
    load_end_ms: f64,
) -> Vec<Check> {
    let history = history.of_tenant(tenant);
    let mut checks = check(
        &history,
        stream,
        facts,
        outages,
        heals,
        failovers,
        load_end_ms,
    );
    for check in &mut checks {
        check.tenant = Some(tenant.to_owned());
    }
    checks
}

pub fn check(
    history: &History,
    stream: &[SeenEvent],
    facts: &Facts,
    outages: &[Outage],
    heals: &[Heal],
    failovers: &[Outage],
    load_end_ms: f64,
) -> Vec<Check> {
    // The reservation checks judge every load but the stock-states one (the stream's own
    // checks, its density and order, read all of it).
    let classic: Vec<SeenEvent> = stream
        .iter()
        .filter(|e| !of_waiting_load(e))
        .cloned()
        .collect();
    let mut classic_facts = facts.clone();
    classic_facts
        .reservations
        .retain(|r| !r.lines.iter().any(|l| waits(&l.0)));
    classic_facts.stock.retain(|s| !waits(&s.sku));
    let mut by_key: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in history.ops.iter().filter(|o| o.kind == OpKind::Reserve) {
        by_key
            .entry(op.key.as_deref().unwrap_or(""))
            .or_default()
            .push(op);
    }
    let mut rows_by_key: HashMap<&str, Vec<&ReservationRow>> = HashMap::new();
    for row in &classic_facts.reservations {
        rows_by_key.entry(&row.key).or_default().push(row);
    }
    let rows_by_id: HashMap<&str, &ReservationRow> = classic_facts
        .reservations
        .iter()
        .map(|r| (r.id.as_str(), r))
        .collect();
    vec![
        never_oversold(history, stream, facts),
        successes_exist_once(&by_key, &rows_by_key),
        failures_left_nothing(&by_key, &rows_by_key),
        indeterminate_resolved(&by_key, &rows_by_key),
        no_phantoms(&by_key, &classic_facts),
        settled_never_lost(history, &rows_by_id),
        stock_returned_once(&classic, &classic_facts),
        units_settled_once(history, &classic, &classic_facts, &rows_by_id),
        fences_increase(&classic, &classic_facts, &rows_by_id),
        events_gap_free(stream, facts),
        events_in_commit_order(stream),
        live_stream_consistent(history, stream),
        unavailable_while_redis_down(history, outages),
        resumed_after_faults(history, heals, load_end_ms),
        adjusts_and_cancels_kept(history, facts),
        retryable_during_failover(history, failovers),
        never_overpromised(history, stream, facts),
    ]
}

/// (held, confirmed, released) of each of an event's lines. A stream read before events
/// carried them has none: the lines are then taken whole, where the event type puts them.
fn event_units(e: &SeenEvent) -> Vec<(i64, i64, i64)> {
    if e.units.len() == e.lines.len() {
        return e.units.clone();
    }
    e.lines
        .iter()
        .map(|l| match e.event_type.as_str() {
            "RESERVATION_CONFIRMED" => (0, l.quantity, 0),
            "RESERVATION_RELEASED" | "RESERVATION_EXPIRED" => (0, 0, l.quantity),
            _ => (l.quantity, 0, 0),
        })
        .collect()
}

/// The version of `sku` an event's levels carry.
fn version_of(event: &SeenEvent, sku: &str) -> Option<i64> {
    event.levels.iter().find(|l| l.0 == sku).map(|l| l.3)
}

#[cfg(test)]
mod tests;
