//! What a call came to when it did not succeed, in the three cases an order service acts on
//! differently: refused (do something else), invalid (fix the request), or unknown (retry
//! later with the same key, or compensate).

use std::{collections::HashMap, time::Duration};

use tonic::{Code, Status};
use tonic_types::StatusExt as _;

/// One field the server found wrong (`BadRequest.field_violations`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldViolation {
    /// The request field, e.g. `lines[1].quantity`.
    pub field: String,
    pub description: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered no, definitely: nothing was changed (or, for a key used before,
    /// that first call's refusal is the answer). `reason` is the `ErrorInfo.reason`
    /// (`INSUFFICIENT_STOCK`, `VERSION_MISMATCH`, `RESERVATION_NOT_FOUND`, ...), `metadata`
    /// its details (`current_version`, ...). Retrying the same request gets the same answer.
    #[error("refused ({code:?}, {reason}): {message}")]
    Refused {
        code: Code,
        reason: String,
        message: String,
        metadata: HashMap<String, String>,
    },
    /// The request is wrong; `violations` names each bad field.
    #[error("invalid request: {message}")]
    Invalid {
        message: String,
        violations: Vec<FieldViolation>,
    },
    /// A call that changes something may or may not have taken effect: an attempt's answer was
    /// lost (deadline, connection, server restart, an internal error) and no later attempt
    /// settled it before the budget ran out. Call again with the same `idempotency_key` to
    /// learn the outcome (the server answers a repeat from what the first did), or compensate
    /// (`CancelOrder`). `None` for a call without a key (`ExtendReservation`): read the
    /// reservation to see.
    #[error("outcome unknown after {attempts} attempt(s) (key {idempotency_key:?}): {last}")]
    OutcomeUnknown {
        idempotency_key: Option<String>,
        attempts: u32,
        last: Status,
    },
    /// Nothing was changed and no answer came within the budget: a read that could not be
    /// answered, or a write whose every attempt was refused before it acted (a lease race
    /// lost, load shed).
    #[error("unavailable after {attempts} attempt(s) in {elapsed:?}: {last}")]
    Unavailable {
        attempts: u32,
        elapsed: Duration,
        last: Status,
    },
    /// The endpoint or the TLS material could not be used.
    #[error("cannot connect: {0}")]
    Connect(#[from] tonic::transport::Error),
    /// No cell of the [`CellMap`](crate::CellMap) serves this tenant: the call was not sent.
    #[error("no cell serves tenant {tenant:?}")]
    UnknownTenant { tenant: String },
}

impl Error {
    /// The refusal's `ErrorInfo.reason`, if this is one.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Refused { reason, .. } => Some(reason),
            _ => None,
        }
    }

    /// A failure of `WatchEvents`, opening it or as the stream's last item: `Unavailable`
    /// when opening again (from the last cursor) may work, otherwise the server's answer
    /// (`Refused` with `CURSOR_NOT_IN_HISTORY` or `CURSOR_PRUNED`: see
    /// [`EventCursor`](crate::EventCursor)).
    pub fn from_stream(status: Status) -> Self {
        if crate::retry::verdict(&status) == crate::retry::Verdict::Retry {
            return Self::Unavailable {
                attempts: 1,
                elapsed: std::time::Duration::ZERO,
                last: status,
            };
        }
        Self::definite(status)
    }

    /// A definite answer of the server's, turned into an error.
    pub(crate) fn definite(status: Status) -> Self {
        let details = status.get_error_details();
        if status.code() == Code::InvalidArgument {
            let violations = details
                .bad_request()
                .map(|bad| {
                    bad.field_violations
                        .iter()
                        .map(|v| FieldViolation {
                            field: v.field.clone(),
                            description: v.description.clone(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            return Self::Invalid {
                message: status.message().to_owned(),
                violations,
            };
        }
        let (reason, metadata) = details.error_info().map_or_else(
            || (format!("{:?}", status.code()), HashMap::new()),
            |info| (info.reason.clone(), info.metadata.clone()),
        );
        Self::Refused {
            code: status.code(),
            reason,
            message: status.message().to_owned(),
            metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use tonic_types::ErrorDetails;

    use super::*;

    #[test]
    fn invalid_arguments_name_their_fields() {
        let mut details = ErrorDetails::new();
        details.add_bad_request_violation("lines[0].quantity", "must be positive");
        let status = Status::with_error_details(Code::InvalidArgument, "bad lines", details);
        match Error::definite(status) {
            Error::Invalid { violations, .. } => assert_eq!(
                violations,
                [FieldViolation {
                    field: "lines[0].quantity".into(),
                    description: "must be positive".into()
                }]
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refusals_carry_their_reason_and_metadata() {
        let mut details = ErrorDetails::new();
        details.set_error_info(
            "VERSION_MISMATCH",
            "inventory.v1",
            HashMap::from([("current_version".to_owned(), "7".to_owned())]),
        );
        let error = Error::definite(Status::with_error_details(Code::Aborted, "stale", details));
        assert_eq!(error.reason(), Some("VERSION_MISMATCH"));
        match error {
            Error::Refused { code, metadata, .. } => {
                assert_eq!(code, Code::Aborted);
                assert_eq!(metadata["current_version"], "7");
            }
            other => panic!("{other:?}"),
        }
        // Without ErrorInfo, the code names the refusal.
        assert_eq!(
            Error::definite(Status::not_found("gone")).reason(),
            Some("NotFound")
        );
    }
}
