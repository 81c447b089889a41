//! The event stream over the outbox: positioning committed events, reading them back,
//! retention, and the `LISTEN` connection that tells replicas the head moved.
//!
//! Invariant relied on: every transaction that changes a stock row inserts its outbox rows
//! after it has locked that row, and `outbox.sequence` is taken at insert. A later writer of
//! the same SKU waits for the row lock, which is released only once the earlier writer's
//! commit is visible, so its events get higher sequences and become visible later. Events are
//! therefore positioned in `sequence` order among those committed: for each SKU (and each
//! reservation) the stream follows commit order, whatever transaction ids the writers got.
//! An event committed after others were positioned gets a position above the head, so
//! "after my cursor" never misses one, and no open transaction anywhere holds positioning back.

use std::{sync::Arc, time::SystemTime};

use deadpool_postgres::Transaction;
use inventory_core::{
    Error,
    domain::{
        Allocation, LocationId, OrderId, Peg, Quantity, ReceiptId, ReservationId, ReservationLine,
        ReservationState, Sku, States, StockLevel,
    },
    events::{Change, Epoch, EpochId, Event, ReservationEvent, StreamBounds},
    ports::{EventStore, HeadFeed, Subscription},
};
use serde::Deserialize;
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, Row};

use crate::{
    PgStore,
    plumbing::error::{from_db, from_pool},
};

/// The channel the sequencer notifies after it moved the head.
pub const POSITIONS_CHANNEL: &str = "inventory_events";

/// `SKIP LOCKED`: while one replica's sequencer runs, the others skip their turn. With the
/// head: the current epoch, what it recorded of the cluster and the cluster as it is now
/// (system identifier, and the timeline of the WAL being written).
const LOCK_STREAM: &str = "
    SELECT s.head, e.epoch, e.system_identifier, e.timeline, c.system_identifier, c.timeline
    FROM event_stream s,
         LATERAL (SELECT epoch, system_identifier, timeline FROM stream_epochs
                  ORDER BY seq DESC LIMIT 1) e,
         inventory_cluster() c
    WHERE s.id = 1 FOR UPDATE OF s SKIP LOCKED";

/// The current epoch adopts the cluster it was first positioned on.
const ADOPT_CLUSTER: &str = "
    UPDATE stream_epochs SET system_identifier = $2, timeline = $3 WHERE epoch = $1";

/// A new epoch after the head, on the cluster as it is now.
const NEW_EPOCH: &str = "
    INSERT INTO stream_epochs (epoch, starts_after, system_identifier, timeline, reason)
    VALUES ($1, (SELECT head FROM event_stream WHERE id = 1), $2, $3, $4)
    RETURNING starts_after";

const POSITION_READY: &str = "
    WITH ready AS (
        SELECT sequence, row_number() OVER (ORDER BY sequence) AS n
        FROM outbox
        WHERE position IS NULL
        ORDER BY sequence
        LIMIT $2
    )
    UPDATE outbox o SET position = $1 + ready.n FROM ready WHERE o.sequence = ready.sequence";

const MOVE_HEAD: &str = "UPDATE event_stream SET head = head + $1 WHERE id = 1";

const NOTIFY: &str = "SELECT pg_notify($1, $2::text)";

/// With each event, the epoch its position belongs to: the latest that starts before it.
const EVENTS_AFTER: &str = "
    SELECT o.position, o.event_id, o.event_type, o.reservation_id, o.sku, o.payload,
           o.occurred_at, e.epoch, e.starts_after
    FROM outbox o
    LEFT JOIN LATERAL (SELECT epoch, starts_after FROM stream_epochs
                       WHERE starts_after < o.position ORDER BY seq DESC LIMIT 1) e ON true
    WHERE o.position > $1 ORDER BY o.position LIMIT $2";

const UNPOSITIONED: &str = "SELECT count(*) FROM outbox WHERE position IS NULL";

/// The head, retention's end and every epoch (oldest first), in one snapshot: a new epoch
/// starts at the head it reads.
const BOUNDS: &str = "
    SELECT head, pruned_through,
           (SELECT coalesce(array_agg(epoch ORDER BY seq), '{}') FROM stream_epochs),
           (SELECT coalesce(array_agg(starts_after ORDER BY seq), '{}') FROM stream_epochs)
    FROM event_stream WHERE id = 1";

pub use inventory_core::events::Positioned;

impl PgStore {
    /// Wakes the local sequencer; called after each commit that wrote an event.
    pub(crate) fn outbox_written(&self) {
        self.outbox_written.notify_one();
    }

    /// Completes when this replica committed an event since the last call.
    pub async fn wait_outbox_written(&self) {
        self.outbox_written.notified().await;
    }

    /// One sequencer run: positions up to `batch` committed events in `sequence` order, moves
    /// the head and notifies listeners, in one transaction.
    #[tracing::instrument(skip_all)]
    pub async fn position_events(&self, batch: usize) -> Result<Positioned, Error> {
        self.bounded(async {
            let mut client = self.pool().get().await.map_err(from_pool)?;
            let tx = client.transaction().await.map_err(from_db)?;
            let statement = tx.prepare_cached(LOCK_STREAM).await.map_err(from_db)?;
            let Some(row) = tx.query_opt(&statement, &[]).await.map_err(from_db)? else {
                return Ok(Positioned::Busy);
            };
            let head: i64 = row.get(0);
            same_history(&tx, &row).await?;
            let statement = tx.prepare_cached(POSITION_READY).await.map_err(from_db)?;
            let limit = i64::try_from(batch).unwrap_or(i64::MAX);
            let moved = tx
                .execute(&statement, &[&head, &limit])
                .await
                .map_err(from_db)?;
            if moved > 0 {
                let moved_i64 = i64::try_from(moved).map_err(Error::internal)?;
                let statement = tx.prepare_cached(MOVE_HEAD).await.map_err(from_db)?;
                tx.execute(&statement, &[&moved_i64])
                    .await
                    .map_err(from_db)?;
                let statement = tx.prepare_cached(NOTIFY).await.map_err(from_db)?;
                let new_head = (head + moved_i64).to_string();
                tx.query(&statement, &[&&*self.positions_channel, &new_head])
                    .await
                    .map_err(from_db)?;
            }
            let statement = tx.prepare_cached(UNPOSITIONED).await.map_err(from_db)?;
            let waiting: i64 = tx.query_one(&statement, &[]).await.map_err(from_db)?.get(0);
            tx.commit().await.map_err(from_db)?;
            crate::plumbing::metrics::store()
                .unpositioned
                .record(u64::try_from(waiting).unwrap_or(0), self.tenant_attribute());
            Ok(Positioned::Moved(moved))
        })
        .await
    }
}

/// Before anything is positioned: if the cluster is not the one the current epoch recorded
/// (another system, or another timeline: a promotion, the end of a point-in-time recovery),
/// the history may have been cut at the head, so a new epoch starts there. `row`: what
/// [`LOCK_STREAM`] read.
async fn same_history(tx: &Transaction<'_>, row: &Row) -> Result<(), Error> {
    let epoch: i64 = row.get(1);
    let recorded: (Option<i64>, Option<i32>) = (row.get(2), row.get(3));
    let (Some(system), Some(timeline)) = (row.get::<_, Option<i64>>(4), row.get(5)) else {
        if !CLUSTER_UNSEEN.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(
                "PostgreSQL does not let this user read its system identifier or timeline: a \
                 restore or a lossy failover will not start a new stream epoch by itself (run \
                 `inventory-server new-stream-epoch` after one)"
            );
        }
        return Ok(());
    };
    let now: (i64, i32) = (system, timeline);
    match recorded {
        (Some(system), Some(timeline)) if (system, timeline) == now => Ok(()),
        (None, _) | (_, None) => {
            let statement = tx.prepare_cached(ADOPT_CLUSTER).await.map_err(from_db)?;
            tx.execute(&statement, &[&epoch, &now.0, &now.1])
                .await
                .map_err(from_db)?;
            Ok(())
        }
        (Some(system), Some(timeline)) => {
            let reason = if system == now.0 {
                format!("timeline {timeline} -> {}", now.1)
            } else {
                format!("system {system} -> {}", now.0)
            };
            let epoch = start_epoch(tx, (Some(now.0), Some(now.1)), &reason).await?;
            tracing::warn!(
                %reason,
                epoch = %epoch.id,
                starts_after = epoch.starts_after,
                "the event stream's history may have been cut: a new epoch begins; consumers \
                 past it start over from a snapshot"
            );
            Ok(())
        }
    }
}

/// Whether the sequencer already said it cannot see the cluster's identity.
static CLUSTER_UNSEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Starts a new epoch after the current head. The caller holds the event stream's row lock.
async fn start_epoch(
    tx: &tokio_postgres::Transaction<'_>,
    cluster: (Option<i64>, Option<i32>),
    reason: &str,
) -> Result<Epoch, Error> {
    let id = new_epoch_id();
    let row = tx
        .query_one(NEW_EPOCH, &[&id, &cluster.0, &cluster.1, &reason])
        .await
        .map_err(from_db)?;
    Ok(Epoch {
        id: EpochId(id),
        starts_after: row.get(0),
    })
}

/// A random positive 63-bit id.
fn new_epoch_id() -> i64 {
    let bits = uuid::Uuid::new_v4().as_u64_pair().0 >> 1;
    i64::try_from(bits).unwrap_or(i64::MAX).max(1)
}

/// `inventory-server new-stream-epoch`: a new epoch after the current head, for a cut the
/// sequencer cannot see (a data folder copied back without recovery, a restore the timeline
/// does not show). Waits for a running sequencer. Returns the new epoch.
pub async fn new_stream_epoch(
    client: &mut tokio_postgres::Client,
    reason: &str,
) -> Result<Epoch, Error> {
    let tx = client.transaction().await.map_err(from_db)?;
    let row = tx
        .query_one(
            "SELECT c.system_identifier, c.timeline
             FROM event_stream s, inventory_cluster() c WHERE s.id = 1 FOR UPDATE OF s",
            &[],
        )
        .await
        .map_err(from_db)?;
    let epoch = start_epoch(&tx, (row.get(0), row.get(1)), reason).await?;
    tx.commit().await.map_err(from_db)?;
    Ok(epoch)
}

impl EventStore for PgStore {
    async fn events_after(&self, after: i64, limit: usize) -> Result<Vec<Event>, Error> {
        self.bounded(async {
            let client = self.pool().get().await.map_err(from_pool)?;
            let statement = client.prepare_cached(EVENTS_AFTER).await.map_err(from_db)?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = client
                .query(&statement, &[&after, &limit])
                .await
                .map_err(from_db)?;
            rows.iter().map(event).collect()
        })
        .await
    }

    async fn stream_bounds(&self) -> Result<StreamBounds, Error> {
        self.bounded(async {
            let client = self.pool().get().await.map_err(from_pool)?;
            let statement = client.prepare_cached(BOUNDS).await.map_err(from_db)?;
            let row = client.query_one(&statement, &[]).await.map_err(from_db)?;
            let ids: Vec<i64> = row.get(2);
            let starts: Vec<i64> = row.get(3);
            Ok(StreamBounds {
                head: row.get(0),
                pruned_through: row.get(1),
                epochs: ids
                    .into_iter()
                    .zip(starts)
                    .map(|(id, starts_after)| Epoch {
                        id: EpochId(id),
                        starts_after,
                    })
                    .collect(),
            })
        })
        .await
    }

    async fn position_events(&self, batch: usize) -> Result<Positioned, Error> {
        PgStore::position_events(self, batch).await
    }

    async fn written(&self) {
        self.wait_outbox_written().await
    }
}

#[derive(Debug, Deserialize)]
struct StockPayload {
    delta: i64,
    reason: String,
    on_hand: i64,
    reserved: i64,
    /// Absent in events written before stock versions existed: 0, "unknown".
    #[serde(default)]
    version: i64,
    /// The changed location's level; absent before locations existed.
    #[serde(default)]
    location: Option<LevelPayload>,
    /// The total's states; absent while all are 0, and before states existed.
    #[serde(default)]
    states: Option<[i64; 7]>,
    /// The total's `apart`: absent while 0, and before it was worked out.
    #[serde(default)]
    apart: i64,
}

#[derive(Debug, Deserialize)]
struct TransferPayload {
    quantity: i64,
    reason: String,
    level: LevelPayload,
    from: LevelPayload,
    to: LevelPayload,
}

#[derive(Debug, Deserialize)]
struct ReservationPayload {
    order_id: String,
    state: String,
    lines: Vec<LinePayload>,
    levels: Vec<LevelPayload>,
    /// A hold's expiry; absent in other states and in events written before it was kept.
    #[serde(default)]
    expires_at_micros: Option<i64>,
}

/// `held`, `confirmed` and `released` are absent in events written before lines kept them:
/// then every unit is where the event's state says.
#[derive(Debug, Deserialize)]
struct LinePayload {
    sku: String,
    quantity: i64,
    #[serde(default)]
    held: Option<i64>,
    #[serde(default)]
    confirmed: Option<i64>,
    #[serde(default)]
    released: Option<i64>,
    /// Absent before locations existed: then every unit is at `default`.
    #[serde(default)]
    allocations: Option<Vec<AllocationPayload>>,
}

#[derive(Debug, Deserialize)]
struct AllocationPayload {
    location_id: String,
    quantity: i64,
    held: i64,
    confirmed: i64,
    released: i64,
    /// Absent while none wait, and before stock states existed.
    #[serde(default)]
    backordered: i64,
    #[serde(default)]
    preordered: i64,
    #[serde(default)]
    receipt_id: Option<String>,
    #[serde(default)]
    expected_at_micros: Option<i64>,
}

#[derive(Debug, Deserialize)]
struct AvailabilityPayload {
    on_hand: i64,
    reserved: i64,
    version: i64,
    /// Absent while every state is 0, and in events written before states existed.
    #[serde(default)]
    states: Option<[i64; 7]>,
    /// Absent while 0, and in events written before it was worked out.
    #[serde(default)]
    apart: i64,
}

#[derive(Debug, Deserialize)]
struct LevelPayload {
    sku: String,
    on_hand: i64,
    reserved: i64,
    /// Absent in events written before stock versions existed: 0, "unknown".
    #[serde(default)]
    version: i64,
    /// A location's level; absent in a SKU's total.
    #[serde(default)]
    location_id: Option<String>,
    /// Absent while every state is 0, and in events written before states existed.
    #[serde(default)]
    states: Option<[i64; 7]>,
    /// A total's `apart`: absent while 0, and in events written before it was worked out.
    #[serde(default)]
    apart: i64,
}

impl LevelPayload {
    fn level(self) -> Result<StockLevel, String> {
        Ok(StockLevel {
            sku: Sku::parse(&self.sku)?,
            on_hand: self.on_hand,
            reserved: self.reserved,
            version: self.version,
            location: self
                .location_id
                .as_deref()
                .map(LocationId::parse)
                .transpose()?,
            states: self.states.map(States::from_array).unwrap_or_default(),
            apart: self.apart,
        })
    }
}

/// A SKU's total as a stock event's payload carries it: `(on_hand, reserved, version)` and
/// its states (absent while every state is 0, and before states existed).
fn total_level(
    sku: Sku,
    (on_hand, reserved, version): (i64, i64, i64),
    states: Option<[i64; 7]>,
    apart: i64,
) -> StockLevel {
    StockLevel {
        states: states.map(States::from_array).unwrap_or_default(),
        apart,
        ..StockLevel::total(sku, on_hand, reserved, version)
    }
}

fn event(row: &Row) -> Result<Event, Error> {
    let invalid = |problem: String| Error::internal(format!("stored event is invalid: {problem}"));
    let event_type: &str = row.try_get(2).map_err(Error::internal)?;
    let payload: serde_json::Value = row.try_get(5).map_err(Error::internal)?;
    // The SKU column, which stock events carry (reservation events name theirs in lines).
    let sku = || -> Result<Sku, Error> {
        let sku: Option<&str> = row.try_get(4).map_err(Error::internal)?;
        Sku::parse(sku.unwrap_or_default()).map_err(invalid)
    };
    let change = if event_type == crate::tables::ledger::OUT_OF_STOCK
        || event_type == crate::tables::ledger::BACK_IN_STOCK
    {
        let sku = sku()?;
        let payload: AvailabilityPayload =
            serde_json::from_value(payload).map_err(Error::internal)?;
        Change::Availability {
            out_of_stock: event_type == crate::tables::ledger::OUT_OF_STOCK,
            level: total_level(
                sku.clone(),
                (payload.on_hand, payload.reserved, payload.version),
                payload.states,
                payload.apart,
            ),
            sku,
        }
    } else if event_type == crate::tables::outbox::STOCK_TRANSFERRED {
        let sku = sku()?;
        let payload: TransferPayload = serde_json::from_value(payload).map_err(Error::internal)?;
        Change::StockTransferred {
            sku,
            quantity: payload.quantity,
            reason: payload.reason,
            level: payload.level.level().map_err(invalid)?,
            from: payload.from.level().map_err(invalid)?,
            to: payload.to.level().map_err(invalid)?,
        }
    } else if event_type == crate::tables::outbox::STOCK_STATE_CHANGED {
        let payload: crate::usecases::states::StateChangedPayload =
            serde_json::from_value(payload).map_err(Error::internal)?;
        let level = |value: serde_json::Value| {
            serde_json::from_value::<LevelPayload>(value)
                .map_err(|e| e.to_string())?
                .level()
        };
        payload.change(sku()?, level).map_err(invalid)?
    } else if event_type == crate::tables::outbox::STOCK_ADJUSTED {
        let sku = sku()?;
        let payload: StockPayload = serde_json::from_value(payload).map_err(Error::internal)?;
        Change::StockAdjusted {
            delta: payload.delta,
            reason: payload.reason,
            level: total_level(
                sku.clone(),
                (payload.on_hand, payload.reserved, payload.version),
                payload.states,
                payload.apart,
            ),
            location_level: payload
                .location
                .map(LevelPayload::level)
                .transpose()
                .map_err(invalid)?,
            sku,
        }
    } else {
        let id: Option<uuid::Uuid> = row.try_get(3).map_err(Error::internal)?;
        let id = id.ok_or_else(|| invalid("no reservation id".into()))?;
        let payload: ReservationPayload =
            serde_json::from_value(payload).map_err(Error::internal)?;
        let reservation_id = ReservationId::from_uuid(id);
        let order_id = OrderId::parse(&payload.order_id).map_err(invalid)?;
        let state = ReservationState::parse(&payload.state)
            .ok_or_else(|| invalid(format!("state {:?}", payload.state)))?;
        let lines = payload
            .lines
            .into_iter()
            .map(|line| {
                let sku = Sku::parse(&line.sku).map_err(invalid)?;
                let quantity = Quantity::parse(line.quantity).map_err(invalid)?;
                let allocations = match (line.allocations, line.held, line.confirmed, line.released)
                {
                    (Some(allocations), ..) => allocations
                        .into_iter()
                        .map(|a| {
                            let receipt = match (a.receipt_id, a.expected_at_micros) {
                                (Some(id), Some(at)) => Some(Peg {
                                    receipt: ReceiptId::parse(&id)?,
                                    expected_at: inventory_core::domain::from_micros(at),
                                }),
                                _ => None,
                            };
                            Ok(Allocation {
                                location: LocationId::parse(&a.location_id)?,
                                quantity: a.quantity,
                                held: a.held,
                                confirmed: a.confirmed,
                                released: a.released,
                                backordered: a.backordered,
                                preordered: a.preordered,
                                receipt,
                            })
                        })
                        .collect::<Result<Vec<_>, String>>()
                        .map_err(invalid)?,
                    (None, Some(held), Some(confirmed), Some(released)) => vec![
                        Allocation {
                            confirmed,
                            released,
                            ..Allocation::new_hold(LocationId::default_location(), quantity.get())
                        }
                        .with_held(held),
                    ],
                    _ => vec![Allocation::stored(
                        LocationId::default_location(),
                        quantity.get(),
                        0,
                        0,
                        state,
                        true,
                    )],
                };
                ReservationLine::from_allocations(sku, allocations).map_err(invalid)
            })
            .collect::<Result<_, Error>>()?;
        let expires_at = payload
            .expires_at_micros
            .map(inventory_core::domain::from_micros);
        if event_type == crate::tables::outbox::RESERVATION_EXTENDED {
            Change::ReservationExtended {
                reservation_id,
                order_id,
                lines,
                expires_at: expires_at.ok_or_else(|| invalid("no expiry".into()))?,
            }
        } else {
            Change::Reservation {
                reservation_id,
                order_id,
                what: ReservationEvent::parse(event_type)
                    .ok_or_else(|| invalid(format!("event type {event_type:?}")))?,
                state,
                lines,
                levels: payload
                    .levels
                    .into_iter()
                    .map(|level| level.level().map_err(invalid))
                    .collect::<Result<_, Error>>()?,
                expires_at,
            }
        }
    };
    Ok(Event {
        position: row.try_get(0).map_err(Error::internal)?,
        id: row.try_get(1).map_err(Error::internal)?,
        occurred_at: row.try_get::<_, SystemTime>(6).map_err(Error::internal)?,
        change,
        // Positioned before the first epoch began: none (a stream reset from before epochs).
        epoch: Epoch {
            id: EpochId(
                row.try_get::<_, Option<i64>>(7)
                    .map_err(Error::internal)?
                    .unwrap_or(0),
            ),
            starts_after: row
                .try_get::<_, Option<i64>>(8)
                .map_err(Error::internal)?
                .unwrap_or(0),
        },
    })
}

/// A dedicated connection `LISTEN`ing on [`POSITIONS_CHANNEL`]; every notification wakes
/// `wake`. It ends when the connection does: check [`PositionListener::is_alive`].
#[derive(Debug)]
pub struct PositionListener {
    _client: tokio_postgres::Client,
    task: tokio::task::JoinHandle<()>,
}

impl PositionListener {
    pub async fn start(config: &crate::PgConfig, wake: Arc<Notify>) -> Result<Self, Error> {
        let (client, mut connection) = config.open().await.map_err(from_db)?;
        let task = tokio::spawn(async move {
            while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                match message {
                    Ok(AsyncMessage::Notification(_)) => wake.notify_one(),
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%error, "event listener connection failed");
                        break;
                    }
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN {}", config.schema().positions_channel()))
            .await
            .map_err(from_db)?;
        Ok(Self {
            _client: client,
            task,
        })
    }

    pub fn is_alive(&self) -> bool {
        !self.task.is_finished()
    }
}

impl Drop for PositionListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Subscription for PositionListener {
    fn is_alive(&self) -> bool {
        PositionListener::is_alive(self)
    }
}

/// Head moves, from a [`PositionListener`] on its own connection to the database (a pooled
/// connection cannot `LISTEN`: the pool drops its notifications).
#[derive(Clone, Debug)]
pub struct PgHeadFeed {
    config: crate::PgConfig,
    /// How long opening the connection and `LISTEN` may take, every host tried.
    bound: std::time::Duration,
}

impl PgHeadFeed {
    /// `bound`: how long one use case may wait for PostgreSQL ([`PgStore::bound`]).
    pub fn new(config: crate::PgConfig, bound: std::time::Duration) -> Self {
        let bound = config.open_bound(bound);
        Self { config, bound }
    }
}

impl HeadFeed for PgHeadFeed {
    type Subscription = PositionListener;

    async fn subscribe(&self, wake: Arc<Notify>) -> Result<PositionListener, Error> {
        let start = PositionListener::start(&self.config, wake);
        tokio::time::timeout(self.bound, start)
            .await
            .unwrap_or_else(|_| {
                Err(Error::unavailable(
                    inventory_core::Dependency::Postgres,
                    "LISTEN got no answer in time",
                ))
            })
    }
}
