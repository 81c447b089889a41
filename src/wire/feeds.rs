//! The event feed's messages: `WatchEvents` requests with their filters, heartbeats, and
//! named subscriptions.

use inventory_core::{
    Error,
    command::WatchEvents,
    domain::{LocationId, OrderId, Sku},
    events::{
        AckEvents, CreateSubscription, EpochId, EventFilter, EventKind, MAX_FILTER_VALUES,
        ReservationEvent, Subscription, SubscriptionName,
    },
};

use super::{Decode, Encode, decode::Violations, encode::timestamp};
use crate::{auth::Principal, proto};

fn kind(event_type: proto::EventType) -> Option<EventKind> {
    use proto::EventType as T;
    Some(match event_type {
        T::StockAdjusted => EventKind::StockAdjusted,
        T::ReservationHeld => EventKind::Reservation(ReservationEvent::Held),
        T::ReservationConfirmed => EventKind::Reservation(ReservationEvent::Confirmed),
        T::ReservationReleased => EventKind::Reservation(ReservationEvent::Released),
        T::ReservationExpired => EventKind::Reservation(ReservationEvent::Expired),
        T::ReservationExtended => EventKind::ReservationExtended,
        T::ReservationPartiallyConfirmed => {
            EventKind::Reservation(ReservationEvent::PartiallyConfirmed)
        }
        T::ReservationPartiallyReleased => {
            EventKind::Reservation(ReservationEvent::PartiallyReleased)
        }
        T::OutOfStock => EventKind::OutOfStock,
        T::BackInStock => EventKind::BackInStock,
        T::StockTransferred => EventKind::StockTransferred,
        T::StockStateChanged => EventKind::StockStateChanged,
        T::ReservationFilled => EventKind::Reservation(ReservationEvent::Filled),
        T::ReservationPreorderAtRisk => EventKind::Reservation(ReservationEvent::PreorderAtRisk),
        T::Unspecified | T::Heartbeat => return None,
    })
}

fn event_type(kind: EventKind) -> proto::EventType {
    use proto::EventType as T;
    match kind {
        EventKind::StockAdjusted => T::StockAdjusted,
        EventKind::Reservation(ReservationEvent::Held) => T::ReservationHeld,
        EventKind::Reservation(ReservationEvent::Confirmed) => T::ReservationConfirmed,
        EventKind::Reservation(ReservationEvent::Released) => T::ReservationReleased,
        EventKind::Reservation(ReservationEvent::Expired) => T::ReservationExpired,
        EventKind::Reservation(ReservationEvent::PartiallyConfirmed) => {
            T::ReservationPartiallyConfirmed
        }
        EventKind::Reservation(ReservationEvent::PartiallyReleased) => {
            T::ReservationPartiallyReleased
        }
        EventKind::ReservationExtended => T::ReservationExtended,
        EventKind::OutOfStock => T::OutOfStock,
        EventKind::BackInStock => T::BackInStock,
        EventKind::StockTransferred => T::StockTransferred,
        EventKind::StockStateChanged => T::StockStateChanged,
        EventKind::Reservation(ReservationEvent::Filled) => T::ReservationFilled,
        EventKind::Reservation(ReservationEvent::PreorderAtRisk) => T::ReservationPreorderAtRisk,
    }
}

/// Every value of every list checked (each named by its path, `filter.skus[2]`); `None` if
/// any is wrong.
fn filter(
    violations: &mut Violations,
    field: &str,
    raw: proto::EventFilter,
) -> Option<EventFilter> {
    let total = raw.types.len()
        + raw.skus.len()
        + raw.sku_prefixes.len()
        + raw.order_ids.len()
        + raw.location_ids.len();
    let mut ok = total <= MAX_FILTER_VALUES;
    if !ok {
        violations.add(
            field,
            format!("has {total} values; at most {MAX_FILTER_VALUES}"),
        );
    }
    let skus = each(violations, &mut ok, field, "skus", &raw.skus, Sku::parse);
    let sku_prefixes = each(
        violations,
        &mut ok,
        field,
        "sku_prefixes",
        &raw.sku_prefixes,
        EventFilter::parse_sku_prefix,
    );
    let order_ids = each(
        violations,
        &mut ok,
        field,
        "order_ids",
        &raw.order_ids,
        OrderId::parse,
    );
    let locations = each(
        violations,
        &mut ok,
        field,
        "location_ids",
        &raw.location_ids,
        LocationId::parse,
    );
    let mut kinds = Vec::new();
    for (i, raw) in raw.types.iter().enumerate() {
        match proto::EventType::try_from(*raw).ok().and_then(kind) {
            Some(kind) => kinds.push(kind),
            None => {
                violations.add(
                    format!("{field}.types[{i}]"),
                    "must be an event type (not UNSPECIFIED or HEARTBEAT)",
                );
                ok = false;
            }
        }
    }
    ok.then_some(EventFilter {
        kinds,
        skus,
        sku_prefixes,
        order_ids,
        locations,
    })
}

/// One list of a filter, each value parsed once: the good ones kept, each bad one a
/// violation named by its path (`filter.skus[2]`), which clears `ok`.
fn each<T>(
    violations: &mut Violations,
    ok: &mut bool,
    field: &str,
    list: &str,
    values: &[String],
    parse: impl Fn(&str) -> Result<T, String>,
) -> Vec<T> {
    let mut parsed = Vec::with_capacity(values.len());
    for (i, value) in values.iter().enumerate() {
        match violations.check(format!("{field}.{list}[{i}]"), parse(value)) {
            Some(value) => parsed.push(value),
            None => *ok = false,
        }
    }
    parsed
}

fn epoch(violations: &mut Violations, raw: &str) -> Option<Option<EpochId>> {
    if raw.is_empty() {
        return Some(None);
    }
    violations.check("epoch", EpochId::parse(raw)).map(Some)
}

impl Decode for proto::WatchEventsRequest {
    type Command = WatchEvents;

    fn into_command(self, _: &Principal) -> Result<WatchEvents, Error> {
        let request = self;
        let mut violations = Violations::default();
        let command =
            violations.check("after_sequence", WatchEvents::parse(request.after_sequence));
        let epoch = epoch(&mut violations, &request.epoch);
        let filter = match request.filter {
            None => Some(None),
            Some(raw) => filter(&mut violations, "filter", raw).map(Some),
        };
        let subscription = if request.subscription.is_empty() {
            Some(None)
        } else {
            for (set, field) in [
                (request.after_sequence != 0, "after_sequence"),
                (!request.epoch.is_empty(), "epoch"),
                (filter.as_ref().is_some_and(Option::is_some), "filter"),
            ] {
                if set {
                    violations.add(
                        field,
                        "must be unset with a subscription: it has its own cursor and filter",
                    );
                }
            }
            violations
                .check(
                    "subscription",
                    SubscriptionName::parse(&request.subscription),
                )
                .map(Some)
        };
        violations.finish(|| {
            let mut command = command?;
            command.epoch = epoch?;
            command.filter = filter?;
            command.subscription = subscription?;
            Some(command)
        })
    }
}

impl Decode for proto::CreateSubscriptionRequest {
    type Command = CreateSubscription;

    fn into_command(self, _: &Principal) -> Result<CreateSubscription, Error> {
        let mut violations = Violations::default();
        let name = violations.check("name", SubscriptionName::parse(&self.name));
        let filter = filter(&mut violations, "filter", self.filter.unwrap_or_default());
        violations.finish(|| {
            Some(CreateSubscription {
                name: name?,
                filter: filter?,
                from_oldest: self.from_oldest,
            })
        })
    }
}

impl Decode for proto::AckEventsRequest {
    type Command = AckEvents;

    fn into_command(self, _: &Principal) -> Result<AckEvents, Error> {
        let mut violations = Violations::default();
        let name = violations.check("subscription", SubscriptionName::parse(&self.subscription));
        let position = violations.check(
            "sequence",
            if self.sequence < 0 {
                Err("must not be negative".to_owned())
            } else {
                Ok(self.sequence)
            },
        );
        let epoch = epoch(&mut violations, &self.epoch);
        violations.finish(|| {
            Some(AckEvents {
                name: name?,
                position: position?,
                epoch: epoch?,
            })
        })
    }
}

/// `DeleteSubscription`: the name, and whether a missing one counts as deleted.
impl Decode for proto::DeleteSubscriptionRequest {
    type Command = (SubscriptionName, bool);

    fn into_command(self, _: &Principal) -> Result<(SubscriptionName, bool), Error> {
        let mut violations = Violations::default();
        let name = violations.check("name", SubscriptionName::parse(&self.name));
        violations.finish(|| Some((name?, self.allow_missing)))
    }
}

impl Decode for proto::ListSubscriptionsRequest {
    type Command = ();

    fn into_command(self, _: &Principal) -> Result<(), Error> {
        Ok(())
    }
}

impl Encode for EventFilter {
    type Message = proto::EventFilter;

    fn into_message(self) -> proto::EventFilter {
        proto::EventFilter {
            types: self
                .kinds
                .into_iter()
                .map(|kind| event_type(kind).into())
                .collect(),
            skus: self.skus.iter().map(|s| s.as_str().to_owned()).collect(),
            sku_prefixes: self.sku_prefixes,
            order_ids: self
                .order_ids
                .iter()
                .map(|o| o.as_str().to_owned())
                .collect(),
            location_ids: self
                .locations
                .iter()
                .map(|l| l.as_str().to_owned())
                .collect(),
        }
    }
}

impl Encode for Subscription {
    type Message = proto::Subscription;

    fn into_message(self) -> proto::Subscription {
        proto::Subscription {
            name: self.name.as_str().to_owned(),
            filter: Some(self.filter.into_message()),
            acked_sequence: self.acked,
            acked_epoch: self.acked_epoch.map(|e| e.to_string()).unwrap_or_default(),
            created_at: Some(timestamp(self.created_at)),
            acked_at: Some(timestamp(self.acked_at)),
            lag: self.lag,
            lost: self.lost.is_some(),
            lost_reason: self.lost.unwrap_or_default(),
        }
    }
}

impl Encode for Vec<Subscription> {
    type Message = proto::ListSubscriptionsResponse;

    fn into_message(self) -> proto::ListSubscriptionsResponse {
        proto::ListSubscriptionsResponse {
            subscriptions: self.into_iter().map(Encode::into_message).collect(),
        }
    }
}

/// A filtered stream's word that it scanned through `position` (of `epoch`).
pub fn heartbeat(position: i64, epoch: Option<EpochId>) -> proto::Event {
    proto::Event {
        sequence: position,
        r#type: proto::EventType::Heartbeat.into(),
        occurred_at: Some(timestamp(std::time::SystemTime::now())),
        epoch: epoch.map(|e| e.to_string()).unwrap_or_default(),
        ..proto::Event::default()
    }
}

/// What `DeleteSubscription` answers.
#[derive(Debug)]
pub struct Deleted;

impl Encode for Deleted {
    type Message = proto::DeleteSubscriptionResponse;

    fn into_message(self) -> proto::DeleteSubscriptionResponse {
        proto::DeleteSubscriptionResponse {}
    }
}
