//! The event relay's sink: each tenant's event stream copied, in position order, to a NATS
//! JetStream stream of its own.
//!
//! # Layout
//! One module: [`JetStreamSink`], the `EventSink` of `inventory-core` on JetStream.
//!
//! - **Names.** Tenant `t`'s stream is `<stream prefix>_<T>` (`INVENTORY_DEFAULT`), on the
//!   subjects `<subject prefix>.t.>`. Each event's subject is
//!   `<subject prefix>.<tenant>.<event type>.<sku>` (`inventory.default.reservation_held.MUG-1`):
//!   the type in lower case, the SKU with each `.` written `%2E` (a subject's tokens cannot
//!   hold one), and `%` for a reservation of several SKUs (no SKU has a `%`).
//! - **Message.** The payload is the API's `inventory.v1.Event`, encoded; the headers carry
//!   `Nats-Msg-Id` (the event id), `Inventory-Position`, `Inventory-Epoch`, `Inventory-Tenant`
//!   and `Inventory-Event-Type`.
//! - **No duplicates.** Every publish says which stream sequence it expects to follow
//!   (`Nats-Expected-Last-Sequence`), so a copy is one chain: a publish from a relay that
//!   lost its place (a stale one, one whose earlier publish timed out) is refused instead of
//!   stored out of order, and the relay reads where the copy ends and goes on from there. A
//!   message whose id the stream stored within its duplicate window is acknowledged as a
//!   duplicate and not stored again (JetStream checks the id first).

use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage, stream};
use inventory_core::{
    error::BoxError,
    events::{EpochId, Outgoing},
    ports::{EventSink, SinkEnd},
};

pub const POSITION: &str = "Inventory-Position";
pub const EPOCH: &str = "Inventory-Epoch";
pub const TENANT: &str = "Inventory-Tenant";
pub const EVENT_TYPE: &str = "Inventory-Event-Type";

/// Where and how the copies are kept.
#[derive(Clone, Debug)]
pub struct JetStreamSettings {
    /// Streams are named `<stream_prefix>_<TENANT>`.
    pub stream_prefix: String,
    /// Subjects start `<subject_prefix>.<tenant>.`.
    pub subject_prefix: String,
    /// How long JetStream remembers a message id (a stream the relay creates).
    pub duplicate_window: Duration,
    /// How long a message is kept (a stream the relay creates); 0 keeps them.
    pub max_age: Duration,
    /// How long a publish waits for JetStream's acknowledgement.
    pub ack_timeout: Duration,
}

/// One tenant's copy.
#[derive(Clone, Debug)]
pub struct JetStreamSink {
    context: jetstream::Context,
    stream: String,
    /// What the stream is created with, at start and again if it is gone (deleted, or its
    /// server's store wiped): a copy that is gone is made again from the oldest event kept.
    config: stream::Config,
    /// `<subject prefix>.<tenant>`.
    root: String,
    tenant: String,
}

/// The stream of `tenant`'s copy.
pub fn stream_name(prefix: &str, tenant: &str) -> String {
    format!("{prefix}_{}", tenant.to_ascii_uppercase())
}

/// A SKU as one subject token.
pub fn sku_token(sku: &str) -> String {
    sku.replace('.', "%2E")
}

impl JetStreamSink {
    /// The sink of `tenant`, creating its stream if there is none (an existing one is used as
    /// it is configured).
    pub async fn open(
        client: async_nats::Client,
        settings: &JetStreamSettings,
        tenant: &str,
    ) -> Result<Self, BoxError> {
        let mut context = jetstream::new(client);
        context.set_timeout(settings.ack_timeout);
        let stream = stream_name(&settings.stream_prefix, tenant);
        let root = format!("{}.{tenant}", settings.subject_prefix);
        let max_age = settings.max_age;
        // JetStream refuses a duplicate window longer than the messages are kept.
        let duplicate_window = if max_age.is_zero() {
            settings.duplicate_window
        } else {
            settings.duplicate_window.min(max_age)
        };
        let config = stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{root}.>")],
            storage: stream::StorageType::File,
            max_age,
            duplicate_window,
            ..Default::default()
        };
        context.get_or_create_stream(config.clone()).await?;
        Ok(Self {
            context,
            stream,
            config,
            root,
            tenant: tenant.to_owned(),
        })
    }

    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The subject `event` is published on.
    pub fn subject(&self, event: &Outgoing) -> String {
        let sku = event
            .sku
            .as_ref()
            .map_or_else(|| "%".to_owned(), |sku| sku_token(sku.as_str()));
        format!(
            "{}.{}.{sku}",
            self.root,
            event.kind.as_str().to_ascii_lowercase()
        )
    }
}

impl EventSink for JetStreamSink {
    async fn end(&self) -> Result<SinkEnd, BoxError> {
        let stream = self
            .context
            .get_or_create_stream(self.config.clone())
            .await?;
        let state = &stream.cached_info().state;
        let sequence = state.last_sequence;
        if state.messages == 0 || sequence == 0 {
            return Ok(SinkEnd {
                sequence,
                last: None,
            });
        }
        let message = stream.get_raw_message(sequence).await?;
        let header = |name: &str| -> Result<&str, BoxError> {
            message
                .headers
                .get(name)
                .map(|v| v.as_str())
                .ok_or_else(|| {
                    format!("message {sequence} of {} has no {name}", self.stream).into()
                })
        };
        let position: i64 = header(POSITION)?.parse()?;
        let epoch = EpochId::parse(header(EPOCH)?)?;
        Ok(SinkEnd {
            sequence,
            last: Some((position, epoch)),
        })
    }

    async fn publish(&self, after: &SinkEnd, batch: Vec<Outgoing>) -> Result<SinkEnd, BoxError> {
        let mut end = after.clone();
        let mut acks = Vec::with_capacity(batch.len());
        // Sent one after another without waiting (JetStream stores them in this order), then
        // every acknowledgement awaited in order.
        for (expected, event) in (after.sequence..).zip(batch) {
            let subject = self.subject(&event);
            let publish = PublishMessage::build()
                .payload(event.payload.into())
                .message_id(event.id.to_string())
                .expected_last_sequence(expected)
                .header(POSITION, event.position.to_string())
                .header(EPOCH, event.epoch.to_string())
                .header(TENANT, self.tenant.as_str())
                .header(EVENT_TYPE, event.kind.as_str());
            acks.push((
                self.context.send_publish(subject, publish).await?,
                event.position,
                event.epoch,
            ));
        }
        for (ack, position, epoch) in acks {
            match ack.await {
                // Stored now, or stored before at just this place (a relay that lost its
                // lease published the same chain): the copy grew by it.
                Ok(ack) if !ack.duplicate || ack.sequence == end.sequence + 1 => {
                    end = SinkEnd {
                        sequence: ack.sequence,
                        last: Some((position, epoch)),
                    };
                }
                // Its id was stored elsewhere in the copy (within the duplicate window): it is
                // there, but the stream did not grow, so what followed it in this batch expected
                // a sequence the stream never reached. Stop after it.
                Ok(_) => {
                    return Ok(SinkEnd {
                        sequence: end.sequence,
                        last: Some((position, epoch)),
                    });
                }
                // What was stored before the failure counts; the rest is tried again.
                Err(_) if end != *after => return Ok(end),
                Err(error) => return Err(error.into()),
            }
        }
        Ok(end)
    }
}
