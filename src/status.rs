//! The one place where errors become gRPC statuses. The match is exhaustive on purpose: a new
//! error variant does not compile until someone decides what the client sees. Internal causes
//! are logged here and never sent: no SQL, driver or Redis text reaches a client.

use std::{collections::HashMap, time::Duration};

use inventory_core::{Dependency, Error};
// Every `ErrorInfo.reason` sent is a value of the proto's `ErrorReason`: declared there, with
// the status code it comes with and its metadata keys.
use inventory_proto::ErrorReason;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// `ErrorInfo.domain` of every error this service returns.
const ERROR_DOMAIN: &str = "inventory.v1";
/// How long a client should wait before retrying after `UNAVAILABLE`.
const UNAVAILABLE_RETRY_DELAY: Duration = Duration::from_millis(500);
/// How long a client should wait before retrying after `RESOURCE_EXHAUSTED`.
const EXHAUSTED_RETRY_DELAY: Duration = Duration::from_millis(200);
/// How long a caller past a cap on what it holds should wait: its holds settle in seconds at
/// best.
const QUOTA_RETRY_DELAY: Duration = Duration::from_secs(2);

/// The name a tenant's cap is configured under and refusals carry.
fn tenant_quota(quota: inventory_core::quota::Quota) -> &'static str {
    match quota {
        inventory_core::quota::Quota::Holds => "tenant_max_holds",
        inventory_core::quota::Quota::HeldUnits => "tenant_max_held_units",
    }
}

/// How long a client should wait before retrying a `Reserve` that lost a lease race.
const ABORTED_RETRY_DELAY: Duration = Duration::from_millis(50);

pub fn to_status(error: Error) -> Status {
    match &error {
        Error::CallerSaturated { .. } => crate::metrics::record_caller_refusal("max_in_flight"),
        Error::QuotaExceeded { quota, .. } => crate::metrics::record_caller_refusal(quota.as_str()),
        Error::TenantSaturated { .. } => {
            crate::metrics::record_caller_refusal("tenant_max_in_flight");
        }
        Error::TenantQuotaExceeded { quota, .. } => {
            crate::metrics::record_caller_refusal(tenant_quota(*quota));
        }
        _ => {}
    }
    let settled_by_the_caller = matches!(
        error,
        Error::QuotaExceeded { .. } | Error::TenantQuotaExceeded { .. }
    );
    let mut status = with_pushback(status_of(error));
    if settled_by_the_caller {
        // A cap clears when the caller's own holds settle, not in a moment: a negative
        // pushback tells gRPC not to retry on its own (gRFC A6), so a client at its cap does
        // not spend its channel's retry tokens on it. The application reads `RetryInfo`.
        status.metadata_mut().insert(
            "grpc-retry-pushback-ms",
            tonic::metadata::MetadataValue::from_static("-1"),
        );
    }
    status
}

/// A status that carries `RetryInfo` also carries its delay as `grpc-retry-pushback-ms`: the
/// form gRPC's own retries read (a `retryPolicy` in the service config, see
/// `deploy/grpc/service-config.json`), so clients in other languages wait as long as the Rust
/// client does.
fn with_pushback(mut status: Status) -> Status {
    let delay = status
        .get_error_details()
        .retry_info()
        .and_then(|info| info.retry_delay);
    if let Some(delay) = delay
        && let Ok(value) = delay.as_millis().to_string().parse()
    {
        status
            .metadata_mut()
            .insert("grpc-retry-pushback-ms", value);
    }
    status
}

/// The mapping, one error kind a line: its status code (the constructor's name), its
/// `ErrorInfo.reason`, the metadata it carries and the violations it lists.
fn status_of(error: Error) -> Status {
    let message = &error.to_string();
    match &error {
        Error::InvalidArgument(violations) => bad_request(violations, message),
        Error::UnknownSkus(skus) => not_found(
            ErrorReason::SkuNotFound,
            message,
            metadata([("skus", joined(skus.iter().map(|sku| sku.as_str())))]),
        ),
        Error::UnknownLocation(location) => not_found(
            ErrorReason::LocationNotFound,
            message,
            metadata([("location_id", location.as_str().to_owned())]),
        ),
        Error::UnknownReservation(id) => not_found(
            ErrorReason::ReservationNotFound,
            message,
            metadata([("reservation_id", id.to_string())]),
        ),
        Error::InsufficientStock(shortfalls) => precondition(
            ErrorReason::InsufficientStock,
            message,
            metadata([("skus", joined(shortfalls.iter().map(|s| s.sku.as_str())))]),
            shortfalls.iter().map(shortfall_violation),
        ),
        Error::WrongState { id, state, .. } => precondition(
            ErrorReason::InvalidReservationState,
            message,
            metadata([("state", state.to_string())]),
            [violation("RESERVATION_STATE", id, message)],
        ),
        Error::NotHeld { id, lines } => precondition(
            ErrorReason::NotHeld,
            message,
            metadata([
                ("reservation_id", id.to_string()),
                ("skus", joined(lines.iter().map(|line| line.sku.as_str()))),
            ]),
            lines.iter().map(not_held_violation),
        ),
        Error::PartlyReleased { id, lines } => precondition(
            ErrorReason::PartlyReleased,
            message,
            partly_released_metadata(id, lines),
            lines.iter().map(partly_released_violation),
        ),
        Error::OrderCancelled { order_id } => precondition(
            ErrorReason::OrderCancelled,
            message,
            metadata([("order_id", order_id.as_str().to_owned())]),
            [violation("ORDER_CANCELLED", order_id.as_str(), message)],
        ),
        Error::MaxHoldExceeded { id, latest } => precondition(
            ErrorReason::MaxHoldExceeded,
            message,
            metadata([(
                "latest_expires_at",
                humantime::format_rfc3339_micros(*latest).to_string(),
            )]),
            [violation("MAX_HOLD", id, message)],
        ),
        Error::LeaseBusy { sku, .. } => aborted(ErrorReason::LeaseBusy, sku.as_str(), message),
        // Only peers hear it (as `not_holder`); a client would retry like after a lost race.
        Error::NotHolder { sku } => aborted(ErrorReason::LeaseBusy, sku.as_str(), message),
        // Already a status: the peer that ran the call mapped it.
        Error::Relayed(relayed) => Status::with_details(
            Code::from_i32(relayed.code),
            relayed.message.clone(),
            relayed.details.clone().into(),
        ),
        Error::TooManyWaiters { sku } => exhausted(
            ErrorReason::SkuContended,
            message,
            sku_metadata(sku.as_str()),
            Some(sku.as_str()),
        ),
        Error::Saturated => exhausted(ErrorReason::ServerSaturated, message, HashMap::new(), None),
        Error::CallerSaturated { caller, limit } => exhausted(
            ErrorReason::CallerSaturated,
            message,
            metadata([
                ("caller", caller.as_str().to_owned()),
                ("limit", limit.to_string()),
            ]),
            None,
        ),
        Error::QuotaExceeded {
            caller,
            quota,
            limit,
            current,
        } => {
            let mut details = error_info(
                ErrorReason::CallerQuotaExceeded,
                metadata([
                    ("caller", caller.as_str().to_owned()),
                    ("quota", quota.as_str().to_owned()),
                    ("limit", limit.to_string()),
                    ("current", current.to_string()),
                ]),
            );
            details.set_retry_info(Some(QUOTA_RETRY_DELAY));
            details.add_quota_failure_violation(quota.as_str(), message);
            Status::with_error_details(Code::ResourceExhausted, message, details)
        }
        Error::TenantSaturated { tenant, limit } => exhausted(
            ErrorReason::TenantSaturated,
            message,
            metadata([
                ("tenant", tenant.as_str().to_owned()),
                ("limit", limit.to_string()),
            ]),
            None,
        ),
        Error::TenantQuotaExceeded {
            tenant,
            quota,
            limit,
            current,
        } => {
            let quota = tenant_quota(*quota);
            let mut details = error_info(
                ErrorReason::TenantQuotaExceeded,
                metadata([
                    ("tenant", tenant.as_str().to_owned()),
                    ("quota", quota.to_owned()),
                    ("limit", limit.to_string()),
                    ("current", current.to_string()),
                ]),
            );
            details.set_retry_info(Some(QUOTA_RETRY_DELAY));
            details.add_quota_failure_violation(quota, message);
            Status::with_error_details(Code::ResourceExhausted, message, details)
        }
        Error::TenantNotServed { tenant, cell } => {
            let mut fields = vec![("tenant", tenant.as_str().to_owned())];
            fields.extend(cell.iter().map(|cell| ("cell", cell.clone())));
            let details = error_info(
                ErrorReason::TenantNotServed,
                fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            );
            Status::with_error_details(Code::FailedPrecondition, message, details)
        }
        Error::TooManyWatchers => {
            exhausted(ErrorReason::TooManyWatchers, message, HashMap::new(), None)
        }
        // No RetryInfo: only deleting a subscription makes room.
        Error::TooManySubscriptions { limit } => with_reason(
            Code::ResourceExhausted,
            ErrorReason::TooManySubscriptions,
            message,
            HashMap::from([("limit".to_owned(), limit.to_string())]),
        ),
        Error::DeadlineExceeded => with_reason(
            Code::DeadlineExceeded,
            ErrorReason::DeadlineExceeded,
            message,
            HashMap::new(),
        ),
        Error::LeaseLost { sku } => lease_lost(sku.as_str(), message),
        Error::BelowReserved { sku, .. } => precondition(
            ErrorReason::StockReserved,
            message,
            sku_metadata(sku.as_str()),
            [violation("STOCK_RESERVED", sku.as_str(), message)],
        ),
        Error::VersionMismatch {
            sku,
            expected,
            current,
        } => with_reason(
            Code::Aborted,
            ErrorReason::VersionMismatch,
            message,
            metadata([
                ("sku", sku.as_str().to_owned()),
                ("expected_version", expected.to_string()),
                ("current_version", current.to_string()),
            ]),
        ),
        Error::CountBelowReserved { sku, reserved, .. } => precondition(
            ErrorReason::BelowReserved,
            message,
            metadata([
                ("sku", sku.as_str().to_owned()),
                ("reserved", reserved.to_string()),
            ]),
            [violation("BELOW_RESERVED", sku.as_str(), message)],
        ),
        Error::StockLimit { sku, .. } => precondition(
            ErrorReason::StockLimit,
            message,
            sku_metadata(sku.as_str()),
            [violation("STOCK_LIMIT", sku.as_str(), message)],
        ),
        Error::CursorPruned { pruned_through, .. } => with_reason(
            Code::OutOfRange,
            ErrorReason::CursorPruned,
            message,
            metadata([("oldest_sequence", (pruned_through + 1).to_string())]),
        ),
        Error::SchemaTooNew { release, floor } => schema_too_new(*release, *floor, message),
        Error::CursorNotInHistory { current, head, .. } => with_reason(
            Code::OutOfRange,
            ErrorReason::CursorNotInHistory,
            message,
            metadata([
                ("epoch", current.id.to_string()),
                ("epoch_starts_after", current.starts_after.to_string()),
                ("head", head.to_string()),
            ]),
        ),
        Error::UnknownReceipt(id) => not_found(
            ErrorReason::ReceiptNotFound,
            message,
            metadata([("receipt_id", id.to_string())]),
        ),
        Error::ReceiptExists(id) => with_reason(
            Code::AlreadyExists,
            ErrorReason::ReceiptExists,
            message,
            metadata([("receipt_id", id.to_string())]),
        ),
        Error::ReceiptClosed { id, state } => with_reason(
            Code::FailedPrecondition,
            ErrorReason::ReceiptClosed,
            message,
            metadata([
                ("receipt_id", id.to_string()),
                ("state", state.as_str().to_owned()),
            ]),
        ),
        Error::SubscriptionNotFound(name) => with_reason(
            Code::NotFound,
            ErrorReason::SubscriptionNotFound,
            message,
            metadata([("subscription", name.to_string())]),
        ),
        Error::SubscriptionExists(name) => with_reason(
            Code::AlreadyExists,
            ErrorReason::SubscriptionExists,
            message,
            metadata([("subscription", name.to_string())]),
        ),
        Error::SubscriptionTakenOver(name) => with_reason(
            Code::FailedPrecondition,
            ErrorReason::SubscriptionTakenOver,
            message,
            metadata([("subscription", name.to_string())]),
        ),
        Error::SubscriptionLost {
            name,
            acked,
            reason,
        } => with_reason(
            Code::FailedPrecondition,
            ErrorReason::SubscriptionLost,
            message,
            metadata([
                ("subscription", name.to_string()),
                ("acked_sequence", acked.to_string()),
                ("reason", reason.clone()),
            ]),
        ),
        Error::IdempotencyKeyReused => with_reason(
            Code::AlreadyExists,
            ErrorReason::IdempotencyKeyReused,
            message,
            HashMap::new(),
        ),
        Error::Unavailable { dependency, source } => unavailable(*dependency, source, message),
        Error::Internal(source) => internal(source),
    }
}

/// `ErrorInfo.metadata`.
type Metadata = HashMap<String, String>;

/// A `PreconditionFailure` violation: its type, subject and description.
type Violation = (&'static str, String, String);

/// Details carrying only the `ErrorInfo`, for `reason` and its `metadata`.
fn error_info(reason: ErrorReason, metadata: Metadata) -> ErrorDetails {
    ErrorDetails::with_error_info(reason.as_str_name(), ERROR_DOMAIN, metadata)
}

/// `code` with an `ErrorInfo` and nothing else.
fn with_reason(code: Code, reason: ErrorReason, message: &str, metadata: Metadata) -> Status {
    Status::with_error_details(code, message, error_info(reason, metadata))
}

/// `INVALID_ARGUMENT`, each bad field a `BadRequest` violation.
fn bad_request(violations: &[inventory_core::FieldViolation], message: &str) -> Status {
    let mut details = error_info(ErrorReason::InvalidArgument, HashMap::new());
    for violation in violations {
        details.add_bad_request_violation(&violation.field, &violation.description);
    }
    Status::with_error_details(Code::InvalidArgument, message, details)
}

/// `NOT_FOUND`, naming what was not found in `metadata`.
fn not_found(reason: ErrorReason, message: &str, metadata: Metadata) -> Status {
    with_reason(Code::NotFound, reason, message, metadata)
}

/// `FAILED_PRECONDITION`, each unmet precondition a `PreconditionFailure` violation.
fn precondition(
    reason: ErrorReason,
    message: &str,
    metadata: Metadata,
    violations: impl IntoIterator<Item = Violation>,
) -> Status {
    let mut details = error_info(reason, metadata);
    for (kind, subject, description) in violations {
        details.add_precondition_failure_violation(kind, subject, description);
    }
    Status::with_error_details(Code::FailedPrecondition, message, details)
}

/// `RESOURCE_EXHAUSTED` with a retry delay; `quota`, when set, is the subject of a
/// `QuotaFailure` violation.
fn exhausted(
    reason: ErrorReason,
    message: &str,
    metadata: Metadata,
    quota: Option<&str>,
) -> Status {
    let mut details = error_info(reason, metadata);
    details.set_retry_info(Some(EXHAUSTED_RETRY_DELAY));
    if let Some(subject) = quota {
        details.add_quota_failure_violation(subject, message);
    }
    Status::with_error_details(Code::ResourceExhausted, message, details)
}

/// A refused attempt that a plain retry may win: `ABORTED` with a short retry delay.
fn aborted(reason: ErrorReason, sku: &str, message: &str) -> Status {
    let mut details = error_info(reason, sku_metadata(sku));
    details.set_retry_info(Some(ABORTED_RETRY_DELAY));
    Status::with_error_details(Code::Aborted, message, details)
}

/// A write fenced off: `ABORTED` like a busy lease, and logged.
fn lease_lost(sku: &str, message: &str) -> Status {
    tracing::warn!(%sku, "write fenced off: the lease was lost");
    aborted(ErrorReason::LeaseLost, sku, message)
}

/// A replica below the schema floor: `FAILED_PRECONDITION`, and logged as an error.
fn schema_too_new(release: i32, floor: i32, message: &str) -> Status {
    tracing::error!(
        release,
        floor,
        "write refused: this replica's release is below the schema floor; roll it forward"
    );
    precondition(
        ErrorReason::SchemaTooNew,
        message,
        metadata([
            ("release", release.to_string()),
            ("floor", floor.to_string()),
        ]),
        [violation("SCHEMA_TOO_NEW", "schema", message)],
    )
}

/// `UNAVAILABLE` with a retry delay, naming the dependency; the cause is logged, not sent.
fn unavailable(
    dependency: Dependency,
    source: &(impl std::fmt::Display + ?Sized),
    message: &str,
) -> Status {
    tracing::warn!(%dependency, error = %source, "dependency unavailable");
    let reason = match dependency {
        Dependency::Postgres => ErrorReason::PostgresUnavailable,
        Dependency::Redis => ErrorReason::RedisUnavailable,
    };
    let mut details = error_info(reason, HashMap::new());
    details.set_retry_info(Some(UNAVAILABLE_RETRY_DELAY));
    Status::with_error_details(Code::Unavailable, message, details)
}

/// `INTERNAL` with no details: the cause is logged, never sent.
fn internal(source: &(impl std::fmt::Display + std::fmt::Debug + ?Sized)) -> Status {
    tracing::error!(error = %source, cause = ?source, "internal error");
    Status::internal("internal error")
}

fn violation(kind: &'static str, subject: impl ToString, description: &str) -> Violation {
    (kind, subject.to_string(), description.to_owned())
}

fn shortfall_violation(shortfall: &inventory_core::error::Shortfall) -> Violation {
    // Enough over every location, but no single one has it all.
    let whole = if shortfall.available >= shortfall.requested {
        "; no one location has them all (allow_split combines locations)"
    } else {
        ""
    };
    let description = format!(
        "requested {}, available {}{whole}",
        shortfall.requested, shortfall.available
    );
    violation("INSUFFICIENT_STOCK", shortfall.sku.as_str(), &description)
}

fn not_held_violation(line: &inventory_core::error::NotHeld) -> Violation {
    let description = match line.held {
        Some(held) => format!(
            "asks for {} units of {}; {held} held",
            line.requested, line.sku
        ),
        None => format!("{} is not a line of the reservation", line.sku),
    };
    violation("NOT_HELD", format!("lines[{}]", line.index), &description)
}

fn partly_released_violation(line: &inventory_core::error::Settled) -> Violation {
    let description = format!(
        "{} reserved: {} confirmed, {} went back to stock",
        line.quantity, line.confirmed, line.released
    );
    violation("PARTLY_RELEASED", line.sku.as_str(), &description)
}

fn partly_released_metadata(
    id: &impl ToString,
    lines: &[inventory_core::error::Settled],
) -> Metadata {
    let total = |units: fn(&inventory_core::error::Settled) -> i64| {
        lines.iter().map(units).sum::<i64>().to_string()
    };
    metadata([
        ("reservation_id", id.to_string()),
        ("confirmed", total(|l| l.confirmed)),
        ("released", total(|l| l.released)),
    ])
}

fn metadata<const N: usize>(entries: [(&str, String); N]) -> Metadata {
    entries
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect()
}

fn joined<'a>(values: impl Iterator<Item = &'a str>) -> String {
    values.collect::<Vec<_>>().join(",")
}

fn sku_metadata(sku: &str) -> Metadata {
    metadata([("sku", sku.to_owned())])
}
