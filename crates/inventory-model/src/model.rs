//! The state the model keeps and the rule of every call, each written from the proto's
//! comments and the README ("Stock states", "Idempotency", the status table).
//!
//! [`Model::step`] answers the outcomes a call may have, each with the state it leaves. Most
//! calls have one; where the contract leaves a choice to the server (which of two refusals
//! comes first), each is listed, and the runner goes on from the one the server gave.
//!
//! Choices the contract leaves open, made here and stated in the proto's comments:
//! - the location `default` has priority 0;
//! - a waiting line is placed at the first location (in strategy order) where its rest
//!   either pegs to a receipt or fits the backorder limit, a pre-order tried first there;
//! - a settle's answer is the reservation before the fill its freed units started.

use std::collections::{BTreeMap, BTreeSet};

use crate::{
    call::{Call, LineSpec, State},
    view::{
        AllocationView, Answer, Code, Level, LineView, LocationView, ReceiptView, ReservationView,
    },
};

/// Rules where a stricter reading of the contract would answer otherwise than the
/// documented one. Off: the documented rule. On: the stricter one (`make model MODEL_STRICT=1`).
/// None is open now: each one the server came to follow became the model's only rule (a SKU's
/// total `available` and `available_to_promise` as the sums of its active locations' own was
/// the last).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rules {}

impl Rules {
    /// The stricter rules named in `names` (comma separated, or `1`/`all` for every one);
    /// `Err` names one it does not know.
    pub fn parse(names: &str) -> Result<Rules, String> {
        let mut rules = Rules::default();
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "1" | "all" => rules = Rules::strict(),
                "0" | "none" => {}
                other => return Err(format!("no stricter rule `{other}`")),
            }
        }
        Ok(rules)
    }

    pub fn strict() -> Rules {
        Rules {}
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Place {
    priority: i32,
    active: bool,
}

/// One (SKU, location) row: what is stored there (the waiting and incoming units are read
/// from the reservations and receipts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Cell {
    on_hand: i64,
    reserved: i64,
    damaged: i64,
    quality_control: i64,
    safety_stock: i64,
    backorder_limit: i64,
}

impl Cell {
    fn unsellable(&self) -> i64 {
        self.damaged + self.quality_control
    }

    /// Sellable units above the safety stock that no hold has: may be negative.
    fn free(&self) -> i64 {
        self.on_hand - self.reserved - self.safety_stock - self.unsellable()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ResState {
    Held,
    Confirmed,
    Released,
    Expired,
}

impl ResState {
    fn name(self) -> &'static str {
        match self {
            ResState::Held => "HELD",
            ResState::Confirmed => "CONFIRMED",
            ResState::Released => "RELEASED",
            ResState::Expired => "EXPIRED",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Alloc {
    location: String,
    quantity: i64,
    held: i64,
    confirmed: i64,
    released: i64,
    backordered: i64,
    preordered: i64,
    receipt: Option<String>,
    /// When `receipt` is due (a day of 2030).
    day: Option<u32>,
}

impl Alloc {
    fn new(location: &str, quantity: i64) -> Alloc {
        Alloc {
            location: location.to_owned(),
            quantity,
            held: quantity,
            confirmed: 0,
            released: 0,
            backordered: 0,
            preordered: 0,
            receipt: None,
            day: None,
        }
    }

    fn waiting(&self) -> i64 {
        self.backordered + self.preordered
    }

    /// The receipt units wait for, as answers show it: only while some do.
    fn pegged(&self) -> Option<&str> {
        self.receipt.as_deref().filter(|_| self.preordered > 0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    sku: String,
    quantity: i64,
    /// By location id.
    allocs: Vec<Alloc>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Res {
    order: String,
    state: ResState,
    /// By SKU.
    lines: Vec<Line>,
}

impl Res {
    fn held(&self) -> i64 {
        self.allocs().map(|a| a.held).sum()
    }
    fn waiting(&self) -> i64 {
        self.allocs().map(Alloc::waiting).sum()
    }
    fn confirmed(&self) -> i64 {
        self.allocs().map(|a| a.confirmed).sum()
    }
    fn released(&self) -> i64 {
        self.allocs().map(|a| a.released).sum()
    }
    fn allocs(&self) -> impl Iterator<Item = &Alloc> {
        self.lines.iter().flat_map(|l| &l.allocs)
    }

    /// Held and waiting units go back (released), and the hold ends: CONFIRMED if any unit
    /// was confirmed, else `ended`. Answers the (SKU, location)s whose held units went back.
    fn end(&mut self, ended: ResState) -> Vec<(String, String, i64)> {
        let mut freed = Vec::new();
        for line in &mut self.lines {
            for alloc in &mut line.allocs {
                if alloc.held > 0 {
                    freed.push((line.sku.clone(), alloc.location.clone(), alloc.held));
                }
                alloc.released += alloc.held + alloc.waiting();
                alloc.held = 0;
                alloc.backordered = 0;
                alloc.preordered = 0;
            }
        }
        self.state = if self.confirmed() > 0 {
            ResState::Confirmed
        } else {
            ended
        };
        freed
    }

    fn view(&self) -> ReservationView {
        ReservationView {
            order: self.order.clone(),
            state: self.state.name(),
            lines: self
                .lines
                .iter()
                .map(|line| {
                    let sum = |f: fn(&Alloc) -> i64| line.allocs.iter().map(f).sum::<i64>();
                    let receipt = line
                        .allocs
                        .iter()
                        .find_map(|a| a.pegged().map(str::to_owned))
                        .unwrap_or_default();
                    let expected_day = line
                        .allocs
                        .iter()
                        .find_map(|a| a.pegged().and(a.day))
                        .map(i64::from);
                    LineView {
                        expected_day,
                        sku: line.sku.clone(),
                        quantity: line.quantity,
                        held: sum(|a| a.held),
                        confirmed: sum(|a| a.confirmed),
                        released: sum(|a| a.released),
                        backordered: sum(|a| a.backordered),
                        preordered: sum(|a| a.preordered),
                        receipt,
                        location: if line.allocs.len() == 1 {
                            line.allocs[0].location.clone()
                        } else {
                            String::new()
                        },
                        allocations: line
                            .allocs
                            .iter()
                            .map(|a| AllocationView {
                                location: a.location.clone(),
                                quantity: a.quantity,
                                held: a.held,
                                confirmed: a.confirmed,
                                released: a.released,
                                backordered: a.backordered,
                                preordered: a.preordered,
                                receipt: a.pegged().unwrap_or_default().to_owned(),
                                expected_day: a.pegged().and(a.day).map(i64::from),
                            })
                            .collect(),
                    }
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecState {
    Open,
    Received,
    Cancelled,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    sku: String,
    location: String,
    quantity: i64,
    received: i64,
    day: u32,
    state: RecState,
}

impl Rec {
    fn remainder(&self) -> i64 {
        if self.state == RecState::Open {
            (self.quantity - self.received).max(0)
        } else {
            0
        }
    }
}

/// What a key has stored.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stored {
    /// The answer given when it ran, replayed as it was.
    Fixed {
        fingerprint: String,
        answer: Answer,
    },
    /// A refusal whose storage the contract does not settle: never replayed by the
    /// generator (a shrink may still replay it, and then either answer goes).
    Unsettled {
        fingerprint: String,
        answer: Answer,
    },
    /// A settle or cancel: a retry answers the reservation(s) as they now are.
    Reservation {
        fingerprint: String,
        index: usize,
    },
    Order {
        fingerprint: String,
        order: String,
    },
}

impl Stored {
    fn fingerprint(&self) -> &str {
        match self {
            Stored::Fixed { fingerprint, .. }
            | Stored::Unsettled { fingerprint, .. }
            | Stored::Reservation { fingerprint, .. }
            | Stored::Order { fingerprint, .. } => fingerprint,
        }
    }
}

/// One outcome a call may have, with the state it leaves.
#[derive(Debug, Clone)]
pub struct Expected {
    pub answer: Answer,
    pub next: Model,
    /// After the answer, the runner lets the hold run out (a `Lapse` that was extended).
    pub lapse: bool,
}

/// The whole state of one tenant as the contract describes it.
#[derive(Debug, Clone)]
pub struct Model {
    #[expect(
        dead_code,
        reason = "read by a stricter rule while one is open; none is now"
    )]
    rules: Rules,
    places: BTreeMap<String, Place>,
    stock: BTreeMap<String, BTreeMap<String, Cell>>,
    reservations: Vec<Res>,
    /// The key of the `Reserve` that made each reservation.
    made_by: BTreeMap<String, usize>,
    receipts: BTreeMap<String, Rec>,
    cancelled: BTreeSet<String>,
    keys: BTreeMap<String, Stored>,
}

impl Model {
    pub fn new(rules: Rules) -> Model {
        let mut places = BTreeMap::new();
        places.insert(
            "default".to_owned(),
            Place {
                priority: 0,
                active: true,
            },
        );
        Model {
            rules,
            places,
            stock: BTreeMap::new(),
            reservations: Vec::new(),
            made_by: BTreeMap::new(),
            receipts: BTreeMap::new(),
            cancelled: BTreeSet::new(),
            keys: BTreeMap::new(),
        }
    }

    // ---- what the generator and the runner read ----

    pub fn skus(&self) -> Vec<String> {
        self.stock.keys().cloned().collect()
    }

    pub fn locations(&self) -> Vec<String> {
        self.places.keys().cloned().collect()
    }

    /// Keys of `Reserve`s that made a reservation, with whether it is still held.
    pub fn reservations(&self) -> Vec<(String, bool)> {
        self.made_by
            .iter()
            .map(|(key, index)| {
                (
                    key.clone(),
                    self.reservations[*index].state == ResState::Held,
                )
            })
            .collect()
    }

    /// The lines of a reservation: `(sku, held, waiting)`.
    pub fn lines_of(&self, reservation: &str) -> Vec<(String, i64, i64)> {
        self.made_by
            .get(reservation)
            .map(|index| {
                self.reservations[*index]
                    .lines
                    .iter()
                    .map(|l| {
                        (
                            l.sku.clone(),
                            l.allocs.iter().map(|a| a.held).sum(),
                            l.allocs.iter().map(Alloc::waiting).sum(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Receipt ids with whether each is open.
    pub fn receipts(&self) -> Vec<(String, bool)> {
        self.receipts
            .iter()
            .map(|(id, r)| (id.clone(), r.state == RecState::Open))
            .collect()
    }

    pub fn receipt_days(&self) -> BTreeSet<u32> {
        self.receipts.values().map(|r| r.day).collect()
    }

    /// Keys whose stored outcome a retry must replay.
    pub fn replayable_keys(&self) -> BTreeSet<String> {
        self.keys
            .iter()
            .filter(|(_, stored)| !matches!(stored, Stored::Unsettled { .. }))
            .map(|(key, _)| key.clone())
            .collect()
    }

    pub fn has_key(&self, key: &str) -> bool {
        self.keys.contains_key(key)
    }

    /// Every non-empty level: each SKU's total (location "") and each location's, with
    /// `available_to_promise` as GetStock answers it.
    pub fn levels(&self) -> BTreeMap<(String, String), Level> {
        let mut levels = BTreeMap::new();
        for sku in self.stock.keys() {
            levels.insert((sku.clone(), String::new()), self.total(sku, true));
            for location in self.stock[sku].keys() {
                let mut level = self.level(sku, location);
                level.promise = self.location_promise_lines(sku, location);
                if !level.is_empty() {
                    levels.insert((sku.clone(), location.clone()), level);
                }
            }
        }
        levels
    }

    // ---- levels ----

    fn cell(&self, sku: &str, location: &str) -> Cell {
        self.stock
            .get(sku)
            .and_then(|cells| cells.get(location))
            .copied()
            .unwrap_or_default()
    }

    fn cell_mut(&mut self, sku: &str, location: &str) -> &mut Cell {
        self.stock
            .entry(sku.to_owned())
            .or_default()
            .entry(location.to_owned())
            .or_default()
    }

    fn active(&self, location: &str) -> bool {
        self.places.get(location).is_some_and(|p| p.active)
    }

    /// What a Reserve may take at a location: 0 at an inactive one.
    fn available(&self, sku: &str, location: &str) -> i64 {
        if self.active(location) {
            self.cell(sku, location).free().max(0)
        } else {
            0
        }
    }

    fn held_allocs(&self) -> impl Iterator<Item = (&str, &Alloc)> {
        self.reservations
            .iter()
            .filter(|r| r.state == ResState::Held)
            .flat_map(|r| &r.lines)
            .flat_map(|l| l.allocs.iter().map(move |a| (l.sku.as_str(), a)))
    }

    /// Units waiting with no receipt able to bring them at a location: backorders, and the
    /// pre-ordered units of each receipt there beyond what it has still to bring (all of them
    /// once it is closed: cancelled, or received without filling them), which count as
    /// backorders do: in the backorder room of new demand and in `available_to_promise`.
    fn backorder_demand(&self, sku: &str, location: &str) -> i64 {
        let backordered: i64 = self
            .held_allocs()
            .filter(|(s, a)| *s == sku && a.location == location)
            .map(|(_, a)| a.backordered)
            .sum();
        let at_risk: i64 = self
            .receipts
            .iter()
            .filter(|(_, r)| r.sku == sku && r.location == location)
            .map(|(id, r)| (self.preordered_to(id) - r.remainder()).max(0))
            .sum();
        backordered + at_risk
    }

    fn preordered_to(&self, receipt: &str) -> i64 {
        self.held_allocs()
            .filter(|(_, a)| a.receipt.as_deref() == Some(receipt))
            .map(|(_, a)| a.preordered)
            .sum()
    }

    fn level(&self, sku: &str, location: &str) -> Level {
        let cell = self.cell(sku, location);
        let waiting = |f: fn(&Alloc) -> i64| {
            self.held_allocs()
                .filter(|(s, a)| *s == sku && a.location == location)
                .map(|(_, a)| f(a))
                .sum::<i64>()
        };
        Level {
            sku: sku.to_owned(),
            location: location.to_owned(),
            on_hand: cell.on_hand,
            reserved: cell.reserved,
            available: cell.free().max(0),
            safety_stock: cell.safety_stock,
            unsellable: cell.unsellable(),
            damaged: cell.damaged,
            quality_control: cell.quality_control,
            incoming: self
                .receipts
                .values()
                .filter(|r| r.sku == sku && r.location == location)
                .map(Rec::remainder)
                .sum(),
            backorder_limit: cell.backorder_limit,
            backordered: waiting(|a| a.backordered),
            preordered: waiting(|a| a.preordered),
            promise: Vec::new(),
        }
    }

    /// The SKU's total over every location; `promise`: with `available_to_promise`.
    fn total(&self, sku: &str, promise: bool) -> Level {
        let locations: Vec<&String> = self
            .stock
            .get(sku)
            .map(|c| c.keys().collect())
            .unwrap_or_default();
        let mut total = Level {
            sku: sku.to_owned(),
            ..Level::default()
        };
        let mut per_location = 0;
        for location in &locations {
            let l = self.level(sku, location);
            total.on_hand += l.on_hand;
            total.reserved += l.reserved;
            total.safety_stock += l.safety_stock;
            total.unsellable += l.unsellable;
            total.damaged += l.damaged;
            total.quality_control += l.quality_control;
            total.incoming += l.incoming;
            total.backorder_limit += l.backorder_limit;
            total.backordered += l.backordered;
            total.preordered += l.preordered;
            if self.active(location) {
                per_location += l.available;
            }
        }
        // What each active location has: a location short of its safety stock hides
        // nothing elsewhere, and an inactive one's units are not for sale.
        total.available = per_location;
        if promise {
            total.promise = self.promise_per_location(sku, &locations);
        }
        total
    }

    fn location_promise(&self, sku: &str, location: &str) -> Vec<(i64, i64)> {
        self.promise(sku, Some(location), self.cell(sku, location).free())
    }

    /// A location's `available_to_promise` with what one line gets by each date: what it may
    /// hold now, or more where the rest fits one open receipt due by then that has that many
    /// units no pre-order took, and by whose date the location promises the whole line (the
    /// rule `peg` takes a receipt by).
    fn location_promise_lines(&self, sku: &str, location: &str) -> Vec<(i64, i64, i64)> {
        let steps = self.location_promise(sku, location);
        let available = self.cell(sku, location).free().max(0);
        let promised = |day: i64| {
            steps
                .iter()
                .rev()
                .find(|(d, _)| *d <= day)
                .map_or(0, |(_, q)| *q)
        };
        steps
            .iter()
            .map(|&(day, units)| {
                let pegged = self
                    .receipts
                    .iter()
                    .filter(|(_, r)| {
                        r.sku == sku
                            && r.location == location
                            && r.state == RecState::Open
                            && i64::from(r.day) <= day
                    })
                    .map(|(id, r)| {
                        let unpromised = (r.remainder() - self.preordered_to(id)).max(0);
                        (available + unpromised).min(promised(i64::from(r.day)))
                    })
                    .max()
                    .unwrap_or(0);
                (day, units, available.min(units).max(pegged))
            })
            .collect()
    }

    /// The total's `available_to_promise` as the sum of each active location's own, on
    /// every date an open receipt of an active location is due (before a location's first
    /// date, it promises what it has free less what waits there for no open receipt), and the
    /// most one line gets by then: at any one of them, or split over all of them from what
    /// they have available now.
    fn promise_per_location(&self, sku: &str, locations: &[&String]) -> Vec<(i64, i64, i64)> {
        let days: BTreeSet<u32> = self
            .receipts
            .values()
            .filter(|r| r.sku == sku && r.state == RecState::Open && self.active(&r.location))
            .map(|r| r.day)
            .collect();
        days.into_iter()
            .map(|day| {
                let by_then: Vec<(i64, i64)> = locations
                    .iter()
                    .filter(|l| self.active(l))
                    .map(|l| {
                        let steps = self.location_promise_lines(sku, l);
                        steps
                            .iter()
                            .rev()
                            .find(|(d, ..)| *d <= i64::from(day))
                            .map_or_else(
                                || {
                                    let units = (self.cell(sku, l).free()
                                        - self.backorder_demand(sku, l))
                                    .max(0);
                                    (units, self.cell(sku, l).free().max(0).min(units))
                                },
                                |(_, q, line)| (*q, *line),
                            )
                    })
                    .collect();
                // A line split over the active locations takes what each has available now.
                let units: i64 = by_then.iter().map(|(q, _)| q).sum();
                let split: i64 = locations
                    .iter()
                    .filter(|l| self.active(l))
                    .map(|l| self.cell(sku, l).free().max(0))
                    .sum();
                (
                    i64::from(day),
                    units,
                    by_then
                        .iter()
                        .map(|(_, line)| *line)
                        .max()
                        .unwrap_or(0)
                        .max(split.min(units)),
                )
            })
            .collect()
    }

    /// `available_to_promise` of a SKU's total (`location` None) or one location's: per
    /// date an open receipt is due, what is free now (`free`: a safety stock not yet met
    /// counts against it, so a receipt refills the buffer before it is promised), less what
    /// backorders wait for, plus what receipts due by then bring that no pre-order took.
    fn promise(&self, sku: &str, location: Option<&str>, free: i64) -> Vec<(i64, i64)> {
        let here = |l: &str| location.is_none_or(|at| at == l);
        let open: Vec<(&String, &Rec)> = self
            .receipts
            .iter()
            .filter(|(_, r)| r.sku == sku && r.state == RecState::Open && here(&r.location))
            .collect();
        let days: BTreeSet<u32> = open.iter().map(|(_, r)| r.day).collect();
        let backorders: i64 = self
            .stock
            .get(sku)
            .map(|cells| {
                cells
                    .keys()
                    .filter(|l| here(l))
                    .map(|l| self.backorder_demand(sku, l))
                    .sum()
            })
            .unwrap_or(0);
        days.into_iter()
            .map(|day| {
                let brought: i64 = open
                    .iter()
                    .filter(|(_, r)| r.day <= day)
                    .map(|(id, r)| (r.remainder() - self.preordered_to(id)).max(0))
                    .sum();
                (i64::from(day), (free - backorders + brought).max(0))
            })
            .collect()
    }

    // ---- the calls ----

    /// The outcomes `call` may have; `None` when it cannot be made (the reservation it is
    /// about was never made: a shrink removed its `Reserve`).
    pub fn step(&self, call: &Call) -> Option<Vec<Expected>> {
        if let Some(reservation) = call.reservation()
            && !self.made_by.contains_key(reservation)
        {
            return None;
        }
        // A malformed request is refused before anything is read, its key included: a
        // policy that sets nothing, an adjustment of zero units.
        if matches!(
            call,
            Call::SetStockPolicy {
                safety_stock: None,
                backorder_limit: None,
                ..
            } | Call::AdjustStock { delta: 0, .. }
        ) {
            return Some(vec![
                self.same(Answer::refused(Code::InvalidArgument, "INVALID_ARGUMENT")),
            ]);
        }
        // A key used before: its stored outcome, or ALREADY_EXISTS for another request.
        if let Some(key) = call.key()
            && let Some(stored) = self.keys.get(key)
        {
            if stored.fingerprint() != call.fingerprint() {
                let reused = self.same(Answer::refused(
                    Code::AlreadyExists,
                    "IDEMPOTENCY_KEY_REUSED",
                ));
                if let Stored::Unsettled { .. } = stored {
                    // The refusal may not have been kept: then the key is free.
                    let mut fresh = self.clone();
                    fresh.keys.remove(key);
                    let mut outcomes = vec![reused];
                    outcomes.extend(fresh.run(call));
                    return Some(outcomes);
                }
                return Some(vec![reused]);
            }
            let answer = match stored {
                Stored::Fixed { answer, .. } => answer.clone(),
                Stored::Unsettled { answer, .. } => {
                    // Either replayed, or run again as a first use.
                    let mut fresh = self.clone();
                    fresh.keys.remove(key);
                    let mut outcomes = vec![self.same(answer.clone())];
                    outcomes.extend(fresh.run(call));
                    return Some(outcomes);
                }
                Stored::Reservation { index, .. } => {
                    Answer::Reservation(self.reservations[*index].view())
                }
                Stored::Order { order, .. } => Answer::Reservations(self.order_views(order)),
            };
            return Some(vec![self.same(answer)]);
        }
        Some(self.run(call))
    }

    fn same(&self, answer: Answer) -> Expected {
        Expected {
            answer,
            next: self.clone(),
            lapse: false,
        }
    }

    /// A call whose key (if any) is unused.
    fn run(&self, call: &Call) -> Vec<Expected> {
        let mut next = self.clone();
        match call {
            Call::UpsertLocation {
                location,
                priority,
                active,
            } => {
                next.places.insert(
                    location.clone(),
                    Place {
                        priority: *priority,
                        active: *active,
                    },
                );
                vec![next.done(Answer::Location(LocationView {
                    location: location.clone(),
                    priority: *priority,
                    active: *active,
                }))]
            }
            Call::AdjustStock {
                sku,
                location,
                delta,
                state,
                ..
            } => next.adjust(
                call,
                sku,
                location,
                *delta,
                state.unwrap_or(State::Sellable),
            ),
            Call::SetStock {
                sku,
                location,
                on_hand,
                ..
            } => next.set_stock(call, sku, location, *on_hand),
            Call::SetStockPolicy {
                sku,
                location,
                safety_stock,
                backorder_limit,
                ..
            } => next.set_policy(call, sku, location, *safety_stock, *backorder_limit),
            Call::MoveStockState {
                sku,
                location,
                quantity,
                from,
                to,
                ..
            } => next.move_state(call, sku, location, *quantity, *from, *to),
            Call::Reserve { .. } => next.reserve(call),
            Call::Confirm {
                reservation, lines, ..
            } => next.confirm(call, reservation, lines),
            Call::Release {
                reservation, lines, ..
            } => next.release(call, reservation, lines),
            Call::Lapse { reservation } => {
                let index = next.made_by[reservation];
                if next.reservations[index].state != ResState::Held {
                    let answer = invalid_state(next.reservations[index].state);
                    return vec![next.done(answer)];
                }
                let answer = Answer::Reservation(next.reservations[index].view());
                // Waiting units are a commitment, not a checkout hold: a hold with units
                // waiting lasts until the wait horizon (which no run reaches), and no ttl
                // moves it, so it does not lapse.
                let waits = next.reservations[index].waiting() > 0;
                if !waits {
                    next.end_hold(index, ResState::Expired);
                }
                vec![Expected {
                    answer,
                    next,
                    lapse: !waits,
                }]
            }
            Call::GetReservation { reservation } => {
                let index = next.made_by[reservation];
                let answer = Answer::Reservation(next.reservations[index].view());
                vec![next.done(answer)]
            }
            Call::CancelOrder { order, .. } => {
                next.cancelled.insert(order.clone());
                for index in 0..next.reservations.len() {
                    let res = &next.reservations[index];
                    if &res.order == order && res.state == ResState::Held {
                        next.end_hold(index, ResState::Released);
                    }
                }
                next.store(
                    call,
                    Stored::Order {
                        fingerprint: call.fingerprint(),
                        order: order.clone(),
                    },
                );
                let answer = Answer::Reservations(next.order_views(order));
                vec![next.done(answer)]
            }
            Call::ExpectStock {
                receipt,
                sku,
                location,
                quantity,
                day,
                ..
            } => next.expect_stock(call, receipt, sku, location, *quantity, *day),
            Call::ReceiveStock {
                receipt,
                quantity,
                state,
                ..
            } => next.receive(call, receipt, *quantity, *state),
            Call::CancelReceipt { receipt, .. } => next.cancel_receipt(call, receipt),
        }
    }

    fn done(self, answer: Answer) -> Expected {
        Expected {
            answer,
            next: self,
            lapse: false,
        }
    }

    fn store(&mut self, call: &Call, stored: Stored) {
        if let Some(key) = call.key() {
            self.keys.insert(key.to_owned(), stored);
        }
    }

    /// A final answer stored with the call's key.
    fn fixed(mut self, call: &Call, answer: Answer) -> Expected {
        self.store(
            call,
            Stored::Fixed {
                fingerprint: call.fingerprint(),
                answer: answer.clone(),
            },
        );
        self.done(answer)
    }

    /// Refusals, any of which the server may give: each stored with the key as unsettled.
    fn refusals(self, call: &Call, refusals: &[(Code, &str)], stored: bool) -> Vec<Expected> {
        refusals
            .iter()
            .map(|(code, reason)| {
                let answer = Answer::refused(*code, reason);
                let mut next = self.clone();
                if stored {
                    next.store(
                        call,
                        Stored::Unsettled {
                            fingerprint: call.fingerprint(),
                            answer: answer.clone(),
                        },
                    );
                }
                next.done(answer)
            })
            .collect()
    }

    /// The refusals of a call about `sku` at `location`, if either is unknown.
    fn unknown(&self, sku: Option<&str>, location: &str) -> Vec<(Code, &'static str)> {
        let mut refusals = Vec::new();
        if let Some(sku) = sku
            && !self.stock.contains_key(sku)
        {
            refusals.push((Code::NotFound, "SKU_NOT_FOUND"));
        }
        if !self.places.contains_key(location) {
            refusals.push((Code::NotFound, "LOCATION_NOT_FOUND"));
        }
        refusals
    }

    fn level_answer(&self, sku: &str) -> Answer {
        Answer::Level(self.total(sku, false))
    }

    fn adjust(
        mut self,
        call: &Call,
        sku: &str,
        location: &str,
        delta: i64,
        state: State,
    ) -> Vec<Expected> {
        if !self.places.contains_key(location) {
            // Not stored with the key: the same call works once the location exists.
            return self.refusals(call, &[(Code::NotFound, "LOCATION_NOT_FOUND")], false);
        }
        if delta < 0 && !self.stock.contains_key(sku) {
            return self.refusals(call, &[(Code::NotFound, "SKU_NOT_FOUND")], true);
        }
        let cell = self.cell(sku, location);
        if delta < 0 {
            let n = -delta;
            let short = match state {
                // Sellable units: STOCK_RESERVED (the reason removals had before states),
                // whether held units or no units at all stand in the way.
                State::Sellable => (n > cell.on_hand - cell.unsellable() - cell.reserved)
                    .then(|| vec![(Code::FailedPrecondition, "STOCK_RESERVED")]),
                State::Damaged => (n > cell.damaged)
                    .then(|| vec![(Code::FailedPrecondition, "INSUFFICIENT_STOCK")]),
                State::QualityControl => (n > cell.quality_control)
                    .then(|| vec![(Code::FailedPrecondition, "INSUFFICIENT_STOCK")]),
            };
            if let Some(refusals) = short {
                return self.refusals(call, &refusals, true);
            }
        }
        let cell = self.cell_mut(sku, location);
        cell.on_hand += delta;
        match state {
            State::Sellable => {}
            State::Damaged => cell.damaged += delta,
            State::QualityControl => cell.quality_control += delta,
        }
        if delta > 0 && state == State::Sellable {
            self.fill(sku, location);
        }
        let answer = self.level_answer(sku);
        vec![self.fixed(call, answer)]
    }

    fn set_stock(mut self, call: &Call, sku: &str, location: &str, on_hand: i64) -> Vec<Expected> {
        if !self.places.contains_key(location) {
            return self.refusals(call, &[(Code::NotFound, "LOCATION_NOT_FOUND")], false);
        }
        let cell = self.cell(sku, location);
        if on_hand < cell.reserved + cell.unsellable() {
            return self.refusals(call, &[(Code::FailedPrecondition, "BELOW_RESERVED")], true);
        }
        let rose = on_hand > cell.on_hand;
        self.cell_mut(sku, location).on_hand = on_hand;
        if rose {
            self.fill(sku, location);
        }
        let answer = self.level_answer(sku);
        vec![self.fixed(call, answer)]
    }

    fn set_policy(
        mut self,
        call: &Call,
        sku: &str,
        location: &str,
        safety_stock: Option<i64>,
        backorder_limit: Option<i64>,
    ) -> Vec<Expected> {
        let unknown = self.unknown(Some(sku), location);
        if !unknown.is_empty() {
            return self.refusals(call, &unknown, true);
        }
        let cell = self.cell_mut(sku, location);
        if let Some(s) = safety_stock {
            cell.safety_stock = s;
        }
        if let Some(l) = backorder_limit {
            cell.backorder_limit = l;
        }
        self.fill(sku, location);
        let answer = self.level_answer(sku);
        vec![self.fixed(call, answer)]
    }

    fn move_state(
        mut self,
        call: &Call,
        sku: &str,
        location: &str,
        quantity: i64,
        from: State,
        to: State,
    ) -> Vec<Expected> {
        let unknown = self.unknown(Some(sku), location);
        if !unknown.is_empty() {
            return self.refusals(call, &unknown, true);
        }
        let cell = self.cell(sku, location);
        let movable = match from {
            State::Sellable => cell.on_hand - cell.unsellable() - cell.reserved,
            State::Damaged => cell.damaged,
            State::QualityControl => cell.quality_control,
        };
        if quantity > movable {
            return self.refusals(
                call,
                &[(Code::FailedPrecondition, "INSUFFICIENT_STOCK")],
                true,
            );
        }
        let cell = self.cell_mut(sku, location);
        match from {
            State::Sellable => {}
            State::Damaged => cell.damaged -= quantity,
            State::QualityControl => cell.quality_control -= quantity,
        }
        match to {
            State::Sellable => {}
            State::Damaged => cell.damaged += quantity,
            State::QualityControl => cell.quality_control += quantity,
        }
        if to == State::Sellable {
            self.fill(sku, location);
        }
        let answer = self.level_answer(sku);
        vec![self.fixed(call, answer)]
    }

    /// Locations a line may use, in strategy order (priority, then id).
    fn candidates(&self, pin: Option<&str>) -> Vec<String> {
        if let Some(pin) = pin {
            return vec![pin.to_owned()];
        }
        let mut active: Vec<(&String, &Place)> =
            self.places.iter().filter(|(_, p)| p.active).collect();
        active.sort_by_key(|(id, p)| (p.priority, (*id).clone()));
        active.into_iter().map(|(id, _)| id.clone()).collect()
    }

    /// Where a line's units come from, or `None` when it cannot be served.
    fn place(
        &self,
        line: &LineSpec,
        split: bool,
        backorder: bool,
        preorder: bool,
    ) -> Option<Vec<Alloc>> {
        let candidates = self.candidates(line.location.as_deref());
        let q = line.quantity;
        if !split {
            if let Some(location) = candidates
                .iter()
                .find(|l| self.available(&line.sku, l) >= q)
            {
                return Some(vec![Alloc::new(location, q)]);
            }
        } else {
            let mut allocs = Vec::new();
            let mut rest = q;
            for location in &candidates {
                let take = self.available(&line.sku, location).min(rest);
                if take > 0 {
                    allocs.push(Alloc::new(location, take));
                    rest -= take;
                }
                if rest == 0 {
                    allocs.sort_by(|a, b| a.location.cmp(&b.location));
                    return Some(allocs);
                }
            }
        }
        if !backorder && !preorder {
            return None;
        }
        for location in &candidates {
            if !self.active(location) {
                continue;
            }
            let held = self.available(&line.sku, location).min(q);
            let rest = q - held;
            let mut alloc = Alloc::new(location, q);
            alloc.held = held;
            if preorder && let Some(receipt) = self.peg(&line.sku, location, held, rest) {
                alloc.preordered = rest;
                alloc.day = Some(self.receipts[&receipt].day);
                alloc.receipt = Some(receipt);
                return Some(vec![alloc]);
            }
            if backorder {
                let cell = self.cell(&line.sku, location);
                let room =
                    cell.on_hand - cell.unsellable() - cell.safety_stock + cell.backorder_limit;
                if cell.reserved + held + self.backorder_demand(&line.sku, location) + rest <= room
                {
                    alloc.backordered = rest;
                    return Some(vec![alloc]);
                }
            }
        }
        None
    }

    /// The open receipt at `location`, due earliest, with `rest` units no pre-order took,
    /// by whose date `available_to_promise` there covers the whole line (`held + rest`): one
    /// rule for what GetStock promises and what Reserve gives, and demand already waiting
    /// served first.
    fn peg(&self, sku: &str, location: &str, held: i64, rest: i64) -> Option<String> {
        let mut open: Vec<(&String, &Rec)> = self
            .receipts
            .iter()
            .filter(|(_, r)| r.sku == sku && r.location == location && r.state == RecState::Open)
            .collect();
        open.sort_by_key(|(id, r)| (r.day, (*id).clone()));
        let promise = self.location_promise(sku, location);
        let promised = |day: u32| {
            promise
                .iter()
                .rev()
                .find(|(d, _)| *d <= i64::from(day))
                .map_or(0, |(_, q)| *q)
        };
        open.into_iter()
            .find(|(id, r)| {
                r.remainder() - self.preordered_to(id) >= rest && promised(r.day) >= held + rest
            })
            .map(|(id, _)| id.clone())
    }

    fn reserve(mut self, call: &Call) -> Vec<Expected> {
        let Call::Reserve {
            order,
            lines,
            allow_split,
            allow_backorder,
            allow_preorder,
            ..
        } = call
        else {
            unreachable!("reserve runs Reserve calls")
        };
        let mut refusals = Vec::new();
        if self.cancelled.contains(order) {
            refusals.push((Code::FailedPrecondition, "ORDER_CANCELLED"));
        }
        if lines.iter().any(|l| !self.stock.contains_key(&l.sku)) {
            refusals.push((Code::NotFound, "SKU_NOT_FOUND"));
        }
        if lines.iter().any(|l| {
            l.location
                .as_ref()
                .is_some_and(|p| !self.places.contains_key(p))
        }) {
            refusals.push((Code::NotFound, "LOCATION_NOT_FOUND"));
        }
        if !refusals.is_empty() {
            return self.stored_refusals(call, &refusals);
        }
        let mut placed = Vec::new();
        for line in lines {
            match self.place(line, *allow_split, *allow_backorder, *allow_preorder) {
                Some(allocs) => placed.push(Line {
                    sku: line.sku.clone(),
                    quantity: line.quantity,
                    allocs,
                }),
                None => {
                    return self.stored_refusals(
                        call,
                        &[(Code::FailedPrecondition, "INSUFFICIENT_STOCK")],
                    );
                }
            }
        }
        placed.sort_by(|a, b| a.sku.cmp(&b.sku));
        for line in &placed {
            for alloc in &line.allocs {
                self.cell_mut(&line.sku, &alloc.location).reserved += alloc.held;
            }
        }
        let res = Res {
            order: order.clone(),
            state: ResState::Held,
            lines: placed,
        };
        let answer = Answer::Reservation(res.view());
        self.reservations.push(res);
        let index = self.reservations.len() - 1;
        if let Some(key) = call.key() {
            self.made_by.insert(key.to_owned(), index);
        }
        vec![self.fixed(call, answer)]
    }

    /// Refusals of a Reserve: stored with the key like a success.
    fn stored_refusals(self, call: &Call, refusals: &[(Code, &str)]) -> Vec<Expected> {
        refusals
            .iter()
            .map(|(code, reason)| self.clone().fixed(call, Answer::refused(*code, reason)))
            .collect()
    }

    fn settle_refused(self, answer: Answer) -> Vec<Expected> {
        // Refusals of a settle are never stored: the key stays free.
        vec![self.done(answer)]
    }

    fn confirm(mut self, call: &Call, reservation: &str, lines: &[LineSpec]) -> Vec<Expected> {
        let index = self.made_by[reservation];
        let res = &self.reservations[index];
        if lines.is_empty() {
            match res.state {
                ResState::Held => {
                    // Without a key, a retry after a lost answer would ship units filled
                    // since: a hold with waiting units is confirmed only under a key.
                    if call.key().is_none() && res.waiting() > 0 {
                        return self.settle_refused(Answer::refused(
                            Code::InvalidArgument,
                            "INVALID_ARGUMENT",
                        ));
                    }
                    if res.held() == 0 {
                        return self
                            .settle_refused(Answer::refused(Code::FailedPrecondition, "NOT_HELD"));
                    }
                }
                ResState::Confirmed if res.released() > 0 => {
                    return self.settle_refused(Answer::refused(
                        Code::FailedPrecondition,
                        "PARTLY_RELEASED",
                    ));
                }
                ResState::Confirmed => {
                    // Changes nothing: like a refusal, it leaves the key free.
                    let answer = Answer::Reservation(self.reservations[index].view());
                    return vec![self.done(answer)];
                }
                state => return self.settle_refused(invalid_state(state)),
            }
            let mut confirmed = Vec::new();
            let res = &mut self.reservations[index];
            for line in &mut res.lines {
                for alloc in &mut line.allocs {
                    if alloc.held > 0 {
                        confirmed.push((line.sku.clone(), alloc.location.clone(), alloc.held));
                        alloc.confirmed += alloc.held;
                        alloc.held = 0;
                    }
                }
            }
            if res.waiting() == 0 {
                res.state = ResState::Confirmed;
            }
            for (sku, location, n) in confirmed {
                let cell = self.cell_mut(&sku, &location);
                cell.on_hand -= n;
                cell.reserved -= n;
            }
        } else {
            if res.state != ResState::Held {
                let state = res.state;
                return self.settle_refused(invalid_state(state));
            }
            let Some(takes) = takes(res, lines) else {
                return self.settle_refused(Answer::refused(Code::FailedPrecondition, "NOT_HELD"));
            };
            for (line, alloc, n) in takes {
                let res = &mut self.reservations[index];
                let sku = res.lines[line].sku.clone();
                let a = &mut res.lines[line].allocs[alloc];
                a.held -= n;
                a.confirmed += n;
                let location = a.location.clone();
                let cell = self.cell_mut(&sku, &location);
                cell.on_hand -= n;
                cell.reserved -= n;
            }
            let res = &mut self.reservations[index];
            if res.held() == 0 && res.waiting() == 0 {
                res.state = ResState::Confirmed;
            }
        }
        self.store_settle(call, index);
        let answer = Answer::Reservation(self.reservations[index].view());
        vec![self.done(answer)]
    }

    fn release(mut self, call: &Call, reservation: &str, lines: &[LineSpec]) -> Vec<Expected> {
        let index = self.made_by[reservation];
        let res = &self.reservations[index];
        if lines.is_empty() {
            match res.state {
                ResState::Held => {}
                // Changes nothing: like a refusal, it leaves the key free.
                ResState::Released | ResState::Expired => {
                    let answer = Answer::Reservation(self.reservations[index].view());
                    return vec![self.done(answer)];
                }
                ResState::Confirmed if res.released() > 0 => {
                    let answer = Answer::Reservation(self.reservations[index].view());
                    return vec![self.done(answer)];
                }
                ResState::Confirmed => {
                    return self.settle_refused(invalid_state(ResState::Confirmed));
                }
            }
            self.end_hold(index, ResState::Released);
            self.store_settle(call, index);
            let answer = Answer::Reservation(self.reservations[index].view());
            return vec![self.done(answer)];
        }
        if res.state != ResState::Held {
            let state = res.state;
            return self.settle_refused(invalid_state(state));
        }
        let Some(takes) = takes(res, lines) else {
            return self.settle_refused(Answer::refused(Code::FailedPrecondition, "NOT_HELD"));
        };
        let mut freed = Vec::new();
        for (line, alloc, n) in takes {
            let res = &mut self.reservations[index];
            let sku = res.lines[line].sku.clone();
            let a = &mut res.lines[line].allocs[alloc];
            a.held -= n;
            a.released += n;
            let location = a.location.clone();
            self.cell_mut(&sku, &location).reserved -= n;
            freed.push((sku, location, n));
        }
        let res = &mut self.reservations[index];
        if res.held() == 0 && res.waiting() == 0 {
            res.state = if res.confirmed() > 0 {
                ResState::Confirmed
            } else {
                ResState::Released
            };
        }
        self.store_settle(call, index);
        // The answer is the reservation before the fill its freed units start.
        let answer = Answer::Reservation(self.reservations[index].view());
        self.fill_freed(&freed);
        vec![self.done(answer)]
    }

    fn store_settle(&mut self, call: &Call, index: usize) {
        self.store(
            call,
            Stored::Reservation {
                fingerprint: call.fingerprint(),
                index,
            },
        );
    }

    fn order_views(&self, order: &str) -> Vec<ReservationView> {
        self.reservations
            .iter()
            .filter(|r| r.order == order)
            .map(Res::view)
            .collect()
    }

    fn receipt_view(&self, id: &str, level: bool) -> ReceiptView {
        let r = &self.receipts[id];
        ReceiptView {
            receipt: id.to_owned(),
            sku: r.sku.clone(),
            location: r.location.clone(),
            quantity: r.quantity,
            received: r.received,
            preordered: self.preordered_to(id),
            remainder: r.remainder(),
            state: match r.state {
                RecState::Open => "OPEN",
                RecState::Received => "RECEIVED",
                RecState::Cancelled => "CANCELLED",
            },
            day: i64::from(r.day),
            level: level.then(|| self.total(&r.sku, false)),
        }
    }

    fn expect_stock(
        mut self,
        call: &Call,
        receipt: &str,
        sku: &str,
        location: &str,
        quantity: i64,
        day: u32,
    ) -> Vec<Expected> {
        let mut refusals = self.unknown(Some(sku), location);
        if self.receipts.contains_key(receipt) {
            refusals.push((Code::AlreadyExists, "RECEIPT_EXISTS"));
        }
        if !refusals.is_empty() {
            return self.refusals(call, &refusals, true);
        }
        self.cell_mut(sku, location);
        self.receipts.insert(
            receipt.to_owned(),
            Rec {
                sku: sku.to_owned(),
                location: location.to_owned(),
                quantity,
                received: 0,
                day,
                state: RecState::Open,
            },
        );
        let answer = Answer::Receipt(self.receipt_view(receipt, true));
        vec![self.fixed(call, answer)]
    }

    /// Units of an open receipt arrive. Sellable ones go to its own pre-orders first (see
    /// [`Model::fill_received`]); ones that arrive in quality control or damaged are on hand
    /// and unsellable, and fill nothing.
    fn receive(
        mut self,
        call: &Call,
        receipt: &str,
        quantity: i64,
        state: Option<State>,
    ) -> Vec<Expected> {
        let Some(r) = self.receipts.get_mut(receipt) else {
            return self.refusals(call, &[(Code::NotFound, "RECEIPT_NOT_FOUND")], true);
        };
        if r.state != RecState::Open {
            return self.refusals(call, &[(Code::FailedPrecondition, "RECEIPT_CLOSED")], true);
        }
        r.received += quantity;
        if r.received >= r.quantity {
            r.state = RecState::Received;
        }
        let (sku, location) = (r.sku.clone(), r.location.clone());
        let cell = self.cell_mut(&sku, &location);
        cell.on_hand += quantity;
        match state {
            None | Some(State::Sellable) => self.fill_received(&sku, &location, receipt, quantity),
            Some(State::QualityControl) => cell.quality_control += quantity,
            Some(State::Damaged) => cell.damaged += quantity,
        }
        let answer = Answer::Receipt(self.receipt_view(receipt, true));
        vec![self.fixed(call, answer)]
    }

    fn cancel_receipt(mut self, call: &Call, receipt: &str) -> Vec<Expected> {
        let Some(r) = self.receipts.get_mut(receipt) else {
            return self.refusals(call, &[(Code::NotFound, "RECEIPT_NOT_FOUND")], true);
        };
        match r.state {
            RecState::Received => {
                return self.refusals(call, &[(Code::FailedPrecondition, "RECEIPT_CLOSED")], true);
            }
            RecState::Cancelled => {}
            RecState::Open => r.state = RecState::Cancelled,
        }
        let answer = Answer::Receipt(self.receipt_view(receipt, true));
        vec![self.fixed(call, answer)]
    }

    /// Ends a hold (see [`Res::end`]): its held units go back to their locations, which
    /// then fill the holds waiting there.
    fn end_hold(&mut self, index: usize, ended: ResState) {
        let freed = self.reservations[index].end(ended);
        for (sku, location, n) in &freed {
            self.cell_mut(sku, location).reserved -= n;
        }
        self.fill_freed(&freed);
    }

    fn fill_freed(&mut self, freed: &[(String, String, i64)]) {
        let places: BTreeSet<(String, String)> = freed
            .iter()
            .map(|(sku, location, _)| (sku.clone(), location.clone()))
            .collect();
        for (sku, location) in places {
            self.fill(&sku, &location);
        }
    }

    /// Units that arrived for `receipt` go to its own pre-orders first, oldest reservation
    /// first, up to the units that arrived, whatever the safety stock: those units were
    /// promised to them (a safety stock keeps units from new demand, not from a promise made
    /// before). Then the rest fills like any other freed units.
    fn fill_received(&mut self, sku: &str, location: &str, receipt: &str, mut units: i64) {
        for res in &mut self.reservations {
            if res.state != ResState::Held {
                continue;
            }
            for line in &mut res.lines {
                for alloc in &mut line.allocs {
                    if units == 0 || alloc.receipt.as_deref() != Some(receipt) {
                        continue;
                    }
                    let n = alloc.preordered.min(units);
                    alloc.preordered -= n;
                    alloc.held += n;
                    units -= n;
                    let cell = self
                        .stock
                        .get_mut(sku)
                        .and_then(|c| c.get_mut(location))
                        .expect("a receipt's row exists");
                    cell.reserved += n;
                }
            }
        }
        self.fill(sku, location);
    }

    /// Waiting units at (SKU, location) become held while units are free there, oldest
    /// reservation first (a line in part when too few are free, and the ones after it wait).
    fn fill(&mut self, sku: &str, location: &str) {
        for r in 0..self.reservations.len() {
            if self.reservations[r].state != ResState::Held {
                continue;
            }
            for l in 0..self.reservations[r].lines.len() {
                if self.reservations[r].lines[l].sku != sku {
                    continue;
                }
                for a in 0..self.reservations[r].lines[l].allocs.len() {
                    let free = self.cell(sku, location).free();
                    if free <= 0 {
                        return;
                    }
                    let alloc = &mut self.reservations[r].lines[l].allocs[a];
                    if alloc.location != location || alloc.waiting() == 0 {
                        continue;
                    }
                    let take = free.min(alloc.waiting());
                    let from_backorder = take.min(alloc.backordered);
                    alloc.backordered -= from_backorder;
                    alloc.preordered -= take - from_backorder;
                    alloc.held += take;
                    self.cell_mut(sku, location).reserved += take;
                }
            }
        }
    }
}

fn invalid_state(state: ResState) -> Answer {
    let _ = state;
    Answer::refused(Code::FailedPrecondition, "INVALID_RESERVATION_STATE")
}

/// Which held units the lines of a partial confirm or release take: `(line, allocation,
/// units)`, from the named location's allocation or else the line's allocations by
/// location id; `None` when a line asks for more than is held (NOT_HELD).
fn takes(res: &Res, lines: &[LineSpec]) -> Option<Vec<(usize, usize, i64)>> {
    let mut takes = Vec::new();
    for spec in lines {
        let l = res.lines.iter().position(|line| line.sku == spec.sku)?;
        let mut rest = spec.quantity;
        for (a, alloc) in res.lines[l].allocs.iter().enumerate() {
            if spec
                .location
                .as_ref()
                .is_some_and(|loc| *loc != alloc.location)
            {
                continue;
            }
            let take = alloc.held.min(rest);
            if take > 0 {
                takes.push((l, a, take));
                rest -= take;
            }
        }
        if rest > 0 {
            return None;
        }
    }
    Some(takes)
}
