//! While PostgreSQL fails over, every answer says what happened or to try again.

use super::{Check, Outage, Verdict};
use crate::history::History;

/// While PostgreSQL fails over, a call is answered OK or with a status that says "try again"
/// (or that the request cannot be met, as at any time): never an error that hides what
/// happened (`INTERNAL`, `UNKNOWN` from the server), nor `NOT_FOUND` for what an earlier
/// answer created. A transport error (the replica called was killed) is no answer.
pub(super) fn retryable_during_failover(history: &History, failovers: &[Outage]) -> Check {
    const EXPECTED: [&str; 7] = [
        "Ok",
        "Unavailable",
        "DeadlineExceeded",
        "Aborted",
        "ResourceExhausted",
        "FailedPrecondition",
        "Cancelled",
    ];
    let mut v = Verdict::new("retryable_during_failover");
    let mut unavailable = 0;
    for failover in failovers {
        for op in history
            .ops
            .iter()
            .filter(|o| o.invoked_ms >= failover.start_ms && o.invoked_ms <= failover.end_ms)
        {
            v.examined += 1;
            unavailable += usize::from(op.code == "Unavailable");
            // The client's own report that the replica it called went away (a replica fault
            // beside the failover), not an answer.
            let transport = op.code == "Unknown" && op.message.starts_with("transport error");
            if !EXPECTED.contains(&op.code.as_str()) && !transport {
                v.fail(format!(
                    "{:?} {} answered {} ({}) at {:.0} ms during {}",
                    op.kind,
                    op.key
                        .as_deref()
                        .or(op.reservation_id.as_deref())
                        .unwrap_or(""),
                    op.code,
                    op.message,
                    op.invoked_ms,
                    failover.fault
                ));
            }
        }
    }
    v.note = format!(
        "{} failovers: calls answered OK or retryable ({unavailable} UNAVAILABLE)",
        failovers.len()
    );
    v.done()
}
