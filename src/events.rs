//! The live event stream of one replica.
//!
//! Three parts, so that many watchers share one stream of work:
//! - the **sequencer** positions committed outbox events (woken by this replica's commits,
//!   with a slow tick for the others'); one replica at a time does it, the others skip;
//! - the **tailer** `LISTEN`s for head moves, reads each new event once and broadcasts it
//!   (while no watcher follows the live tail, it only keeps up with the head);
//! - each **watcher** (one `WatchEvents` call) catches up from PostgreSQL from its cursor, then
//!   follows the broadcast. A watcher that falls behind the broadcast (a slow consumer) goes
//!   back to reading PostgreSQL from its cursor: the server never buffers more than the
//!   broadcast ring and [`WATCH_BUFFER`] events per watcher.
//!
//! A watcher with a filter still scans every event (its cursor is the whole stream's
//! position) but sends only those the filter passes, and a heartbeat with the position it
//! scanned through: first at its starting cursor, then whenever it scanned past events it did
//! not send, at the end of each catch-up and every heartbeat interval while it follows the
//! tail. A subscription's watcher
//! is a filtered one that started from the subscription's acknowledged position; on every
//! heartbeat tick it also checks that no other reader took the subscription over.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use inventory_core::{
    Error,
    command::WatchEvents,
    events::{EpochId, Event, EventFilter, Positioned, StreamBounds, SubscriptionName},
    ports::{HeadFeed, Subscription},
};
use tokio::sync::{Notify, broadcast, mpsc, watch};
use tonic::Status;

use crate::{Service, proto, status::to_status, wire::Encode as _};

/// Events queued for one watcher before it stops reading (and so backs off to PostgreSQL).
pub const WATCH_BUFFER: usize = 64;
/// Events shared by every watcher of this replica that follows the live tail.
const BROADCAST_RING: usize = 1024;
/// Events read from PostgreSQL in one query.
const PAGE: usize = 500;
/// Events positioned by one sequencer transaction.
const POSITION_BATCH: usize = 1000;
/// Fallback wake-ups: events committed by other replicas.
const SEQUENCER_TICK: Duration = Duration::from_millis(250);
/// Least time between two sequencer runs. A run is a transaction and a commit of its own;
/// under load, one run per gap positions the events of every commit in it instead of one run
/// per commit. After a quiet spell the first commit is positioned at once.
const SEQUENCER_MIN_GAP: Duration = Duration::from_millis(10);
const TAILER_TICK: Duration = Duration::from_secs(1);

/// What a watcher hands to its `WatchEvents` response stream.
type Delivery = Result<proto::Event, Status>;

type Watchers = Mutex<Vec<mpsc::WeakSender<Delivery>>>;

fn open_watchers(watchers: &Watchers) -> usize {
    let mut watchers = watchers.lock().expect("watchers lock");
    watchers.retain(|w| w.strong_count() > 0);
    watchers.len()
}

/// See [`EventHub::watcher_count`].
#[derive(Clone, Debug)]
pub struct WatcherCount(std::sync::Weak<Watchers>);

impl WatcherCount {
    /// `None` once the hub is gone.
    pub fn get(&self) -> Option<usize> {
        self.0.upgrade().map(|watchers| open_watchers(&watchers))
    }
}

#[derive(Clone, Debug)]
pub struct EventHub {
    /// The event stream is read through the core, like every other call.
    inventory: Arc<Service>,
    live: broadcast::Sender<Arc<Event>>,
    stopping: watch::Receiver<bool>,
    /// Senders of the open watchers, to count them and report how much they have queued.
    watchers: Arc<Watchers>,
    limits: WatchLimits,
}

/// What bounds and paces the watchers of a replica.
#[derive(Clone, Copy, Debug)]
pub struct WatchLimits {
    /// Most watchers open at once (`MAX_WATCHERS`).
    pub max_watchers: usize,
    /// `WATCH_HEARTBEAT_INTERVAL`.
    pub heartbeat: Duration,
}

impl EventHub {
    pub fn new(
        inventory: Arc<Service>,
        stopping: watch::Receiver<bool>,
        limits: WatchLimits,
    ) -> Self {
        Self {
            inventory,
            live: broadcast::channel(BROADCAST_RING).0,
            stopping,
            watchers: Arc::default(),
            limits,
        }
    }

    /// A hub for another tenant's stream: its own events, the same `stopping`, and the
    /// same count of open watchers, so `MAX_WATCHERS` bounds the replica, not each tenant.
    pub fn sibling(&self, inventory: Arc<Service>) -> Self {
        Self {
            inventory,
            live: broadcast::channel(BROADCAST_RING).0,
            stopping: self.stopping.clone(),
            watchers: Arc::clone(&self.watchers),
            limits: self.limits,
        }
    }

    /// Watchers open now.
    pub fn watching(&self) -> usize {
        open_watchers(&self.watchers)
    }

    /// Counts this hub's open watchers without keeping the hub alive (for a metric).
    pub fn watcher_count(&self) -> WatcherCount {
        WatcherCount(Arc::downgrade(&self.watchers))
    }

    /// Starts a watcher after checking its cursor against retention (a subscription's: after
    /// taking it over). Beyond `MAX_WATCHERS` open at once: [`Error::TooManyWatchers`], before
    /// any work (a subscription is taken over only once this watcher has its place).
    pub async fn watch(&self, command: WatchEvents) -> Result<mpsc::Receiver<Delivery>, Error> {
        let (sender, receiver) = mpsc::channel(WATCH_BUFFER);
        {
            let mut watchers = self.watchers.lock().expect("watchers lock");
            watchers.retain(|w| w.strong_count() > 0);
            if watchers.len() >= self.limits.max_watchers {
                return Err(Error::TooManyWatchers);
            }
            // Counted from now on; a refusal below drops `sender`, which frees the place.
            watchers.push(sender.downgrade());
        }
        let (command, reader) = match command.subscription {
            None => (command, None),
            Some(name) => {
                let taken = self.inventory.take_over_subscription(&name).await?;
                let command = WatchEvents {
                    after: taken.acked,
                    epoch: taken.acked_epoch,
                    filter: Some(taken.filter),
                    subscription: None,
                };
                (
                    command,
                    Some(Reader {
                        name,
                        generation: taken.reader,
                        created_at: taken.created_at,
                    }),
                )
            }
        };
        let bounds = self.inventory.stream_bounds().await?;
        let (after, epoch) = match command.after {
            // From the oldest kept: whatever epoch the consumer had, it starts afresh.
            0 if reader.is_none() => (bounds.pruned_through, None),
            after if after < bounds.pruned_through => {
                return Err(match reader {
                    // Pruned by a replica that did not hold events back for it.
                    Some(reader) => Error::SubscriptionLost {
                        name: reader.name,
                        acked: after,
                        reason: format!("events through {} were pruned", bounds.pruned_through),
                    },
                    None => Error::CursorPruned {
                        requested: after,
                        pruned_through: bounds.pruned_through,
                    },
                });
            }
            after => (after, command.epoch),
        };
        if !bounds.admits(epoch, after) {
            return Err(not_in_history(after, epoch, &bounds));
        }
        // Without the consumer's word, the epoch `after` falls in as this history has it.
        let epoch = epoch.or_else(|| bounds.epoch_at(after));
        let watcher = Watcher {
            cursor: Cursor { after, epoch },
            sent: after,
            filter: command.filter,
            reader,
            checked: tokio::time::Instant::now(),
            sender,
        };
        tokio::spawn(self.clone().follow(watcher));
        Ok(receiver)
    }

    /// The most events any open watcher has queued (never above [`WATCH_BUFFER`]).
    pub fn most_queued(&self) -> usize {
        let watchers = self.watchers.lock().expect("watchers lock");
        watchers
            .iter()
            .filter_map(mpsc::WeakSender::upgrade)
            .map(|sender| sender.max_capacity() - sender.capacity())
            .max()
            .unwrap_or(0)
    }

    /// Sends an event (if the watcher's filter passes it) after checking that it continues
    /// the history the watcher scanned so far; `false` once the watcher must end (the
    /// consumer is gone, or told the history was cut).
    async fn deliver(
        &self,
        watcher: &mut Watcher,
        event: Event,
        stopping: &mut watch::Receiver<bool>,
    ) -> bool {
        if !watcher.cursor.continues(&event) {
            // A new epoch began before positions this watcher already sent from the old one:
            // the history was cut behind the consumer (a restore, a failover that lost them).
            let error = match self.inventory.stream_bounds().await {
                Ok(bounds) => not_in_history(watcher.cursor.after, watcher.cursor.epoch, &bounds),
                Err(error) => error,
            };
            let _ = watcher.sender.send(Err(to_status(error))).await;
            return false;
        }
        watcher.cursor.after = event.position;
        watcher.cursor.epoch = Some(event.epoch.id);
        if watcher.filter.as_ref().is_some_and(|f| !f.matches(&event)) {
            return true;
        }
        watcher.sent = event.position;
        // A consumer that stopped reading must not keep this task (and its database reads)
        // alive past shutdown.
        tokio::select! {
            sent = watcher.sender.send(Ok(event.into_message())) => sent.is_ok(),
            _ = stopping.changed() => false,
        }
    }

    /// A filtered watcher that scanned past what it sent says where it is; `false` once the
    /// consumer is gone.
    async fn heartbeat(&self, watcher: &mut Watcher, stopping: &mut watch::Receiver<bool>) -> bool {
        if watcher.filter.is_none() || watcher.cursor.after <= watcher.sent {
            return true;
        }
        watcher.sent = watcher.cursor.after;
        let beat = crate::wire::heartbeat(watcher.cursor.after, watcher.cursor.epoch);
        tokio::select! {
            sent = watcher.sender.send(Ok(beat)) => sent.is_ok(),
            _ = stopping.changed() => false,
        }
    }

    /// A subscription's reader goes on while the subscription is still its own.
    async fn still_reader(&self, watcher: &mut Watcher) -> bool {
        watcher.checked = tokio::time::Instant::now();
        let Some(reader) = &watcher.reader else {
            return true;
        };
        let error = match self.inventory.subscription(&reader.name).await {
            Ok(found) if found.lost.is_some() => found.lost_error(),
            // The same subscription (not one deleted and made again under its name), and
            // this reader still its reader.
            Ok(found)
                if found.reader == reader.generation && found.created_at == reader.created_at =>
            {
                return true;
            }
            Ok(found) if found.created_at != reader.created_at => {
                Error::SubscriptionNotFound(reader.name.clone())
            }
            Ok(_) => Error::SubscriptionTakenOver(reader.name.clone()),
            Err(error @ Error::SubscriptionNotFound(_)) => error,
            // PostgreSQL is away: the next tick asks again.
            Err(_) => return true,
        };
        let _ = watcher.sender.send(Err(to_status(error))).await;
        false
    }

    async fn follow(self, mut watcher: Watcher) {
        let mut stopping = self.stopping.clone();
        let mut beats = (watcher.filter.is_some() || watcher.reader.is_some()).then(|| {
            let mut beats = tokio::time::interval(self.limits.heartbeat);
            beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            beats
        });
        // A filtered stream opens with a heartbeat at its starting cursor: the consumer learns
        // where it starts (a subscription's acknowledged position), and that this replica
        // knows filters. A replica of a release before them ignores the filter and the
        // subscription and streams everything from the oldest event kept, and never sends a
        // heartbeat; the client kit checks the first item and goes elsewhere.
        if watcher.filter.is_some() {
            watcher.sent = watcher.cursor.after - 1;
            if !self.heartbeat(&mut watcher, &mut stopping).await {
                return;
            }
        }
        'catch_up: loop {
            // Subscribe before reading, so nothing broadcast meanwhile is missed.
            let mut live = self.live.subscribe();
            loop {
                let page = match self
                    .inventory
                    .events_after(watcher.cursor.after, PAGE)
                    .await
                {
                    Ok(page) => page,
                    Err(error) => {
                        let _ = watcher.sender.send(Err(to_status(error))).await;
                        return;
                    }
                };
                if page.is_empty() {
                    break;
                }
                if page[0].position != watcher.cursor.after + 1 {
                    // Positions are dense: a jump means retention pruned events this watcher
                    // had not read yet. Say so rather than skip them.
                    let error = match self.inventory.stream_bounds().await {
                        Ok(bounds) => Error::CursorPruned {
                            requested: watcher.cursor.after,
                            pruned_through: bounds.pruned_through,
                        },
                        Err(error) => error,
                    };
                    let _ = watcher.sender.send(Err(to_status(error))).await;
                    return;
                }
                for event in page {
                    if !self.deliver(&mut watcher, event, &mut stopping).await {
                        return;
                    }
                }
                // A long catch-up still says where it is, and still ends when its
                // subscription is taken over.
                if beats.is_some()
                    && watcher.checked.elapsed() >= self.limits.heartbeat
                    && (!self.still_reader(&mut watcher).await
                        || !self.heartbeat(&mut watcher, &mut stopping).await)
                {
                    return;
                }
            }
            // Caught up: a filtered consumer learns how far the stream was scanned.
            if !self.heartbeat(&mut watcher, &mut stopping).await {
                return;
            }
            loop {
                let event = tokio::select! {
                    event = live.recv() => event,
                    () = tick(beats.as_mut()) => {
                        if !self.still_reader(&mut watcher).await
                            || !self.heartbeat(&mut watcher, &mut stopping).await
                        {
                            return;
                        }
                        continue;
                    }
                    _ = stopping.changed() => return,
                    () = watcher.sender.closed() => return,
                };
                match event {
                    Ok(event) if event.position <= watcher.cursor.after => {}
                    Ok(event) if event.position == watcher.cursor.after + 1 => {
                        let event = event.as_ref().clone();
                        if !self.deliver(&mut watcher, event, &mut stopping).await {
                            return;
                        }
                    }
                    // A gap (it subscribed after the event went by) or a lag (it was too slow
                    // for the ring): read the missing events from PostgreSQL.
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue 'catch_up,
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    }
}

/// The next tick of `beats`; never without one.
async fn tick(beats: Option<&mut tokio::time::Interval>) {
    match beats {
        Some(beats) => {
            beats.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// One `WatchEvents` call's state.
struct Watcher {
    /// How far it scanned.
    cursor: Cursor,
    /// The position of the last event or heartbeat it sent.
    sent: i64,
    /// `None`: every event, no heartbeats.
    filter: Option<EventFilter>,
    /// The subscription it reads, if any.
    reader: Option<Reader>,
    /// When it last checked that the subscription is still its own.
    checked: tokio::time::Instant,
    sender: mpsc::Sender<Delivery>,
}

/// The subscription a watcher reads, and the generation it took it over at.
struct Reader {
    name: SubscriptionName,
    generation: i64,
    /// Told apart from a subscription deleted and made again under the same name.
    created_at: std::time::SystemTime,
}

/// Where a watcher is: the position it scanned last, and the epoch of that position.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    after: i64,
    /// `None` until the first event when the consumer named none and `after` is in no epoch.
    epoch: Option<EpochId>,
}

impl Cursor {
    /// Whether `event`, the position after this cursor, continues the history delivered so
    /// far: in the same epoch, or in one that began at or after the cursor.
    fn continues(&self, event: &Event) -> bool {
        match self.epoch {
            Some(epoch) if epoch != event.epoch.id => event.epoch.starts_after >= self.after,
            _ => true,
        }
    }
}

/// The refusal of a cursor the stream's current history does not have.
fn not_in_history(after: i64, epoch: Option<EpochId>, bounds: &StreamBounds) -> Error {
    Error::CursorNotInHistory {
        after,
        requested: epoch.map_or_else(|| "unknown".to_owned(), |e| e.to_string()),
        current: bounds.current_epoch(),
        head: bounds.head,
    }
}

/// Positions committed events whenever this replica commits one, and on a slow tick.
pub async fn run_sequencer(inventory: Arc<Service>, mut stopping: watch::Receiver<bool>) {
    let mut ticks = tokio::time::interval(SEQUENCER_TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_run: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = inventory.written() => {}
            _ = ticks.tick() => {}
            _ = stopping.changed() => return,
        }
        if let Some(last) = last_run {
            // Commits that land meanwhile are positioned by this run.
            tokio::select! {
                () = tokio::time::sleep_until(last + SEQUENCER_MIN_GAP) => {}
                _ = stopping.changed() => return,
            }
        }
        last_run = Some(tokio::time::Instant::now());
        let mut busy_retries = 0;
        loop {
            match inventory.position_events(POSITION_BATCH).await {
                Ok(Positioned::Moved(moved)) if moved as usize == POSITION_BATCH => {}
                Ok(Positioned::Moved(_)) => break,
                // Another replica is positioning; it may have looked before our commit.
                Ok(Positioned::Busy) if busy_retries < 5 => {
                    busy_retries += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(Positioned::Busy) => break,
                Err(error) => {
                    tracing::warn!(%error, "positioning events failed; retrying");
                    break;
                }
            }
        }
    }
}

/// Reads each newly positioned event once and broadcasts it to this replica's watchers.
pub async fn run_tailer<F: HeadFeed>(hub: EventHub, feed: F, mut stopping: watch::Receiver<bool>) {
    let wake = Arc::new(Notify::new());
    let mut listener: Option<F::Subscription> = None;
    let mut head = None;
    let mut ticks = tokio::time::interval(TAILER_TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if !listener.as_ref().is_some_and(Subscription::is_alive) {
            match feed.subscribe(Arc::clone(&wake)).await {
                Ok(started) => listener = Some(started),
                Err(error) => tracing::warn!(%error, "cannot listen for events; polling instead"),
            }
        }
        let Some(mut position) = head else {
            match hub.inventory.stream_bounds().await {
                Ok(bounds) => head = Some(bounds.head),
                Err(error) => {
                    tracing::warn!(%error, "cannot read the event stream head");
                    tokio::select! {
                        _ = ticks.tick() => {}
                        _ = stopping.changed() => return,
                    }
                }
            }
            continue;
        };
        if hub.live.receiver_count() == 0 {
            // Nobody follows the live tail: skip to the head instead of reading every event
            // (and decoding its payload) for no one. A watcher that subscribes meanwhile
            // catches up from PostgreSQL and reads again across any gap it sees. The head is
            // read now, at every wake, not when a watcher appears: read then, it would already
            // include the event whose commit woke the tailer, which would never be broadcast
            // to a watcher that caught up just before it (and sees no gap to read across).
            match hub.inventory.stream_bounds().await {
                Ok(bounds) => position = bounds.head,
                Err(error) => tracing::warn!(%error, "cannot read the event stream head"),
            }
        }
        while hub.live.receiver_count() > 0 {
            match hub.inventory.events_after(position, PAGE).await {
                Ok(page) if page.is_empty() => break,
                Ok(page) => {
                    for event in page {
                        position = event.position;
                        // No receiver is fine: nobody is watching right now.
                        let _ = hub.live.send(Arc::new(event));
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot read new events");
                    break;
                }
            }
        }
        head = Some(position);
        tokio::select! {
            () = wake.notified() => {}
            _ = ticks.tick() => {}
            _ = stopping.changed() => return,
        }
    }
}
