//! Repository instruments, from the global meter provider.

use std::sync::OnceLock;

use inventory_core::metrics::SECONDS_BUCKETS;

use opentelemetry::{
    KeyValue, global,
    metrics::{Counter, Gauge, Histogram},
};

pub(crate) struct StoreMetrics {
    /// Line updates refused because the stored fence was not below the holder's token.
    pub fence_rejected: Counter<u64>,
    /// Line updates that matched no row for lack of available stock.
    pub insufficient: Counter<u64>,
    pub replays: Counter<u64>,
    pub conflicts: Counter<u64>,
    /// Reservations entering a state (HELD, CONFIRMED, RELEASED, EXPIRED) or refused.
    pub reservations: Counter<u64>,
    pub swept: Counter<u64>,
    /// How long past its expiry each hold was when a sweep expired it (seconds).
    pub expiry_lateness: Histogram<f64>,
    /// Requests written by one coalesced `Reserve` transaction.
    pub batch_size: Histogram<u64>,
    /// How long a `Reserve` transaction took, from taking a connection to the end of its
    /// commit, and the commit alone (seconds), by path.
    pub batch_duration: Histogram<f64>,
    pub commit_duration: Histogram<f64>,
    /// Committed events still waiting for a stream position after a sequencer run.
    pub unpositioned: Gauge<u64>,
    /// Reservations in state HELD, and units reserved, as the sweeper last counted them.
    pub held_reservations: Gauge<u64>,
    /// Holds past their expiry that no sweep has returned yet: a stuck sweeper.
    pub overdue_reservations: Gauge<u64>,
    /// How long the oldest hold past its expiry has waited for a sweep (seconds; 0: none).
    pub oldest_overdue: Gauge<f64>,
    pub held_units: Gauge<u64>,
    /// Units free where holds wait for stock, as the last refill pass found them (it then
    /// fills them): above 0 pass after pass, fills keep failing.
    pub free_while_waiting: Gauge<u64>,
    /// Waiting units the refill pass filled (a fill an earlier write skipped).
    pub refilled: Counter<u64>,
    /// Open receipts past their expected date, as the sweeper last counted them.
    pub late_receipts: Gauge<u64>,
}

pub(crate) fn store() -> &'static StoreMetrics {
    static METRICS: OnceLock<StoreMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let meter = global::meter("inventory-postgres");
        StoreMetrics {
            fence_rejected: meter
                .u64_counter("inventory.fence.rejected")
                .with_description("Writes refused by PostgreSQL because their fencing token was stale")
                .build(),
            insufficient: meter
                .u64_counter("inventory.stock.insufficient")
                .with_description("Reservation lines refused for lack of available stock")
                .build(),
            replays: meter
                .u64_counter("inventory.idempotency.replays")
                .with_description("Requests answered from a stored outcome, by operation")
                .build(),
            conflicts: meter
                .u64_counter("inventory.idempotency.conflicts")
                .with_description("Idempotency keys reused for a different request, by operation")
                .build(),
            reservations: meter
                .u64_counter("inventory.reservations")
                .with_description("Reservation outcomes: states entered, or refused")
                .build(),
            swept: meter
                .u64_counter("inventory.sweeper.expired")
                .with_description("Expired holds whose stock the sweeper returned")
                .build(),
            expiry_lateness: meter
                .f64_histogram("inventory.sweeper.lateness")
                .with_unit("s")
                .with_description("How long past its expiry each hold was when a sweep returned its stock")
                .with_boundaries(vec![0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0])
                .build(),
            batch_size: meter
                .u64_histogram("inventory.reserve.batch_size")
                .with_description("Reserve requests written by one coalesced transaction")
                .with_boundaries(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0])
                .build(),
            batch_duration: meter
                .f64_histogram("inventory.reserve.transaction.duration")
                .with_unit("s")
                .with_description("Reserve transactions, from taking a connection to the end of the commit, by path (single, coalesced)")
                .with_boundaries(SECONDS_BUCKETS.to_vec())
                .build(),
            commit_duration: meter
                .f64_histogram("inventory.reserve.commit.duration")
                .with_unit("s")
                .with_description("The COMMIT of Reserve transactions, by path (single, coalesced)")
                .with_boundaries(SECONDS_BUCKETS.to_vec())
                .build(),
            unpositioned: meter
                .u64_gauge("inventory.outbox.unpositioned")
                .with_description("Committed events not yet in the stream after the last sequencer run (outbox lag)")
                .build(),
            held_reservations: meter
                .u64_gauge("inventory.reservations.held")
                .with_description("Reservations in state HELD, as the sweeper last counted them")
                .build(),
            overdue_reservations: meter
                .u64_gauge("inventory.reservations.overdue")
                .with_description("Holds more than a minute past their expiry not yet returned by a sweep, as the sweeper last counted them")
                .build(),
            oldest_overdue: meter
                .f64_gauge("inventory.reservations.oldest_overdue")
                .with_unit("s")
                .with_description("How long the oldest hold past its expiry has waited for a sweep, as the sweeper last looked (0: none)")
                .build(),
            held_units: meter
                .u64_gauge("inventory.stock.reserved.units")
                .with_description("Units reserved across every SKU, as the sweeper last counted them")
                .build(),
            free_while_waiting: meter
                .u64_gauge("inventory.stock.free_while_waiting.units")
                .with_description("Units free at a (SKU, location) where holds wait for stock, as the sweeper's last refill pass found them before filling them")
                .build(),
            refilled: meter
                .u64_counter("inventory.stock.refilled.units")
                .with_description("Waiting units the sweeper's refill pass filled, which the write that freed them had skipped")
                .build(),
            late_receipts: meter
                .u64_gauge("inventory.receipts.late")
                .with_description("Open receipts past their expected date, as the sweeper last counted them")
                .build(),
        }
    })
}

/// Creates the instruments and starts the counters without labels at 0, so `/metrics` lists
/// them (and `rate()` has a start) before their first event.
pub fn init() {
    let metrics = store();
    for counter in [
        &metrics.fence_rejected,
        &metrics.insufficient,
        &metrics.swept,
        &metrics.refilled,
    ] {
        counter.add(0, &[]);
    }
}

pub(crate) fn reservation(outcome: &'static str) {
    reservations(outcome, 1);
}

/// Counts `count` reservations that reached `outcome`.
pub(crate) fn reservations(outcome: &'static str, count: u64) {
    store()
        .reservations
        .add(count, &[KeyValue::new("outcome", outcome)]);
}

pub(crate) fn operation(name: &'static str) -> [KeyValue; 1] {
    [KeyValue::new("operation", name)]
}

/// Records a Reserve transaction that committed: from `started` (taking a connection) and
/// from `committing` (the COMMIT), by path (`coalesced` or `single`).
pub(crate) fn reserve_committed(
    coalesced: bool,
    started: std::time::Instant,
    committing: std::time::Instant,
) {
    let metrics = store();
    let path = [KeyValue::new(
        "path",
        if coalesced { "coalesced" } else { "single" },
    )];
    metrics
        .commit_duration
        .record(committing.elapsed().as_secs_f64(), &path);
    metrics
        .batch_duration
        .record(started.elapsed().as_secs_f64(), &path);
}

/// How many subscriptions each tenant had as its sweeper last read them.
static SUBSCRIPTION_COUNTS: std::sync::Mutex<std::collections::BTreeMap<String, u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// `inventory_subscriptions` of `tenant` from now on.
pub(crate) fn subscriptions_counted(tenant: &str, count: u64) {
    static GAUGE: OnceLock<()> = OnceLock::new();
    GAUGE.get_or_init(|| {
        global::meter("inventory-postgres")
            .u64_observable_gauge("inventory.subscriptions")
            .with_description("Event subscriptions of the tenant, as the sweeper last read them")
            .with_callback(|observer| {
                let counts = SUBSCRIPTION_COUNTS.lock().expect("subscription counts");
                for (tenant, count) in counts.iter() {
                    observer.observe(
                        *count,
                        &[opentelemetry::KeyValue::new("tenant", tenant.clone())],
                    );
                }
            })
            .build();
    });
    SUBSCRIPTION_COUNTS
        .lock()
        .expect("subscription counts")
        .insert(tenant.to_owned(), count);
}

/// One subscription as the sweeper last read it: name, lag, lost.
pub(crate) type SubscriptionReading = (String, u64, bool);

/// The subscriptions of each tenant as its sweeper last read them. The gauges report this
/// snapshot, so a deleted subscription's series goes with it.
static SUBSCRIPTIONS: std::sync::Mutex<
    std::collections::BTreeMap<String, Vec<SubscriptionReading>>,
> = std::sync::Mutex::new(std::collections::BTreeMap::new());

/// `inventory_subscription_lag` and `_lost` of `tenant` from now on.
pub(crate) fn subscriptions_read(tenant: &str, readings: Vec<SubscriptionReading>) {
    static GAUGES: OnceLock<()> = OnceLock::new();
    GAUGES.get_or_init(|| {
        let meter = global::meter("inventory-postgres");
        type Pick = fn(&SubscriptionReading) -> u64;
        let gauges: [(&'static str, &'static str, Pick); 2] = [
            (
                "inventory.subscription.lag",
                "Events of the stream after the subscription's last acknowledgement (the relay's too), as the sweeper last read them",
                |r| r.1,
            ),
            (
                "inventory.subscription.lost",
                "1 when retention removed events the subscription had not acknowledged, as the sweeper last read them",
                |r| u64::from(r.2),
            ),
        ];
        for (name, description, pick) in gauges {
            meter
                .u64_observable_gauge(name)
                .with_description(description)
                .with_callback(move |observer| {
                    let readings = SUBSCRIPTIONS.lock().expect("subscription readings");
                    for (tenant, subscriptions) in readings.iter() {
                        for reading in subscriptions {
                            observer.observe(
                                pick(reading),
                                &[
                                    opentelemetry::KeyValue::new("tenant", tenant.clone()),
                                    opentelemetry::KeyValue::new(
                                        "subscription",
                                        reading.0.clone(),
                                    ),
                                ],
                            );
                        }
                    }
                })
                .build();
        }
    });
    SUBSCRIPTIONS
        .lock()
        .expect("subscription readings")
        .insert(tenant.to_owned(), readings);
}
