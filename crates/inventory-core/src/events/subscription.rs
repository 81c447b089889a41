//! Named subscriptions: a filter and a cursor the server keeps for a consumer.

use std::time::SystemTime;

use super::{EpochId, EventFilter};

/// Longest subscription name, in bytes.
pub const MAX_SUBSCRIPTION_NAME_LEN: usize = 64;

/// 1 to [`MAX_SUBSCRIPTION_NAME_LEN`] characters of `A-Z a-z 0-9 . _ -`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SubscriptionName(String);

impl SubscriptionName {
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() || raw.len() > MAX_SUBSCRIPTION_NAME_LEN {
            return Err(format!(
                "must be 1 to {MAX_SUBSCRIPTION_NAME_LEN} characters"
            ));
        }
        if !raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err("may contain only A-Z a-z 0-9 . _ -".into());
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SubscriptionName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A subscription as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscription {
    pub name: SubscriptionName,
    pub filter: EventFilter,
    /// Every event up to here was acknowledged.
    pub acked: i64,
    /// The epoch of `acked`; `None` before the stream's first event.
    pub acked_epoch: Option<EpochId>,
    pub created_at: SystemTime,
    pub acked_at: SystemTime,
    /// Events of the whole stream after `acked`, up to the head.
    pub lag: i64,
    /// Why and when retention removed events it had not acknowledged.
    pub lost: Option<String>,
    /// Bumped by each reader that takes it over; a reader whose generation is no longer the
    /// stored one ends.
    pub reader: i64,
}

impl Subscription {
    /// The refusal a lost subscription answers to its reader and to acknowledgements.
    pub fn lost_error(self) -> crate::Error {
        crate::Error::SubscriptionLost {
            reason: self.lost.unwrap_or_default(),
            acked: self.acked,
            name: self.name,
        }
    }
}

/// `CreateSubscription`.
#[derive(Clone, Debug)]
pub struct CreateSubscription {
    pub name: SubscriptionName,
    pub filter: EventFilter,
    /// Start at the oldest event kept, not the head.
    pub from_oldest: bool,
}

/// `AckEvents`.
#[derive(Clone, Debug)]
pub struct AckEvents {
    pub name: SubscriptionName,
    pub position: i64,
    pub epoch: Option<EpochId>,
}
