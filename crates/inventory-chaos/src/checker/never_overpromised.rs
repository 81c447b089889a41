//! No unit is ever promised twice by the stock-states load: at every level the stream
//! committed (the SKU's total and each location's), what holds have plus what backorders
//! wait for never exceeds what is on hand plus the backorder limit, and held units never
//! include unsellable ones; no receipt is ever pre-ordered beyond its quantity, in every
//! read of the receipts during the run and in the rows at the end; at the end each
//! receipt's pre-ordered units are exactly those its live holds wait for; and at the end every
//! unit of waiting demand is covered: held + backordered + pre-ordered against open receipts
//! <= on hand + backorder limit + what open receipts bring.

use super::{Check, Facts, Verdict};
use crate::history::{History, SeenEvent};
use crate::workload::waits;

pub(super) fn never_overpromised(history: &History, stream: &[SeenEvent], facts: &Facts) -> Check {
    let mut v = Verdict::new("never_overpromised");
    let mut levels = 0;
    for e in stream {
        for (sku, on_hand, reserved, backordered, limit, unsellable) in &e.promised {
            if !waits(sku) {
                continue;
            }
            levels += 1;
            v.examined += 1;
            if reserved + backordered > on_hand + limit {
                v.fail(format!(
                    "{sku} (event {}): held {reserved} + backordered {backordered} > on hand \
                     {on_hand} + limit {limit}",
                    e.sequence
                ));
            }
            if reserved + unsellable > *on_hand {
                v.fail(format!(
                    "{sku} (event {}): held {reserved} + unsellable {unsellable} > on hand \
                     {on_hand}",
                    e.sequence
                ));
            }
        }
    }
    for r in &history.receipts {
        v.examined += 1;
        if r.preordered > r.quantity || r.preordered < 0 {
            v.fail(format!(
                "receipt {} at {:.0} ms: {} pre-ordered of {}",
                r.receipt_id, r.at_ms, r.preordered, r.quantity
            ));
        }
    }
    for r in &facts.receipts {
        v.examined += 1;
        if r.preordered > r.quantity || r.preordered != r.pegged {
            v.fail(format!(
                "receipt {} at the end: {} pre-ordered of {}, live holds wait for {}",
                r.receipt_id, r.preordered, r.quantity, r.pegged
            ));
        }
    }
    for d in &facts.demand {
        if !waits(&d.sku) {
            continue;
        }
        v.examined += 1;
        let promised = d.held + d.backordered + d.preordered_open;
        if promised > d.on_hand + d.backorder_limit + d.incoming {
            v.fail(format!(
                "{} at the end: held {} + backordered {} + pre-ordered {} > on hand {} + limit \
                 {} + incoming {}",
                d.sku,
                d.held,
                d.backordered,
                d.preordered_open,
                d.on_hand,
                d.backorder_limit,
                d.incoming
            ));
        }
    }
    v.note = format!(
        "{levels} committed levels, {} receipt reads, {} receipts at the end",
        history.receipts.len(),
        facts.receipts.len()
    );
    v.done()
}
