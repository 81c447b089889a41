//! The use cases the gRPC layer calls.
//!
//! `reserve` is the only one that coordinates: leases first (to queue contention on Redis),
//! then one fenced SQL transaction that alone decides. Confirm, release and reads need no
//! lease, since none of them can oversell, and so keep working while Redis is down.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{
    budget::Budget,
    coalesce::{
        CoalesceConfig, CommitTurn, CommitWait, Committer, GroupOutcome, Joined, Kept, Leadership,
        MAX_GROUPS, MAX_HELD_BATCHES, Origin, Queued, Queues, Submitted, Turn, TurnWait, Writing,
    },
    command::{
        AdjustStock, BatchSetStock, CancelOrder, CancelReceipt, ExpectStock, ExtendReservation,
        GetStock, ListReceipts, ListReservations, ListStockMovements, MoveStockState, MovementList,
        ReceiptChanged, ReceiveStock, ReservationList, ReservationRef, Reserve, SetStock,
        SetStockPolicy, SettleReservation, StockLevels, TransferStock, Transferred, movement_token,
        page_token,
    },
    domain::{FenceToken, Location, Reservation, Sku, StockLevel, Tenant, Ttl},
    error::Error,
    events::{
        AckEvents, CreateSubscription, Event, Positioned, StreamBounds, Subscription,
        SubscriptionName,
    },
    pause::{PausePoint, PausePoints},
    ports::{
        Answers, Attempt, EventStore, Forwarded, Forwarder, Lease, LeaseService, Peer,
        ReservationStore, ReserveGroup, StockStore, SubscriptionStore, Upkeep, WriteOutcome,
    },
    quota::HoldCaps,
    rules,
    upkeep::{HeldTotals, Pruned, Retention},
};

/// How many times one `Reserve` raises lagging fence counters and tries again before giving
/// up with [`Error::LeaseLost`]. One is enough (every fenced SKU is raised at once) unless
/// Redis keeps losing data mid-request.
const MAX_FENCE_RECOVERIES: usize = 3;

/// How long a replica sends a SKU's calls straight to the peer it last found holding the
/// lease, before it looks at the lease again (one grant attempt).
const HINT_TTL: Duration = Duration::from_secs(1);

/// Most times one call is forwarded (each time to the holder found then, one hop each) before
/// it waits for the lease where it arrived: a handover between the sender's look and the
/// peer's is followed once; a lease that keeps moving is not chased, nor is a holder that
/// did not answer (after a failed hop the call waits for the lease at once).
const MAX_FORWARDS: u32 = 2;

/// Most batches one hold of a hot SKU's lease writes before it is given back, while peers
/// forward calls to it (a batch holds a forwarded call). They send their calls to the holder
/// instead of waiting for the lease, so the hold can last longer than [`MAX_HELD_BATCHES`]:
/// only calls whose forwards failed wait for it, and a handover costs the calls in flight a
/// second hop.
const MAX_HELD_BATCHES_FORWARDING: u32 = 64;

/// Most SKUs a replica remembers a holding peer for; past it, stale ones are dropped first.
const MAX_HINTS: usize = 4096;

/// What the coalescing path came to: an answer, or the peer to forward the call to.
enum Routed {
    Done(Result<Reservation, Error>),
    Forward(Peer),
}

#[derive(Clone, Debug)]
pub struct InventoryConfig {
    /// The hold a `Reserve` without a TTL gets.
    pub default_ttl: Ttl,
    pub coalesce: CoalesceConfig,
    /// Longest a `Reserve` waits for busy leases, whatever the caller's deadline.
    pub lease_wait: Duration,
    /// Longest a hold may last from when it was made, extensions included.
    pub max_hold: Duration,
    /// Longest waiting demand (backorders, pre-orders) may wait from when its reservation
    /// was made: the store keeps such a hold past its checkout expiry until then.
    pub wait_horizon: Duration,
    /// The tenant this instance serves and its caps on what all its callers hold together
    /// (checked by [`Inventory::reserve_capped`]); `None`: no tenant caps.
    pub tenant_caps: Option<(Tenant, HoldCaps)>,
}

#[derive(Debug)]
pub struct Inventory<S, L> {
    store: S,
    leases: L,
    config: InventoryConfig,
    pauses: PausePoints,
    queues: Queues,
    committer: Committer,
    /// Batches written under a lease the last leader kept.
    handed_batches: AtomicU64,
    /// Where single-line calls go when a peer holds their SKU's lease; `None`: never forwarded.
    forwarder: Option<Arc<dyn Forwarder>>,
    /// The peer last found holding each SKU's lease, and when.
    hints: Mutex<HashMap<Sku, (Peer, Instant)>>,
    forwards: ForwardCounts,
}

/// How the calls this replica forwarded ended, counted since it started.
#[derive(Debug, Default)]
pub struct ForwardCounts {
    /// The peer ran the call and answered it.
    pub answered: AtomicU64,
    /// The peer no longer held the lease; the call ran here.
    pub not_holder: AtomicU64,
    /// The hop failed; the call ran here.
    pub failed: AtomicU64,
}

impl<S, L> Inventory<S, L>
where
    S: StockStore + ReservationStore,
    L: LeaseService,
{
    pub fn new(store: S, leases: L, config: InventoryConfig) -> Self {
        let committer = Committer::new(config.coalesce.max_commits);
        Self {
            store,
            leases,
            config,
            pauses: PausePoints::default(),
            queues: Queues::default(),
            committer,
            handed_batches: AtomicU64::new(0),
            forwarder: None,
            hints: Mutex::default(),
            forwards: ForwardCounts::default(),
        }
    }

    /// The same service, handing single-line calls to the replica holding their SKU's lease.
    pub fn with_forwarder(mut self, forwarder: Arc<dyn Forwarder>) -> Self {
        self.forwarder = Some(forwarder);
        self
    }

    /// The same service, reaching these pause points (to share them with an adapter).
    pub fn with_pause_points(mut self, pauses: PausePoints) -> Self {
        self.pauses = pauses;
        self
    }

    /// How many `Reserve` calls wait in this replica's queue for `sku` behind its leader.
    pub fn queued(&self, sku: &Sku) -> usize {
        self.queues.queued(sku)
    }

    /// How many SKU batches of this replica wait for the group commit in progress.
    pub fn groups_waiting(&self) -> usize {
        self.committer.waiting()
    }

    /// How many batches of this replica were written under a lease the last leader kept
    /// (renewed) instead of one taken from Redis.
    pub fn handed_batches(&self) -> u64 {
        self.handed_batches.load(Ordering::Relaxed)
    }

    /// How the calls this replica forwarded to the holder of their SKU's lease ended.
    pub fn forwards(&self) -> &ForwardCounts {
        &self.forwards
    }

    /// The lease service this instance takes its leases from.
    pub fn leases(&self) -> &L {
        &self.leases
    }

    /// The pause points of this instance, for tests to arm.
    pub fn pause_points(&self) -> &PausePoints {
        &self.pauses
    }

    pub async fn adjust_stock(&self, command: &AdjustStock) -> Result<StockLevel, Error> {
        self.store.adjust_stock(command).await
    }

    pub async fn get_stock(&self, query: &GetStock) -> Result<StockLevels, Error> {
        self.store.get_stock(query).await
    }

    /// Records an incoming receipt; no lease, like an adjustment.
    pub async fn expect_stock(&self, command: &ExpectStock) -> Result<ReceiptChanged, Error> {
        self.store.expect_stock(command).await
    }

    /// Units of a receipt arrive; no lease, like an adjustment.
    pub async fn receive_stock(&self, command: &ReceiveStock) -> Result<ReceiptChanged, Error> {
        self.store.receive_stock(command).await
    }

    pub async fn cancel_receipt(&self, command: &CancelReceipt) -> Result<ReceiptChanged, Error> {
        self.store.cancel_receipt(command).await
    }

    pub async fn list_receipts(
        &self,
        query: &ListReceipts,
    ) -> Result<crate::command::ReceiptList, Error> {
        let page = self.store.list_receipts(query).await?;
        Ok(crate::command::ReceiptList {
            next_page_token: page.next.map_or_else(String::new, |last| {
                crate::command::receipt_token::encode(&last, query.sku.as_ref())
            }),
            receipts: page.receipts,
        })
    }

    /// Sets a (SKU, location)'s policy; no lease, like an adjustment.
    pub async fn set_stock_policy(&self, command: &SetStockPolicy) -> Result<StockLevel, Error> {
        self.store.set_stock_policy(command).await
    }

    /// Moves units between states; no lease, like an adjustment.
    pub async fn move_stock_state(&self, command: &MoveStockState) -> Result<StockLevel, Error> {
        self.store.move_stock_state(command).await
    }

    /// Moves available units between locations; no lease, like an adjustment (the SKU's row
    /// lock orders it with every Reserve).
    pub async fn transfer_stock(&self, command: &TransferStock) -> Result<Transferred, Error> {
        self.store.transfer_stock(command).await
    }

    pub async fn upsert_location(&self, location: &Location) -> Result<Location, Error> {
        self.store.upsert_location(location).await
    }

    pub async fn list_locations(&self) -> Result<Vec<Location>, Error> {
        self.store.list_locations().await
    }

    /// An absolute count (see [`StockStore::set_stock`]); no lease, like an adjustment.
    pub async fn set_stock(&self, command: &SetStock) -> Result<StockLevel, Error> {
        self.store.set_stock(command).await
    }

    /// Many counts, all or none (see [`StockStore::batch_set_stock`]).
    pub async fn batch_set_stock(&self, command: &BatchSetStock) -> Result<Vec<StockLevel>, Error> {
        self.store.batch_set_stock(command).await
    }

    /// A page of a SKU's movements, with the token of the next page.
    pub async fn list_movements(&self, query: &ListStockMovements) -> Result<MovementList, Error> {
        let page = self.store.list_movements(query).await?;
        Ok(MovementList {
            next_page_token: page.next.map_or_else(String::new, |last| {
                movement_token::encode(last, &query.sku, query.after_version)
            }),
            movements: page.movements,
        })
    }

    /// Leases for every line (in SKU order), then the fenced write. A single-line request
    /// goes through its SKU's queue instead (see [`crate::coalesce`]), unless coalescing is
    /// off.
    ///
    /// A write refused by a fence means one of two things. If our lease is gone, another
    /// holder took over while we stalled: we are the stale writer and report
    /// [`Error::LeaseLost`], never success. If we still hold it, Redis handed out a token
    /// below what PostgreSQL already accepted (its counter was lost or rolled back): raise the
    /// counter above the stored fence and try again, so no legitimate holder is locked out.
    #[tracing::instrument(skip_all, fields(order_id = command.order_id.as_str(), lines = command.lines().len()))]
    ///
    /// Leases are waited for until the server's `lease_wait` or the caller's budget, whichever
    /// ends first; which one ran out decides between [`Error::LeaseBusy`] and
    /// [`Error::DeadlineExceeded`].
    pub async fn reserve(&self, command: &Reserve, budget: Budget) -> Result<Reservation, Error> {
        self.reserve_from(command, budget, self.config.lease_wait, Origin::Client)
            .await
    }

    /// A `Reserve` a peer forwarded here because this replica held its SKU's lease. Run like
    /// any other, except that it is never forwarded again: if another replica holds the
    /// lease now, the answer is [`Error::NotHolder`] and the sender runs it.
    ///
    /// `lease_wait`: how long the sender would still have waited for the lease; the wait here
    /// ends then, or at this replica's own bound if that comes first.
    pub async fn reserve_forwarded(
        &self,
        command: &Reserve,
        budget: Budget,
        lease_wait: Option<Duration>,
    ) -> Result<Reservation, Error> {
        let lease_wait = lease_wait.map_or(self.config.lease_wait, |wait| {
            wait.min(self.config.lease_wait)
        });
        self.reserve_from(command, budget, lease_wait, Origin::Peer)
            .await
    }

    async fn reserve_from(
        &self,
        command: &Reserve,
        budget: Budget,
        lease_wait: Duration,
        origin: Origin,
    ) -> Result<Reservation, Error> {
        let wait = budget.lease_wait(lease_wait, Instant::now());
        wait.judge(
            self.reserve_until(command, wait.until, budget.answer_by(), origin)
                .await,
        )
    }

    async fn reserve_until(
        &self,
        command: &Reserve,
        deadline: Instant,
        answer_by: Option<Instant>,
        origin: Origin,
    ) -> Result<Reservation, Error> {
        let ttl = command.ttl.unwrap_or(self.config.default_ttl);
        rules::within_max_hold(ttl, self.config.max_hold)?;
        // A line that may wait for stock is placed with the receipts it may be pegged to,
        // which only the one-request path reads.
        if let [line] = command.lines()
            && self.config.coalesce.max_batch > 1
            && !command.allocation.may_wait()
        {
            return self
                .reserve_routed(&line.sku, command, ttl, deadline, answer_by, origin)
                .await;
        }
        let skus: Vec<Sku> = command
            .lines_by_sku()
            .into_iter()
            .map(|l| l.sku.clone())
            .collect();
        let store = &self.store;
        self.fenced_write(&skus, deadline, |fences| async move {
            store.reserve(command, ttl, &fences).await
        })
        .await?
    }

    /// A single-line call: to the peer holding its SKU's lease when there is one, else through
    /// this replica's queue. Each forward is one hop (the peer never forwards it on). One the
    /// peer refuses (the lease moved on) is looked up again once and sent to the holder found
    /// then; after a second refusal, or any failed hop, the call waits for the lease here.
    async fn reserve_routed(
        &self,
        sku: &Sku,
        command: &Reserve,
        ttl: Ttl,
        deadline: Instant,
        answer_by: Option<Instant>,
        origin: Origin,
    ) -> Result<Reservation, Error> {
        let mut origin = match (&self.forwarder, origin) {
            (None, Origin::Client) => Origin::Local,
            (_, origin) => origin,
        };
        // A SKU led here has its lease held or being taken here: no need to look elsewhere.
        let mut target = match origin {
            Origin::Client if !self.queues.has_leader(sku) => self.hint(sku),
            _ => None,
        };
        let mut forwards = 0;
        // A hop that failed after the call was sent: the peer may still write it.
        let mut ambiguous = false;
        loop {
            let peer = match target.take() {
                Some(peer) => peer,
                // Boxed: the coalescing path's future is large, and this loop holds it beside
                // the forward's.
                None => match Box::pin(self.reserve_coalesced(sku, command, origin, ttl, deadline))
                    .await
                {
                    Routed::Done(Err(error)) if ambiguous && !error.decided_with_key() => {
                        // Nothing was written here, but the call may yet be written where it
                        // was sent: not a refusal the caller may take as "nothing changed".
                        return Err(Error::DeadlineExceeded);
                    }
                    Routed::Done(answer) => return answer,
                    Routed::Forward(peer) => peer,
                },
            };
            let Some(forwarder) = &self.forwarder else {
                unreachable!("only a replica with a forwarder forwards");
            };
            let started = Instant::now();
            let forwarded = forwarder.forward(&peer, command, deadline, answer_by).await;
            crate::metrics::count_forward(&forwarded, started.elapsed());
            match forwarded {
                Forwarded::Answered(answer) => {
                    self.forwards.answered.fetch_add(1, Ordering::Relaxed);
                    return answer;
                }
                Forwarded::NotHolder => {
                    self.forwards.not_holder.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%sku, %peer, "peer no longer holds the lease; looking again");
                }
                Forwarded::Failed { error, sent } => {
                    self.forwards.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%sku, %peer, %error, sent, "forward failed; running here");
                    ambiguous |= sent;
                    // A holder that did not answer is not chased: its lease runs out, and the
                    // call waits for it here.
                    origin = Origin::Local;
                }
            }
            self.forget_hint(sku, &peer);
            forwards += 1;
            if forwards >= MAX_FORWARDS {
                origin = Origin::Local;
            }
        }
    }

    /// The peer last found holding `sku`'s lease, if that was recent.
    fn hint(&self, sku: &Sku) -> Option<Peer> {
        let mut hints = self.hints.lock().expect("hints lock");
        match hints.get(sku) {
            Some((peer, at)) if at.elapsed() < HINT_TTL => Some(peer.clone()),
            Some(_) => {
                hints.remove(sku);
                None
            }
            None => None,
        }
    }

    fn remember_hint(&self, sku: &Sku, peer: &Peer) {
        let mut hints = self.hints.lock().expect("hints lock");
        if hints.len() >= MAX_HINTS && !hints.contains_key(sku) {
            hints.retain(|_, (_, at)| at.elapsed() < HINT_TTL);
            if hints.len() >= MAX_HINTS {
                hints.clear();
            }
        }
        hints.insert(sku.clone(), (peer.clone(), Instant::now()));
    }

    /// This replica holds `sku`'s lease now: no peer does.
    fn forget_hints(&self, sku: &Sku) {
        self.hints.lock().expect("hints lock").remove(sku);
    }

    fn forget_hint(&self, sku: &Sku, peer: &Peer) {
        let mut hints = self.hints.lock().expect("hints lock");
        if hints.get(sku).is_some_and(|(hinted, _)| hinted == peer) {
            hints.remove(sku);
        }
    }

    /// Queues behind the SKU's leader, or leads: one lease and one transaction for the whole
    /// queue, each request answered on its own. A leader that finds the lease held by a peer
    /// sends the queue's client calls there (see [`Queues::redirect`]).
    async fn reserve_coalesced(
        &self,
        sku: &Sku,
        command: &Reserve,
        origin: Origin,
        ttl: Ttl,
        deadline: Instant,
    ) -> Routed {
        let config = &self.config.coalesce;
        let joined = match self
            .queues
            .join(sku, command, origin, ttl, deadline, config.max_queued)
        {
            Ok(joined) => joined,
            Err(error) => return Routed::Done(Err(error)),
        };
        let kept = match joined {
            Joined::Lead => None,
            Joined::Wait { id, turn } => match self.wait_turn(sku, id, turn, deadline).await {
                Turn::Done(answer) => return Routed::Done(answer),
                Turn::Forward(peer) => return Routed::Forward(peer),
                Turn::Lead(kept) => kept,
            },
        };
        let try_first = kept.is_none() && self.forwarder.is_some();
        let leadership = Leadership::new(&self.queues, sku, kept);
        let mut granted = None;
        if try_first {
            // One grant attempt before taking the batch: it takes the lease, or says which
            // peer has it, so the queue goes there instead of waiting its turn here. Dropping
            // the leadership on the way out passes the lead to whoever stays queued.
            match self.leases.try_acquire(sku).await {
                Ok(Attempt::Granted(lease)) => {
                    self.forget_hints(sku);
                    granted = Some(lease);
                }
                Ok(Attempt::Held { peer }) => {
                    if let Some(peer) = &peer {
                        self.remember_hint(sku, peer);
                    }
                    self.queues.redirect(sku, peer.as_ref());
                    match (origin, peer) {
                        (Origin::Client, Some(peer)) => return Routed::Forward(peer),
                        (Origin::Peer, _) => {
                            return Routed::Done(Err(Error::NotHolder { sku: sku.clone() }));
                        }
                        _ => {}
                    }
                }
                // One of this replica's own writes holds it (a cart): wait for it here.
                Ok(Attempt::HeldHere) => {}
                Err(error) => {
                    for queued in self.queues.take(sku, usize::MAX, command) {
                        queued.answer(Err(error.clone()));
                    }
                    return Routed::Done(Err(error));
                }
            }
        }
        // Boxed, like the coalescing path itself: it is held beside the grant attempt's.
        Routed::Done(
            Box::pin(self.lead_batch(leadership, sku, (command, ttl), origin, deadline, granted))
                .await,
        )
    }

    /// Writes the leader's batch: its own call (`own`, from `origin`) and up to
    /// `max_batch - 1` queued ones, under the lease the last leader kept, the one just
    /// `granted`, or one taken now.
    async fn lead_batch(
        &self,
        mut leadership: Leadership<'_>,
        sku: &Sku,
        own: (&Reserve, Ttl),
        origin: Origin,
        deadline: Instant,
        granted: Option<Lease>,
    ) -> Result<Reservation, Error> {
        let (command, ttl) = own;
        let config = &self.config.coalesce;
        if !config.linger.is_zero() && self.queues.queued(sku) > 0 {
            // Others are already waiting, so more are likely: give them a moment to join.
            let until = (Instant::now() + config.linger).min(deadline);
            tokio::time::sleep_until(until.into()).await;
        }
        let queued = self.queues.take(sku, config.max_batch - 1, command);
        // Peers forward to this replica instead of waiting for the lease: it may keep it
        // longer (see `MAX_HELD_BATCHES_FORWARDING`). Otherwise replicas (of an older release
        // too) take turns as before.
        let max_held = if origin == Origin::Peer || queued.iter().any(Queued::forwarded) {
            MAX_HELD_BATCHES_FORWARDING
        } else {
            MAX_HELD_BATCHES
        };
        // The lease is waited for as long as the most patient request of the batch may wait.
        let batch_deadline = queued
            .iter()
            .map(|q| q.deadline)
            .fold(deadline, Instant::max);
        let (others, replies): (Vec<_>, Vec<_>) =
            queued.into_iter().map(Queued::into_parts).unzip();
        let batch: Vec<(Reserve, Ttl)> = std::iter::once((command.clone(), ttl))
            .chain(others)
            .collect();
        let written = self
            .write_batch(
                &mut leadership,
                sku,
                &batch,
                batch_deadline,
                granted,
                max_held,
            )
            .await
            .and_then(|answers| {
                if answers.len() == batch.len() {
                    Ok(answers)
                } else {
                    Err(Error::internal(
                        "a batch write returned the wrong number of answers",
                    ))
                }
            });
        match written {
            Ok(answers) => {
                let mut answers = answers.into_iter();
                let own = answers.next().expect("the leader's answer comes first");
                for (reply, answer) in replies.into_iter().zip(answers) {
                    reply.answer(answer);
                }
                own
            }
            Err(error) => {
                for reply in replies {
                    reply.answer(Err(error.clone()));
                }
                Err(error)
            }
        }
    }

    /// Waits in the SKU's queue until the request is answered or leads (with the lease the
    /// last leader kept, if any).
    async fn wait_turn(
        &self,
        sku: &Sku,
        id: u64,
        turn: tokio::sync::oneshot::Receiver<Turn>,
        deadline: Instant,
    ) -> Turn {
        let enqueued = Instant::now();
        let busy = || {
            Turn::Done(Err(Error::LeaseBusy {
                sku: sku.clone(),
                waited: enqueued.elapsed(),
            }))
        };
        let mut waiting = TurnWait::new(turn, &self.queues, sku);
        let turn = match tokio::time::timeout_at(deadline.into(), &mut waiting.turn).await {
            Ok(turn) => turn,
            // Gave up in the queue, where nothing was written yet. Unless a leader took the
            // request first: then its answer is on the way and is the truth.
            Err(_) if self.queues.leave(sku, id) => return busy(),
            Err(_) => (&mut waiting.turn).await,
        };
        match turn {
            // Handed the lead just as its own budget ran out: pass it on, write nothing.
            Ok(Turn::Lead(kept)) if Instant::now() >= deadline => {
                drop(Leadership::new(&self.queues, sku, kept));
                busy()
            }
            Ok(turn) => turn,
            Err(_) => Turn::Done(Err(Error::internal("batch leader ended without answering"))),
        }
    }

    /// Writes one SKU's batch through the group commit, under the lease the last leader kept
    /// or a new one. While others queue, the lease is renewed beside the commit and handed on
    /// with the lead (see [`crate::coalesce`]); otherwise it is released.
    async fn write_batch(
        &self,
        leadership: &mut Leadership<'_>,
        sku: &Sku,
        batch: &[(Reserve, Ttl)],
        deadline: Instant,
        mut granted: Option<Lease>,
        max_held: u32,
    ) -> Result<Answers, Error> {
        let mut recoveries = 0;
        loop {
            let (lease, batches) = match leadership.take_kept() {
                Some(kept) => {
                    self.handed_batches.fetch_add(1, Ordering::Relaxed);
                    self.pauses.reach(PausePoint::LeaseHanded).await;
                    (kept.lease, kept.batches)
                }
                None => {
                    let lease = match granted.take() {
                        Some(lease) => lease,
                        None => self.leases.acquire(sku, deadline).await?,
                    };
                    self.pauses.reach(PausePoint::LeaseGranted).await;
                    (lease, 0)
                }
            };
            crate::metrics::count_batch(batches > 0);
            let keep = batches + 1 < max_held && self.queues.queued(sku) > 0;
            let group = ReserveGroup {
                sku: sku.clone(),
                fence: lease.fence,
                batch: batch.to_vec(),
            };
            let renewal = async {
                if !keep {
                    return None;
                }
                self.leases.renew(&lease).await.unwrap_or_else(|error| {
                    tracing::debug!(%sku, %error, "lease not renewed; it is released instead");
                    None
                })
            };
            let (written, renewed) = tokio::join!(self.commit(group), renewal);
            match written {
                Ok(WriteOutcome::Answered {
                    answer: answers,
                    unknown,
                }) => {
                    self.pauses.reach(PausePoint::Committed).await;
                    match renewed {
                        Some(renewed) if unknown.is_empty() => {
                            let kept = Kept {
                                lease: renewed,
                                batches: batches + 1,
                            };
                            if let Err(kept) = leadership.pass(kept) {
                                // Nobody queued any more: give it back.
                                self.release_all(&[kept.lease]).await;
                            }
                        }
                        renewed => {
                            let leases = [renewed.unwrap_or(lease)];
                            self.forget_unknown(&leases, &unknown).await;
                            self.release_all(&leases).await;
                        }
                    }
                    return Ok(answers);
                }
                Ok(WriteOutcome::Fenced(fenced)) => {
                    // A renewal has the same holder: releasing either lease releases it.
                    self.recover_fenced(&[lease], fenced, &mut recoveries)
                        .await?;
                }
                Err(error) => {
                    self.release_all(&[lease]).await;
                    return Err(error);
                }
            }
        }
    }

    /// Writes one SKU's batch through the replica's group commit: in the transaction being
    /// assembled now, with whichever other SKUs' batches are ready.
    async fn commit(&self, group: ReserveGroup) -> GroupOutcome {
        let own = match self.committer.submit(group) {
            Submitted::Lead(group) => group,
            Submitted::Wait(turn) => match (&mut CommitWait::new(turn, &self.committer).turn).await
            {
                Ok(CommitTurn::Done(outcome)) => return outcome,
                Ok(CommitTurn::Lead(group)) => group,
                Err(_) => return Err(Error::internal("group commit ended without answering")),
            },
        };
        let writing = Writing::new(&self.committer);
        self.pauses.reach(PausePoint::GroupCommit).await;
        let (others, replies): (Vec<_>, Vec<_>) = self
            .committer
            .take(MAX_GROUPS - 1, &own)
            .into_iter()
            .map(|pending| (pending.group, pending.reply))
            .unzip();
        if others.is_empty()
            && let [(command, ttl)] = own.batch.as_slice()
        {
            // Nobody to share the transaction with: the one-request write is the cheaper one,
            // so coalescing costs a lone call nothing.
            let fences = [(own.sku.clone(), own.fence)];
            return Ok(match self.store.reserve(command, *ttl, &fences).await? {
                WriteOutcome::Answered { answer, unknown } => WriteOutcome::Answered {
                    answer: vec![answer],
                    unknown,
                },
                WriteOutcome::Fenced(fenced) => WriteOutcome::Fenced(fenced),
            });
        }
        let groups: Vec<ReserveGroup> = std::iter::once(own).chain(others).collect();
        let outcomes = self
            .store
            .reserve_groups(&groups, &|| writing.committing())
            .await
            .and_then(|outcomes| {
                if outcomes.len() == groups.len() {
                    Ok(outcomes)
                } else {
                    Err(Error::internal(
                        "a group commit returned the wrong number of outcomes",
                    ))
                }
            });
        let answer = |reply: tokio::sync::oneshot::Sender<CommitTurn>, outcome| {
            let _ = reply.send(CommitTurn::Done(outcome));
        };
        match outcomes {
            Ok(outcomes) => {
                let mut outcomes = outcomes.into_iter();
                let own = outcomes.next().expect("the leader's outcome comes first");
                for (reply, outcome) in replies.into_iter().zip(outcomes) {
                    answer(reply, Ok(outcome));
                }
                Ok(own)
            }
            Err(error) => {
                for reply in replies {
                    answer(reply, Err(error.clone()));
                }
                Err(error)
            }
        }
    }

    /// Takes the leases of `skus`, runs `write` with their fencing tokens and gives the
    /// leases back; recovers from fence counters that fell behind PostgreSQL (see
    /// [`Self::reserve`]).
    async fn fenced_write<T, F, Fut>(
        &self,
        skus: &[Sku],
        deadline: Instant,
        write: F,
    ) -> Result<T, Error>
    where
        F: Fn(Vec<(Sku, FenceToken)>) -> Fut,
        Fut: Future<Output = Result<WriteOutcome<T>, Error>>,
    {
        let mut recoveries = 0;
        loop {
            let leases = self.acquire_all(skus, deadline).await?;
            self.pauses.reach(PausePoint::LeaseGranted).await;
            let fences: Vec<_> = leases.iter().map(|l| (l.sku.clone(), l.fence)).collect();
            match write(fences).await {
                Ok(WriteOutcome::Answered { answer, unknown }) => {
                    self.pauses.reach(PausePoint::Committed).await;
                    self.forget_unknown(&leases, &unknown).await;
                    self.release_all(&leases).await;
                    return Ok(answer);
                }
                Ok(WriteOutcome::Fenced(fenced)) => {
                    self.recover_fenced(&leases, fenced, &mut recoveries)
                        .await?;
                }
                Err(error) => {
                    self.release_all(&leases).await;
                    return Err(error);
                }
            }
        }
    }

    /// After a write refused by a fence: releases `leases`, then either reports the lease
    /// lost (we are the stale writer) or raises the lagging fence counters so the caller can
    /// try again (see [`Self::reserve`]).
    async fn recover_fenced(
        &self,
        leases: &[Lease],
        fenced: Vec<(Sku, FenceToken)>,
        recoveries: &mut usize,
    ) -> Result<(), Error> {
        let lost = self.first_lost(leases, &fenced).await;
        self.release_all(leases).await;
        if let Some(sku) = lost? {
            return Err(Error::LeaseLost { sku });
        }
        if *recoveries == MAX_FENCE_RECOVERIES {
            let (sku, _) = fenced.into_iter().next().expect("at least one line");
            return Err(Error::LeaseLost { sku });
        }
        *recoveries += 1;
        for (sku, stored) in &fenced {
            tracing::warn!(%sku, %stored, "fence counter behind PostgreSQL; raising it");
            self.leases.raise_fence(sku, *stored).await?;
        }
        Ok(())
    }

    /// Confirms or releases held units (see [`ReservationStore::settle`]). Needs no lease:
    /// it only lowers `reserved` (and `on_hand`, for a confirm), never raises it.
    pub async fn settle(&self, command: &SettleReservation) -> Result<Reservation, Error> {
        self.store.settle(command).await
    }

    pub async fn get_reservation(&self, target: ReservationRef) -> Result<Reservation, Error> {
        self.store.get_reservation(target).await
    }

    /// Cancels an order for good (see [`ReservationStore::cancel_order`]). Needs no lease:
    /// it only lowers `reserved`, like a release.
    pub async fn cancel_order(&self, command: &CancelOrder) -> Result<Vec<Reservation>, Error> {
        self.store.cancel_order(command).await
    }

    /// A page of reservations, with the token of the next one bound to the same filters.
    pub async fn list_reservations(
        &self,
        query: &ListReservations,
    ) -> Result<ReservationList, Error> {
        let page = self.store.list_reservations(query).await?;
        Ok(ReservationList {
            next_page_token: page
                .next
                .map(|cursor| page_token::encode(&cursor, &query.filter, &query.scope))
                .unwrap_or_default(),
            reservations: page.reservations,
        })
    }

    /// [`Self::reserve`] for a caller with caps on what it may hold: refused with
    /// [`Error::QuotaExceeded`] when the reservation would pass one, unless its key was used
    /// already (a retry replays its answer). See [`crate::quota`].
    pub async fn reserve_capped(
        &self,
        command: &Reserve,
        caps: HoldCaps,
        budget: Budget,
    ) -> Result<Reservation, Error> {
        if !caps.is_unlimited() {
            let holdings = self
                .store
                .holdings(&command.caller, &command.idempotency_key)
                .await?;
            caps.check(command, &holdings)?;
        }
        if let Some((tenant, caps)) = &self.config.tenant_caps
            && !caps.is_unlimited()
        {
            let holdings = self
                .store
                .tenant_holdings(&command.caller, &command.idempotency_key)
                .await?;
            caps.check_tenant(tenant, command, &holdings)?;
        }
        self.reserve(command, budget).await
    }

    /// Moves a live hold's expiry (see [`rules::extend`]). Needs no lease: no stock moves.
    pub async fn extend(&self, command: &ExtendReservation) -> Result<Reservation, Error> {
        self.store.extend(command, self.config.max_hold).await
    }

    /// One sweep: expires up to `batch` overdue holds.
    pub async fn expire_due(&self, batch: usize) -> Result<usize, Error> {
        self.store.expire_due(batch).await
    }

    /// One refill pass: fills holds waiting where units are free, at up to `batch` places.
    pub async fn refill_waiting(&self, batch: usize) -> Result<u64, Error> {
        self.store.refill_waiting(batch).await
    }

    /// The first fenced SKU whose lease we no longer hold: we stalled and another holder
    /// took over, so our write is the stale one. `None`: we still hold every fenced lease, so
    /// the fences are ahead of Redis's counters instead.
    async fn first_lost(
        &self,
        leases: &[Lease],
        fenced: &[(Sku, FenceToken)],
    ) -> Result<Option<Sku>, Error> {
        for (sku, stored) in fenced {
            let lease = leases
                .iter()
                .find(|l| &l.sku == sku)
                .expect("every fenced line has a lease");
            if !self.leases.is_held(lease).await? {
                tracing::warn!(%sku, token = %lease.fence, %stored, "stale lease holder fenced off");
                return Ok(Some(sku.clone()));
            }
        }
        Ok(None)
    }

    /// Takes the leases in the given (SKU) order; on failure, gives back the ones taken.
    async fn acquire_all(&self, skus: &[Sku], deadline: Instant) -> Result<Vec<Lease>, Error> {
        let mut leases = Vec::with_capacity(skus.len());
        for sku in skus {
            match self.leases.acquire(sku, deadline).await {
                Ok(lease) => leases.push(lease),
                Err(error) => {
                    self.release_all(&leases).await;
                    return Err(error);
                }
            }
        }
        Ok(leases)
    }

    /// Best effort: a SKU that does not exist leaves no fence counter behind, so requests for
    /// made-up SKUs cannot fill Redis. `unknown`: the SKUs the write found not to exist, not
    /// those of a replayed refusal (the SKU may exist by now, its counter in use).
    async fn forget_unknown(&self, leases: &[Lease], unknown: &[Sku]) {
        for lease in leases.iter().filter(|lease| unknown.contains(&lease.sku)) {
            if let Err(error) = self.leases.forget_fence(lease).await {
                tracing::debug!(sku = %lease.sku, %error, "fence of an unknown SKU not removed");
            }
        }
    }

    /// Best effort: a lease that cannot be released expires on its own.
    async fn release_all(&self, leases: &[Lease]) {
        for lease in leases.iter().rev() {
            match self.leases.release(lease).await {
                Ok(true) => {}
                Ok(false) => tracing::debug!(sku = %lease.sku, "lease had already expired"),
                Err(error) => {
                    tracing::debug!(sku = %lease.sku, %error, "lease not released; it will expire")
                }
            }
        }
    }
}

/// The event stream, through the store's [`EventStore`] port: what `WatchEvents`, the
/// sequencer and the tailer use.
impl<S: EventStore, L> Inventory<S, L> {
    /// Up to `limit` events above position `after`, in position order.
    pub async fn events_after(&self, after: i64, limit: usize) -> Result<Vec<Event>, Error> {
        self.store.events_after(after, limit).await
    }

    /// The head, what retention removed and the epochs, in one snapshot.
    pub async fn stream_bounds(&self) -> Result<StreamBounds, Error> {
        self.store.stream_bounds().await
    }

    /// One sequencer run (see [`EventStore::position_events`]).
    pub async fn position_events(&self, batch: usize) -> Result<Positioned, Error> {
        self.store.position_events(batch).await
    }

    /// Completes once this replica has committed an event since the last call.
    pub async fn written(&self) {
        self.store.written().await
    }
}

/// Named subscriptions, through the store's [`SubscriptionStore`] port.
impl<S: EventStore + SubscriptionStore, L> Inventory<S, L> {
    /// Creates a subscription at the head (or the oldest event kept), or answers the same one.
    pub async fn create_subscription(
        &self,
        command: &CreateSubscription,
    ) -> Result<Subscription, Error> {
        let bounds = self.store.stream_bounds().await?;
        let start = if command.from_oldest {
            bounds.pruned_through
        } else {
            bounds.head
        };
        self.store
            .create_subscription(command, start, bounds.epoch_at(start))
            .await
    }

    pub async fn subscription(&self, name: &SubscriptionName) -> Result<Subscription, Error> {
        self.store.subscription(name).await
    }

    /// Makes the caller the subscription's one reader (see [`SubscriptionStore`]).
    pub async fn take_over_subscription(
        &self,
        name: &SubscriptionName,
    ) -> Result<Subscription, Error> {
        self.store.take_over_subscription(name).await
    }

    /// Acknowledges up to a position the stream's history has: never past the head, and in
    /// the epoch the consumer names (when it names one).
    pub async fn ack_events(&self, command: &AckEvents) -> Result<Subscription, Error> {
        let bounds = self.store.stream_bounds().await?;
        if command.position > bounds.head {
            return Err(Error::InvalidArgument(vec![
                crate::error::FieldViolation::new(
                    "sequence",
                    format!("is past the stream's head ({})", bounds.head),
                ),
            ]));
        }
        if !bounds.admits(command.epoch, command.position) {
            return Err(Error::CursorNotInHistory {
                after: command.position,
                requested: command
                    .epoch
                    .map_or_else(|| "unknown".to_owned(), |e| e.to_string()),
                current: bounds.current_epoch(),
                head: bounds.head,
            });
        }
        let epoch = command.epoch.or_else(|| bounds.epoch_at(command.position));
        let acked = self.store.ack_events(command, epoch, false).await?;
        if bounds.admits(acked.acked_epoch, acked.acked) {
            return Ok(acked);
        }
        // It kept a position a cut in the history left behind (a restore), which is read
        // nowhere (CURSOR_NOT_IN_HISTORY): its consumer rebuilt from a snapshot and
        // acknowledges where it goes on, which moves it there, even back.
        self.store.ack_events(command, epoch, true).await
    }

    pub async fn list_subscriptions(&self) -> Result<Vec<Subscription>, Error> {
        self.store.list_subscriptions().await
    }

    pub async fn delete_subscription(&self, name: &SubscriptionName) -> Result<(), Error> {
        self.store.delete_subscription(name).await
    }
}

/// Upkeep, through the store's [`Upkeep`] port: what the sweeper runs besides expiry.
impl<S: Upkeep, L> Inventory<S, L> {
    /// One pruning pass past `retention`, at most `batch` rows per table.
    pub async fn prune(&self, retention: &Retention, batch: usize) -> Result<Pruned, Error> {
        self.store.prune(retention, batch).await
    }

    /// Counts what is held now, for the held gauges.
    pub async fn count_held(&self) -> Result<HeldTotals, Error> {
        self.store.count_held().await
    }

    /// How long the oldest hold past its expiry has waited for a sweep, for its gauge.
    pub async fn oldest_overdue(&self) -> Result<Duration, Error> {
        self.store.oldest_overdue().await
    }
}
