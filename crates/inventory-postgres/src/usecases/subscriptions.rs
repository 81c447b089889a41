//! Named subscriptions: one row each, in `event_subscriptions` (see V20). A filter is stored
//! as JSON, its lists sorted, so the same filter is always the same value.

use std::time::{Duration, SystemTime};

use inventory_core::{
    Error,
    domain::{LocationId, OrderId, Sku},
    events::{
        AckEvents, CreateSubscription, EpochId, EventFilter, EventKind, Subscription,
        SubscriptionName,
    },
    ports::SubscriptionStore,
};
use serde::{Deserialize, Serialize};
use tokio_postgres::Row;

use crate::{
    PgStore,
    plumbing::error::{from_db, from_pool},
};

/// What every statement answers of a subscription, with its lag behind the head.
macro_rules! columns {
    () => {
        "name, filter, acked_position, acked_epoch, created_at, acked_at, lost, reader,
         greatest((SELECT head FROM event_stream WHERE id = 1) - acked_position, 0)"
    };
}

/// Never below what retention removed by the time it is written (a prune that ran since the
/// start was read).
/// A new subscription, unless the tenant has `$5` already (NULL: no limit) or one of this
/// name exists.
const CREATE: &str = "
    INSERT INTO event_subscriptions (name, filter, acked_position, acked_epoch)
    SELECT $1, $2, greatest($3, s.pruned_through),
           CASE WHEN $3 >= s.pruned_through THEN $4
                ELSE (SELECT epoch FROM stream_epochs WHERE starts_after < s.pruned_through
                      ORDER BY seq DESC LIMIT 1) END
    FROM event_stream s
    WHERE s.id = 1
      AND ($5::bigint IS NULL OR (SELECT count(*) FROM event_subscriptions) < $5::bigint)
    ON CONFLICT (name) DO NOTHING";

/// One creator of the schema's subscriptions at a time, so the count `CREATE` checks is not
/// passed by two at once (its own statement's snapshot is taken once the lock is held). The
/// two-key form: its key space is apart from the order locks' single keys.
const ONE_CREATOR: &str = "SELECT pg_advisory_xact_lock(hashtext(current_schema()), 20)";

const GET: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM event_subscriptions WHERE name = $1"
);

const TAKE_OVER: &str = concat!(
    "UPDATE event_subscriptions SET reader = reader + 1 WHERE name = $1 RETURNING ",
    columns!()
);

/// Forward only; the epoch goes with the position it names. Acknowledging the same position
/// again still counts as activity (a consumer of a rare filter acknowledges heartbeats).
const ACK: &str = concat!(
    "UPDATE event_subscriptions
     SET acked_epoch = CASE WHEN $4 OR $2 > acked_position THEN $3 ELSE acked_epoch END,
         acked_position = CASE WHEN $4 THEN $2 ELSE greatest(acked_position, $2) END,
         acked_at = clock_timestamp()
     WHERE name = $1 AND lost IS NULL RETURNING ",
    columns!()
);

const LIST: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM event_subscriptions ORDER BY name"
);

const DELETE: &str = "DELETE FROM event_subscriptions WHERE name = $1";

/// A new reader generation under a lease, unless another holder's lease is still running.
const HOLD: &str = concat!(
    "UPDATE event_subscriptions
     SET reader = reader + 1, holder = $2,
         held_until = clock_timestamp() + make_interval(secs => $3)
     WHERE name = $1 AND lost IS NULL
       AND (holder IS NULL OR holder = $2 OR held_until < clock_timestamp())
     RETURNING ",
    columns!()
);

/// Fenced by the reader generation: a holder whose lease passed on moves nothing. The one
/// holder's cursor is what it published, so it is set as it is, even back (the history was
/// cut behind it, and it publishes the new history from the cut). Renewing the lease is not
/// progress: only a position that moves, or one at the head, counts as an acknowledgement,
/// so a relay whose sink is down for longer than `SUBSCRIPTION_IDLE_LIMIT` stops holding
/// events back (and its subscription is then lost, and says so).
const ADVANCE_HELD: &str = "
    UPDATE event_subscriptions
    SET acked_epoch = coalesce($4, acked_epoch),
        acked_at = CASE WHEN $3 <> acked_position
                          OR $3 >= (SELECT head FROM event_stream WHERE id = 1)
                        THEN clock_timestamp() ELSE acked_at END,
        acked_position = $3,
        held_until = clock_timestamp() + make_interval(secs => $5)
    WHERE name = $1 AND reader = $2 AND lost IS NULL";

const RELEASE_HELD: &str = "
    UPDATE event_subscriptions SET holder = NULL, held_until = NULL
    WHERE name = $1 AND reader = $2";

/// A filter as stored: names, sorted.
#[derive(Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
struct StoredFilter {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    types: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    skus: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    sku_prefixes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    order_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    location_ids: Vec<String>,
}

fn sorted(values: impl Iterator<Item = String>) -> Vec<String> {
    let mut values: Vec<String> = values.collect();
    values.sort();
    values.dedup();
    values
}

pub(crate) fn store_filter(filter: &EventFilter) -> serde_json::Value {
    let stored = StoredFilter {
        types: sorted(filter.kinds.iter().map(|k| k.as_str().to_owned())),
        skus: sorted(filter.skus.iter().map(|s| s.as_str().to_owned())),
        sku_prefixes: sorted(filter.sku_prefixes.iter().cloned()),
        order_ids: sorted(filter.order_ids.iter().map(|o| o.as_str().to_owned())),
        location_ids: sorted(filter.locations.iter().map(|l| l.as_str().to_owned())),
    };
    serde_json::to_value(stored).unwrap_or_default()
}

fn load_filter(value: serde_json::Value) -> Result<EventFilter, Error> {
    let invalid = |problem: String| Error::internal(format!("stored filter is invalid: {problem}"));
    let stored: StoredFilter = serde_json::from_value(value).map_err(Error::internal)?;
    Ok(EventFilter {
        kinds: stored
            .types
            .iter()
            .map(|raw| EventKind::parse(raw).ok_or_else(|| invalid(format!("type {raw:?}"))))
            .collect::<Result<_, _>>()?,
        skus: stored
            .skus
            .iter()
            .map(|raw| Sku::parse(raw).map_err(invalid))
            .collect::<Result<_, _>>()?,
        sku_prefixes: stored.sku_prefixes,
        order_ids: stored
            .order_ids
            .iter()
            .map(|raw| OrderId::parse(raw).map_err(invalid))
            .collect::<Result<_, _>>()?,
        locations: stored
            .location_ids
            .iter()
            .map(|raw| LocationId::parse(raw).map_err(invalid))
            .collect::<Result<_, _>>()?,
    })
}

pub(crate) fn subscription(row: &Row) -> Result<Subscription, Error> {
    let name: &str = row.try_get(0).map_err(Error::internal)?;
    Ok(Subscription {
        name: SubscriptionName::parse(name).map_err(Error::internal)?,
        filter: load_filter(row.try_get(1).map_err(Error::internal)?)?,
        acked: row.try_get(2).map_err(Error::internal)?,
        acked_epoch: row
            .try_get::<_, Option<i64>>(3)
            .map_err(Error::internal)?
            .map(EpochId),
        created_at: row.try_get::<_, SystemTime>(4).map_err(Error::internal)?,
        acked_at: row.try_get::<_, SystemTime>(5).map_err(Error::internal)?,
        lost: row.try_get(6).map_err(Error::internal)?,
        reader: row.try_get(7).map_err(Error::internal)?,
        lag: row.try_get(8).map_err(Error::internal)?,
    })
}

impl PgStore {
    async fn one(
        &self,
        statement: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<Subscription>, Error> {
        self.bounded(async {
            let client = self.pool().get().await.map_err(from_pool)?;
            let statement = client.prepare_cached(statement).await.map_err(from_db)?;
            let row = client
                .query_opt(&statement, params)
                .await
                .map_err(from_db)?;
            row.as_ref().map(subscription).transpose()
        })
        .await
    }

    async fn execute(
        &self,
        statement: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, Error> {
        self.bounded(async {
            let client = self.pool().get().await.map_err(from_pool)?;
            let statement = client.prepare_cached(statement).await.map_err(from_db)?;
            client.execute(&statement, params).await.map_err(from_db)
        })
        .await
    }

    /// Why a statement that names a live subscription found none: it is lost, or not there.
    async fn not_live(&self, name: &SubscriptionName) -> Error {
        match self.one(GET, &[&name.as_str()]).await {
            Ok(Some(found)) if found.lost.is_some() => found.lost_error(),
            Ok(_) => Error::SubscriptionNotFound(name.clone()),
            Err(error) => error,
        }
    }
}

/// Most subscriptions of one tenant with series of their own: every subscription name would
/// be a label value on every replica, so only the ones an alert is about are: lost ones
/// first, then relays', then the most behind (`inventory_subscriptions` says how many there
/// are).
pub const SUBSCRIPTION_SERIES: usize = 20;

impl PgStore {
    /// `inventory_subscription_lag` and `_lost` of the tenant's [`SUBSCRIPTION_SERIES`] worst
    /// subscriptions, and `inventory_subscriptions`, how many it has.
    pub async fn refresh_subscription_gauges(&self) -> Result<(), Error> {
        let mut readings: Vec<crate::plumbing::metrics::SubscriptionReading> = self
            .list_subscriptions()
            .await?
            .into_iter()
            .map(|found| {
                (
                    found.name.as_str().to_owned(),
                    u64::try_from(found.lag).unwrap_or(0),
                    found.lost.is_some(),
                )
            })
            .collect();
        let count = readings.len();
        let relay = |name: &str| name.starts_with("relay.");
        readings.sort_by(|a, b| (b.2, relay(&b.0), b.1, &a.0).cmp(&(a.2, relay(&a.0), a.1, &b.0)));
        readings.truncate(SUBSCRIPTION_SERIES);
        crate::plumbing::metrics::subscriptions_counted(
            &self.tenant_attribute()[0].value.to_string(),
            count as u64,
        );
        let tenant = self.tenant_attribute()[0].value.to_string();
        crate::plumbing::metrics::subscriptions_read(&tenant, readings);
        Ok(())
    }
}

impl SubscriptionStore for PgStore {
    async fn create_subscription(
        &self,
        command: &CreateSubscription,
        start: i64,
        start_epoch: Option<EpochId>,
    ) -> Result<Subscription, Error> {
        let filter = store_filter(&command.filter);
        let limit = self.max_subscriptions;
        let found = self
            .bounded(async {
                let mut client = self.pool().get().await.map_err(from_pool)?;
                let tx = client.transaction().await.map_err(from_db)?;
                if limit.is_some() {
                    tx.execute(ONE_CREATOR, &[]).await.map_err(from_db)?;
                }
                let statement = tx.prepare_cached(CREATE).await.map_err(from_db)?;
                tx.execute(
                    &statement,
                    &[
                        &command.name.as_str(),
                        &filter,
                        &start,
                        &start_epoch.map(|e| e.0),
                        &limit.map(i64::from),
                    ],
                )
                .await
                .map_err(from_db)?;
                let statement = tx.prepare_cached(GET).await.map_err(from_db)?;
                let row = tx
                    .query_opt(&statement, &[&command.name.as_str()])
                    .await
                    .map_err(from_db)?;
                tx.commit().await.map_err(from_db)?;
                match row {
                    Some(row) => subscription(&row),
                    // Not made, and none of this name: the tenant has its most.
                    None => match limit {
                        Some(limit) => Err(Error::TooManySubscriptions { limit }),
                        None => Err(Error::SubscriptionNotFound(command.name.clone())),
                    },
                }
            })
            .await?;
        if store_filter(&found.filter) != filter {
            return Err(Error::SubscriptionExists(command.name.clone()));
        }
        Ok(found)
    }

    async fn subscription(&self, name: &SubscriptionName) -> Result<Subscription, Error> {
        self.one(GET, &[&name.as_str()])
            .await?
            .ok_or_else(|| Error::SubscriptionNotFound(name.clone()))
    }

    async fn take_over_subscription(&self, name: &SubscriptionName) -> Result<Subscription, Error> {
        let found = self
            .one(TAKE_OVER, &[&name.as_str()])
            .await?
            .ok_or_else(|| Error::SubscriptionNotFound(name.clone()))?;
        if found.lost.is_some() {
            return Err(found.lost_error());
        }
        Ok(found)
    }

    async fn ack_events(
        &self,
        command: &AckEvents,
        epoch: Option<EpochId>,
        rebase: bool,
    ) -> Result<Subscription, Error> {
        match self
            .one(
                ACK,
                &[
                    &command.name.as_str(),
                    &command.position,
                    &epoch.map(|e| e.0),
                    &rebase,
                ],
            )
            .await?
        {
            Some(found) => Ok(found),
            None => Err(self.not_live(&command.name).await),
        }
    }

    async fn list_subscriptions(&self) -> Result<Vec<Subscription>, Error> {
        self.bounded(async {
            let client = self.pool().get().await.map_err(from_pool)?;
            let statement = client.prepare_cached(LIST).await.map_err(from_db)?;
            let rows = client.query(&statement, &[]).await.map_err(from_db)?;
            rows.iter().map(subscription).collect()
        })
        .await
    }

    async fn delete_subscription(&self, name: &SubscriptionName) -> Result<(), Error> {
        let deleted = self.execute(DELETE, &[&name.as_str()]).await?;
        if deleted == 0 {
            return Err(Error::SubscriptionNotFound(name.clone()));
        }
        Ok(())
    }

    async fn hold_subscription(
        &self,
        name: &SubscriptionName,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Subscription>, Error> {
        self.one(HOLD, &[&name.as_str(), &holder, &ttl.as_secs_f64()])
            .await
    }

    async fn advance_held(
        &self,
        name: &SubscriptionName,
        generation: i64,
        position: i64,
        epoch: Option<EpochId>,
        ttl: Duration,
    ) -> Result<bool, Error> {
        let moved = self
            .execute(
                ADVANCE_HELD,
                &[
                    &name.as_str(),
                    &generation,
                    &position,
                    &epoch.map(|e| e.0),
                    &ttl.as_secs_f64(),
                ],
            )
            .await?;
        Ok(moved == 1)
    }

    async fn release_held(&self, name: &SubscriptionName, generation: i64) -> Result<(), Error> {
        self.execute(RELEASE_HELD, &[&name.as_str(), &generation])
            .await
            .map(drop)
    }
}
