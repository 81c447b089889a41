//! `inventory-server relay`'s flags and environment.

use std::{net::SocketAddr, time::Duration};

use clap::Args;
use secrecy::SecretString;

use super::{DatabaseArgs, secret};

#[derive(Debug, Args)]
pub struct RelayArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// NATS server URL(s), comma separated (nats://, tls://; user:password@ or a token
    /// before @ logs in); never logged.
    #[arg(long, env = "NATS_URL", hide_env_values = true, value_parser = secret)]
    pub nats_url: SecretString,

    /// Each tenant's copy is the JetStream stream `<NATS_STREAM_PREFIX>_<TENANT>`.
    #[arg(long, env = "NATS_STREAM_PREFIX", default_value = "INVENTORY")]
    pub nats_stream_prefix: String,

    /// Each event's subject is `<NATS_SUBJECT_PREFIX>.<tenant>.<type>.<sku>`.
    #[arg(long, env = "NATS_SUBJECT_PREFIX", default_value = "inventory")]
    pub nats_subject_prefix: String,

    /// How long a stream the relay creates remembers message ids (no longer than
    /// NATS_MAX_AGE).
    #[arg(long, env = "NATS_DUPLICATE_WINDOW", default_value = "20m", value_parser = humantime::parse_duration)]
    pub nats_duplicate_window: Duration,

    /// How long a stream the relay creates keeps messages (0: until deleted by hand).
    #[arg(long, env = "NATS_MAX_AGE", default_value = "7days", value_parser = humantime::parse_duration)]
    pub nats_max_age: Duration,

    /// How long a publish waits for JetStream's acknowledgement before it is tried again.
    #[arg(long, env = "NATS_ACK_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub nats_ack_timeout: Duration,

    /// Relays of one name share a lease per tenant (one publishes, the others stand by) and
    /// a cursor, the subscription `relay.<RELAY_NAME>`.
    #[arg(long, env = "RELAY_NAME", default_value = "jetstream")]
    pub relay_name: String,

    /// How long the active relay's lease lasts unless renewed; a standby takes over once it
    /// lapses.
    #[arg(long, env = "RELAY_LEASE_TTL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub relay_lease_ttl: Duration,

    /// Most events published at once (their acknowledgements awaited together).
    #[arg(long, env = "RELAY_BATCH", default_value_t = 256,
          value_parser = clap::value_parser!(u16).range(1..=1_000))]
    pub relay_batch: u16,

    /// Plaintext HTTP listener serving `/metrics`.
    #[arg(long, env = "ADMIN_LISTEN_ADDR")]
    pub admin_listen_addr: Option<SocketAddr>,
}

/// A name of letters, digits, `_` and `-` (a stream name or subject token).
fn plain(name: &str, what: &str, problems: &mut Vec<String>) {
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        problems.push(format!(
            "{what} must be letters, digits, `_` and `-` (got {name:?})"
        ));
    }
}

impl RelayArgs {
    /// Every problem at once.
    pub fn check(&self) -> Result<(), super::ConfigError> {
        let mut problems = Vec::new();
        plain(
            &self.nats_stream_prefix,
            "NATS_STREAM_PREFIX",
            &mut problems,
        );
        plain(
            &self.nats_subject_prefix,
            "NATS_SUBJECT_PREFIX",
            &mut problems,
        );
        if let Err(problem) =
            inventory_core::events::SubscriptionName::parse(&format!("relay.{}", self.relay_name))
        {
            problems.push(format!("RELAY_NAME: {problem}"));
        }
        if self.relay_lease_ttl < Duration::from_millis(300) {
            problems.push("RELAY_LEASE_TTL must be at least 300ms".into());
        }
        if self.nats_ack_timeout.is_zero() {
            problems.push("NATS_ACK_TIMEOUT must be greater than zero".into());
        }
        // A publish that waits out its acknowledgement must leave time to renew the lease.
        if self.relay_lease_ttl < self.nats_ack_timeout * 2 {
            problems.push("RELAY_LEASE_TTL must be at least twice NATS_ACK_TIMEOUT".into());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(super::ConfigError(problems))
        }
    }
}
