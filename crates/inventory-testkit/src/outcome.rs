//! The one rule of what a client may conclude from a status code.
//!
//! A call that ended with `DEADLINE_EXCEEDED`, `UNAVAILABLE`, `INTERNAL`, `UNKNOWN` or
//! `CANCELLED` may or may not have taken effect: the request may have been applied before the
//! answer was lost. Only a retry with the same idempotency key settles it.

use serde::{Deserialize, Serialize};
use tonic::Code;

/// What a client can conclude from an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Ok,
    /// A definite refusal: nothing was written.
    Fail,
    /// The call may or may not have taken effect (deadline, unavailable, cut connection).
    Unknown,
}

impl Outcome {
    /// By the client crate's rule (`inventory_client::retry::outcome_unknown`), so the suites
    /// judge answers as order services are told to.
    pub fn of(code: Code) -> Self {
        match code {
            Code::Ok => Outcome::Ok,
            code if inventory_client::retry::outcome_unknown(code) => Outcome::Unknown,
            _ => Outcome::Fail,
        }
    }

    /// Whether a refusal with this code (as `tonic::Code`'s `Debug` spells it) settles an
    /// idempotency key: it is a stored outcome (out of stock), or the request itself is wrong.
    /// `ABORTED` and `RESOURCE_EXHAUSTED` refuse only the attempt: an earlier attempt with the
    /// key may still have gone through. (The client's `retry::settles_key` also counts
    /// `ABORTED` with `VERSION_MISMATCH`, which the fault suite's calls never get.)
    pub fn settles(code: &str) -> bool {
        matches!(
            code,
            "FailedPrecondition" | "NotFound" | "InvalidArgument" | "AlreadyExists"
        )
    }
}

/// Whether a call that ended with `code` may have taken effect anyway.
pub fn is_unknown(code: Code) -> bool {
    Outcome::of(code) == Outcome::Unknown
}

#[cfg(test)]
mod tests;
