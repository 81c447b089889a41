//! What may be retried, and how long to wait: pure functions of a status, so the rules are
//! tested without a server.
//!
//! - Retried: `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `ABORTED` with reason `LEASE_BUSY` or
//!   `LEASE_LOST` (a lost race for a SKU's lease: the next attempt may win), and
//!   `DEADLINE_EXCEEDED` of one attempt (`RetryPolicy::attempt_timeout`), also for calls that
//!   change something: always with the same idempotency key, so a repeat acts at most once.
//! - Never retried: `FAILED_PRECONDITION`, `ALREADY_EXISTS`, `INVALID_ARGUMENT`, `NOT_FOUND`,
//!   `ABORTED` for any other reason (`VERSION_MISMATCH`: read again and decide again),
//!   `PERMISSION_DENIED`, `UNAUTHENTICATED`, `UNIMPLEMENTED`, `INTERNAL`, ...
//! - The wait before the next attempt is the larger of the server's `RetryInfo.retry_delay`
//!   and an exponential backoff with full jitter, never past the call's budget.

use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::StatusExt as _;

/// How a call retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The whole call, every attempt and wait included. A call whose caller set a shorter
    /// deadline (`InventoryClient::with_budget`) uses that.
    pub budget: Duration,
    /// The longest one attempt may take (its gRPC deadline): an attempt that hangs is given
    /// up and retried, leaving the rest of the budget for the next.
    pub attempt_timeout: Duration,
    /// First backoff; each attempt doubles it, up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Most attempts, the first included.
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            budget: Duration::from_secs(10),
            attempt_timeout: Duration::from_secs(2),
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            max_attempts: 20,
        }
    }
}

/// Whether the call changes something (then it carries an idempotency key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Read,
    Write,
}

/// What to make of an attempt that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Try again with the same key.
    Retry,
    /// A definite answer: stop.
    Final,
}

/// `ErrorInfo.reason` of a status, if it carries one.
pub fn reason(status: &Status) -> Option<String> {
    status
        .get_error_details()
        .error_info()
        .map(|info| info.reason.clone())
}

/// Whether another attempt may change the answer.
pub fn verdict(status: &Status) -> Verdict {
    match status.code() {
        Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded => Verdict::Retry,
        Code::Aborted => match reason(status).as_deref() {
            Some("LEASE_BUSY" | "LEASE_LOST") => Verdict::Retry,
            _ => Verdict::Final,
        },
        _ => Verdict::Final,
    }
}

/// Whether a write that ended with `code` may have taken effect anyway: the request may have
/// been applied before the answer was lost. Only a retry with the same key settles it.
pub fn outcome_unknown(code: Code) -> bool {
    matches!(
        code,
        Code::DeadlineExceeded
            | Code::Unavailable
            | Code::Internal
            | Code::Unknown
            | Code::Cancelled
    )
}

/// Whether a definite refusal settles a key an earlier attempt may have used: the server
/// decides these after looking the key up (a replay would have answered instead). Refusals
/// decided before the key (authentication, an unknown method, a lease or load refusal) do
/// not.
pub fn settles_key(status: &Status) -> bool {
    match status.code() {
        // A cell that does not serve the caller's tenant refuses before anything else: an
        // earlier attempt may have been written where the tenant was served (a move).
        Code::FailedPrecondition => reason(status).as_deref() != Some("TENANT_NOT_SERVED"),
        Code::NotFound | Code::InvalidArgument | Code::AlreadyExists => true,
        Code::Aborted => reason(status).as_deref() == Some("VERSION_MISMATCH"),
        _ => false,
    }
}

/// The server's `RetryInfo.retry_delay`, if it sent one.
pub fn server_delay(status: &Status) -> Option<Duration> {
    status
        .get_error_details()
        .retry_info()
        .and_then(|info| info.retry_delay)
}

/// The wait before attempt `attempt + 1` (0-based `attempt` just failed): exponential backoff
/// with full jitter (`jitter` in `[0, 1)`), or the server's delay plus up to a fifth of it
/// when that is longer, so clients told the same delay do not come back in step.
pub fn wait(policy: &RetryPolicy, attempt: u32, server: Option<Duration>, jitter: f64) -> Duration {
    let jitter = jitter.clamp(0.0, 1.0);
    let ceiling = policy
        .initial_backoff
        .saturating_mul(1u32.checked_shl(attempt.min(16)).unwrap_or(u32::MAX))
        .min(policy.max_backoff);
    let backoff = ceiling.mul_f64(jitter);
    let server = server.unwrap_or_default();
    backoff.max(server + server.mul_f64(0.2 * jitter))
}

/// A number in `[0, 1)` from the operating system's generator (0.5 if it cannot answer).
pub fn jitter() -> f64 {
    getrandom::u64().map_or(0.5, |n| (n >> 11) as f64 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use tonic_types::{ErrorDetails, StatusExt as _};

    use super::*;

    fn with_reason(code: Code, reason: &str, delay: Option<Duration>) -> Status {
        let mut details = ErrorDetails::new();
        details.set_error_info(reason, "inventory.v1", std::collections::HashMap::new());
        if let Some(delay) = delay {
            details.set_retry_info(Some(delay));
        }
        Status::with_error_details(code, "test", details)
    }

    #[test]
    fn transient_answers_are_retried() {
        for status in [
            Status::unavailable("redis"),
            Status::resource_exhausted("full"),
            with_reason(Code::Aborted, "LEASE_BUSY", None),
            with_reason(Code::Aborted, "LEASE_LOST", None),
            Status::deadline_exceeded("slow"),
        ] {
            assert_eq!(verdict(&status), Verdict::Retry, "{status:?}");
        }
    }

    #[test]
    fn definite_answers_are_never_retried() {
        for status in [
            Status::failed_precondition("out of stock"),
            Status::already_exists("exists"),
            Status::invalid_argument("bad"),
            Status::not_found("no such sku"),
            with_reason(Code::Aborted, "VERSION_MISMATCH", None),
            Status::aborted("no reason"),
            Status::permission_denied("no"),
            Status::unauthenticated("who"),
            Status::unimplemented("old server"),
            Status::internal("bug"),
        ] {
            assert_eq!(verdict(&status), Verdict::Final, "{status:?}");
        }
    }

    #[test]
    fn only_refusals_decided_after_the_key_settle_an_unknown_attempt() {
        for status in [
            Status::failed_precondition("out of stock"),
            Status::not_found("no such sku"),
            Status::invalid_argument("bad"),
            Status::already_exists("key reused"),
            with_reason(Code::Aborted, "VERSION_MISMATCH", None),
        ] {
            assert!(settles_key(&status), "{status:?}");
        }
        for status in [
            Status::unauthenticated("token rotated"),
            Status::permission_denied("role"),
            Status::unimplemented("old replica"),
            with_reason(Code::Aborted, "LEASE_BUSY", None),
            Status::resource_exhausted("shed"),
            with_reason(Code::FailedPrecondition, "TENANT_NOT_SERVED", None),
        ] {
            assert!(!settles_key(&status), "{status:?}");
        }
    }

    #[test]
    fn lost_answers_leave_a_write_unknown_and_refusals_do_not() {
        for code in [
            Code::DeadlineExceeded,
            Code::Unavailable,
            Code::Internal,
            Code::Unknown,
            Code::Cancelled,
        ] {
            assert!(outcome_unknown(code), "{code:?}");
        }
        for code in [
            Code::FailedPrecondition,
            Code::Aborted,
            Code::ResourceExhausted,
            Code::InvalidArgument,
            Code::NotFound,
        ] {
            assert!(!outcome_unknown(code), "{code:?}");
        }
    }

    #[test]
    fn the_wait_grows_is_capped_and_honours_the_server() {
        let policy = RetryPolicy::default();
        // No jitter drawn high: the ceiling itself.
        assert_eq!(
            wait(&policy, 0, None, 0.999_999),
            Duration::from_millis(50).mul_f64(0.999_999)
        );
        assert_eq!(wait(&policy, 3, None, 0.5), Duration::from_millis(200));
        assert_eq!(wait(&policy, 30, None, 0.5), Duration::from_secs(1));
        // Full jitter can reach 0, but never below what the server asked for.
        assert_eq!(wait(&policy, 0, None, 0.0), Duration::ZERO);
        assert_eq!(
            wait(&policy, 0, Some(Duration::from_millis(500)), 0.0),
            Duration::from_millis(500)
        );
        // Spread above the server's delay, by at most a fifth of it.
        assert_eq!(
            wait(&policy, 0, Some(Duration::from_millis(500)), 0.5),
            Duration::from_millis(550)
        );
        assert_eq!(
            server_delay(&with_reason(
                Code::Unavailable,
                "REDIS_UNAVAILABLE",
                Some(Duration::from_millis(500))
            )),
            Some(Duration::from_millis(500))
        );
    }

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..1000 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j), "{j}");
        }
    }
}
