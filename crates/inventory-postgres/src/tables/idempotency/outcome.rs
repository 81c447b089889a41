//! The stored outcomes of requests: what a retry with the same idempotency key gets back,
//! as the JSON kept in `idempotency_keys.outcome`. Only final outcomes are stored (a result,
//! or a refusal the caller must act on); failures to carry a request out never are.
//!
//! The encoding is read back by every later version of the service: fields are only ever
//! added, with defaults.

use inventory_core::{
    Error,
    command::{AdjustStock, BatchSetStock, ReceiptChanged, SetStock, Transferred},
    domain::{
        Allocation, Line, LocationId, MAX_ON_HAND, OrderId, Peg, Quantity, Receipt, ReceiptId,
        ReceiptState, Reservation, ReservationId, ReservationLine, ReservationState, Sku, States,
        StockLevel, from_micros, micros,
    },
    error::Shortfall,
};
use serde::{Deserialize, Serialize};

/// A stored outcome this release cannot read: written by a newer release (a variant or field
/// added since), met by this one during a rollout or a rollback. Only the call that replays
/// it is refused, with `UNAVAILABLE`: its retry may reach a replica that reads it.
pub(crate) fn unreadable(error: serde_json::Error) -> Error {
    tracing::error!(%error, "a stored outcome this release cannot read (written by a newer one?)");
    Error::unavailable(
        inventory_core::Dependency::Postgres,
        format!("a stored outcome this release cannot read: {error}"),
    )
}

/// The operation names idempotency records carry.
pub(crate) const RESERVE: &str = "Reserve";
pub(crate) const ADJUST_STOCK: &str = "AdjustStock";
pub(crate) const CANCEL_ORDER: &str = "CancelOrder";
pub(crate) const SET_STOCK: &str = "SetStock";
pub(crate) const BATCH_SET_STOCK: &str = "BatchSetStock";
pub(crate) const TRANSFER_STOCK: &str = "TransferStock";
pub(crate) const SET_STOCK_POLICY: &str = "SetStockPolicy";
pub(crate) const MOVE_STOCK_STATE: &str = "MoveStockState";
pub(crate) const EXPECT_STOCK: &str = "ExpectStock";
pub(crate) const RECEIVE_STOCK: &str = "ReceiveStock";
pub(crate) const CANCEL_RECEIPT: &str = "CancelReceipt";

/// The stored outcome of a `Reserve`: what a retry with the same key gets back.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(crate) enum ReserveOutcome {
    Held { reservation: StoredReservation },
    UnknownSkus { skus: Vec<String> },
    InsufficientStock { shortfalls: Vec<StoredShortfall> },
    OrderCancelled { order_id: String },
    UnknownLocation { location_id: String },
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoredReservation {
    reservation_id: uuid::Uuid,
    order_id: String,
    lines: Vec<(String, i64)>,
    /// Per line, `(location, units)`; absent before locations existed: all at `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    allocations: Option<Vec<Vec<(String, i64)>>>,
    /// Per line and allocation, the units left waiting; absent when none wait (and before
    /// stock states existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    waiting: Option<Vec<Vec<StoredWait>>>,
    created_at_micros: i64,
    expires_at_micros: i64,
}

/// Waiting units of an allocation: backordered, or pre-ordered against a receipt due then.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct StoredWait {
    #[serde(default)]
    backordered: i64,
    #[serde(default)]
    preordered: i64,
    #[serde(default)]
    receipt_id: Option<String>,
    #[serde(default)]
    expected_at_micros: i64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoredShortfall {
    sku: String,
    requested: i64,
    available: i64,
}

impl StoredShortfall {
    fn of(shortfall: &Shortfall) -> Self {
        Self {
            sku: shortfall.sku.as_str().to_owned(),
            requested: shortfall.requested,
            available: shortfall.available,
        }
    }

    fn shortfall(self) -> Result<Shortfall, Error> {
        Ok(Shortfall {
            sku: Sku::parse(&self.sku).map_err(Error::internal)?,
            requested: self.requested,
            available: self.available,
        })
    }
}

impl ReserveOutcome {
    pub(crate) fn of(result: &Result<Reservation, Error>) -> Self {
        match result {
            Ok(reservation) => Self::held(reservation),
            Err(Error::UnknownSkus(skus)) => Self::UnknownSkus {
                skus: skus.iter().map(|s| s.as_str().to_owned()).collect(),
            },
            Err(Error::InsufficientStock(shortfalls)) => Self::InsufficientStock {
                shortfalls: shortfalls.iter().map(StoredShortfall::of).collect(),
            },
            Err(Error::OrderCancelled { order_id }) => Self::OrderCancelled {
                order_id: order_id.as_str().to_owned(),
            },
            Err(Error::UnknownLocation(location)) => Self::UnknownLocation {
                location_id: location.as_str().to_owned(),
            },
            Err(other) => unreachable!("only final outcomes are stored, not {other:?}"),
        }
    }

    /// The outcome stored for a hold: what a retry with its key gets back.
    pub(crate) fn held(reservation: &Reservation) -> Self {
        Self::Held {
            reservation: StoredReservation {
                reservation_id: reservation.id.as_uuid(),
                order_id: reservation.order_id.as_str().to_owned(),
                lines: reservation
                    .lines
                    .iter()
                    .map(|l| (l.sku.as_str().to_owned(), l.quantity.get()))
                    .collect(),
                allocations: Some(
                    reservation
                        .lines
                        .iter()
                        .map(|l| {
                            l.allocations
                                .iter()
                                .map(|a| (a.location.as_str().to_owned(), a.quantity))
                                .collect()
                        })
                        .collect(),
                ),
                waiting: reservation.lines.iter().any(|l| l.waiting() > 0).then(|| {
                    reservation
                        .lines
                        .iter()
                        .map(|l| {
                            l.allocations
                                .iter()
                                .map(|a| StoredWait {
                                    backordered: a.backordered,
                                    preordered: a.preordered,
                                    receipt_id: a
                                        .receipt
                                        .as_ref()
                                        .map(|p| p.receipt.as_str().to_owned()),
                                    expected_at_micros: a
                                        .receipt
                                        .as_ref()
                                        .map_or(0, |p| micros(p.expected_at)),
                                })
                                .collect()
                        })
                        .collect()
                }),
                created_at_micros: micros(reservation.created_at),
                expires_at_micros: micros(reservation.expires_at),
            },
        }
    }

    pub(crate) fn into_result(self) -> Result<Result<Reservation, Error>, Error> {
        let sku = |raw: String| Sku::parse(&raw).map_err(Error::internal);
        Ok(match self {
            Self::Held { reservation } => Ok(Reservation {
                id: ReservationId::from_uuid(reservation.reservation_id),
                order_id: OrderId::parse(&reservation.order_id).map_err(Error::internal)?,
                // The outcome as it was: the reservation was held when it was made.
                state: ReservationState::Held,
                lines: {
                    let mut allocations = reservation.allocations.unwrap_or_default().into_iter();
                    let mut waits = reservation.waiting.unwrap_or_default().into_iter();
                    reservation
                        .lines
                        .into_iter()
                        .map(|(raw, quantity)| {
                            let line = Line::new(
                                sku(raw)?,
                                Quantity::parse(quantity).map_err(Error::internal)?,
                            );
                            let mut line_waits = waits.next().unwrap_or_default().into_iter();
                            let placed = match allocations.next() {
                                Some(placed) => placed
                                    .into_iter()
                                    .map(|(location, units)| {
                                        let location = LocationId::parse(&location)
                                            .map_err(Error::internal)?;
                                        let wait = line_waits.next().unwrap_or_default();
                                        let receipt = wait
                                            .receipt_id
                                            .map(|id| {
                                                Ok::<_, Error>(Peg {
                                                    receipt: ReceiptId::parse(&id)
                                                        .map_err(Error::internal)?,
                                                    expected_at: from_micros(
                                                        wait.expected_at_micros,
                                                    ),
                                                })
                                            })
                                            .transpose()?;
                                        let waiting = wait.backordered + wait.preordered;
                                        Ok(Allocation::new_waiting(
                                            location,
                                            units - waiting,
                                            waiting,
                                            receipt,
                                        ))
                                    })
                                    .collect::<Result<_, Error>>()?,
                                None => vec![Allocation::new_hold(
                                    LocationId::default_location(),
                                    quantity,
                                )],
                            };
                            Ok(ReservationLine::new_hold(&line, placed))
                        })
                        .collect::<Result<_, Error>>()?
                },
                created_at: from_micros(reservation.created_at_micros),
                expires_at: from_micros(reservation.expires_at_micros),
            }),
            Self::UnknownSkus { skus } => Err(Error::UnknownSkus(
                skus.into_iter().map(sku).collect::<Result<_, _>>()?,
            )),
            Self::OrderCancelled { order_id } => Err(Error::OrderCancelled {
                order_id: OrderId::parse(&order_id).map_err(Error::internal)?,
            }),
            Self::UnknownLocation { location_id } => Err(Error::UnknownLocation(
                LocationId::parse(&location_id).map_err(Error::internal)?,
            )),
            Self::InsufficientStock { shortfalls } => Err(Error::InsufficientStock(
                shortfalls
                    .into_iter()
                    .map(StoredShortfall::shortfall)
                    .collect::<Result<_, Error>>()?,
            )),
        })
    }
}

/// The stored outcome of a `TransferStock`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(crate) enum TransferOutcome {
    Transferred {
        total: Box<StoredLevel>,
        from: Box<StoredLevel>,
        to: Box<StoredLevel>,
    },
    UnknownSku {
        sku: String,
    },
    InsufficientStock {
        shortfall: StoredShortfall,
    },
    StockLimit {
        sku: String,
        requested: i64,
    },
}

/// A level's states as stored in an outcome ([`States::to_array`]); absent while all are 0,
/// and in outcomes stored before states existed.
pub(crate) type StoredStates = Option<Vec<i64>>;

pub(crate) fn stored_states(states: &States) -> StoredStates {
    (!states.is_zero()).then(|| states.to_array().to_vec())
}

/// Counts a later release added past the seven known ones are not this release's to read.
pub(crate) fn states_of(stored: StoredStates) -> States {
    let mut counts = [0; 7];
    for (count, stored) in counts.iter_mut().zip(stored.unwrap_or_default()) {
        *count = stored;
    }
    States::from_array(counts)
}

/// A total's `apart` as stored in an outcome: absent while 0 (one active location, or its
/// safety stock met), and in outcomes stored before it was worked out.
pub(crate) fn no_apart(apart: &i64) -> bool {
    *apart == 0
}

/// A level as stored in an outcome.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoredLevel {
    sku: String,
    #[serde(default)]
    location_id: Option<String>,
    on_hand: i64,
    reserved: i64,
    version: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    states: StoredStates,
    #[serde(default, skip_serializing_if = "no_apart")]
    apart: i64,
}

impl StoredLevel {
    pub(crate) fn of(level: &StockLevel) -> Self {
        Self {
            sku: level.sku.as_str().to_owned(),
            location_id: level.location.as_ref().map(|l| l.as_str().to_owned()),
            on_hand: level.on_hand,
            reserved: level.reserved,
            version: level.version,
            states: stored_states(&level.states),
            apart: level.apart,
        }
    }

    pub(crate) fn level(self) -> Result<StockLevel, Error> {
        Ok(StockLevel {
            sku: Sku::parse(&self.sku).map_err(Error::internal)?,
            on_hand: self.on_hand,
            reserved: self.reserved,
            version: self.version,
            location: self
                .location_id
                .as_deref()
                .map(LocationId::parse)
                .transpose()
                .map_err(Error::internal)?,
            states: states_of(self.states),
            apart: self.apart,
        })
    }
}

impl TransferOutcome {
    pub(crate) fn of(result: &Result<Transferred, Error>) -> Self {
        match result {
            Ok(t) => Self::Transferred {
                total: Box::new(StoredLevel::of(&t.total)),
                from: Box::new(StoredLevel::of(&t.from)),
                to: Box::new(StoredLevel::of(&t.to)),
            },
            Err(Error::UnknownSkus(skus)) => Self::UnknownSku {
                sku: skus[0].as_str().to_owned(),
            },
            Err(Error::InsufficientStock(shortfalls)) => Self::InsufficientStock {
                shortfall: StoredShortfall::of(&shortfalls[0]),
            },
            Err(Error::StockLimit { sku, requested, .. }) => Self::StockLimit {
                sku: sku.as_str().to_owned(),
                requested: *requested,
            },
            Err(other) => unreachable!("only final outcomes are stored, not {other:?}"),
        }
    }

    pub(crate) fn into_result(self) -> Result<Transferred, Error> {
        let sku = |raw: &str| Sku::parse(raw).map_err(Error::internal);
        match self {
            Self::Transferred { total, from, to } => Ok(Transferred {
                total: total.level()?,
                from: from.level()?,
                to: to.level()?,
            }),
            Self::UnknownSku { sku: raw } => Err(Error::UnknownSkus(vec![sku(&raw)?])),
            Self::InsufficientStock { shortfall } => {
                Err(Error::InsufficientStock(vec![shortfall.shortfall()?]))
            }
            Self::StockLimit {
                sku: raw,
                requested,
            } => Err(Error::StockLimit {
                sku: sku(&raw)?,
                requested,
                limit: MAX_ON_HAND,
            }),
        }
    }
}

/// The stored outcome of an `AdjustStock`. The SKU and delta are not stored: a replay has the
/// same fingerprint, hence the same SKU and delta.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(crate) enum AdjustOutcome {
    Adjusted {
        on_hand: i64,
        reserved: i64,
        /// Absent in outcomes stored before stock versions existed: 0, "unknown".
        #[serde(default)]
        version: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        states: StoredStates,
        #[serde(default, skip_serializing_if = "no_apart")]
        apart: i64,
    },
    UnknownSku,
    /// Fewer units in the state removed than the delta (absent before states existed).
    InsufficientStock {
        available: i64,
    },
    BelowReserved {
        on_hand: i64,
        reserved: i64,
    },
    StockLimit,
    /// Absent from outcomes stored before compare-and-set existed.
    VersionMismatch {
        expected: i64,
        current: i64,
    },
}

impl AdjustOutcome {
    pub(crate) fn from_result(result: &Result<StockLevel, Error>) -> Option<Self> {
        Some(match result {
            Ok(level) => Self::Adjusted {
                on_hand: level.on_hand,
                reserved: level.reserved,
                version: level.version,
                states: stored_states(&level.states),
                apart: level.apart,
            },
            Err(Error::UnknownSkus(_)) => Self::UnknownSku,
            Err(Error::InsufficientStock(shortfalls)) => Self::InsufficientStock {
                available: shortfalls.first().map_or(0, |s| s.available),
            },
            Err(Error::BelowReserved {
                on_hand, reserved, ..
            }) => Self::BelowReserved {
                on_hand: *on_hand,
                reserved: *reserved,
            },
            Err(Error::StockLimit { .. }) => Self::StockLimit,
            Err(Error::VersionMismatch {
                expected, current, ..
            }) => Self::VersionMismatch {
                expected: *expected,
                current: *current,
            },
            // Anything else is not an outcome of the request but a failure to carry it out.
            Err(_) => return None,
        })
    }

    pub(crate) fn into_result(self, command: &AdjustStock) -> Result<StockLevel, Error> {
        let sku = command.sku.clone();
        let requested = command.delta.get().abs();
        match self {
            Self::Adjusted {
                on_hand,
                reserved,
                version,
                states,
                apart,
            } => Ok(StockLevel {
                states: states_of(states),
                apart,
                ..StockLevel::total(sku, on_hand, reserved, version)
            }),
            Self::UnknownSku => Err(Error::UnknownSkus(vec![sku])),
            Self::InsufficientStock { available } => {
                Err(Error::InsufficientStock(vec![Shortfall {
                    sku,
                    requested,
                    available,
                }]))
            }
            Self::BelowReserved { on_hand, reserved } => Err(Error::BelowReserved {
                sku,
                requested,
                on_hand,
                reserved,
            }),
            Self::StockLimit => Err(Error::StockLimit {
                sku,
                requested,
                limit: MAX_ON_HAND,
            }),
            Self::VersionMismatch { expected, current } => Err(Error::VersionMismatch {
                sku,
                expected,
                current,
            }),
        }
    }
}

/// The stored outcome of a `BatchSetStock`: every level, or the refused entry's outcome.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(crate) enum BatchSetOutcome {
    Set {
        levels: Vec<(i64, i64, i64)>,
        /// Each level's states, in the same order; absent while all are 0.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        states: Option<Vec<StoredStates>>,
        /// Each level's `apart`, in the same order; absent while all are 0.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        apart: Option<Vec<i64>>,
    },
    Refused {
        index: usize,
        refusal: SetOutcome,
    },
}

impl BatchSetOutcome {
    /// `result`'s refusal comes with the index of the count refused.
    pub(crate) fn from_result(result: &Result<Vec<StockLevel>, (usize, Error)>) -> Option<Self> {
        Some(match result {
            Ok(levels) => Self::Set {
                levels: levels
                    .iter()
                    .map(|l| (l.on_hand, l.reserved, l.version))
                    .collect(),
                states: levels
                    .iter()
                    .any(|l| !l.states.is_zero())
                    .then(|| levels.iter().map(|l| stored_states(&l.states)).collect()),
                apart: levels
                    .iter()
                    .any(|l| l.apart != 0)
                    .then(|| levels.iter().map(|l| l.apart).collect()),
            },
            Err((index, error)) => Self::Refused {
                index: *index,
                refusal: SetOutcome::from_result(&Err(error.clone()))?,
            },
        })
    }

    pub(crate) fn into_result(self, command: &BatchSetStock) -> Result<Vec<StockLevel>, Error> {
        match self {
            Self::Set {
                levels,
                states,
                apart,
            } => {
                let mut states = states.unwrap_or_default().into_iter();
                let mut apart = apart.unwrap_or_default().into_iter();
                Ok(command
                    .counts
                    .iter()
                    .zip(levels)
                    .map(|(count, (on_hand, reserved, version))| StockLevel {
                        states: states_of(states.next().flatten()),
                        apart: apart.next().unwrap_or_default(),
                        ..StockLevel::total(count.sku.clone(), on_hand, reserved, version)
                    })
                    .collect())
            }
            Self::Refused { index, refusal } => {
                let count = command
                    .counts
                    .get(index)
                    .ok_or_else(|| Error::internal("a stored refusal names no entry"))?;
                refusal
                    .into_result(count)
                    .and_then(|_| Err(Error::internal("a stored refusal holds a level")))
            }
        }
    }
}

/// The stored outcome of a `SetStock`; the SKU and count come from the request, whose
/// fingerprint a replay shares.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(crate) enum SetOutcome {
    Set {
        on_hand: i64,
        reserved: i64,
        version: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        states: StoredStates,
        #[serde(default, skip_serializing_if = "no_apart")]
        apart: i64,
    },
    BelowReserved {
        reserved: i64,
    },
    VersionMismatch {
        expected: i64,
        current: i64,
    },
    /// The count would take the SKU's total (over its locations) past the limit. Absent
    /// before counts were per location.
    StockLimit {
        requested: i64,
    },
}

impl SetOutcome {
    pub(crate) fn from_result(result: &Result<StockLevel, Error>) -> Option<Self> {
        Some(match result {
            Ok(level) => Self::Set {
                on_hand: level.on_hand,
                reserved: level.reserved,
                version: level.version,
                states: stored_states(&level.states),
                apart: level.apart,
            },
            Err(Error::CountBelowReserved { reserved, .. }) => Self::BelowReserved {
                reserved: *reserved,
            },
            Err(Error::VersionMismatch {
                expected, current, ..
            }) => Self::VersionMismatch {
                expected: *expected,
                current: *current,
            },
            Err(Error::StockLimit { requested, .. }) => Self::StockLimit {
                requested: *requested,
            },
            Err(_) => return None,
        })
    }

    pub(crate) fn into_result(self, command: &SetStock) -> Result<StockLevel, Error> {
        let sku = command.sku.clone();
        match self {
            Self::Set {
                on_hand,
                reserved,
                version,
                states,
                apart,
            } => Ok(StockLevel {
                states: states_of(states),
                apart,
                ..StockLevel::total(sku, on_hand, reserved, version)
            }),
            Self::BelowReserved { reserved } => Err(Error::CountBelowReserved {
                sku,
                requested: command.on_hand,
                reserved,
            }),
            Self::VersionMismatch { expected, current } => Err(Error::VersionMismatch {
                sku,
                expected,
                current,
            }),
            Self::StockLimit { requested } => Err(Error::StockLimit {
                sku,
                requested,
                limit: MAX_ON_HAND,
            }),
        }
    }
}

/// An outcome stored with a key: built from a final result (`None` for anything else), and
/// read back as the result a retry gets.
pub(crate) trait Stored<T>: Serialize + serde::de::DeserializeOwned + Sized {
    fn of(result: &Result<T, Error>) -> Option<Self>;
    fn into_result(self) -> Result<T, Error>;
}

impl Stored<StockLevel> for StatesOutcome {
    fn of(result: &Result<StockLevel, Error>) -> Option<Self> {
        StatesOutcome::of(result)
    }

    fn into_result(self) -> Result<StockLevel, Error> {
        StatesOutcome::into_result(self)
    }
}

impl Stored<ReceiptChanged> for ReceiptOutcome {
    fn of(result: &Result<ReceiptChanged, Error>) -> Option<Self> {
        ReceiptOutcome::of(result)
    }

    fn into_result(self) -> Result<ReceiptChanged, Error> {
        ReceiptOutcome::into_result(self)
    }
}

/// The stored outcome of a change of a (SKU, location)'s states (`SetStockPolicy`,
/// `MoveStockState`): the SKU's total after it, or the refusal.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(crate) enum StatesOutcome {
    Changed { level: Box<StoredLevel> },
    UnknownSku { sku: String },
    InsufficientStock { shortfall: StoredShortfall },
}

impl StatesOutcome {
    /// `None` for anything but a final outcome.
    pub(crate) fn of(result: &Result<StockLevel, Error>) -> Option<Self> {
        Some(match result {
            Ok(level) => Self::Changed {
                level: Box::new(StoredLevel::of(level)),
            },
            Err(Error::UnknownSkus(skus)) => Self::UnknownSku {
                sku: skus.first()?.as_str().to_owned(),
            },
            Err(Error::InsufficientStock(shortfalls)) => Self::InsufficientStock {
                shortfall: StoredShortfall::of(shortfalls.first()?),
            },
            Err(_) => return None,
        })
    }

    pub(crate) fn into_result(self) -> Result<StockLevel, Error> {
        let sku = |raw: &str| Sku::parse(raw).map_err(Error::internal);
        match self {
            Self::Changed { level } => level.level(),
            Self::UnknownSku { sku: raw } => Err(Error::UnknownSkus(vec![sku(&raw)?])),
            Self::InsufficientStock { shortfall } => {
                Err(Error::InsufficientStock(vec![shortfall.shortfall()?]))
            }
        }
    }
}

/// A receipt as stored in an outcome.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoredReceipt {
    receipt_id: String,
    sku: String,
    location_id: String,
    quantity: i64,
    received: i64,
    preordered: i64,
    expected_at_micros: i64,
    state: String,
    created_at_micros: i64,
}

impl StoredReceipt {
    fn of(receipt: &Receipt) -> Self {
        Self {
            receipt_id: receipt.id.as_str().to_owned(),
            sku: receipt.sku.as_str().to_owned(),
            location_id: receipt.location.as_str().to_owned(),
            quantity: receipt.quantity,
            received: receipt.received,
            preordered: receipt.preordered,
            expected_at_micros: micros(receipt.expected_at),
            state: receipt.state.as_str().to_owned(),
            created_at_micros: micros(receipt.created_at),
        }
    }

    fn receipt(self) -> Result<Receipt, Error> {
        Ok(Receipt {
            id: ReceiptId::parse(&self.receipt_id).map_err(Error::internal)?,
            sku: Sku::parse(&self.sku).map_err(Error::internal)?,
            location: LocationId::parse(&self.location_id).map_err(Error::internal)?,
            quantity: self.quantity,
            received: self.received,
            preordered: self.preordered,
            expected_at: from_micros(self.expected_at_micros),
            state: ReceiptState::parse(&self.state)
                .ok_or_else(|| Error::internal("a stored receipt state this release lacks"))?,
            created_at: from_micros(self.created_at_micros),
        })
    }
}

/// The stored outcome of `ExpectStock`, `ReceiveStock` and `CancelReceipt`: the receipt
/// and the SKU's total after the change, or the refusal.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(crate) enum ReceiptOutcome {
    Changed {
        receipt: Box<StoredReceipt>,
        level: Box<StoredLevel>,
    },
    UnknownSku {
        sku: String,
    },
    UnknownReceipt {
        receipt_id: String,
    },
    ReceiptExists {
        receipt_id: String,
    },
    ReceiptClosed {
        receipt_id: String,
        state: String,
    },
    StockLimit {
        sku: String,
        requested: i64,
    },
}

impl ReceiptOutcome {
    /// `None` for anything but a final outcome.
    pub(crate) fn of(result: &Result<ReceiptChanged, Error>) -> Option<Self> {
        Some(match result {
            Ok(changed) => Self::Changed {
                receipt: Box::new(StoredReceipt::of(&changed.receipt)),
                level: Box::new(StoredLevel::of(&changed.level)),
            },
            Err(Error::UnknownSkus(skus)) => Self::UnknownSku {
                sku: skus.first()?.as_str().to_owned(),
            },
            Err(Error::UnknownReceipt(id)) => Self::UnknownReceipt {
                receipt_id: id.as_str().to_owned(),
            },
            Err(Error::ReceiptExists(id)) => Self::ReceiptExists {
                receipt_id: id.as_str().to_owned(),
            },
            Err(Error::ReceiptClosed { id, state }) => Self::ReceiptClosed {
                receipt_id: id.as_str().to_owned(),
                state: state.as_str().to_owned(),
            },
            Err(Error::StockLimit { sku, requested, .. }) => Self::StockLimit {
                sku: sku.as_str().to_owned(),
                requested: *requested,
            },
            Err(_) => return None,
        })
    }

    pub(crate) fn into_result(self) -> Result<ReceiptChanged, Error> {
        let receipt_id = |raw: &str| ReceiptId::parse(raw).map_err(Error::internal);
        let sku = |raw: &str| Sku::parse(raw).map_err(Error::internal);
        match self {
            Self::Changed { receipt, level } => Ok(ReceiptChanged {
                receipt: receipt.receipt()?,
                level: level.level()?,
            }),
            Self::UnknownSku { sku: raw } => Err(Error::UnknownSkus(vec![sku(&raw)?])),
            Self::UnknownReceipt { receipt_id: raw } => {
                Err(Error::UnknownReceipt(receipt_id(&raw)?))
            }
            Self::ReceiptExists { receipt_id: raw } => Err(Error::ReceiptExists(receipt_id(&raw)?)),
            Self::ReceiptClosed {
                receipt_id: raw,
                state,
            } => Err(Error::ReceiptClosed {
                id: receipt_id(&raw)?,
                state: ReceiptState::parse(&state)
                    .ok_or_else(|| Error::internal("a stored receipt state this release lacks"))?,
            }),
            Self::StockLimit {
                sku: raw,
                requested,
            } => Err(Error::StockLimit {
                sku: sku(&raw)?,
                requested,
                limit: MAX_ON_HAND,
            }),
        }
    }
}

#[cfg(test)]
mod tests;
