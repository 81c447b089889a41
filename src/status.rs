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
/// How long a client should wait before retrying a `Reserve` that lost a lease race.
const ABORTED_RETRY_DELAY: Duration = Duration::from_millis(50);

pub fn to_status(error: Error) -> Status {
    with_pushback(status_of(error))
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

fn status_of(error: Error) -> Status {
    match error {
        Error::InvalidArgument(violations) => {
            let mut details = ErrorDetails::new();
            for violation in &violations {
                details.add_bad_request_violation(&violation.field, &violation.description);
            }
            details.set_error_info(
                ErrorReason::InvalidArgument.as_str_name(),
                ERROR_DOMAIN,
                HashMap::new(),
            );
            Status::with_error_details(
                Code::InvalidArgument,
                Error::InvalidArgument(violations).to_string(),
                details,
            )
        }
        Error::UnknownSkus(ref skus) => {
            let joined = skus
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(",");
            let mut details = ErrorDetails::new();
            details.set_error_info(
                ErrorReason::SkuNotFound.as_str_name(),
                ERROR_DOMAIN,
                HashMap::from([("skus".to_string(), joined)]),
            );
            Status::with_error_details(Code::NotFound, error.to_string(), details)
        }
        Error::UnknownLocation(ref location) => {
            let mut details = ErrorDetails::new();
            details.set_error_info(
                ErrorReason::LocationNotFound.as_str_name(),
                ERROR_DOMAIN,
                HashMap::from([("location_id".to_string(), location.as_str().to_owned())]),
            );
            Status::with_error_details(Code::NotFound, error.to_string(), details)
        }
        Error::UnknownReservation(id) => {
            let mut details = ErrorDetails::new();
            details.set_error_info(
                ErrorReason::ReservationNotFound.as_str_name(),
                ERROR_DOMAIN,
                HashMap::from([("reservation_id".to_string(), id.to_string())]),
            );
            Status::with_error_details(Code::NotFound, error.to_string(), details)
        }
        Error::InsufficientStock(ref shortfalls) => {
            let mut details = ErrorDetails::new();
            for shortfall in shortfalls {
                // Enough over every location, but no single one has it all.
                let whole = if shortfall.available >= shortfall.requested {
                    "; no one location has them all (allow_split combines locations)"
                } else {
                    ""
                };
                details.add_precondition_failure_violation(
                    "INSUFFICIENT_STOCK",
                    shortfall.sku.as_str(),
                    format!(
                        "requested {}, available {}{whole}",
                        shortfall.requested, shortfall.available
                    ),
                );
            }
            let skus = shortfalls
                .iter()
                .map(|s| s.sku.as_str())
                .collect::<Vec<_>>()
                .join(",");
            details.set_error_info(
                ErrorReason::InsufficientStock.as_str_name(),
                ERROR_DOMAIN,
                HashMap::from([("skus".to_string(), skus)]),
            );
            Status::with_error_details(Code::FailedPrecondition, error.to_string(), details)
        }
        Error::WrongState { id, state, .. } => {
            let mut details = ErrorDetails::new();
            details
                .add_precondition_failure_violation(
                    "RESERVATION_STATE",
                    id.to_string(),
                    error.to_string(),
                )
                .set_error_info(
                    ErrorReason::InvalidReservationState.as_str_name(),
                    ERROR_DOMAIN,
                    HashMap::from([("state".to_string(), state.to_string())]),
                );
            Status::with_error_details(Code::FailedPrecondition, error.to_string(), details)
        }
        Error::NotHeld { id, ref lines } => {
            let mut details = ErrorDetails::new();
            for line in lines {
                let description = match line.held {
                    Some(held) => format!(
                        "asks for {} units of {}; {held} held",
                        line.requested, line.sku
                    ),
                    None => format!("{} is not a line of the reservation", line.sku),
                };
                details.add_precondition_failure_violation(
                    "NOT_HELD",
                    format!("lines[{}]", line.index),
                    description,
                );
            }
            let skus = lines
                .iter()
                .map(|line| line.sku.as_str())
                .collect::<Vec<_>>()
                .join(",");
            details.set_error_info(
                ErrorReason::NotHeld.as_str_name(),
                ERROR_DOMAIN,
                HashMap::from([
                    ("reservation_id".to_string(), id.to_string()),
                    ("skus".to_string(), skus),
                ]),
            );
            Status::with_error_details(Code::FailedPrecondition, error.to_string(), details)
        }
        Error::PartlyReleased { id, ref lines } => {
            let mut details = ErrorDetails::new();
            for line in lines {
                details.add_precondition_failure_violation(
                    "PARTLY_RELEASED",
                    line.sku.as_str(),
                    format!(
                        "{} reserved: {} confirmed, {} went back to stock",
                        line.quantity, line.confirmed, line.released
                    ),
                );
            }
            let total = |units: fn(&inventory_core::error::Settled) -> i64| {
                lines.iter().map(units).sum::<i64>().to_string()
            };
            details.set_error_info(
                ErrorReason::PartlyReleased.as_str_name(),
                ERROR_DOMAIN,
                HashMap::from([
                    ("reservation_id".to_string(), id.to_string()),
                    ("confirmed".to_string(), total(|l| l.confirmed)),
                    ("released".to_string(), total(|l| l.released)),
                ]),
            );
            Status::with_error_details(Code::FailedPrecondition, error.to_string(), details)
        }
        Error::OrderCancelled { ref order_id } => {
            let mut details = ErrorDetails::new();
            details
                .add_precondition_failure_violation(
                    "ORDER_CANCELLED",
                    order_id.as_str(),
                    error.to_string(),
                )
                .set_error_info(
                    ErrorReason::OrderCancelled.as_str_name(),
                    ERROR_DOMAIN,
                    HashMap::from([("order_id".to_string(), order_id.as_str().to_owned())]),
                );
            Status::with_error_details(Code::FailedPrecondition, error.to_string(), details)
        }
        Error::MaxHoldExceeded { id, latest } => {
            let latest = humantime::format_rfc3339_micros(latest).to_string();
            let mut details = ErrorDetails::new();
            details
                .add_precondition_failure_violation("MAX_HOLD", id.to_string(), error.to_string())
                .set_error_info(
                    ErrorReason::MaxHoldExceeded.as_str_name(),
                    ERROR_DOMAIN,
                    HashMap::from([("latest_expires_at".to_string(), latest)]),
                );
            Status::with_error_details(Code::FailedPrecondition, error.to_string(), details)
        }
        Error::LeaseBusy { ref sku, .. } => aborted(ErrorReason::LeaseBusy, sku.as_str(), &error),
        Error::TooManyWaiters { ref sku } => {
            let mut details = ErrorDetails::new();
            details
                .set_retry_info(Some(EXHAUSTED_RETRY_DELAY))
                .add_quota_failure_violation(sku.as_str(), error.to_string())
                .set_error_info(
                    ErrorReason::SkuContended.as_str_name(),
                    ERROR_DOMAIN,
                    sku_metadata(sku.as_str()),
                );
            Status::with_error_details(Code::ResourceExhausted, error.to_string(), details)
        }
        Error::Saturated => {
            let mut details = ErrorDetails::new();
            details
                .set_retry_info(Some(EXHAUSTED_RETRY_DELAY))
                .set_error_info(
                    ErrorReason::ServerSaturated.as_str_name(),
                    ERROR_DOMAIN,
                    HashMap::new(),
                );
            Status::with_error_details(Code::ResourceExhausted, error.to_string(), details)
        }
        Error::TooManyWatchers => {
            let mut details = ErrorDetails::new();
            details
                .set_retry_info(Some(EXHAUSTED_RETRY_DELAY))
                .set_error_info(
                    ErrorReason::TooManyWatchers.as_str_name(),
                    ERROR_DOMAIN,
                    HashMap::new(),
                );
            Status::with_error_details(Code::ResourceExhausted, error.to_string(), details)
        }
        Error::DeadlineExceeded => {
            let mut details = ErrorDetails::new();
            details.set_error_info(
                ErrorReason::DeadlineExceeded.as_str_name(),
                ERROR_DOMAIN,
                HashMap::new(),
            );
            Status::with_error_details(Code::DeadlineExceeded, error.to_string(), details)
        }
        Error::LeaseLost { ref sku } => {
            tracing::warn!(%sku, "write fenced off: the lease was lost");
            aborted(ErrorReason::LeaseLost, sku.as_str(), &error)
        }
        Error::BelowReserved { ref sku, .. } => {
            let mut details = ErrorDetails::new();
            details
                .add_precondition_failure_violation(
                    "STOCK_RESERVED",
                    sku.as_str(),
                    error.to_string(),
                )
                .set_error_info(
                    ErrorReason::StockReserved.as_str_name(),
                    ERROR_DOMAIN,
                    sku_metadata(sku.as_str()),
                );
            Status::with_error_details(Code::FailedPrecondition, error.to_string(), details)
        }
        Error::VersionMismatch {
            ref sku,
            expected,
            current,
        } => {
            let mut details = ErrorDetails::new();
            details.set_error_info(
                ErrorReason::VersionMismatch.as_str_name(),
                ERROR_DOMAIN,
                HashMap::from([
                    ("sku".to_string(), sku.as_str().to_owned()),
                    ("expected_version".to_string(), expected.to_string()),
                    ("current_version".to_string(), current.to_string()),
                ]),
            );
            Status::with_error_details(Code::Aborted, error.to_string(), details)
        }
        Error::CountBelowReserved {
            ref sku, reserved, ..
        } => {
            let mut details = ErrorDetails::new();
            details
                .add_precondition_failure_violation(
                    "BELOW_RESERVED",
                    sku.as_str(),
                    error.to_string(),
                )
                .set_error_info(
                    ErrorReason::BelowReserved.as_str_name(),
                    ERROR_DOMAIN,
                    HashMap::from([
                        ("sku".to_string(), sku.as_str().to_owned()),
                        ("reserved".to_string(), reserved.to_string()),
                    ]),
                );
            Status::with_error_details(Code::FailedPrecondition, error.to_string(), details)
        }
        Error::StockLimit { ref sku, .. } => {
            let mut details = ErrorDetails::new();
            details
                .add_precondition_failure_violation("STOCK_LIMIT", sku.as_str(), error.to_string())
                .set_error_info(
                    ErrorReason::StockLimit.as_str_name(),
                    ERROR_DOMAIN,
                    sku_metadata(sku.as_str()),
                );
            Status::with_error_details(Code::FailedPrecondition, error.to_string(), details)
        }
        Error::CursorPruned { pruned_through, .. } => {
            let mut details = ErrorDetails::new();
            details.set_error_info(
                ErrorReason::CursorPruned.as_str_name(),
                ERROR_DOMAIN,
                HashMap::from([(
                    "oldest_sequence".to_string(),
                    (pruned_through + 1).to_string(),
                )]),
            );
            Status::with_error_details(Code::OutOfRange, error.to_string(), details)
        }
        Error::SchemaTooNew { release, floor } => {
            tracing::error!(
                release,
                floor,
                "write refused: this replica's release is below the schema floor; roll it forward"
            );
            let mut details = ErrorDetails::new();
            details
                .add_precondition_failure_violation("SCHEMA_TOO_NEW", "schema", error.to_string())
                .set_error_info(
                    ErrorReason::SchemaTooNew.as_str_name(),
                    ERROR_DOMAIN,
                    HashMap::from([
                        ("release".to_string(), release.to_string()),
                        ("floor".to_string(), floor.to_string()),
                    ]),
                );
            Status::with_error_details(Code::FailedPrecondition, error.to_string(), details)
        }
        Error::CursorNotInHistory { current, head, .. } => {
            let mut details = ErrorDetails::new();
            details.set_error_info(
                ErrorReason::CursorNotInHistory.as_str_name(),
                ERROR_DOMAIN,
                HashMap::from([
                    ("epoch".to_string(), current.id.to_string()),
                    (
                        "epoch_starts_after".to_string(),
                        current.starts_after.to_string(),
                    ),
                    ("head".to_string(), head.to_string()),
                ]),
            );
            Status::with_error_details(Code::OutOfRange, error.to_string(), details)
        }
        Error::IdempotencyKeyReused => {
            let mut details = ErrorDetails::new();
            details.set_error_info(
                ErrorReason::IdempotencyKeyReused.as_str_name(),
                ERROR_DOMAIN,
                HashMap::new(),
            );
            Status::with_error_details(Code::AlreadyExists, error.to_string(), details)
        }
        Error::Unavailable {
            dependency,
            ref source,
        } => {
            tracing::warn!(%dependency, error = %source, "dependency unavailable");
            let reason = match dependency {
                Dependency::Postgres => ErrorReason::PostgresUnavailable,
                Dependency::Redis => ErrorReason::RedisUnavailable,
            };
            let mut details = ErrorDetails::new();
            details
                .set_retry_info(Some(UNAVAILABLE_RETRY_DELAY))
                .set_error_info(reason.as_str_name(), ERROR_DOMAIN, HashMap::new());
            Status::with_error_details(Code::Unavailable, error.to_string(), details)
        }
        Error::Internal(ref source) => {
            tracing::error!(error = %source, cause = ?source, "internal error");
            Status::internal("internal error")
        }
    }
}

/// A refused attempt that a plain retry may win: `ABORTED` with a short retry delay.
fn aborted(reason: ErrorReason, sku: &str, error: &Error) -> Status {
    let mut details = ErrorDetails::new();
    details
        .set_retry_info(Some(ABORTED_RETRY_DELAY))
        .set_error_info(reason.as_str_name(), ERROR_DOMAIN, sku_metadata(sku));
    Status::with_error_details(Code::Aborted, error.to_string(), details)
}

fn sku_metadata(sku: &str) -> HashMap<String, String> {
    HashMap::from([("sku".to_string(), sku.to_string())])
}
