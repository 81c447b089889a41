//! The boundary: raw protobuf requests become core commands here, or an `INVALID_ARGUMENT`
//! listing every offending field at once. Nothing past this module sees an unchecked value.

use std::collections::HashMap;

use inventory_core::{
    Error, FieldViolation,
    command::{AdjustStock, GetStock},
    domain::{IdempotencyKey, MAX_SKUS_PER_READ, Reason, Sku, StockDelta},
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

    /// `Ok(value)` only if no violation was recorded.
    fn finish<T>(self, value: Option<T>) -> Result<T, Error> {
        match value {
            Some(value) if self.0.is_empty() => Ok(value),
            _ => Err(Error::InvalidArgument(self.0)),
        }
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
        let command = (|| {
            Some(AdjustStock {
                sku: sku?,
                delta: delta?,
                idempotency_key: idempotency_key?,
                reason: reason?,
            })
        })();
        violations.finish(command)
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
            return violations.finish(None);
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
        violations.finish(Some(skus)).map(GetStock::new)
    }
}

#[cfg(test)]
mod tests;
