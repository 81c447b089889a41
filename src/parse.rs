//! The boundary: raw protobuf requests become core commands here, or an `INVALID_ARGUMENT`
//! listing every offending field at once. Nothing past this module sees an unchecked value.

use std::collections::HashMap;

use std::time::Duration;

use inventory_core::{
    Error, FieldViolation,
    command::{AdjustStock, GetStock, ReservationRef, Reserve, WatchEvents},
    domain::{
        Caller, IdempotencyKey, Line, MAX_LINES, MAX_SKUS_PER_READ, OrderId, Quantity, Reason,
        ReservationId, Scope, Sku, StockDelta, Ttl,
    },
};

use crate::proto;

/// Collects field violations while a request is parsed.
#[derive(Debug, Default)]
struct Violations(Vec<FieldViolation>);

impl Violations {
    fn check<T>(&mut self, field: impl Into<String>, parsed: Result<T, String>) -> Option<T> {
        parsed
            .map_err(|description| self.0.push(FieldViolation::new(field, description)))
            .ok()
    }

    fn add(&mut self, field: impl Into<String>, description: impl Into<String>) {
        self.0.push(FieldViolation::new(field, description));
    }

    /// Builds the command only if no violation was recorded (so constructors may assume a
    /// valid request), and reports every violation otherwise.
    fn finish<T>(self, build: impl FnOnce() -> Option<T>) -> Result<T, Error> {
        if !self.0.is_empty() {
            return Err(Error::InvalidArgument(self.0));
        }
        build().ok_or_else(|| Error::internal("a request without violations did not parse"))
    }
}

impl TryFrom<proto::AdjustStockRequest> for AdjustStock {
    type Error = Error;

    fn try_from(request: proto::AdjustStockRequest) -> Result<Self, Error> {
        let mut violations = Violations::default();
        let sku = violations.check("sku", Sku::parse(&request.sku));
        let delta = violations.check("delta", StockDelta::parse(request.delta));
        let idempotency_key = violations.check(
            "idempotency_key",
            IdempotencyKey::parse(&request.idempotency_key),
        );
        let reason = violations.check("reason", Reason::parse(&request.reason));
        violations.finish(|| {
            Some(AdjustStock {
                // Set by the gRPC layer once the caller is authenticated.
                caller: Caller::anonymous(),
                sku: sku?,
                delta: delta?,
                idempotency_key: idempotency_key?,
                reason: reason?,
            })
        })
    }
}

impl TryFrom<proto::GetStockRequest> for GetStock {
    type Error = Error;

    fn try_from(request: proto::GetStockRequest) -> Result<Self, Error> {
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
        violations.finish(|| Some(GetStock::new(skus)))
    }
}

impl TryFrom<proto::ReserveRequest> for Reserve {
    type Error = Error;

    fn try_from(request: proto::ReserveRequest) -> Result<Self, Error> {
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
        if request.lines.len() > MAX_LINES {
            violations.add("lines", format!("must have at most {MAX_LINES} lines"));
            return violations.finish(|| None);
        }
        let mut lines = Vec::with_capacity(request.lines.len());
        let mut first_seen: HashMap<&str, usize> = HashMap::new();
        for (index, line) in request.lines.iter().enumerate() {
            let sku = violations.check(format!("lines[{index}].sku"), Sku::parse(&line.sku));
            let quantity = violations.check(
                format!("lines[{index}].quantity"),
                Quantity::parse(line.quantity),
            );
            if let Some(first) = first_seen.get(line.sku.as_str()) {
                violations.add(
                    format!("lines[{index}].sku"),
                    format!("duplicates lines[{first}].sku"),
                );
                continue;
            }
            first_seen.insert(&line.sku, index);
            if let (Some(sku), Some(quantity)) = (sku, quantity) {
                lines.push(Line { sku, quantity });
            }
        }
        violations.finish(|| Some(Reserve::new(idempotency_key?, order_id?, lines, ttl?)))
    }
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
pub fn reservation_ref(raw: &str, scope: Scope) -> Result<ReservationRef, Error> {
    let mut violations = Violations::default();
    let id = violations.check("reservation_id", ReservationId::parse(raw));
    violations.finish(|| id.map(|id| ReservationRef::new(id, scope)))
}

impl TryFrom<proto::WatchEventsRequest> for WatchEvents {
    type Error = Error;

    fn try_from(request: proto::WatchEventsRequest) -> Result<Self, Error> {
        let mut violations = Violations::default();
        let command =
            violations.check("after_sequence", WatchEvents::parse(request.after_sequence));
        violations.finish(|| command)
    }
}

#[cfg(test)]
mod tests;
