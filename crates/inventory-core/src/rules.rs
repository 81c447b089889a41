//! The decisions of the inventory, as pure functions of what a transaction read.
//!
//! The PostgreSQL adapter locks the rows, asks here, and writes what was decided; its
//! statements repeat the same conditions as guards (and the table's CHECK constraints refuse
//! negative availability), so should the two ever disagree the transaction aborts instead of
//! overselling. "Is there enough stock?" is answered here, once.

use std::time::{Duration, SystemTime};

use crate::{
    allocation::{Placement, SkuStock, Unplaced},
    command::{
        AdjustStock, ExpectStock, MoveStockState, Promise, Reserve, SetStock, SetStockPolicy,
        Settle,
    },
    domain::{
        Allocation, FenceToken, Line, Location, LocationId, MAX_ON_HAND, Receipt, ReceiptState,
        Reservation, ReservationId, ReservationLine, ReservationState, Sku, States, StockLevel,
        StockState, Ttl,
    },
    error::{Error, NotHeld, Settled, Shortfall},
    events::ReservationEvent,
    ports::ReserveGroup,
};

// ---------------------------------------------------------------------------------------------
// AdjustStock

/// The level after `command`, applied to the SKU's locked row (`None`: no such SKU yet).
///
/// Adding creates a SKU on its first positive adjustment and may not take `on_hand` past
/// [`MAX_ON_HAND`]; removing needs the SKU to exist and units in the state removed (sellable
/// ones may not cut into what is reserved).
pub fn adjust_stock(
    current: Option<&StockLevel>,
    command: &AdjustStock,
) -> Result<StockLevel, Error> {
    let sku = &command.sku;
    at_expected_version(sku, current, command.expected_version)?;
    let delta = command.delta.get();
    let state = command.state.unwrap_or(StockState::Sellable);
    let Some(current) = current else {
        if delta < 0 {
            return Err(Error::UnknownSkus(vec![sku.clone()]));
        }
        return within_limit(sku, 0, delta).map(|on_hand| StockLevel {
            sku: sku.clone(),
            on_hand,
            reserved: 0,
            version: 1,
            location: None,
            states: state.delta(delta),
            apart: 0,
        });
    };
    if delta > 0 {
        within_limit(sku, current.on_hand, delta)?;
    } else {
        take_units(sku, current, state, -delta)?;
    }
    Ok(StockLevel {
        on_hand: current.on_hand + delta,
        version: current.version + 1,
        states: current.states.plus(&state.delta(delta)),
        ..current.clone()
    })
}

/// Refuses to remove `units` in `state` from `level` unless it has them; sellable units
/// held by reservations are not there to remove.
fn take_units(sku: &Sku, level: &StockLevel, state: StockState, units: i64) -> Result<(), Error> {
    match state {
        StockState::Sellable if level.sellable() - units < level.reserved => {
            Err(Error::BelowReserved {
                sku: sku.clone(),
                requested: units,
                on_hand: level.sellable(),
                reserved: level.reserved,
            })
        }
        StockState::Damaged | StockState::QualityControl if state.units(level) < units => {
            Err(Error::InsufficientStock(vec![Shortfall {
                sku: sku.clone(),
                requested: units,
                available: state.units(level),
            }]))
        }
        _ => Ok(()),
    }
}

/// A compare-and-set: the change applies only while the SKU is at the version the caller
/// expected (0: it does not exist).
fn at_expected_version(
    sku: &Sku,
    current: Option<&StockLevel>,
    expected: Option<i64>,
) -> Result<(), Error> {
    let version = current.map_or(0, |level| level.version);
    match expected {
        Some(expected) if expected != version => Err(Error::VersionMismatch {
            sku: sku.clone(),
            expected,
            current: version,
        }),
        _ => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// SetStock

/// The level after an absolute count of the SKU's locked row (`None`: no such SKU yet, which
/// the count creates). The count may not fall below what reservations hold.
pub fn set_stock(current: Option<&StockLevel>, command: &SetStock) -> Result<StockLevel, Error> {
    at_expected_version(&command.sku, current, command.expected_version)?;
    let Some(current) = current else {
        let state = command.state.unwrap_or(StockState::Sellable);
        return Ok(StockLevel {
            sku: command.sku.clone(),
            on_hand: command.on_hand,
            reserved: 0,
            version: 1,
            location: None,
            states: state.delta(command.on_hand),
            apart: 0,
        });
    };
    let delta = count_delta(current, command)?;
    Ok(StockLevel {
        on_hand: current.on_hand + delta,
        version: current.version + 1,
        states: current
            .states
            .plus(&command.state.unwrap_or(StockState::Sellable).delta(delta)),
        ..current.clone()
    })
}

/// How a count moves `level`'s `on_hand`: the count is of the whole location (no state),
/// or of the units in one state. It may not leave fewer sellable units than are reserved.
fn count_delta(level: &StockLevel, command: &SetStock) -> Result<i64, Error> {
    let (counted_now, floor) = match command.state {
        None => (level.on_hand, level.reserved + level.states.unsellable()),
        Some(StockState::Sellable) => (level.sellable(), level.reserved),
        Some(state) => (state.units(level), 0),
    };
    if command.on_hand < floor {
        return Err(Error::CountBelowReserved {
            sku: command.sku.clone(),
            requested: command.on_hand,
            reserved: floor,
        });
    }
    Ok(command.on_hand - counted_now)
}

// ---------------------------------------------------------------------------------------------
// Stock at one location

/// The SKU's level at `location` before a change: its row there, or nothing yet.
fn at_or_empty(total: &StockLevel, at: Option<&StockLevel>, location: &LocationId) -> StockLevel {
    at.cloned().unwrap_or_else(|| StockLevel {
        on_hand: 0,
        reserved: 0,
        location: Some(location.clone()),
        states: States::default(),
        ..total.clone()
    })
}

/// An adjustment at one location of an existing SKU (its locked total, and its locked row
/// there, if any): the total's rules, and the location may not lose units its holds need,
/// nor units it does not have in the state removed. Answers the total and the location's
/// level after.
pub fn adjust_at(
    total: &StockLevel,
    at: Option<&StockLevel>,
    command: &AdjustStock,
) -> Result<(StockLevel, StockLevel), Error> {
    let total_after = adjust_stock(Some(total), command)?;
    let before = at_or_empty(total, at, &command.location);
    let delta = command.delta.get();
    let state = command.state.unwrap_or(StockState::Sellable);
    if delta < 0 {
        take_units(&command.sku, &before, state, -delta)?;
    }
    let version = total_after.version;
    Ok((
        total_after,
        StockLevel {
            on_hand: before.on_hand + delta,
            version,
            states: before.states.plus(&state.delta(delta)),
            ..before
        },
    ))
}

/// An absolute count at one location of an existing SKU: it may not fall below what holds
/// there need, nor take the total past the limit. `None`: the count is what is stored, and
/// nothing changes. Otherwise the total, the location's level after, and the change of
/// `on_hand`.
pub fn set_at(
    total: &StockLevel,
    at: Option<&StockLevel>,
    command: &SetStock,
) -> Result<Option<(StockLevel, StockLevel, i64)>, Error> {
    at_expected_version(&command.sku, Some(total), command.expected_version)?;
    let before = at_or_empty(total, at, &command.location);
    let delta = count_delta(&before, command)?;
    if delta == 0 {
        return Ok(None);
    }
    let on_hand = if delta > 0 {
        within_limit(&command.sku, total.on_hand, delta)?
    } else {
        total.on_hand + delta
    };
    let version = total.version + 1;
    let states = command.state.unwrap_or(StockState::Sellable).delta(delta);
    Ok(Some((
        StockLevel {
            on_hand,
            version,
            states: total.states.plus(&states),
            ..total.clone()
        },
        StockLevel {
            on_hand: before.on_hand + delta,
            version,
            states: before.states.plus(&states),
            ..before
        },
        delta,
    )))
}

/// A change of a (SKU, location)'s states decided on its locked rows: the total and the
/// location's level after (one version), and the delta of the states.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatesChange {
    pub total: StockLevel,
    pub at: StockLevel,
    pub delta: States,
}

impl StatesChange {
    fn of(total: &StockLevel, before: StockLevel, delta: States) -> Self {
        Self::with_on_hand(total, before, delta, 0)
    }

    /// A change of the states by `delta` and of `on_hand` by `on_hand`.
    fn with_on_hand(total: &StockLevel, before: StockLevel, delta: States, on_hand: i64) -> Self {
        let version = total.version + 1;
        Self {
            total: StockLevel {
                version,
                on_hand: total.on_hand + on_hand,
                states: total.states.plus(&delta),
                ..total.clone()
            },
            at: StockLevel {
                version,
                on_hand: before.on_hand + on_hand,
                states: before.states.plus(&delta),
                ..before
            },
            delta,
        }
    }

    /// The change of `on_hand` at the location.
    pub fn on_hand(&self, before: Option<&StockLevel>) -> i64 {
        self.at.on_hand - before.map_or(0, |b| b.on_hand)
    }
}

/// An incoming receipt recorded at a location of a locked SKU: its units are incoming.
pub fn expect(total: &StockLevel, at: Option<&StockLevel>, command: &ExpectStock) -> StatesChange {
    let before = at_or_empty(total, at, &command.location);
    let delta = States {
        incoming: command.quantity,
        ..States::default()
    };
    StatesChange::of(total, before, delta)
}

/// `quantity` units of an open receipt arrive at its location (of the locked SKU): they
/// are on hand, and what they bring of the receipt's remainder is no longer incoming (an
/// over-delivery adds units that were never incoming). The receipt is received once its
/// quantity is. Answers the change and the receipt after.
pub fn receive(
    total: &StockLevel,
    at: Option<&StockLevel>,
    receipt: &Receipt,
    quantity: i64,
    state: Option<crate::domain::StockState>,
) -> Result<(StatesChange, Receipt), Error> {
    if receipt.state != ReceiptState::Open {
        return Err(Error::ReceiptClosed {
            id: receipt.id.clone(),
            state: receipt.state,
        });
    }
    within_limit(&receipt.sku, total.on_hand, quantity)?;
    let before = at_or_empty(total, at, &receipt.location);
    let delta = States {
        incoming: -quantity.min(receipt.remainder()),
        ..States::default()
    }
    .plus(&state.map_or(States::default(), |s| s.delta(quantity)));
    let mut after = receipt.clone();
    after.received += quantity;
    if after.received >= after.quantity {
        after.state = ReceiptState::Received;
    }
    Ok((
        StatesChange::with_on_hand(total, before, delta, quantity),
        after,
    ))
}

/// An open receipt cancelled: what it had still to bring is no longer incoming. Its
/// pre-ordered units stay with their holds (at risk), to be filled by other stock.
pub fn cancel_receipt(
    total: &StockLevel,
    at: Option<&StockLevel>,
    receipt: &Receipt,
) -> Result<(StatesChange, Receipt), Error> {
    if receipt.state != ReceiptState::Open {
        return Err(Error::ReceiptClosed {
            id: receipt.id.clone(),
            state: receipt.state,
        });
    }
    let before = at_or_empty(total, at, &receipt.location);
    let delta = States {
        incoming: -receipt.remainder(),
        ..States::default()
    };
    let mut after = receipt.clone();
    after.state = ReceiptState::Cancelled;
    Ok((StatesChange::of(total, before, delta), after))
}

/// What may be promised of a (SKU, location) or a SKU's total by a date: one step per
/// date open receipts are expected on, each the units promisable by then (what is free now,
/// less what waits with no open receipt behind it: backorders, and pre-orders of closed
/// receipts; plus the unpromised remainder of every receipt due by then), never below 0.
/// Receipts only add, so no step promises what a later one takes back. `receipts`: those
/// the level counts (of the location, or of every location), closed ones with pre-ordered
/// units still pegged included.
///
/// A pre-order follows the same rule (see `SkuStock::place_waiting`): it is taken only where
/// the step at its receipt's date covers it, so what GetStock promises by a date bounds what
/// Reserve gives by that date.
pub fn available_to_promise(level: &StockLevel, receipts: &[&Receipt]) -> Vec<(SystemTime, i64)> {
    let mut open: Vec<&&Receipt> = receipts
        .iter()
        .filter(|r| r.state == ReceiptState::Open)
        .collect();
    open.sort_by_key(|r| r.expected_at);
    let at_risk: i64 = receipts.iter().map(|r| r.at_risk()).sum();
    let mut balance = level.free() - level.states.backordered - at_risk;
    let mut steps: Vec<(SystemTime, i64)> = Vec::new();
    for receipt in open {
        balance += receipt.unpromised();
        match steps.last_mut() {
            Some(last) if last.0 == receipt.expected_at => last.1 = balance.max(0),
            _ => steps.push((receipt.expected_at, balance.max(0))),
        }
    }
    steps
}

/// [`available_to_promise`] at one location (`level`, and the receipts it counts), with what
/// one Reserve line may get by each step: what it may hold now, or more where a pre-order
/// of the rest fits one open receipt due by then (and by `waits_until`, the end of demand
/// made now) that has that many unpromised units, and the step at that receipt's date covers
/// the whole line: exactly the rule [`SkuStock::place_waiting`](crate::allocation::SkuStock::place_waiting)
/// pegs by, so a line of `one_line` units is taken by then.
pub fn promises(
    level: &StockLevel,
    receipts: &[&Receipt],
    waits_until: Option<SystemTime>,
) -> Vec<Promise> {
    let steps = available_to_promise(level, receipts);
    let available = level.available();
    steps
        .iter()
        .map(|&(at, units)| {
            let pegged = receipts
                .iter()
                .filter(|r| {
                    r.state == ReceiptState::Open
                        && r.expected_at <= at
                        && waits_until.is_none_or(|end| r.expected_at <= end)
                })
                .map(|r| (available + r.unpromised()).min(promised_by(&steps, r.expected_at)))
                .max()
                .unwrap_or(0);
            Promise {
                at,
                units,
                one_line: available.min(units).max(pegged),
            }
        })
        .collect()
}

/// What may be promised of a SKU's total by date: per date one of its active locations
/// (`locations`: each one's level and the receipts it counts) steps on, the sum of what each
/// promises by then, and the most one line may get: at any one of them (a line waits at one
/// location), or split over all of them from what they have available now (never above what
/// the total promises by then). Before its first step a location promises what it has free less what waits
/// there with no open receipt behind it, never below 0, and a line what it may hold now of
/// that. A total promises no unit an active location could not give: never a free unit of an
/// inactive location, or one that another location's unmet safety stock would take back.
pub fn total_promise(
    locations: &[(&StockLevel, Vec<&Receipt>)],
    waits_until: Option<SystemTime>,
) -> Vec<Promise> {
    let each: Vec<(Promise, Vec<Promise>)> = locations
        .iter()
        .map(|(level, receipts)| {
            let at_risk: i64 = receipts.iter().map(|r| r.at_risk()).sum();
            let units = (level.free() - level.states.backordered - at_risk).max(0);
            let now = Promise {
                at: SystemTime::UNIX_EPOCH,
                units,
                one_line: level.available().min(units),
            };
            (now, promises(level, receipts, waits_until))
        })
        .collect();
    let mut dates: Vec<SystemTime> = each
        .iter()
        .flat_map(|(_, steps)| steps.iter().map(|step| step.at))
        .collect();
    dates.sort();
    dates.dedup();
    let split: i64 = locations.iter().map(|(level, _)| level.available()).sum();
    dates
        .into_iter()
        .map(|at| {
            let by_then: Vec<Promise> = each
                .iter()
                .map(|(now, steps)| {
                    steps
                        .iter()
                        .rev()
                        .find(|step| step.at <= at)
                        .copied()
                        .unwrap_or(*now)
                })
                .collect();
            let units: i64 = by_then.iter().map(|p| p.units).sum();
            Promise {
                at,
                units,
                one_line: by_then
                    .iter()
                    .map(|p| p.one_line)
                    .max()
                    .unwrap_or(0)
                    .max(split.min(units)),
            }
        })
        .collect()
}

/// `steps` as a reader is told them at `now`: a step dated in the past (a late receipt's)
/// is promised from now, merged with the others due by then.
pub fn promised_from(steps: Vec<Promise>, now: SystemTime) -> Vec<Promise> {
    let mut shown: Vec<Promise> = Vec::with_capacity(steps.len());
    for step in steps {
        let at = step.at.max(now);
        match shown.last_mut() {
            Some(last) if last.at == at => *last = Promise { at, ..step },
            _ => shown.push(Promise { at, ..step }),
        }
    }
    shown
}

/// The units `steps` (of [`available_to_promise`]) promise by `at`: the last step due by
/// then, 0 before the first.
pub fn promised_by(steps: &[(SystemTime, i64)], at: SystemTime) -> i64 {
    steps
        .iter()
        .rev()
        .find(|(date, _)| *date <= at)
        .map_or(0, |(_, units)| *units)
}

/// Units moved between states at one location: the source must have them, and sellable
/// units held by reservations never move (a held unit stays sound). `on_hand` stays.
pub fn move_state(
    total: &StockLevel,
    at: Option<&StockLevel>,
    command: &MoveStockState,
) -> Result<StatesChange, Error> {
    let before = at_or_empty(total, at, &command.location);
    let movable = match command.from {
        StockState::Sellable => before.sellable() - before.reserved,
        state => state.units(&before),
    };
    if movable < command.quantity {
        return Err(Error::InsufficientStock(vec![Shortfall {
            sku: command.sku.clone(),
            requested: command.quantity,
            available: movable.max(0),
        }]));
    }
    let delta = command
        .to
        .delta(command.quantity)
        .plus(&command.from.delta(-command.quantity));
    Ok(StatesChange::of(total, before, delta))
}

/// A new policy at one location. `None`: it is the policy already stored, and nothing
/// changes. Raising the safety stock above what is free, or lowering the backorder limit
/// below what is backordered, is accepted: demand already accepted stays, new demand is
/// judged against the new policy.
pub fn set_policy(
    total: &StockLevel,
    at: Option<&StockLevel>,
    command: &SetStockPolicy,
) -> Option<StatesChange> {
    let before = at_or_empty(total, at, &command.location);
    let delta = States {
        safety_stock: command
            .safety_stock
            .map_or(0, |wanted| wanted - before.states.safety_stock),
        backorder_limit: command
            .backorder_limit
            .map_or(0, |wanted| wanted - before.states.backorder_limit),
        ..States::default()
    };
    (!delta.is_zero()).then(|| StatesChange::of(total, before, delta))
}

/// A transfer of available units between two locations of a SKU (its locked total and rows):
/// only what is available at `from` may leave. Answers the total and both levels after.
pub fn transfer(
    total: &StockLevel,
    from: Option<&StockLevel>,
    to: Option<&StockLevel>,
    command: &crate::command::TransferStock,
) -> Result<crate::command::Transferred, Error> {
    let from = at_or_empty(total, from, &command.from);
    let to = at_or_empty(total, to, &command.to);
    if from.available() < command.quantity {
        return Err(Error::InsufficientStock(vec![Shortfall {
            sku: command.sku.clone(),
            requested: command.quantity,
            available: from.available(),
        }]));
    }
    let to_on_hand = within_limit(&command.sku, to.on_hand, command.quantity)?;
    // One movement per side, in location order.
    let (first, second) = if command.from < command.to {
        (total.version + 1, total.version + 2)
    } else {
        (total.version + 2, total.version + 1)
    };
    Ok(crate::command::Transferred {
        total: StockLevel {
            version: total.version + 2,
            ..total.clone()
        },
        from: StockLevel {
            on_hand: from.on_hand - command.quantity,
            version: first,
            ..from
        },
        to: StockLevel {
            on_hand: to_on_hand,
            version: second,
            ..to
        },
    })
}

fn within_limit(sku: &Sku, on_hand: i64, added: i64) -> Result<i64, Error> {
    match on_hand.checked_add(added) {
        Some(total) if total <= MAX_ON_HAND => Ok(total),
        _ => Err(Error::StockLimit {
            sku: sku.clone(),
            requested: added,
            limit: MAX_ON_HAND,
        }),
    }
}

// ---------------------------------------------------------------------------------------------
// Reserve, one request

/// What the lines of one reservation came to, all or none.
#[derive(Clone, Debug)]
pub enum LinesVerdict {
    /// Every line placed: per line (in the order given), where its units went.
    Held(Vec<Vec<Placement>>),
    /// A final refusal, stored with the idempotency key.
    Refused(Error),
    /// Stale fences outrank every other outcome: nothing is written and nothing stored, and a
    /// lagging counter is repaired for every SKU at once.
    Fenced(Vec<(Sku, FenceToken)>),
}

/// Places every line of one reservation (in SKU order, each with its lease's token) on the
/// stock its transaction locked (`None`: no such SKU), all or none. Every fenced line is
/// named first, then every unknown SKU, then every unknown location, then every shortfall.
/// `stock` is changed only when every line is held.
pub fn place_lines(
    lines: &[(&Line, FenceToken)],
    stock: &mut std::collections::HashMap<Sku, SkuStock>,
    policy: crate::domain::AllocationPolicy,
    locations: &[Location],
) -> LinesVerdict {
    let mut trial = stock.clone();
    let (mut unknown, mut nowhere, mut fenced, mut short) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut placed = Vec::with_capacity(lines.len());
    for (line, fence) in lines {
        let Some(sku) = trial.get_mut(&line.sku) else {
            unknown.push(line.sku.clone());
            continue;
        };
        if sku.fence >= *fence {
            fenced.push((line.sku.clone(), sku.fence));
            continue;
        }
        match sku.place(line, policy, locations) {
            Ok(placements) => placed.push(placements),
            Err(Unplaced::UnknownLocation(location)) => nowhere.push(location),
            Err(Unplaced::Short(shortfall)) => {
                match policy
                    .may_wait()
                    .then(|| sku.place_waiting(line, policy, locations))
                    .flatten()
                {
                    Some(placement) => placed.push(vec![placement]),
                    None => short.push(shortfall),
                }
            }
        }
    }
    if !fenced.is_empty() {
        LinesVerdict::Fenced(fenced)
    } else if !unknown.is_empty() {
        LinesVerdict::Refused(Error::UnknownSkus(unknown))
    } else if let Some(location) = nowhere.into_iter().next() {
        LinesVerdict::Refused(Error::UnknownLocation(location))
    } else if !short.is_empty() {
        LinesVerdict::Refused(Error::InsufficientStock(short))
    } else {
        *stock = trial;
        LinesVerdict::Held(placed)
    }
}

/// A line's allocations from where its units were placed.
pub fn allocations(placements: &[Placement]) -> Vec<Allocation> {
    placements
        .iter()
        .map(|p| {
            Allocation::new_waiting(
                p.location.clone(),
                p.units,
                p.waiting.waiting(),
                p.receipt.clone(),
            )
        })
        .collect()
}

/// A new hold made at `now` for `ttl`. Times are kept to the microsecond, as storage keeps
/// them, so what is answered is exactly what a later read returns.
pub fn new_hold(
    command: &Reserve,
    lines: Vec<ReservationLine>,
    now: SystemTime,
    ttl: Ttl,
) -> Reservation {
    let ttl = to_micros(ttl.get());
    Reservation {
        id: ReservationId::new_random(),
        order_id: command.order_id.clone(),
        state: ReservationState::Held,
        lines,
        created_at: now,
        expires_at: now + ttl,
    }
}

// ---------------------------------------------------------------------------------------------
// Reserve, a coalesced group

/// What a request's idempotency key held when its transaction looked.
#[derive(Debug)]
pub enum Earlier {
    /// This transaction claimed the key: the request is executed, its outcome stored.
    Claimed,
    /// An earlier request with the same key and the same content: its outcome, replayed.
    Replay(Result<Reservation, Error>),
    /// An earlier request with the same key and different content.
    KeyReused,
    /// Neither claimed nor stored: retention removed the record between the claim and the
    /// read. The key is free again and nothing was written; a retry settles it.
    Vanished,
}

/// One request's decision.
#[derive(Debug)]
pub struct Decided {
    pub answer: Result<Reservation, Error>,
    /// This transaction executed the request, so stores its outcome with the key.
    pub executed: bool,
    /// For a new hold: where its units went, with the levels right after each placement
    /// (the last one's total is the SKU's level its event carries).
    pub placements: Vec<Placement>,
}

/// What a coalesced group came to.
#[derive(Debug)]
pub enum GroupVerdict {
    /// The stored fence is not below the group's token: nothing of the group is written.
    Fenced(FenceToken),
    /// One decision per request, in batch order.
    Decided(Vec<Decided>),
}

/// Decides every request of one SKU's group in batch order, each the way it would have gone
/// alone after the ones before it: replay, refusal or hold. `earlier` reports what each
/// request's key held (asked once per request, in batch order); `cancelled`, whether its
/// order was cancelled (a stored refusal: replays of keys used before the cancel still
/// replay what they got).
pub fn decide_group(
    group: &ReserveGroup,
    stock: Option<&SkuStock>,
    locations: &[Location],
    mut earlier: impl FnMut(&Reserve) -> Result<Earlier, Error>,
    cancelled: impl Fn(&Reserve) -> bool,
) -> Result<GroupVerdict, Error> {
    if let Some(stock) = stock
        && stock.fence >= group.fence
    {
        return Ok(GroupVerdict::Fenced(stock.fence));
    }
    let mut stock = stock.cloned();
    let mut decided = Vec::with_capacity(group.batch.len());
    for (command, ttl) in &group.batch {
        let answer = |answer, executed| Decided {
            answer,
            executed,
            placements: Vec::new(),
        };
        match earlier(command)? {
            Earlier::Replay(outcome) => {
                decided.push(answer(outcome, false));
                continue;
            }
            Earlier::KeyReused => {
                decided.push(answer(Err(Error::IdempotencyKeyReused), false));
                continue;
            }
            Earlier::Vanished => {
                decided.push(answer(
                    Err(Error::unavailable(
                        crate::Dependency::Postgres,
                        "the idempotency record was pruned while this call claimed it",
                    )),
                    false,
                ));
                continue;
            }
            Earlier::Claimed => {}
        }
        if cancelled(command) {
            let refusal = Error::OrderCancelled {
                order_id: command.order_id.clone(),
            };
            decided.push(answer(Err(refusal), true));
            continue;
        }
        let line = &command.lines()[0];
        debug_assert_eq!(line.sku, group.sku, "a group holds one SKU");
        let Some(stock) = stock.as_mut() else {
            decided.push(answer(
                Err(Error::UnknownSkus(vec![group.sku.clone()])),
                true,
            ));
            continue;
        };
        let placements = match stock.place(line, command.allocation, locations) {
            Ok(placements) => placements,
            Err(Unplaced::UnknownLocation(location)) => {
                decided.push(answer(Err(Error::UnknownLocation(location)), true));
                continue;
            }
            Err(Unplaced::Short(shortfall)) => {
                decided.push(answer(Err(Error::InsufficientStock(vec![shortfall])), true));
                continue;
            }
        };
        let held = ReservationLine::new_hold(line, allocations(&placements));
        decided.push(Decided {
            answer: Ok(new_hold(command, vec![held], stock.now, *ttl)),
            executed: true,
            placements,
        });
    }
    Ok(GroupVerdict::Decided(decided))
}

// ---------------------------------------------------------------------------------------------
// Extend

/// A duration as storage keeps it: to the microsecond.
fn to_micros(duration: Duration) -> Duration {
    Duration::from_micros(u64::try_from(duration.as_micros()).unwrap_or(u64::MAX))
}

/// A new hold may not be asked to last longer than `max_hold`.
pub fn within_max_hold(ttl: Ttl, max_hold: Duration) -> Result<(), Error> {
    if ttl.get() > max_hold {
        return Err(Error::InvalidArgument(vec![crate::FieldViolation::new(
            "ttl",
            format!("must be at most {}s (MAX_HOLD)", max_hold.as_secs()),
        )]));
    }
    Ok(())
}

/// The new expiry of `reservation` (as read, in its effective state) extended at `now` by
/// `ttl`: only a live hold may be extended, and never to end more than `max_hold` after it
/// was made. The new expiry may be earlier than the old one: the caller says how long from
/// now, not how much longer. A hold with units waiting keeps its expiry (the wait horizon,
/// see [`committed`]): the answer is its expiry as it is.
pub fn extend(
    reservation: &Reservation,
    now: SystemTime,
    ttl: Ttl,
    max_hold: Duration,
) -> Result<SystemTime, Error> {
    let state = match reservation.state {
        ReservationState::Held if reservation.expires_at <= now && reservation.waiting() == 0 => {
            ReservationState::Expired
        }
        state => state,
    };
    if state != ReservationState::Held {
        return Err(Error::WrongState {
            id: reservation.id,
            state,
            action: "extend",
        });
    }
    // Units of it wait for stock: it lasts until the wait horizon, which no ttl moves.
    if reservation.waiting() > 0 {
        return Ok(reservation.expires_at);
    }
    let expires_at = now + to_micros(ttl.get());
    let latest = reservation.created_at + max_hold;
    if expires_at > latest {
        return Err(Error::MaxHoldExceeded {
            id: reservation.id,
            latest,
        });
    }
    Ok(expires_at)
}

/// A new hold with units waiting for stock is a commitment, not a checkout hold: it lasts
/// until the wait horizon, `horizon` after it was made, whatever its `ttl` (it ends sooner
/// when it is confirmed whole, released or cancelled). One with nothing waiting keeps its
/// `ttl`.
pub fn committed(mut hold: Reservation, horizon: Duration) -> Reservation {
    if hold.waiting() > 0 {
        hold.expires_at = hold.created_at + to_micros(horizon);
    }
    hold
}

// ---------------------------------------------------------------------------------------------
// Confirm, release, expire: moving held units

/// Held units leaving one allocation of a reservation line, and waiting units it gives up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub sku: Sku,
    pub location: LocationId,
    pub units: i64,
    /// Waiting units released: `backordered` and `preordered` (positive counts).
    pub waiting: States,
    /// The receipt the released pre-ordered units were pegged to.
    pub receipt: Option<crate::domain::ReceiptId>,
}

/// What a change does to a locked hold: the units it moves and the reservation after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitMove {
    /// One per allocation some units leave, in (SKU, location) order: the order stock rows
    /// are locked in.
    pub moves: Vec<Move>,
    /// The reservation after the change.
    pub after: Reservation,
    pub event: ReservationEvent,
    /// Whether the lines' counts must be written: always once a reservation is settled in
    /// parts. A reservation settled in one step keeps its stored counts at zero and is read
    /// by its state (see [`ReservationLine::stored`]), which saves a write per line.
    pub write_lines: bool,
}

/// What settling a reservation in a given state does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettleStep {
    /// A live hold: move its units.
    Apply(UnitMove),
    /// Already where the call would take it: answer it as it is, change nothing.
    Repeat,
}

impl Settle {
    pub fn action(self) -> &'static str {
        match self {
            Self::Confirm => "confirm",
            Self::Release => "release",
        }
    }

    /// The step `requested` (empty: every unit still held) takes from `reservation` as read,
    /// in its effective state. `keyed`: the call carries an idempotency key. A whole confirm
    /// of a hold with waiting units needs one: without it, a retry after a lost answer would
    /// ship the units filled in between too (a whole release ends the hold, and its retry
    /// answers the same, so it needs none).
    pub fn step(
        self,
        reservation: &Reservation,
        requested: &[Line],
        keyed: bool,
    ) -> Result<SettleStep, Error> {
        let id = reservation.id;
        if self == Self::Confirm
            && requested.is_empty()
            && !keyed
            && reservation.state == ReservationState::Held
            && reservation.lines.iter().any(|line| line.waiting() > 0)
        {
            return Err(Error::InvalidArgument(vec![crate::FieldViolation::new(
                "idempotency_key",
                "required to confirm a reservation with units waiting for stock (a retry \
                 without one could ship units filled since)",
            )]));
        }
        if reservation.state != ReservationState::Held {
            if requested.is_empty() && self.repeats(reservation) {
                return Ok(SettleStep::Repeat);
            }
            if requested.is_empty() && self == Self::Confirm {
                return Err(partly_released(reservation));
            }
            return Err(self.wrong_state(id, reservation.state));
        }
        let mut after = reservation.clone();
        let mut moves = Vec::new();
        if requested.is_empty() {
            // Only held units ship: a whole confirm of a hold that holds nothing yet (every
            // unit still waits) is refused, line by line.
            if self == Self::Confirm && after.lines.iter().all(|line| line.held == 0) {
                return Err(Error::NotHeld {
                    id,
                    lines: after
                        .lines
                        .iter()
                        .enumerate()
                        .map(|(index, line)| NotHeld {
                            index,
                            sku: line.sku.clone(),
                            requested: line.waiting(),
                            held: Some(0),
                        })
                        .collect(),
                });
            }
            for line in &mut after.lines {
                let held = line.held;
                self.apply(line, held, None, &mut moves);
                if self == Self::Release {
                    release_waiting(line, &mut moves);
                }
            }
        } else {
            let mut refused = Vec::new();
            for (index, wanted) in requested.iter().enumerate() {
                let units = wanted.quantity.get();
                let pinned = wanted.location.as_ref();
                match after.lines.iter_mut().find(|l| l.sku == wanted.sku) {
                    Some(line) if held_at(line, pinned) >= units => {
                        self.apply(line, units, pinned, &mut moves);
                    }
                    found => refused.push(NotHeld {
                        index,
                        sku: wanted.sku.clone(),
                        requested: units,
                        held: found.map(|line| held_at(line, pinned)),
                    }),
                }
            }
            if !refused.is_empty() {
                return Err(Error::NotHeld { id, lines: refused });
            }
        }
        let moves = merge_moves(moves);
        let partial = after
            .lines
            .iter()
            .any(|line| line.held > 0 || line.waiting() > 0);
        let event = match (self, partial) {
            (Self::Confirm, false) => ReservationEvent::Confirmed,
            (Self::Release, false) => ReservationEvent::Released,
            (Self::Confirm, true) => ReservationEvent::PartiallyConfirmed,
            (Self::Release, true) => ReservationEvent::PartiallyReleased,
        };
        if !partial {
            after.state = ended_state(&after, ReservationState::Released);
        }
        let write_lines = partial
            || reservation
                .lines
                .iter()
                .any(|line| line.touched() || line.waiting() > 0);
        Ok(SettleStep::Apply(UnitMove {
            moves,
            after,
            event,
            write_lines,
        }))
    }

    /// A call without lines on a reservation that holds nothing any more: a repeat if it
    /// already went where this call would take it. A whole confirm is one only if every unit
    /// was confirmed: after a partial confirm whose rest went back to stock, OK would tell a
    /// caller reading the status alone to ship units that may be sold to someone else.
    fn repeats(self, reservation: &Reservation) -> bool {
        match (self, reservation.state) {
            (Self::Confirm, ReservationState::Confirmed) => {
                reservation.lines.iter().all(|line| line.released == 0)
            }
            (Self::Release, ReservationState::Released | ReservationState::Expired) => true,
            // The rest of a partly confirmed reservation was released (or expired).
            (Self::Release, ReservationState::Confirmed) => {
                reservation.lines.iter().any(|line| line.released > 0)
            }
            _ => false,
        }
    }

    /// Takes `units` held units of `line` (from `pinned`'s allocation, or from its
    /// allocations in location order), recording one move per allocation touched.
    fn apply(
        self,
        line: &mut ReservationLine,
        units: i64,
        pinned: Option<&LocationId>,
        moves: &mut Vec<Move>,
    ) {
        let mut left = units;
        for allocation in &mut line.allocations {
            if left == 0 {
                break;
            }
            if pinned.is_some_and(|p| p != &allocation.location) {
                continue;
            }
            let take = allocation.held.min(left);
            if take == 0 {
                continue;
            }
            allocation.held -= take;
            match self {
                Self::Confirm => allocation.confirmed += take,
                Self::Release => allocation.released += take,
            }
            left -= take;
            moves.push(Move {
                sku: line.sku.clone(),
                location: allocation.location.clone(),
                units: take,
                waiting: States::default(),
                receipt: None,
            });
        }
        debug_assert_eq!(left, 0, "only held units are taken");
        line.recount();
    }

    /// The hold expired while its lock was waited for: it is the sweeper's now. Releasing
    /// all of it is done already; anything else is too late.
    pub fn expired_meanwhile(
        self,
        mut reservation: Reservation,
        requested: &[Line],
    ) -> Result<Reservation, Error> {
        for line in &mut reservation.lines {
            for allocation in &mut line.allocations {
                allocation.released += allocation.held + allocation.waiting();
                allocation.held = 0;
                allocation.backordered = 0;
                allocation.preordered = 0;
                // No unit waits for it any more: a read of the stored rows names none.
                allocation.receipt = None;
            }
            line.recount();
        }
        reservation.state = ended_state(&reservation, ReservationState::Expired);
        if self == Self::Release && requested.is_empty() {
            return Ok(reservation);
        }
        if self == Self::Confirm && requested.is_empty() {
            return Err(partly_released(&reservation));
        }
        Err(self.wrong_state(reservation.id, reservation.state))
    }

    fn wrong_state(self, id: ReservationId, state: ReservationState) -> Error {
        Error::WrongState {
            id,
            state,
            action: self.action(),
        }
    }
}

/// The refusal of a whole confirm of a reservation some of whose units went back to stock
/// (or, for one never confirmed at all, its wrong state).
fn partly_released(reservation: &Reservation) -> Error {
    if reservation.state != ReservationState::Confirmed {
        return Settle::Confirm.wrong_state(reservation.id, reservation.state);
    }
    Error::PartlyReleased {
        id: reservation.id,
        lines: reservation
            .lines
            .iter()
            .map(|line| Settled {
                sku: line.sku.clone(),
                quantity: line.quantity.get(),
                confirmed: line.confirmed,
                released: line.released,
            })
            .collect(),
    }
}

/// Ends a locked hold whose units still held all go back to `available` (`Released` by a
/// cancel, `Expired` by the sweeper).
pub fn end_hold(reservation: &Reservation, ended: ReservationState) -> UnitMove {
    let mut after = reservation.clone();
    let mut moves = Vec::new();
    for line in &mut after.lines {
        let held = line.held;
        Settle::Release.apply(line, held, None, &mut moves);
        release_waiting(line, &mut moves);
    }
    let moves = merge_moves(moves);
    after.state = ended_state(&after, ended);
    UnitMove {
        moves,
        write_lines: reservation
            .lines
            .iter()
            .any(|line| line.touched() || line.waiting() > 0),
        after,
        event: match ended {
            ReservationState::Expired => ReservationEvent::Expired,
            _ => ReservationEvent::Released,
        },
    }
}

/// What a line still holds at `location` (anywhere, with none).
fn held_at(line: &ReservationLine, location: Option<&LocationId>) -> i64 {
    match location {
        None => line.held,
        Some(location) => line
            .allocations
            .iter()
            .filter(|a| &a.location == location)
            .map(|a| a.held)
            .sum(),
    }
}

/// Gives up every waiting unit of `line` (a hold that ends): they count as released.
fn release_waiting(line: &mut ReservationLine, moves: &mut Vec<Move>) {
    for allocation in &mut line.allocations {
        if allocation.waiting() == 0 {
            continue;
        }
        moves.push(Move {
            sku: line.sku.clone(),
            location: allocation.location.clone(),
            units: 0,
            waiting: States {
                backordered: allocation.backordered,
                preordered: allocation.preordered,
                ..States::default()
            },
            receipt: (allocation.preordered > 0)
                .then(|| allocation.receipt.as_ref().map(|p| p.receipt.clone()))
                .flatten(),
        });
        allocation.released += allocation.waiting();
        allocation.backordered = 0;
        allocation.preordered = 0;
        // No unit waits for it any more: a read of the stored rows names none.
        allocation.receipt = None;
    }
    line.recount();
}

/// One move per (SKU, location), in that order.
fn merge_moves(mut moves: Vec<Move>) -> Vec<Move> {
    moves.sort_by(|a, b| (&a.sku, &a.location).cmp(&(&b.sku, &b.location)));
    let mut merged: Vec<Move> = Vec::with_capacity(moves.len());
    for next in moves {
        match merged.last_mut() {
            Some(last) if last.sku == next.sku && last.location == next.location => {
                last.units += next.units;
                last.waiting = last.waiting.plus(&next.waiting);
                last.receipt = last.receipt.take().or(next.receipt);
            }
            _ => merged.push(next),
        }
    }
    merged
}

/// Where a reservation that holds nothing any more ends: `CONFIRMED` if any unit was
/// confirmed, else `otherwise` (`RELEASED` or `EXPIRED`).
fn ended_state(reservation: &Reservation, otherwise: ReservationState) -> ReservationState {
    if reservation.lines.iter().any(|line| line.confirmed > 0) {
        ReservationState::Confirmed
    } else {
        otherwise
    }
}

// ---------------------------------------------------------------------------------------------
// Filling waiting holds as stock arrives

/// Units of a held line waiting at one location, as the fill reads them (oldest reservation
/// first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub reservation: ReservationId,
    pub sku: Sku,
    pub location: LocationId,
    pub backordered: i64,
    pub preordered: i64,
    pub receipt: Option<crate::domain::ReceiptId>,
}

/// Waiting units of one line (by its index among those read) that become held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fill {
    pub index: usize,
    pub backordered: i64,
    pub preordered: i64,
}

impl Fill {
    pub fn units(&self) -> i64 {
        self.backordered + self.preordered
    }
}

/// Whether a (SKU, location) at `level` has waiting holds that units could fill: free units
/// while holds wait (or, for a receipt just received there, its pre-orders).
pub fn may_fill(level: &StockLevel, received: Option<(&crate::domain::ReceiptId, i64)>) -> bool {
    level.states.waiting() > 0 && (level.free() > 0 || received.is_some_and(|(_, n)| n > 0))
}

/// Which waiting units become held, at the locations whose levels (locked, as they are
/// now) are given: strictly first come, first served by reservation, a line filled in part
/// when too few units are there (and the lines after it wait). `received`: units of a
/// receipt just received, which go to the pre-orders pegged to it first (oldest first),
/// whatever else waits; what is then free goes to every waiting line in order. `waiting` is
/// in fill order (oldest reservation first).
pub fn fill_plan(
    levels: &[StockLevel],
    waiting: &[Waiting],
    received: Option<(&crate::domain::ReceiptId, i64)>,
) -> Vec<Fill> {
    let mut free: std::collections::HashMap<(&Sku, &LocationId), i64> = levels
        .iter()
        .filter_map(|l| Some(((&l.sku, l.location.as_ref()?), l.free())))
        .collect();
    let mut fills: Vec<Fill> = Vec::new();
    let mut left: Vec<(i64, i64)> = waiting
        .iter()
        .map(|w| (w.backordered, w.preordered))
        .collect();
    if let Some((receipt, mut units)) = received {
        for (index, w) in waiting.iter().enumerate() {
            if units == 0 {
                break;
            }
            if w.receipt.as_ref() != Some(receipt) || left[index].1 == 0 {
                continue;
            }
            let n = left[index].1.min(units);
            units -= n;
            left[index].1 -= n;
            if let Some(f) = free.get_mut(&(&w.sku, &w.location)) {
                *f -= n;
            }
            fills.push(Fill {
                index,
                backordered: 0,
                preordered: n,
            });
        }
    }
    for (index, w) in waiting.iter().enumerate() {
        let Some(f) = free.get_mut(&(&w.sku, &w.location)) else {
            continue;
        };
        if *f <= 0 {
            continue;
        }
        let backordered = left[index].0.min(*f);
        let preordered = left[index].1.min(*f - backordered);
        if backordered + preordered == 0 {
            continue;
        }
        *f -= backordered + preordered;
        match fills.iter_mut().find(|fill| fill.index == index) {
            Some(fill) => {
                fill.backordered += backordered;
                fill.preordered += preordered;
            }
            None => fills.push(Fill {
                index,
                backordered,
                preordered,
            }),
        }
    }
    fills.sort_by_key(|fill| fill.index);
    fills
}

#[cfg(test)]
mod tests;
