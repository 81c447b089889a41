//! The decisions of the inventory, as pure functions of what a transaction read.
//!
//! The PostgreSQL adapter locks the rows, asks here, and writes what was decided; its
//! statements repeat the same conditions as guards (and the table's CHECK constraints refuse
//! negative availability), so should the two ever disagree the transaction aborts instead of
//! overselling. "Is there enough stock?" is answered here, once.

use std::time::{Duration, SystemTime};

use crate::{
    command::{AdjustStock, Reserve, SetStock, Settle},
    domain::{
        FenceToken, Line, MAX_ON_HAND, Reservation, ReservationId, ReservationLine,
        ReservationState, Sku, StockLevel, Ttl,
    },
    error::{Error, NotHeld, Shortfall},
    events::ReservationEvent,
    ports::ReserveGroup,
};

// ---------------------------------------------------------------------------------------------
// AdjustStock

/// The level after `command`, applied to the SKU's locked row (`None`: no such SKU yet).
///
/// Adding creates a SKU on its first positive adjustment and may not take `on_hand` past
/// [`MAX_ON_HAND`]; removing may not cut into reserved units, and needs the SKU to exist.
pub fn adjust_stock(
    current: Option<&StockLevel>,
    command: &AdjustStock,
) -> Result<StockLevel, Error> {
    let sku = &command.sku;
    at_expected_version(sku, current, command.expected_version)?;
    let delta = command.delta.get();
    let Some(current) = current else {
        if delta < 0 {
            return Err(Error::UnknownSkus(vec![sku.clone()]));
        }
        return within_limit(sku, 0, delta).map(|on_hand| StockLevel {
            sku: sku.clone(),
            on_hand,
            reserved: 0,
            version: 1,
        });
    };
    if delta > 0 {
        let on_hand = within_limit(sku, current.on_hand, delta)?;
        return Ok(StockLevel {
            on_hand,
            version: current.version + 1,
            ..current.clone()
        });
    }
    let units = -delta;
    if current.on_hand - units < current.reserved {
        return Err(Error::BelowReserved {
            sku: sku.clone(),
            requested: units,
            on_hand: current.on_hand,
            reserved: current.reserved,
        });
    }
    Ok(StockLevel {
        on_hand: current.on_hand - units,
        version: current.version + 1,
        ..current.clone()
    })
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
        return Ok(StockLevel {
            sku: command.sku.clone(),
            on_hand: command.on_hand,
            reserved: 0,
            version: 1,
        });
    };
    if command.on_hand < current.reserved {
        return Err(Error::CountBelowReserved {
            sku: command.sku.clone(),
            requested: command.on_hand,
            reserved: current.reserved,
        });
    }
    Ok(StockLevel {
        on_hand: command.on_hand,
        version: current.version + 1,
        ..current.clone()
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

/// What one line found when its fenced, conditional hold did not apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LineRefusal {
    UnknownSku(Sku),
    /// The stored fence is not below the holder's token: the holder must not write.
    Fenced(Sku, FenceToken),
    Short(Shortfall),
}

/// Why a line's hold did not apply, from the row read back (`None`: no such SKU).
pub fn line_refusal(
    line: &Line,
    fence: FenceToken,
    found: Option<(&StockLevel, FenceToken)>,
) -> LineRefusal {
    match found {
        None => LineRefusal::UnknownSku(line.sku.clone()),
        Some((_, stored)) if stored >= fence => LineRefusal::Fenced(line.sku.clone(), stored),
        Some((level, _)) => LineRefusal::Short(Shortfall {
            sku: line.sku.clone(),
            requested: line.quantity.get(),
            available: level.available(),
        }),
    }
}

/// What the lines of one reservation came to, all or none.
#[derive(Clone, Debug)]
pub enum LinesVerdict {
    Held,
    /// A final refusal, stored with the idempotency key.
    Refused(Error),
    /// Stale fences outrank every other outcome: nothing is written and nothing stored, and a
    /// lagging counter is repaired for every SKU at once.
    Fenced(Vec<(Sku, FenceToken)>),
}

/// Judges a reservation from the refusals of its lines: every fenced line is named first,
/// then every unknown SKU, then every shortfall.
pub fn judge_lines(refusals: Vec<LineRefusal>) -> LinesVerdict {
    let (mut unknown, mut fenced, mut short) = (Vec::new(), Vec::new(), Vec::new());
    for refusal in refusals {
        match refusal {
            LineRefusal::UnknownSku(sku) => unknown.push(sku),
            LineRefusal::Fenced(sku, stored) => fenced.push((sku, stored)),
            LineRefusal::Short(shortfall) => short.push(shortfall),
        }
    }
    if !fenced.is_empty() {
        LinesVerdict::Fenced(fenced)
    } else if !unknown.is_empty() {
        LinesVerdict::Refused(Error::UnknownSkus(unknown))
    } else if !short.is_empty() {
        LinesVerdict::Refused(Error::InsufficientStock(short))
    } else {
        LinesVerdict::Held
    }
}

/// A new hold made at `now` for `ttl`. Times are kept to the microsecond, as storage keeps
/// them, so what is answered is exactly what a later read returns.
pub fn new_hold(command: &Reserve, lines: Vec<Line>, now: SystemTime, ttl: Ttl) -> Reservation {
    let ttl = to_micros(ttl.get());
    Reservation {
        id: ReservationId::new_random(),
        order_id: command.order_id.clone(),
        state: ReservationState::Held,
        lines: lines.iter().map(ReservationLine::new_hold).collect(),
        created_at: now,
        expires_at: now + ttl,
    }
}

// ---------------------------------------------------------------------------------------------
// Reserve, a coalesced group

/// One SKU's stock row as the group's transaction locked it, with the transaction's clock.
#[derive(Clone, Debug)]
pub struct LockedStock {
    pub level: StockLevel,
    pub fence: FenceToken,
    pub now: SystemTime,
}

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
    /// For a new hold: the SKU's level right after it, which its event carries.
    pub level_after: Option<StockLevel>,
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
    stock: Option<&LockedStock>,
    mut earlier: impl FnMut(&Reserve) -> Result<Earlier, Error>,
    cancelled: impl Fn(&Reserve) -> bool,
) -> Result<GroupVerdict, Error> {
    if let Some(stock) = stock
        && stock.fence >= group.fence
    {
        return Ok(GroupVerdict::Fenced(stock.fence));
    }
    let mut level = stock.map(|s| s.level.clone());
    let mut decided = Vec::with_capacity(group.batch.len());
    for (command, ttl) in &group.batch {
        let answer = |answer, executed| Decided {
            answer,
            executed,
            level_after: None,
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
        let (Some(level), Some(stock)) = (level.as_mut(), stock) else {
            decided.push(answer(
                Err(Error::UnknownSkus(vec![group.sku.clone()])),
                true,
            ));
            continue;
        };
        let units = line.quantity.get();
        if units > level.available() {
            let shortfall = Shortfall {
                sku: group.sku.clone(),
                requested: units,
                available: level.available(),
            };
            decided.push(answer(Err(Error::InsufficientStock(vec![shortfall])), true));
            continue;
        }
        level.reserved += units;
        level.version += 1;
        decided.push(Decided {
            answer: Ok(new_hold(command, vec![line.clone()], stock.now, *ttl)),
            executed: true,
            level_after: Some(level.clone()),
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
/// now, not how much longer.
pub fn extend(
    reservation: &Reservation,
    now: SystemTime,
    ttl: Ttl,
    max_hold: Duration,
) -> Result<SystemTime, Error> {
    let state = match reservation.state {
        ReservationState::Held if reservation.expires_at <= now => ReservationState::Expired,
        state => state,
    };
    if state != ReservationState::Held {
        return Err(Error::WrongState {
            id: reservation.id,
            state,
            action: "extend",
        });
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

// ---------------------------------------------------------------------------------------------
// Confirm, release, expire: moving held units

/// What a change does to a locked hold: the units it moves and the reservation after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitMove {
    /// `(sku, units)` for every line some units leave, in SKU order (the order stock rows are
    /// locked in).
    pub moves: Vec<(Sku, i64)>,
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
    /// in its effective state.
    pub fn step(self, reservation: &Reservation, requested: &[Line]) -> Result<SettleStep, Error> {
        let id = reservation.id;
        if reservation.state != ReservationState::Held {
            if requested.is_empty() && self.repeats(reservation) {
                return Ok(SettleStep::Repeat);
            }
            return Err(self.wrong_state(id, reservation.state));
        }
        let mut after = reservation.clone();
        let mut moves = Vec::new();
        if requested.is_empty() {
            for line in &mut after.lines {
                if line.held > 0 {
                    moves.push((line.sku.clone(), line.held));
                    self.apply(line, line.held);
                }
            }
        } else {
            let mut refused = Vec::new();
            for (index, wanted) in requested.iter().enumerate() {
                let units = wanted.quantity.get();
                match after.lines.iter_mut().find(|l| l.sku == wanted.sku) {
                    Some(line) if line.held >= units => {
                        moves.push((line.sku.clone(), units));
                        self.apply(line, units);
                    }
                    found => refused.push(NotHeld {
                        index,
                        sku: wanted.sku.clone(),
                        requested: units,
                        held: found.map(|line| line.held),
                    }),
                }
            }
            if !refused.is_empty() {
                return Err(Error::NotHeld { id, lines: refused });
            }
        }
        moves.sort_by(|a, b| a.0.cmp(&b.0));
        let partial = after.lines.iter().any(|line| line.held > 0);
        let event = match (self, partial) {
            (Self::Confirm, false) => ReservationEvent::Confirmed,
            (Self::Release, false) => ReservationEvent::Released,
            (Self::Confirm, true) => ReservationEvent::PartiallyConfirmed,
            (Self::Release, true) => ReservationEvent::PartiallyReleased,
        };
        if !partial {
            after.state = ended_state(&after, ReservationState::Released);
        }
        let write_lines = partial || reservation.lines.iter().any(ReservationLine::touched);
        Ok(SettleStep::Apply(UnitMove {
            moves,
            after,
            event,
            write_lines,
        }))
    }

    /// A call without lines on a reservation that holds nothing any more: a repeat if it
    /// already went where this call would take it.
    fn repeats(self, reservation: &Reservation) -> bool {
        match (self, reservation.state) {
            (Self::Confirm, ReservationState::Confirmed) => true,
            (Self::Release, ReservationState::Released | ReservationState::Expired) => true,
            // The rest of a partly confirmed reservation was released (or expired).
            (Self::Release, ReservationState::Confirmed) => {
                reservation.lines.iter().any(|line| line.released > 0)
            }
            _ => false,
        }
    }

    fn apply(self, line: &mut ReservationLine, units: i64) {
        line.held -= units;
        match self {
            Self::Confirm => line.confirmed += units,
            Self::Release => line.released += units,
        }
    }

    /// The hold expired while its lock was waited for: it is the sweeper's now. Releasing
    /// all of it is done already; anything else is too late.
    pub fn expired_meanwhile(
        self,
        mut reservation: Reservation,
        requested: &[Line],
    ) -> Result<Reservation, Error> {
        for line in &mut reservation.lines {
            line.released += line.held;
            line.held = 0;
        }
        reservation.state = ended_state(&reservation, ReservationState::Expired);
        if self == Self::Release && requested.is_empty() {
            return Ok(reservation);
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

/// Ends a locked hold whose units still held all go back to `available` (`Released` by a
/// cancel, `Expired` by the sweeper).
pub fn end_hold(reservation: &Reservation, ended: ReservationState) -> UnitMove {
    let mut after = reservation.clone();
    let mut moves = Vec::new();
    for line in &mut after.lines {
        if line.held > 0 {
            moves.push((line.sku.clone(), line.held));
            line.released += line.held;
            line.held = 0;
        }
    }
    moves.sort_by(|a, b| a.0.cmp(&b.0));
    after.state = ended_state(&after, ended);
    UnitMove {
        moves,
        write_lines: reservation.lines.iter().any(ReservationLine::touched),
        after,
        event: match ended {
            ReservationState::Expired => ReservationEvent::Expired,
            _ => ReservationEvent::Released,
        },
    }
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

#[cfg(test)]
mod tests;
