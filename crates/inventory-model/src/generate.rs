//! Seeded sequences of calls, weighted to reach the edges: few SKUs and small quantities, so
//! stock is near zero most of the time; buffers, damaged units, receipts received in parts
//! and cancelled, backorders at their limit, holds that run out, keys replayed with the same
//! and with another request. Each seed also draws its own weights (swarm testing: a run that
//! hardly ever restocks reaches other states than one that always does).

use crate::{
    call::{Call, LineSpec, State},
    model::Model,
    rng::Rng,
};

const SKUS: [&str; 3] = ["MUG", "JUG", "LAMP"];
const LOCATIONS: [&str; 2] = ["north", "south"];
const ORDERS: [&str; 5] = ["o1", "o2", "o3", "o4", "o5"];

/// What a run is made of.
#[derive(Debug, Clone, Copy)]
pub struct Profile {
    /// Calls per sequence.
    pub calls: usize,
    /// Weight of holds let run out (each costs about a second of waiting).
    pub lapse_weight: u64,
    /// Whether a Reserve may wait for stock (`allow_backorder`, `allow_preorder`).
    pub waiting: bool,
}

impl Default for Profile {
    fn default() -> Self {
        Profile {
            calls: 40,
            lapse_weight: 1,
            waiting: true,
        }
    }
}

/// Generates calls one at a time from the model's current state.
#[derive(Debug)]
pub struct Generator {
    rng: Rng,
    waiting: bool,
    weights: Vec<u64>,
    skus: Vec<&'static str>,
    locations: bool,
    next_key: u32,
    next_receipt: u32,
    history: Vec<Call>,
    /// The rest of a story begun by an earlier `next` (see `Kind::Queue`).
    pending: std::collections::VecDeque<Call>,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Location,
    Adjust,
    Set,
    Policy,
    Move,
    Reserve,
    Confirm,
    Release,
    Lapse,
    Get,
    Cancel,
    Expect,
    Receive,
    CancelReceipt,
    Replay,
    Conflict,
    Queue,
}

const KINDS: [Kind; 17] = [
    Kind::Location,
    Kind::Adjust,
    Kind::Set,
    Kind::Policy,
    Kind::Move,
    Kind::Reserve,
    Kind::Confirm,
    Kind::Release,
    Kind::Lapse,
    Kind::Get,
    Kind::Cancel,
    Kind::Expect,
    Kind::Receive,
    Kind::CancelReceipt,
    Kind::Replay,
    Kind::Conflict,
    Kind::Queue,
];

impl Generator {
    pub fn new(seed: u64, profile: Profile) -> Generator {
        let mut rng = Rng::new(seed);
        // Swarm: each kind's weight is drawn per seed, some kinds switched off.
        let base: [u64; 17] = [
            2,
            12,
            4,
            5,
            4,
            22,
            8,
            7,
            profile.lapse_weight,
            2,
            3,
            6,
            6,
            3,
            5,
            2,
            3,
        ];
        let weights = base
            .iter()
            .enumerate()
            .map(|(i, w)| {
                // Stock and Reserve are always there; the rest may be off for this seed.
                if i != 1 && i != 5 && *w > 0 && rng.chance(12) {
                    0
                } else {
                    w * rng.range(1, 3) as u64
                }
            })
            .collect();
        let skus = SKUS[..rng.range(1, 3) as usize].to_vec();
        let locations = rng.chance(50);
        Generator {
            rng,
            waiting: profile.waiting,
            weights,
            skus,
            locations,
            next_key: 0,
            next_receipt: 0,
            history: Vec::new(),
            pending: Default::default(),
        }
    }

    /// A whole sequence of `profile.calls` calls, stepping a model of the documented rules
    /// to pick arguments that mean something (live holds, open receipts).
    pub fn sequence(seed: u64, profile: Profile) -> Vec<Call> {
        let mut generator = Generator::new(seed, profile);
        let mut model = Model::new(Default::default());
        let mut calls = Vec::new();
        while calls.len() < profile.calls {
            let call = generator.next(&model);
            if let Some(outcomes) = model.step(&call) {
                model = outcomes.into_iter().next().expect("an outcome").next;
                calls.push(call);
            }
        }
        calls
    }

    /// A sequential prefix of `profile.calls` calls, then `clients` lists of up to
    /// `per_client` calls each, to be sent at once (one list per client, each in order). The
    /// lists name only reservations the prefix made, never let a hold run out, and now and
    /// then repeat another client's call under its key (two copies of one request racing).
    pub fn concurrent(
        seed: u64,
        profile: Profile,
        clients: usize,
        per_client: usize,
    ) -> (Vec<Call>, Vec<Vec<Call>>) {
        let profile = Profile {
            lapse_weight: 0,
            ..profile
        };
        let mut generator = Generator::new(seed, profile);
        generator.weights[8] = 0;
        let mut model = Model::new(Default::default());
        let mut prefix = Vec::new();
        while prefix.len() < profile.calls {
            let call = generator.next(&model);
            if let Some(outcomes) = model.step(&call) {
                model = outcomes.into_iter().next().expect("an outcome").next;
                prefix.push(call);
            }
        }
        let mut lists: Vec<Vec<Call>> = vec![Vec::new(); clients];
        for _ in 0..per_client {
            for c in 0..clients {
                let copy = c > 0 && generator.rng.chance(15) && !lists[c - 1].is_empty();
                let call = if copy {
                    let earlier = &lists[c - 1];
                    earlier[generator.rng.range(0, earlier.len() as i64 - 1) as usize].clone()
                } else {
                    generator.next(&model)
                };
                lists[c].push(call);
            }
        }
        (prefix, lists)
    }

    /// A day of 2030 no receipt of the run is due on (one receipt per day keeps "due
    /// earliest" free of ties).
    fn free_day(&mut self, used: &std::collections::BTreeSet<u32>) -> u32 {
        let mut day = self.rng.range(1, 365) as u32;
        while used.contains(&day) {
            day = day % 365 + 1;
        }
        day
    }

    fn key(&mut self) -> String {
        self.next_key += 1;
        format!("k{}", self.next_key)
    }

    /// A SKU of this run: mostly one that exists (a call about a missing SKU is one answer,
    /// NOT_FOUND, and the generator would spend half its calls there otherwise).
    fn sku(&mut self, model: &Model) -> String {
        let existing = model.skus();
        if !existing.is_empty() && self.rng.chance(85) {
            return self.rng.pick(&existing).clone();
        }
        (*self.rng.pick(&self.skus)).to_owned()
    }

    fn location(&mut self, model: &Model) -> String {
        if !self.locations || self.rng.chance(60) {
            return "default".to_owned();
        }
        let known = model.locations();
        if self.rng.chance(10) {
            // Perhaps not created yet.
            return (*self.rng.pick(&LOCATIONS)).to_owned();
        }
        self.rng.pick(&known).clone()
    }

    fn state(&mut self) -> State {
        *self
            .rng
            .pick(&[State::Sellable, State::Damaged, State::QualityControl])
    }

    /// The next call for a model in `model`'s state.
    pub fn next(&mut self, model: &Model) -> Call {
        if let Some(call) = self.pending.pop_front() {
            self.history.push(call.clone());
            return call;
        }
        loop {
            let kind = KINDS[self.rng.weighted(&self.weights)];
            if let Some(call) = self.make(kind, model) {
                self.history.push(call.clone());
                return call;
            }
        }
    }

    fn make(&mut self, kind: Kind, model: &Model) -> Option<Call> {
        let held: Vec<String> = model
            .reservations()
            .into_iter()
            .filter(|(_, held)| *held)
            .map(|(k, _)| k)
            .collect();
        let any_res: Vec<String> = model.reservations().into_iter().map(|(k, _)| k).collect();
        Some(match kind {
            Kind::Location => {
                if !self.locations {
                    return None;
                }
                Call::UpsertLocation {
                    location: (*self.rng.pick(&LOCATIONS)).to_owned(),
                    priority: self.rng.range(-2, 2) as i32,
                    active: self.rng.chance(80),
                }
            }
            Kind::Adjust => {
                let delta = if self.rng.chance(75) {
                    self.rng.range(1, 6)
                } else {
                    -self.rng.range(1, 4)
                };
                Call::AdjustStock {
                    key: self.key(),
                    sku: self.sku(model),
                    location: self.location(model),
                    delta,
                    state: if self.rng.chance(25) {
                        Some(self.state())
                    } else {
                        None
                    },
                }
            }
            Kind::Set => Call::SetStock {
                key: self.key(),
                sku: self.sku(model),
                location: self.location(model),
                on_hand: self.rng.range(0, 8),
            },
            Kind::Policy => Call::SetStockPolicy {
                key: self.key(),
                sku: self.sku(model),
                location: self.location(model),
                safety_stock: self.rng.chance(60).then(|| self.rng.range(0, 4)),
                backorder_limit: self.rng.chance(70).then(|| self.rng.range(0, 6)),
            },
            Kind::Move => {
                let from = self.state();
                let mut to = self.state();
                while to == from {
                    to = self.state();
                }
                Call::MoveStockState {
                    key: self.key(),
                    sku: self.sku(model),
                    location: self.location(model),
                    quantity: self.rng.range(1, 3),
                    from,
                    to,
                }
            }
            Kind::Reserve => {
                let count = if self.rng.chance(75) { 1 } else { 2 };
                let mut skus: Vec<String> = if self.rng.chance(90) && !model.skus().is_empty() {
                    model.skus()
                } else {
                    self.skus.iter().map(|s| (*s).to_owned()).collect()
                };
                let mut lines = Vec::new();
                for _ in 0..count.min(skus.len()) {
                    let i = self.rng.range(0, skus.len() as i64 - 1) as usize;
                    let sku = skus.remove(i);
                    let location =
                        (self.locations && self.rng.chance(15)).then(|| self.location(model));
                    lines.push(LineSpec {
                        sku,
                        quantity: self.rng.range(1, 5),
                        location,
                    });
                }
                let waits = self.rng.chance(55) && self.waiting;
                Call::Reserve {
                    key: self.key(),
                    order: (*self.rng.pick(&ORDERS)).to_owned(),
                    lines,
                    allow_split: self.locations && self.rng.chance(30),
                    allow_backorder: waits && self.rng.chance(60),
                    allow_preorder: waits && self.rng.chance(60),
                }
            }
            Kind::Confirm | Kind::Release => {
                let pool = if self.rng.chance(85) && !held.is_empty() {
                    &held
                } else {
                    &any_res
                };
                if pool.is_empty() {
                    return None;
                }
                let reservation = self.rng.pick(pool).clone();
                let (key, lines) = if self.rng.chance(35) {
                    let mut lines = Vec::new();
                    for (sku, held, _) in model.lines_of(&reservation) {
                        if lines.len() == 2 || (held == 0 && !self.rng.chance(20)) {
                            continue;
                        }
                        let quantity = if self.rng.chance(85) {
                            self.rng.range(1, held.max(1))
                        } else {
                            held + 1
                        };
                        lines.push(LineSpec {
                            sku,
                            quantity,
                            location: None,
                        });
                    }
                    if lines.is_empty() {
                        return None;
                    }
                    (Some(self.key()), lines)
                } else {
                    (self.rng.chance(50).then(|| self.key()), Vec::new())
                };
                if matches!(kind, Kind::Confirm) {
                    Call::Confirm {
                        reservation,
                        key,
                        lines,
                    }
                } else {
                    Call::Release {
                        reservation,
                        key,
                        lines,
                    }
                }
            }
            Kind::Lapse => {
                let pool = if held.is_empty() { &any_res } else { &held };
                if pool.is_empty() {
                    return None;
                }
                Call::Lapse {
                    reservation: self.rng.pick(pool).clone(),
                }
            }
            Kind::Get => {
                if any_res.is_empty() {
                    return None;
                }
                Call::GetReservation {
                    reservation: self.rng.pick(&any_res).clone(),
                }
            }
            Kind::Cancel => Call::CancelOrder {
                key: self.key(),
                order: (*self.rng.pick(&ORDERS)).to_owned(),
            },
            Kind::Expect => {
                self.next_receipt += 1;
                let used = model.receipt_days();
                let day = self.free_day(&used);
                Call::ExpectStock {
                    key: self.key(),
                    receipt: format!("po{}", self.next_receipt),
                    sku: self.sku(model),
                    location: self.location(model),
                    quantity: self.rng.range(1, 6),
                    day,
                }
            }
            Kind::Receive | Kind::CancelReceipt => {
                let receipts = model.receipts();
                let open: Vec<String> = receipts
                    .iter()
                    .filter(|(_, open)| *open)
                    .map(|(id, _)| id.clone())
                    .collect();
                let receipt = if !open.is_empty() && self.rng.chance(85) {
                    self.rng.pick(&open).clone()
                } else if !receipts.is_empty() && self.rng.chance(70) {
                    self.rng.pick(&receipts).0.clone()
                } else {
                    "po-none".to_owned()
                };
                if matches!(kind, Kind::Receive) {
                    let state = if self.rng.chance(15) {
                        Some(State::QualityControl)
                    } else if self.rng.chance(5) {
                        Some(State::Sellable)
                    } else {
                        None
                    };
                    Call::ReceiveStock {
                        key: self.key(),
                        receipt,
                        quantity: self.rng.range(1, 4),
                        state,
                    }
                } else {
                    Call::CancelReceipt {
                        key: self.key(),
                        receipt,
                    }
                }
            }
            Kind::Replay => {
                // The same request again under its key (a retry after a lost answer).
                let keys = model.replayable_keys();
                let earlier: Vec<&Call> = self
                    .history
                    .iter()
                    .filter(|c| c.key().is_some_and(|k| keys.contains(k)))
                    .collect();
                if earlier.is_empty() {
                    return None;
                }
                (*self.rng.pick(&earlier)).clone()
            }
            Kind::Queue => {
                // A story: a backorder waits at `default`, a receipt is expected, a younger
                // pre-order pegs to it, and part of it arrives (whose units go first to its
                // own pre-orders, then oldest first).
                if !self.waiting {
                    return None;
                }
                let sku = self.sku(model);
                let free = model
                    .levels()
                    .get(&(sku.clone(), "default".to_owned()))
                    .map_or(0, |level| level.available);
                self.next_receipt += 1;
                let receipt = format!("po{}", self.next_receipt);
                let used = model.receipt_days();
                let day = self.free_day(&used);
                let line = |quantity| {
                    vec![LineSpec {
                        sku: sku.clone(),
                        quantity,
                        location: None,
                    }]
                };
                let story = [
                    Call::SetStockPolicy {
                        key: self.key(),
                        sku: sku.clone(),
                        location: "default".into(),
                        safety_stock: None,
                        backorder_limit: Some(self.rng.range(2, 5)),
                    },
                    Call::Reserve {
                        key: self.key(),
                        order: (*self.rng.pick(&ORDERS)).to_owned(),
                        lines: line(free + self.rng.range(1, 2)),
                        allow_split: false,
                        allow_backorder: true,
                        allow_preorder: false,
                    },
                    Call::ExpectStock {
                        key: self.key(),
                        receipt: receipt.clone(),
                        sku: sku.clone(),
                        location: "default".into(),
                        quantity: self.rng.range(2, 5),
                        day,
                    },
                    Call::Reserve {
                        key: self.key(),
                        order: (*self.rng.pick(&ORDERS)).to_owned(),
                        lines: line(self.rng.range(1, 3)),
                        allow_split: false,
                        allow_backorder: false,
                        allow_preorder: true,
                    },
                    Call::ReceiveStock {
                        key: self.key(),
                        receipt,
                        quantity: self.rng.range(1, 4),
                        state: None,
                    },
                ];
                let mut story = story.into_iter();
                let first = story.next().expect("a story has calls");
                self.pending.extend(story);
                first
            }
            Kind::Conflict => {
                // Another request under a key used before: stored (ALREADY_EXISTS), or left
                // free by a call that changed nothing (it runs). Mostly the earlier request
                // with one field changed, else a stock change.
                let keyed: Vec<Call> = self
                    .history
                    .iter()
                    .filter(|c| c.key().is_some())
                    .cloned()
                    .collect();
                if keyed.is_empty() {
                    return None;
                }
                let earlier = self.rng.pick(&keyed).clone();
                match earlier.variant() {
                    Some(variant) if self.rng.chance(70) => variant,
                    _ => {
                        let key = earlier.key().expect("a keyed call").to_owned();
                        self.make(Kind::Adjust, model)?.with_key(&key)
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{Generator, Profile};

    #[test]
    fn a_seed_gives_the_same_sequence() {
        let a = Generator::sequence(42, Profile::default());
        let b = Generator::sequence(42, Profile::default());
        assert_eq!(a, b);
        assert_eq!(a.len(), Profile::default().calls);
    }
}
