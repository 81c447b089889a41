//! How long a call may take: the caller's deadline, less a margin for the answer to travel,
//! and the server's own bound on waiting for leases. Which of the two runs out first decides
//! what the caller hears: its own deadline is `DeadlineExceeded`, the server's bound on a busy
//! SKU is `LeaseBusy`.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use crate::error::Error;

/// The shortest and longest margin kept back from a caller's timeout for the answer to reach
/// it: a fifth of the timeout, within these bounds.
const MIN_MARGIN: Duration = Duration::from_millis(5);
const MAX_MARGIN: Duration = Duration::from_millis(100);

/// The time one call has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// When the answer must be on its way; `None` when the caller set no deadline.
    answer_by: Option<Instant>,
}

impl Budget {
    /// No deadline: the work runs until it ends (every dependency call is bounded anyway).
    pub fn unbounded() -> Self {
        Self { answer_by: None }
    }

    /// The budget of a call that arrived at `now` with the caller's `timeout`, if any: the
    /// timeout less a margin, so the caller hears `DEADLINE_EXCEEDED` from us rather than
    /// giving up on its own without knowing what happened.
    pub fn from_timeout(timeout: Option<Duration>, now: Instant) -> Self {
        let answer_by = timeout.map(|timeout| {
            let margin = (timeout / 5).clamp(MIN_MARGIN, MAX_MARGIN);
            now + timeout.saturating_sub(margin)
        });
        Self { answer_by }
    }

    pub fn answer_by(&self) -> Option<Instant> {
        self.answer_by
    }

    /// How long a `Reserve` may wait for busy leases: until the server's `lease_wait` bound or
    /// this budget, whichever ends first.
    pub fn lease_wait(&self, lease_wait: Duration, now: Instant) -> LeaseWait {
        let server_bound = now + lease_wait;
        match self.answer_by {
            Some(by) if by < server_bound => LeaseWait {
                until: by,
                caller_binds: true,
            },
            _ => LeaseWait {
                until: server_bound,
                caller_binds: false,
            },
        }
    }

    /// Runs `work` within the budget: past it, `DeadlineExceeded` (and `work` is dropped).
    pub async fn run<T>(&self, work: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
        match self.answer_by {
            None => work.await,
            Some(by) => tokio::time::timeout_at(by.into(), work)
                .await
                .unwrap_or(Err(Error::DeadlineExceeded)),
        }
    }
}

/// Until when a `Reserve` waits for leases, and whose limit that is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseWait {
    pub until: Instant,
    /// The caller's deadline comes before the server's bound.
    pub caller_binds: bool,
}

impl LeaseWait {
    /// A lease still busy when the caller's own deadline ran out is that deadline, not a busy
    /// SKU: the caller hears `DeadlineExceeded`, and `LeaseBusy` (retry later) only when the
    /// server's bound ran out first.
    pub fn judge<T>(&self, outcome: Result<T, Error>) -> Result<T, Error> {
        match outcome {
            Err(Error::LeaseBusy { .. }) if self.caller_binds => Err(Error::DeadlineExceeded),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests;
