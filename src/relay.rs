//! `inventory-server relay`: each tenant's event stream copied to a sink (NATS JetStream,
//! `inventory-nats`), in position order, with no event lost or stored twice.
//!
//! - **One active relay per tenant.** The relay reads the stream as the subscription
//!   `relay.<RELAY_NAME>`, held under a lease (`RELAY_LEASE_TTL`): every other relay stands by
//!   and takes over when the lease lapses. Each cursor move names the lease's reader
//!   generation, so a relay that lost its lease (paused past it) moves nothing; the sink
//!   refuses its publishes too (each says which sink sequence it follows).
//! - **Publish, then move the cursor.** A batch is published and acknowledged by the sink
//!   before the subscription's cursor moves past it. The subscription holds retention back
//!   like any other (and is lost the same way, idle past `SUBSCRIPTION_IDLE_LIMIT`).
//! - **Resume from the sink.** On taking the lease, and after any failed publish, the relay
//!   reads where the sink's copy ends and goes on from there: events a relay published but
//!   could not record are not published again, and a tail the sink lost (a broker that
//!   crashed before syncing) is published again. A copy that is empty (new, or wiped) gets
//!   every event kept; one whose messages aged out goes on from the cursor; one that ends
//!   past a cut in the stream's history (a restore) goes on from the cut.

use std::{sync::Arc, time::Duration};

use inventory_core::{
    Error,
    events::{
        CreateSubscription, EpochId, Event, EventFilter, Outgoing, StreamBounds, SubscriptionName,
    },
    pause::{PausePoint, PausePoints},
    ports::{EventSink, EventStore, HeadFeed, SinkEnd, Subscription as _, SubscriptionStore},
};
use opentelemetry::{KeyValue, global};
use tokio::sync::{Notify, watch};

use crate::wire::Encode as _;

/// How one relay works.
#[derive(Clone, Debug)]
pub struct RelaySettings {
    /// The relay's subscription is `relay.<name>`: relays of one name share a lease.
    pub name: String,
    /// Who this relay is, in the lease (host and process).
    pub holder: String,
    pub lease_ttl: Duration,
    /// Most events published at once.
    pub batch: usize,
}

/// The relay's subscriptions are named `relay.<RELAY_NAME>`; only an admin may touch one
/// through the API.
pub const SUBSCRIPTION_PREFIX: &str = "relay.";

impl RelaySettings {
    pub fn subscription(&self) -> Result<SubscriptionName, String> {
        SubscriptionName::parse(&format!("{SUBSCRIPTION_PREFIX}{}", self.name))
    }
}

/// Most time between two tries after a failure.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// How long a tenant's relay that stopped on what it cannot repair waits to try again.
const TENANT_RETRY: Duration = Duration::from_secs(30);

/// At most [`MAX_BACKOFF`], and short enough that the lease is renewed between tries.
fn max_backoff(lease_ttl: Duration) -> Duration {
    MAX_BACKOFF.min(lease_ttl / 3)
}

struct Metrics {
    lag: opentelemetry::metrics::Gauge<u64>,
    active: opentelemetry::metrics::Gauge<u64>,
    published: opentelemetry::metrics::Counter<u64>,
    errors: opentelemetry::metrics::Counter<u64>,
}

fn metrics() -> &'static Metrics {
    static METRICS: std::sync::OnceLock<Metrics> = std::sync::OnceLock::new();
    METRICS.get_or_init(|| {
        let meter = global::meter("inventory-server");
        Metrics {
            lag: meter
                .u64_gauge("inventory.relay.lag")
                .with_description("Events of the tenant's stream the active relay has not published yet")
                .build(),
            active: meter
                .u64_gauge("inventory.relay.active")
                .with_description("1 while this relay holds the tenant's lease and publishes, 0 while it stands by")
                .build(),
            published: meter
                .u64_counter("inventory.relay.published")
                .with_description("Events the sink acknowledged (a duplicate it already had counts)")
                .build(),
            errors: meter
                .u64_counter("inventory.relay.publish_errors")
                .with_description("Failed attempts to publish a batch or read where the sink's copy ends; each is tried again")
                .build(),
        }
    })
}

/// One tenant's relay: its store, its sink, and what wakes it.
#[derive(Debug)]
pub struct Relay<S, K, F> {
    pub store: Arc<S>,
    pub sink: K,
    pub feed: F,
    pub tenant: String,
    pub settings: RelaySettings,
    pub pauses: PausePoints,
}

/// Where the relay is: the last position published, and its epoch.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    after: i64,
    epoch: Option<EpochId>,
}

/// Whether the lease is still this relay's.
enum Held {
    Yes,
    Lost,
}

impl<S, K, F> Relay<S, K, F>
where
    S: EventStore + SubscriptionStore,
    K: EventSink,
    F: HeadFeed,
{
    fn attributes(&self) -> [KeyValue; 1] {
        [KeyValue::new("tenant", self.tenant.clone())]
    }

    /// Runs until `stopping`: stands by while another relay holds the lease, relays while
    /// this one does.
    pub async fn run(&self, mut stopping: watch::Receiver<bool>) -> Result<(), Error> {
        let name = self.settings.subscription().map_err(Error::internal)?;
        self.ensure_subscription(&name).await?;
        let wake = Arc::new(Notify::new());
        let mut listener = None;
        let mut backoff = Duration::from_millis(100);
        loop {
            if *stopping.borrow() {
                return Ok(());
            }
            if !listener
                .as_ref()
                .is_some_and(|l: &F::Subscription| l.is_alive())
            {
                listener = self.feed.subscribe(Arc::clone(&wake)).await.ok();
            }
            match self
                .store
                .hold_subscription(&name, &self.settings.holder, self.settings.lease_ttl)
                .await
            {
                Ok(Some(held)) => {
                    tracing::info!(tenant = %self.tenant, generation = held.reader, "relay holds the lease");
                    metrics().active.record(1, &self.attributes());
                    let generation = held.reader;
                    let acked = Cursor {
                        after: held.acked,
                        epoch: held.acked_epoch,
                    };
                    let relayed = self
                        .relay(&name, generation, acked, &wake, &mut stopping)
                        .await;
                    metrics().active.record(0, &self.attributes());
                    if let Err(error) = relayed {
                        let _ = self.store.release_held(&name, generation).await;
                        return Err(error);
                    }
                    if *stopping.borrow() {
                        // Handed over at once rather than after the lease runs out.
                        let _ = self.store.release_held(&name, generation).await;
                        return Ok(());
                    }
                    backoff = Duration::from_millis(100);
                }
                Ok(None) => {
                    metrics().active.record(0, &self.attributes());
                    match self.store.subscription(&name).await {
                        Ok(found) => {
                            if let Some(reason) = found.lost {
                                return Err(lost(&name, &reason));
                            }
                        }
                        // Deleted by hand: made again, from the oldest event kept (the copy's
                        // end still decides where publishing goes on).
                        Err(Error::SubscriptionNotFound(_)) => {
                            if let Err(error) = self.ensure_subscription(&name).await {
                                tracing::warn!(tenant = %self.tenant, %error, "cannot create the relay's subscription");
                            }
                        }
                        Err(_) => {}
                    }
                    if !pause(self.settings.lease_ttl / 3, &mut stopping).await {
                        return Ok(());
                    }
                }
                Err(Error::SubscriptionLost { reason, .. }) => return Err(lost(&name, &reason)),
                Err(error) => {
                    tracing::warn!(tenant = %self.tenant, %error, "cannot take the relay's lease; trying again");
                    if !pause(backoff, &mut stopping).await {
                        return Ok(());
                    }
                    backoff = (backoff * 2).min(max_backoff(self.settings.lease_ttl));
                }
            }
        }
    }

    /// The relay's subscription exists: from the oldest event kept, with no filter.
    async fn ensure_subscription(&self, name: &SubscriptionName) -> Result<(), Error> {
        let bounds = self.store.stream_bounds().await?;
        let command = CreateSubscription {
            name: name.clone(),
            filter: EventFilter::default(),
            from_oldest: true,
        };
        self.store
            .create_subscription(
                &command,
                bounds.pruned_through,
                bounds.epoch_at(bounds.pruned_through),
            )
            .await
            .map(drop)
    }

    /// Relays while the lease is this relay's (or until `stopping`).
    async fn relay(
        &self,
        name: &SubscriptionName,
        generation: i64,
        mut acked: Cursor,
        wake: &Notify,
        stopping: &mut watch::Receiver<bool>,
    ) -> Result<(), Error> {
        let ttl = self.settings.lease_ttl;
        let mut backoff = Duration::from_millis(100);
        // Where the sink's copy ends, and so where publishing goes on.
        let mut place: Option<(SinkEnd, Cursor)> = None;
        loop {
            if *stopping.borrow() {
                return Ok(());
            }
            // Behind by what is not recorded as published, whatever is failing.
            if let Ok(bounds) = self.store.stream_bounds().await {
                metrics().lag.record(
                    u64::try_from(bounds.head - acked.after).unwrap_or(0),
                    &self.attributes(),
                );
            }
            let (end, cursor) = match place.take() {
                Some(place) => place,
                None => match self.resume(acked).await {
                    Ok(place) => place,
                    Err(error) => {
                        metrics().errors.add(1, &self.attributes());
                        tracing::warn!(tenant = %self.tenant, %error, "cannot read where the sink's copy ends; trying again");
                        if matches!(self.renew(name, generation, acked).await, Held::Lost)
                            || !pause(backoff, stopping).await
                        {
                            return Ok(());
                        }
                        backoff = (backoff * 2).min(max_backoff(self.settings.lease_ttl));
                        continue;
                    }
                },
            };
            let page = match self
                .store
                .events_after(cursor.after, self.settings.batch)
                .await
            {
                Ok(page) => page,
                Err(error) => {
                    tracing::warn!(tenant = %self.tenant, %error, "cannot read events; trying again");
                    place = Some((end, cursor));
                    if !pause(backoff, stopping).await {
                        return Ok(());
                    }
                    continue;
                }
            };
            let Some(first) = page.first() else {
                // Caught up: keep the lease, then wait for the head to move.
                if matches!(self.renew(name, generation, acked).await, Held::Lost) {
                    return Ok(());
                }
                place = Some((end, cursor));
                tokio::select! {
                    () = wake.notified() => {}
                    () = tokio::time::sleep(ttl / 3) => {}
                    _ = stopping.changed() => return Ok(()),
                }
                continue;
            };
            if first.position != cursor.after + 1 {
                // Nothing the relay can repair; it stops, and says so, rather than skip them.
                metrics().errors.add(1, &self.attributes());
                return Err(Error::internal(format!(
                    "events after {} that the relay had not published were pruned (the next \
                     kept is {}); delete the subscription {name} to relay from the oldest \
                     event kept",
                    cursor.after, first.position
                )));
            }
            if let Some(cut) = cut_behind(cursor, &page) {
                // The history was cut behind the copy (a restore): go on from the cut.
                tracing::warn!(tenant = %self.tenant, cut, "the stream's history was cut behind the relay; relaying from the cut");
                place = Some((
                    end,
                    Cursor {
                        after: cut,
                        epoch: None,
                    },
                ));
                continue;
            }
            let batch: Vec<Outgoing> = page.into_iter().map(outgoing).collect();
            match self.sink.publish(&end, batch).await {
                Ok(stored) => {
                    // The sink may have stored only a prefix (it stops at a message it
                    // already had): the cursor goes as far as the copy does.
                    let last = match stored.last {
                        Some((after, epoch)) => Cursor {
                            after,
                            epoch: Some(epoch),
                        },
                        None => cursor,
                    };
                    metrics().published.add(
                        u64::try_from(last.after - cursor.after).unwrap_or(0),
                        &self.attributes(),
                    );
                    backoff = Duration::from_millis(100);
                    self.pauses.reach(PausePoint::RelayPublished).await;
                    acked = last;
                    if matches!(self.renew(name, generation, acked).await, Held::Lost) {
                        return Ok(());
                    }
                    place = Some((stored, last));
                }
                Err(error) => {
                    metrics().errors.add(1, &self.attributes());
                    tracing::warn!(tenant = %self.tenant, %error, "publishing failed; reading where the sink's copy ends and trying again");
                    if matches!(self.renew(name, generation, acked).await, Held::Lost)
                        || !pause(backoff, stopping).await
                    {
                        return Ok(());
                    }
                    backoff = (backoff * 2).min(max_backoff(self.settings.lease_ttl));
                }
            }
        }
    }

    /// Moves the cursor to `acked` and renews the lease; `Lost` once another relay took it.
    /// PostgreSQL away: the lease may lapse meanwhile, which the next renewal finds.
    async fn renew(&self, name: &SubscriptionName, generation: i64, acked: Cursor) -> Held {
        match self
            .store
            .advance_held(
                name,
                generation,
                acked.after,
                acked.epoch,
                self.settings.lease_ttl,
            )
            .await
        {
            Ok(true) => Held::Yes,
            Ok(false) => {
                tracing::warn!(tenant = %self.tenant, generation, "the relay's lease passed to another relay");
                Held::Lost
            }
            Err(error) => {
                tracing::warn!(tenant = %self.tenant, %error, "cannot renew the relay's lease");
                Held::Yes
            }
        }
    }

    /// Where to go on from: where the sink's copy ends (see the module's notes).
    async fn resume(&self, acked: Cursor) -> Result<(SinkEnd, Cursor), Error> {
        let end = self
            .sink
            .end()
            .await
            .map_err(|e| Error::internal(e.to_string()))?;
        let bounds = self.store.stream_bounds().await?;
        let cursor = resume_from(&end, acked, &bounds).map_err(Error::internal)?;
        tracing::info!(
            tenant = %self.tenant,
            sink_sequence = end.sequence,
            after = cursor.after,
            "relaying after the end of the sink's copy"
        );
        Ok((end, cursor))
    }
}

/// Nothing the relay can repair: events it never published are gone.
fn lost(name: &SubscriptionName, reason: &str) -> Error {
    Error::internal(format!(
        "the relay's subscription {name} is lost ({reason}); delete it to relay from the \
         oldest event kept"
    ))
}

/// Where to go on from, given where the copy ends; an error when events the copy lacks were
/// pruned before the relay published them (it stops rather than leave a hole unsaid).
fn resume_from(end: &SinkEnd, acked: Cursor, bounds: &StreamBounds) -> Result<Cursor, String> {
    let at = |after: i64| Cursor {
        after,
        epoch: bounds.epoch_at(after),
    };
    let from = match end.last {
        Some((position, epoch)) if bounds.admits(Some(epoch), position) => Cursor {
            after: position,
            epoch: Some(epoch),
        },
        // Past a cut in this history: from the cut, where the next epoch after the copy's
        // began (a copy of an epoch this history never had: everything kept).
        Some((_, epoch)) => {
            let cut = bounds
                .epochs
                .iter()
                .position(|e| e.id == epoch)
                .and_then(|i| bounds.epochs.get(i + 1))
                .map_or(bounds.pruned_through, |next| next.starts_after);
            at(cut)
        }
        // A new or wiped copy: everything kept.
        None if end.sequence == 0 => at(bounds.pruned_through),
        // Its messages aged out or were purged: from what it last acknowledged.
        None => acked,
    };
    if from.after >= bounds.pruned_through {
        return Ok(from);
    }
    if acked.after >= bounds.pruned_through {
        // The cursor had passed them: published once, and lost by the sink since (a tail a
        // broker lost, a stream restored from an old backup) after retention removed them
        // here. Nothing can publish them again; say so, and go on.
        tracing::error!(
            copy_ends = from.after,
            oldest_kept = bounds.pruned_through + 1,
            "the sink's copy lacks events retention has removed since they were published; \
             its consumers miss them"
        );
        return Ok(at(bounds.pruned_through));
    }
    Err(format!(
        "events after {} were pruned before the relay published them (the oldest kept follows \
         {}); delete the relay's subscription to relay from the oldest event kept",
        from.after, bounds.pruned_through
    ))
}

/// Where the history was cut behind `cursor`, if the page's first event is of an epoch that
/// began before the cursor and is not the cursor's.
fn cut_behind(cursor: Cursor, page: &[Event]) -> Option<i64> {
    let first = page.first()?;
    match cursor.epoch {
        Some(epoch) if epoch != first.epoch.id && first.epoch.starts_after < cursor.after => {
            Some(first.epoch.starts_after)
        }
        _ => None,
    }
}

/// An event as the sink takes it: the API's message, encoded.
fn outgoing(event: Event) -> Outgoing {
    let kind = event.change.kind();
    let sku = {
        let mut skus = event.change.skus();
        match (skus.next(), skus.next()) {
            (Some(one), None) => Some(one.clone()),
            _ => None,
        }
    };
    Outgoing {
        id: event.id,
        position: event.position,
        epoch: event.epoch.id,
        kind,
        sku,
        payload: prost::Message::encode_to_vec(&event.into_message()),
    }
}

/// Waits `for_`; `false` if `stopping` came first.
async fn pause(for_: Duration, stopping: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(for_) => true,
        _ = stopping.changed() => false,
    }
}

#[cfg(test)]
mod tests;

/// `inventory-server relay`: one relay per tenant until `shutdown`, `/metrics` on the admin
/// port if one is set.
pub async fn serve(
    args: &crate::config::RelayArgs,
    registry: prometheus::Registry,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    args.check()?;
    let config = crate::config::parse_database_url(&args.database.database_url)
        .map_err(anyhow::Error::msg)?;
    let tenants = args.database.tenant_list()?;
    let sink_settings = inventory_nats::JetStreamSettings {
        stream_prefix: args.nats_stream_prefix.clone(),
        subject_prefix: args.nats_subject_prefix.clone(),
        duplicate_window: args.nats_duplicate_window,
        max_age: args.nats_max_age,
        ack_timeout: args.nats_ack_timeout,
    };
    let settings = RelaySettings {
        name: args.relay_name.clone(),
        holder: holder_id(),
        lease_ttl: args.relay_lease_ttl,
        batch: usize::from(args.relay_batch),
    };
    // Connects (and reconnects) in the background: a relay started before its NATS waits.
    let client = async_nats::ConnectOptions::new()
        .name(format!("inventory-relay {}", settings.holder))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connect(secrecy::ExposeSecret::expose_secret(&args.nats_url))
        .await?;
    let (stop, stopping) = watch::channel(false);
    if let Some(addr) = args.admin_listen_addr {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let mut stopped = stopping.clone();
        tokio::spawn(crate::admin::serve(listener, registry, async move {
            let _ = stopped.changed().await;
        }));
    }
    let pool_settings = inventory_postgres::PoolSettings {
        max_size: 2,
        ..Default::default()
    };
    let mut relays = tokio::task::JoinSet::new();
    for tenant in tenants {
        let schema = inventory_postgres::Schema::of_tenant(&tenant);
        let config = config.clone().in_schema(schema);
        let pool = inventory_postgres::connect(config.clone(), &pool_settings)?;
        let bound = pool_settings.operation_bound();
        let store = inventory_postgres::PgStore::new(pool, bound).for_tenant(&tenant);
        let feed = inventory_postgres::events::PgHeadFeed::new(config, bound);
        let (client, sink_settings, settings) =
            (client.clone(), sink_settings.clone(), settings.clone());
        let mut stopping = stopping.clone();
        relays.spawn(async move {
            let tenant = tenant.as_str().to_owned();
            let mut backoff = Duration::from_millis(200);
            let sink = loop {
                match inventory_nats::JetStreamSink::open(client.clone(), &sink_settings, &tenant)
                    .await
                {
                    Ok(sink) => break sink,
                    Err(error) => {
                        tracing::warn!(%tenant, %error, "cannot open the tenant's JetStream stream; trying again");
                        if !pause(backoff, &mut stopping).await {
                            return;
                        }
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
            };
            tracing::info!(%tenant, stream = sink.stream(), "relaying to JetStream");
            let relay = Relay {
                store: Arc::new(store),
                sink,
                feed,
                tenant: tenant.clone(),
                settings,
                pauses: PausePoints::default(),
            };
            // A tenant's relay that cannot go on stops alone and tries again; the other
            // tenants' go on.
            while let Err(error) = relay.run(stopping.clone()).await {
                tracing::error!(%tenant, %error, "the tenant's relay stopped; trying again in 30 s");
                if !pause(TENANT_RETRY, &mut stopping).await {
                    return;
                }
            }
        });
    }
    shutdown.await;
    let _ = stop.send(true);
    while relays.join_next().await.is_some() {}
    Ok(())
}

/// This process, in the lease: the host (the pod's name) and a random suffix.
fn holder_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "relay".to_owned());
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &suffix[..8])
}
