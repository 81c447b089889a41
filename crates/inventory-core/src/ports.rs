//! What the core needs from the outside world. Adapters implement these traits; the core never
//! names a driver.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::Notify;

use crate::{
    command::{
        AdjustStock, BatchSetStock, CancelOrder, CancelReceipt, ExpectStock, ExtendReservation,
        GetStock, ListReceipts, ListReservations, ListStockMovements, MoveStockState, MovementPage,
        ReceiptChanged, ReceiptPage, ReceiveStock, ReservationPage, ReservationRef, Reserve,
        SetStock, SetStockPolicy, SettleReservation, StockLevels, TransferStock, Transferred,
    },
    domain::{Caller, FenceToken, IdempotencyKey, Location, Reservation, Sku, StockLevel, Ttl},
    error::Error,
    events::{
        AckEvents, CreateSubscription, Event, Positioned, StreamBounds, Subscription as Named,
        SubscriptionName,
    },
    quota::Holdings,
    upkeep::{HeldTotals, Pruned, Report, Retention},
};

/// The system of record for stock. Every method is one transaction: it either happens entirely
/// or not at all.
pub trait StockStore: Send + Sync + 'static {
    /// Applies the adjustment and records its outbox event, unless the idempotency key was
    /// already used: then the stored outcome of that first request is returned (or
    /// [`Error::IdempotencyKeyReused`] if the request differs) and nothing changes.
    fn adjust_stock(
        &self,
        command: &AdjustStock,
    ) -> impl Future<Output = Result<StockLevel, Error>> + Send;

    /// Sets `on_hand` to the command's count (creating the SKU) under the same rules as an
    /// adjustment: key, conditional statement, event, movement.
    fn set_stock(
        &self,
        command: &SetStock,
    ) -> impl Future<Output = Result<StockLevel, Error>> + Send;

    /// Every count of the batch in one transaction, all or none: the levels in request order,
    /// or the first refusal in request order.
    fn batch_set_stock(
        &self,
        command: &BatchSetStock,
    ) -> impl Future<Output = Result<Vec<StockLevel>, Error>> + Send;

    /// The current levels of the requested SKUs, in request order, or
    /// [`Error::UnknownSkus`] naming every SKU that does not exist.
    fn get_stock(
        &self,
        query: &GetStock,
    ) -> impl Future<Output = Result<StockLevels, Error>> + Send;

    /// Records an incoming receipt (a new id) for an existing SKU, under its row lock.
    fn expect_stock(
        &self,
        command: &ExpectStock,
    ) -> impl Future<Output = Result<ReceiptChanged, Error>> + Send;

    /// Units of an open receipt arrive, under its SKU's row lock.
    fn receive_stock(
        &self,
        command: &ReceiveStock,
    ) -> impl Future<Output = Result<ReceiptChanged, Error>> + Send;

    /// An open receipt cancelled, under its SKU's row lock.
    fn cancel_receipt(
        &self,
        command: &CancelReceipt,
    ) -> impl Future<Output = Result<ReceiptChanged, Error>> + Send;

    /// A page of receipts, by id.
    fn list_receipts(
        &self,
        query: &ListReceipts,
    ) -> impl Future<Output = Result<ReceiptPage, Error>> + Send;

    /// Sets a (SKU, location)'s policy under the SKU's row lock: the SKU's total after.
    fn set_stock_policy(
        &self,
        command: &SetStockPolicy,
    ) -> impl Future<Output = Result<StockLevel, Error>> + Send;

    /// Moves units between states at a location, under the SKU's row lock: the total after.
    fn move_stock_state(
        &self,
        command: &MoveStockState,
    ) -> impl Future<Output = Result<StockLevel, Error>> + Send;

    /// Moves available units between two locations of a SKU, under its row lock.
    fn transfer_stock(
        &self,
        command: &TransferStock,
    ) -> impl Future<Output = Result<Transferred, Error>> + Send;

    /// Creates or changes a location.
    fn upsert_location(
        &self,
        location: &Location,
    ) -> impl Future<Output = Result<Location, Error>> + Send;

    /// Every location, by priority, then id.
    fn list_locations(&self) -> impl Future<Output = Result<Vec<Location>, Error>> + Send;

    /// One page of a SKU's movements, in version order ([`Error::UnknownSkus`] for a SKU that
    /// never existed).
    fn list_movements(
        &self,
        query: &ListStockMovements,
    ) -> impl Future<Output = Result<MovementPage, Error>> + Send;
}

/// What a reservation write came to.
#[derive(Debug)]
pub enum WriteOutcome<T = Result<Reservation, Error>> {
    /// The answer for the caller: a new reservation, a final refusal (stored with the
    /// idempotency key) or the replay of the key's stored outcome; for a batch, one such
    /// answer per request.
    Answered {
        answer: T,
        /// The SKUs this transaction found not to exist. A replayed `UNKNOWN_SKUS` is not
        /// among them: the SKU may have been created since, and its fence counter is live.
        unknown: Vec<Sku>,
    },
    /// These lines' stored fences were not below the holder's tokens (each with the stored
    /// fence). Nothing was written.
    Fenced(Vec<(Sku, FenceToken)>),
}

impl<T> WriteOutcome<T> {
    /// An answer decided by this transaction: the SKUs of its `UNKNOWN_SKUS` refusals, if
    /// any, are unknown.
    pub fn decided(answer: T, refusals: impl IntoIterator<Item = Sku>) -> Self {
        Self::Answered {
            answer,
            unknown: refusals.into_iter().collect(),
        }
    }

    /// A stored answer replayed: nothing was found out about the SKUs now.
    pub fn replayed(answer: T) -> Self {
        Self::Answered {
            answer,
            unknown: Vec::new(),
        }
    }
}

/// One answer per request of a batch, in batch order.
pub type Answers = Vec<Result<Reservation, Error>>;

/// The SKUs a refusal names as unknown.
pub fn unknown_skus(answer: &Result<Reservation, Error>) -> &[Sku] {
    match answer {
        Err(Error::UnknownSkus(skus)) => skus,
        _ => &[],
    }
}

/// One SKU's coalesced batch, written under the fencing token of the lease held for it.
#[derive(Clone, Debug)]
pub struct ReserveGroup {
    pub sku: Sku,
    pub fence: FenceToken,
    pub batch: Vec<(Reserve, Ttl)>,
}

/// Reservations in the system of record.
pub trait ReservationStore: Send + Sync + 'static {
    /// In one transaction: claims the idempotency key (or replays its outcome), then for each
    /// line in SKU order adds the quantity to `reserved` only if enough is available and the
    /// stored fence is strictly below the line's token, which becomes the stored fence. All
    /// lines or none. `fences` holds one token per line, in SKU order.
    fn reserve(
        &self,
        command: &Reserve,
        ttl: Ttl,
        fences: &[(Sku, FenceToken)],
    ) -> impl Future<Output = Result<WriteOutcome, Error>> + Send;

    /// Coalesced reservations, in one transaction: for each group (one SKU, its batch of
    /// single-line requests and the fencing token of the lease held for it) the stock row is
    /// locked once (all rows in SKU order), then each request is decided on its own in batch
    /// order, exactly as if each ran alone: its idempotency key claimed or replayed, held if
    /// enough is still available after the requests before it, otherwise refused. One
    /// conditional update per SKU, guarded by the group's fence, applies its holds; each hold
    /// is its own reservation with its own outbox event. A group whose stored fence is not
    /// below its token is `Fenced` and writes nothing; the others still commit. One outcome
    /// per group, in order; answers in batch order. Groups have distinct SKUs, every command
    /// exactly one line of its group's SKU, and no two commands share a caller and key.
    ///
    /// `committing` is called once every write of the transaction is done and just before its
    /// `COMMIT` is sent (not at all if it fails earlier): from then on the transaction only
    /// waits for its commit record to be flushed, and the caller may start the next one.
    fn reserve_groups(
        &self,
        groups: &[ReserveGroup],
        committing: &(dyn Fn() + Sync),
    ) -> impl Future<Output = Result<Vec<WriteOutcome<Answers>>, Error>> + Send;

    /// Confirms or releases held units in one transaction: all of them or the command's
    /// lines, as [`Settle::step`](crate::command::Settle) decides from the locked reservation.
    /// With a key, a repeat answers the reservation as it now is and moves nothing.
    fn settle(
        &self,
        command: &SettleReservation,
    ) -> impl Future<Output = Result<Reservation, Error>> + Send;

    fn get_reservation(
        &self,
        target: ReservationRef,
    ) -> impl Future<Output = Result<Reservation, Error>> + Send;

    /// In one transaction: claims the key (or replays), records the order's tombstone under
    /// the order's lock (so a `Reserve` of the order in flight either committed before, and is
    /// released here, or sees the tombstone), releases every live hold of the order, and
    /// returns all of the order's reservations as they now are.
    fn cancel_order(
        &self,
        command: &CancelOrder,
    ) -> impl Future<Output = Result<Vec<Reservation>, Error>> + Send;

    /// One page of the reservations `query` names, in creation order (then id).
    fn list_reservations(
        &self,
        query: &ListReservations,
    ) -> impl Future<Output = Result<ReservationPage, Error>> + Send;

    /// Moves a live hold's expiry to `ttl` after now by the store's clock, as
    /// [`rules::extend`](crate::rules::extend) decides, and records the event.
    fn extend(
        &self,
        command: &ExtendReservation,
        max_hold: Duration,
    ) -> impl Future<Output = Result<Reservation, Error>> + Send;

    /// Expires up to `batch` holds past their `expires_at`, returning their stock; safe to run
    /// from many replicas at once. Returns how many it expired.
    fn expire_due(&self, batch: usize) -> impl Future<Output = Result<usize, Error>> + Send;

    /// Fills waiting holds where units are free (up to `batch` places): what a write's own
    /// fill skipped because another transaction had the hold locked. Returns the units it
    /// filled.
    fn refill_waiting(&self, batch: usize) -> impl Future<Output = Result<u64, Error>> + Send;

    /// What `caller` holds now (live, unexpired holds and their units still held), and
    /// whether `key` is already claimed by it: what a cap is checked against.
    fn holdings(
        &self,
        caller: &Caller,
        key: &IdempotencyKey,
    ) -> impl Future<Output = Result<Holdings, Error>> + Send;

    /// What every caller of this store's tenant holds now together, and whether `key` is
    /// already claimed by `caller`: what a tenant's cap is checked against.
    fn tenant_holdings(
        &self,
        caller: &Caller,
        key: &IdempotencyKey,
    ) -> impl Future<Output = Result<Holdings, Error>> + Send;
}

/// A granted lease: the random token that identifies its holder, and its fencing token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub sku: Sku,
    /// Opaque, from a cryptographically secure source; release compares it.
    pub holder: String,
    pub fence: FenceToken,
}

/// The replica holding a SKU's lease, as its lease names it: the internal address its peers
/// forward calls to. Opaque to the core.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Peer(pub String);

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What one grant attempt found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    Granted(Lease),
    /// Someone else holds the lease: `peer` when its value names another replica that takes
    /// forwarded calls, `None` for a holder that does not (an older release).
    Held {
        peer: Option<Peer>,
    },
    /// This replica holds it (another of its own writes): wait for it here.
    HeldHere,
}

/// Per-SKU leases. They limit contention only: correctness never depends on them.
pub trait LeaseService: Send + Sync + 'static {
    /// One grant attempt, no waiting: the lease with the next fencing token, or who holds it.
    fn try_acquire(&self, sku: &Sku) -> impl Future<Output = Result<Attempt, Error>> + Send;

    /// Waits (bounded, with jittered backoff) until the SKU's lease is free and takes it with
    /// the next fencing token, atomically. Past `deadline`: [`Error::LeaseBusy`].
    fn acquire(
        &self,
        sku: &Sku,
        deadline: Instant,
    ) -> impl Future<Output = Result<Lease, Error>> + Send;

    /// Deletes the lease only if `lease` still holds it; `false` if it had expired or passed on.
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<bool, Error>> + Send;

    /// If `lease` still holds the SKU's lease: extends it by the lease TTL and takes the next
    /// fencing token, atomically, so its holder can write another batch without giving the
    /// lease up. `None` when the lease expired or passed on.
    fn renew(&self, lease: &Lease) -> impl Future<Output = Result<Option<Lease>, Error>> + Send;

    /// Whether `lease` still holds the SKU's lease.
    fn is_held(&self, lease: &Lease) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Deletes the SKU's fence counter if it still holds `lease`'s token, nobody having taken
    /// one since: the write found that the SKU does not exist, so the counter would only be
    /// junk kept for its whole TTL. (Were it deleted wrongly, the next write would heal it, as
    /// after any lost counter.)
    fn forget_fence(&self, lease: &Lease) -> impl Future<Output = Result<(), Error>> + Send;

    /// Raises the SKU's fence counter to at least `floor` (never lowers it), after PostgreSQL
    /// showed that the counter fell behind.
    fn raise_fence(
        &self,
        sku: &Sku,
        floor: FenceToken,
    ) -> impl Future<Output = Result<(), Error>> + Send;
}

/// What a `Reserve` handed to the replica holding its SKU's lease came to.
#[derive(Debug)]
pub enum Forwarded {
    /// The peer ran it: its answer, as if the call had arrived there.
    Answered(Result<Reservation, Error>),
    /// The peer does not hold the lease (another replica does): run the call here.
    NotHolder,
    /// The hop failed (refused, unreachable, cut off, timed out). When `sent`, the call may or
    /// may not have run there (it may still run, late); its idempotency key makes running it
    /// here safe either way, but only an answer decided with that key is definite.
    Failed { error: Error, sent: bool },
}

/// Hands a single-line `Reserve` to the replica holding its SKU's lease, so the calls for a
/// hot SKU meet in one batch, wherever they arrive. The hop carries the caller, the
/// idempotency key and what is left of the deadline; the peer never forwards it again.
pub trait Forwarder: Send + Sync + std::fmt::Debug + 'static {
    /// `lease_wait_until`: how long the peer may wait for the lease (this replica's bound);
    /// `answer_by`: the caller's deadline, if it set one.
    fn forward<'a>(
        &'a self,
        peer: &'a Peer,
        command: &'a Reserve,
        lease_wait_until: Instant,
        answer_by: Option<Instant>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Forwarded> + Send + 'a>>;
}

/// The positioned event stream: events get positions in commit order, then are read back.
pub trait EventStore: Send + Sync + 'static {
    /// Up to `limit` events with a position above `after`, in position order.
    fn events_after(
        &self,
        after: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Event>, Error>> + Send;

    /// The head, what retention removed and the stream's epochs, in one snapshot.
    fn stream_bounds(&self) -> impl Future<Output = Result<StreamBounds, Error>> + Send;

    /// One sequencer run: positions up to `batch` committed events in commit order and moves
    /// the head, in one transaction; [`Positioned::Busy`] while another replica's run holds
    /// the stream. Safe to call from every replica.
    fn position_events(
        &self,
        batch: usize,
    ) -> impl Future<Output = Result<Positioned, Error>> + Send;

    /// Completes once this replica has committed an event since the last call.
    fn written(&self) -> impl Future<Output = ()> + Send;
}

/// Named subscriptions: filters and cursors kept for consumers. Each method is one statement.
pub trait SubscriptionStore: Send + Sync + 'static {
    /// Creates it at `start` (a position of `start_epoch`), or answers the one of that name
    /// if its filter is the same; [`Error::SubscriptionExists`] if not.
    fn create_subscription(
        &self,
        command: &CreateSubscription,
        start: i64,
        start_epoch: Option<crate::events::EpochId>,
    ) -> impl Future<Output = Result<Named, Error>> + Send;

    /// The subscription; [`Error::SubscriptionNotFound`] without one.
    fn subscription(
        &self,
        name: &SubscriptionName,
    ) -> impl Future<Output = Result<Named, Error>> + Send;

    /// Makes the caller its reader: bumps and answers its reader generation.
    fn take_over_subscription(
        &self,
        name: &SubscriptionName,
    ) -> impl Future<Output = Result<Named, Error>> + Send;

    /// Moves its acknowledged position forward to `command.position` (never back; with
    /// `rebase`, to it whichever way: the stored one is not in the stream's history any
    /// more), with `epoch`, the epoch of that position; [`Error::SubscriptionLost`] once lost.
    fn ack_events(
        &self,
        command: &AckEvents,
        epoch: Option<crate::events::EpochId>,
        rebase: bool,
    ) -> impl Future<Output = Result<Named, Error>> + Send;

    /// Every subscription, by name.
    fn list_subscriptions(&self) -> impl Future<Output = Result<Vec<Named>, Error>> + Send;

    /// [`Error::SubscriptionNotFound`] without one.
    fn delete_subscription(
        &self,
        name: &SubscriptionName,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Takes the subscription under a lease for `holder` (a relay), if nobody else holds an
    /// unexpired one: a new reader generation, held for `ttl`. `None` while another holds it.
    fn hold_subscription(
        &self,
        name: &SubscriptionName,
        holder: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Named>, Error>> + Send;

    /// Sets the acknowledged position to `position` (of `epoch`; back too, after a cut in the
    /// history) and renews the lease for `ttl`, only while `generation` is still the
    /// subscription's reader: `false` once another took it (this holder's lease expired), and
    /// nothing moved.
    fn advance_held(
        &self,
        name: &SubscriptionName,
        generation: i64,
        position: i64,
        epoch: Option<crate::events::EpochId>,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Gives the lease up, if `generation` still holds it, so another holder takes it at once.
    fn release_held(
        &self,
        name: &SubscriptionName,
        generation: i64,
    ) -> impl Future<Output = Result<(), Error>> + Send;
}

/// Where a relay copies a tenant's event stream: a broker's stream of its own. The relay
/// publishes in position order, one batch at a time, and moves its cursor in PostgreSQL only
/// after the sink said a batch is stored; the sink makes a message it already stored a no-op
/// (a relay restarted between the two republishes the batch).
pub trait EventSink: Send + Sync + 'static {
    /// Where the sink's copy ends now.
    fn end(&self) -> impl Future<Output = Result<SinkEnd, crate::error::BoxError>> + Send;

    /// Stores `batch` in order right after `after` (what [`Self::end`] or the last publish
    /// answered), and answers the new end: after every message, or after a prefix of them
    /// (stored before a failure, or up to a message the sink already had elsewhere), which
    /// the relay goes on from; an error if none was stored.
    fn publish(
        &self,
        after: &SinkEnd,
        batch: Vec<crate::events::Outgoing>,
    ) -> impl Future<Output = Result<SinkEnd, crate::error::BoxError>> + Send;
}

/// The end of a sink's copy of the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkEnd {
    /// The sink's own sequence of its last message (0: it never stored one).
    pub sequence: u64,
    /// The stream position and epoch of its last message; `None` when it holds none (never
    /// stored one, or its messages aged out or were purged).
    pub last: Option<(i64, crate::events::EpochId)>,
}

/// Tells when the stream's head moved, whichever replica moved it.
pub trait HeadFeed: Send + Sync + 'static {
    type Subscription: Subscription;

    /// Starts telling: every head move from now on wakes `wake`, until the subscription is
    /// dropped or dies (a lost connection).
    fn subscribe(
        &self,
        wake: Arc<Notify>,
    ) -> impl Future<Output = Result<Self::Subscription, Error>> + Send;
}

/// A [`HeadFeed`]'s subscription.
pub trait Subscription: Send + 'static {
    /// Whether head moves still arrive; a dead one is replaced.
    fn is_alive(&self) -> bool;
}

/// Keeping the system of record small and checking it: pruning past retention, counting what
/// is held, verifying the ledger. Safe to run from many replicas at once.
pub trait Upkeep: Send + Sync + 'static {
    /// One pruning pass: at most `batch` rows per table, oldest first.
    fn prune(
        &self,
        retention: &Retention,
        batch: usize,
    ) -> impl Future<Output = Result<Pruned, Error>> + Send;

    /// Counts what is held now (and records it in the held gauges).
    fn count_held(&self) -> impl Future<Output = Result<HeldTotals, Error>> + Send;

    /// How long the oldest hold past its expiry has waited for a sweep (zero when none has),
    /// recorded in the oldest-overdue gauge. Cheap: one step into the expiry index.
    fn oldest_overdue(&self) -> impl Future<Output = Result<Duration, Error>> + Send;

    /// Recomputes every SKU from its ledger and its live holds, in one snapshot, and names
    /// every disagreement.
    fn verify(&self) -> impl Future<Output = Result<Report, Error>> + Send;
}
