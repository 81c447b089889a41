//! Nothing of one tenant is in another: the tenants share SKU names, idempotency keys and order
//! ids, and each has them all to itself.

use std::collections::{BTreeMap, BTreeSet};

use super::{Check, Facts, Verdict};
use crate::history::{History, OpKind, Outcome, SeenEvent};

/// One tenant's side of the run, as the isolation check compares it with the others'.
#[derive(Debug)]
pub struct TenantRows<'a> {
    pub tenant: &'a str,
    /// The names of its callers (`""`: the anonymous caller of a run without authentication).
    pub callers: Vec<&'a str>,
    /// The rows of its schema.
    pub facts: &'a Facts,
    /// Its event stream, read back from the start.
    pub stream: &'a [SeenEvent],
}

/// Across tenants, with the same SKU names, keys and order ids in each:
///
/// - every caller a tenant's rows name (of a reservation, an idempotency key, a cancelled
///   order, a movement of the ledger) is one of that tenant's own callers;
/// - no reservation is stored in two tenants' schemas, and no answer to a tenant's caller
///   named a reservation stored in another's;
/// - no event is in two tenants' streams, and a tenant's stream names only reservations of
///   its own rows;
/// - every tenant has its own stock row of every SKU name of the run, and sold some: a
///   tenant whose `Reserve` never succeeded would prove nothing.
pub fn tenants_isolated(history: &History, tenants: &[TenantRows], skus: &[String]) -> Check {
    let mut v = Verdict::new("tenants_isolated");
    // Which tenant stores each reservation, and which stream holds each event.
    let mut stored: BTreeMap<&str, &str> = BTreeMap::new();
    let mut streamed: BTreeMap<&str, &str> = BTreeMap::new();
    for t in tenants {
        for name in &t.facts.callers {
            v.examined += 1;
            if !t.callers.contains(&name.as_str()) {
                v.fail(format!(
                    "tenant {}'s rows name caller {name:?}, not one of its own",
                    t.tenant
                ));
            }
        }
        for row in &t.facts.reservations {
            v.examined += 1;
            if let Some(other) = stored.insert(&row.id, t.tenant) {
                v.fail(format!(
                    "reservation {} is stored in tenant {other}'s rows and in tenant {}'s",
                    row.id, t.tenant
                ));
            }
        }
        for e in t.stream {
            v.examined += 1;
            if let Some(other) = streamed.insert(&e.event_id, t.tenant) {
                v.fail(format!(
                    "event {} is in tenant {other}'s stream and in tenant {}'s",
                    e.event_id, t.tenant
                ));
            }
        }
        let own: BTreeSet<&str> = t.facts.stock.iter().map(|s| s.sku.as_str()).collect();
        for sku in skus {
            v.examined += 1;
            if !own.contains(sku.as_str()) {
                v.fail(format!("tenant {} has no stock row of {sku}", t.tenant));
            }
        }
    }
    for t in tenants {
        let reservations = t.stream.iter().filter_map(|e| e.reservation_id.as_deref());
        for id in reservations.collect::<BTreeSet<_>>() {
            v.examined += 1;
            match stored.get(id) {
                Some(&owner) if owner != t.tenant => v.fail(format!(
                    "tenant {}'s stream names reservation {id}, stored in tenant {owner}'s rows",
                    t.tenant
                )),
                _ => {}
            }
        }
    }
    let mut sold: BTreeMap<&str, usize> = tenants.iter().map(|t| (t.tenant, 0)).collect();
    for op in &history.ops {
        if op.kind == OpKind::Reserve && op.outcome == Outcome::Ok {
            *sold.entry(op.tenant.as_str()).or_default() += 1;
        }
        let Some(id) = op.reservation_id.as_deref() else {
            continue;
        };
        if op.outcome != Outcome::Ok {
            continue;
        }
        v.examined += 1;
        match stored.get(id) {
            Some(&owner) if owner != op.tenant => v.fail(format!(
                "tenant {}'s {:?} {} was answered with reservation {id}, stored in tenant \
                 {owner}'s rows",
                op.tenant,
                op.kind,
                op.key.as_deref().unwrap_or("")
            )),
            _ => {}
        }
    }
    for (tenant, holds) in &sold {
        if *holds == 0 {
            v.fail(format!("tenant {tenant}: no Reserve succeeded"));
        }
    }
    let sold: Vec<String> = sold
        .iter()
        .map(|(tenant, holds)| format!("{tenant} {holds}"))
        .collect();
    v.note = format!(
        "{} tenants, {} SKU names each; holds: {}; {} reservations, {} events, none shared",
        tenants.len(),
        skus.len(),
        sold.join(", "),
        stored.len(),
        streamed.len()
    );
    v.done()
}
