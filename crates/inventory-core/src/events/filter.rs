//! Which events a consumer wants: by type, SKU (exact or prefix), order and location.
//!
//! Each dimension given is one condition (any of its values); an event passes when it meets
//! every condition given. An empty filter passes everything.

use super::{Change, Event, ReservationEvent};
use crate::domain::{LocationId, OrderId, Sku};

/// Most values in one filter, over every dimension: a filter is a consumer's interest, not a
/// list of a catalogue.
pub const MAX_FILTER_VALUES: usize = 256;

/// The type of an event, as the API names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    StockAdjusted,
    Reservation(ReservationEvent),
    ReservationExtended,
    OutOfStock,
    BackInStock,
    StockTransferred,
    StockStateChanged,
}

impl EventKind {
    pub const ALL: [EventKind; 14] = [
        Self::StockAdjusted,
        Self::Reservation(ReservationEvent::Held),
        Self::Reservation(ReservationEvent::Confirmed),
        Self::Reservation(ReservationEvent::Released),
        Self::Reservation(ReservationEvent::Expired),
        Self::ReservationExtended,
        Self::Reservation(ReservationEvent::PartiallyConfirmed),
        Self::Reservation(ReservationEvent::PartiallyReleased),
        Self::OutOfStock,
        Self::BackInStock,
        Self::StockTransferred,
        Self::StockStateChanged,
        Self::Reservation(ReservationEvent::Filled),
        Self::Reservation(ReservationEvent::PreorderAtRisk),
    ];

    /// The name after `EVENT_TYPE_` in the API (`RESERVATION_HELD`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StockAdjusted => "STOCK_ADJUSTED",
            Self::Reservation(what) => what.as_str(),
            Self::ReservationExtended => "RESERVATION_EXTENDED",
            Self::OutOfStock => "OUT_OF_STOCK",
            Self::BackInStock => "BACK_IN_STOCK",
            Self::StockTransferred => "STOCK_TRANSFERRED",
            Self::StockStateChanged => "STOCK_STATE_CHANGED",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == raw)
    }
}

impl Change {
    pub fn kind(&self) -> EventKind {
        match self {
            Self::StockAdjusted { .. } => EventKind::StockAdjusted,
            Self::StockTransferred { .. } => EventKind::StockTransferred,
            Self::StockStateChanged { .. } => EventKind::StockStateChanged,
            Self::Reservation { what, .. } => EventKind::Reservation(*what),
            Self::Availability {
                out_of_stock: true, ..
            } => EventKind::OutOfStock,
            Self::Availability { .. } => EventKind::BackInStock,
            Self::ReservationExtended { .. } => EventKind::ReservationExtended,
        }
    }

    /// Every SKU the change is about: the stock events' one, a reservation's lines'.
    pub fn skus(&self) -> impl Iterator<Item = &Sku> {
        let (one, lines) = match self {
            Self::StockAdjusted { sku, .. }
            | Self::StockTransferred { sku, .. }
            | Self::StockStateChanged { sku, .. }
            | Self::Availability { sku, .. } => (Some(sku), None),
            Self::Reservation { lines, .. } | Self::ReservationExtended { lines, .. } => {
                (None, Some(lines))
            }
        };
        one.into_iter()
            .chain(lines.into_iter().flatten().map(|line| &line.sku))
    }

    /// The order a reservation change belongs to; stock changes belong to none.
    pub fn order_id(&self) -> Option<&OrderId> {
        match self {
            Self::Reservation { order_id, .. } | Self::ReservationExtended { order_id, .. } => {
                Some(order_id)
            }
            _ => None,
        }
    }

    /// Whether the change touched `location`: a stock change there (one stored before
    /// locations existed was at the default location), a transfer from or to it, a
    /// reservation holding units there. An availability change is the SKU's total: at no one
    /// location.
    pub fn touches(&self, location: &LocationId) -> bool {
        match self {
            Self::StockAdjusted { location_level, .. } => match location_level {
                Some(level) => level.location.as_ref() == Some(location),
                None => location.as_str() == LocationId::DEFAULT,
            },
            Self::StockStateChanged { location_level, .. } => {
                location_level.location.as_ref() == Some(location)
            }
            Self::StockTransferred { from, to, .. } => {
                from.location.as_ref() == Some(location) || to.location.as_ref() == Some(location)
            }
            Self::Reservation { lines, .. } | Self::ReservationExtended { lines, .. } => lines
                .iter()
                .flat_map(|line| &line.allocations)
                .any(|allocation| &allocation.location == location),
            Self::Availability { .. } => false,
        }
    }
}

/// What a consumer wants of the stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventFilter {
    pub kinds: Vec<EventKind>,
    pub skus: Vec<Sku>,
    pub sku_prefixes: Vec<String>,
    pub order_ids: Vec<OrderId>,
    pub locations: Vec<LocationId>,
}

impl EventFilter {
    /// Lets every event through.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
            && self.skus.is_empty()
            && self.sku_prefixes.is_empty()
            && self.order_ids.is_empty()
            && self.locations.is_empty()
    }

    /// How many values it has, over every dimension.
    pub fn len(&self) -> usize {
        self.kinds.len()
            + self.skus.len()
            + self.sku_prefixes.len()
            + self.order_ids.len()
            + self.locations.len()
    }

    /// A SKU prefix: 1 to [`crate::domain::MAX_SKU_LEN`] characters a SKU may have.
    pub fn parse_sku_prefix(raw: &str) -> Result<String, String> {
        Sku::parse(raw).map(|sku| sku.as_str().to_owned())
    }

    pub fn matches(&self, event: &Event) -> bool {
        let change = &event.change;
        (self.kinds.is_empty() || self.kinds.contains(&change.kind()))
            && (self.skus.is_empty() && self.sku_prefixes.is_empty()
                || change.skus().any(|sku| {
                    self.skus.contains(sku)
                        || self
                            .sku_prefixes
                            .iter()
                            .any(|prefix| sku.as_str().starts_with(prefix.as_str()))
                }))
            && (self.order_ids.is_empty()
                || change
                    .order_id()
                    .is_some_and(|order| self.order_ids.contains(order)))
            && (self.locations.is_empty()
                || self
                    .locations
                    .iter()
                    .any(|location| change.touches(location)))
    }
}

#[cfg(test)]
mod tests;
