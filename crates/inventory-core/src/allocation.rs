//! Allocation: which locations a Reserve line's units come from, decided as a pure function
//! of the SKU's rows as its transaction locked them (the total, and one row per location).
//!
//! - Only active locations are allocated from. A pinned line is served by its location
//!   alone; an unknown pinned location is refused as such, an inactive one has nothing
//!   available.
//! - [`AllocationStrategy::Priority`]: locations by `priority` (lowest first), then id.
//!   [`AllocationStrategy::MostAvailable`]: by available units (most first), then priority,
//!   then id.
//! - Without split, a line is served whole by the first location in that order that has all
//!   its units; with split, it takes what each location has, in that order, until it is
//!   served. When it cannot be served, the shortfall names what is available over every
//!   location the line could have used.
//! - Every unit placed moves the location's `reserved` and the SKU's total, and each
//!   (line, location) is one movement: one SKU version.

use std::time::SystemTime;

use crate::{
    domain::{
        AllocationPolicy, AllocationStrategy, FenceToken, Line, Location, LocationId, Peg, Receipt,
        ReceiptState, States, StockLevel,
    },
    error::Shortfall,
};

/// One SKU's stock as a transaction locked it: its total (with its lease fence) and its
/// rows per location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkuStock {
    /// The SKU's total (`location: None`).
    pub total: StockLevel,
    pub fence: FenceToken,
    /// The database's clock once the SKU's row was locked.
    pub now: SystemTime,
    /// The SKU's level at each location it has a row at, by location id.
    pub at: Vec<StockLevel>,
    /// Its open receipts and the closed ones with pre-ordered units still pegged (read only
    /// for a Reserve that may pre-order, or backorder where such units wait), by location
    /// and expected date.
    pub receipts: Vec<Receipt>,
    /// How long waiting units may wait, from now: a pre-order is never pegged to a receipt
    /// due after that. `None`: no bound.
    pub waits_until: Option<SystemTime>,
}

/// Units of a line placed at one location (always an active one), and the levels right after
/// (each placement is one movement, so `total.version` is the version it produced).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub location: LocationId,
    /// Units held.
    pub units: i64,
    /// Units left waiting (`backordered` or `preordered`, as deltas of the location's states).
    pub waiting: States,
    /// The receipt pre-ordered units are pegged to.
    pub receipt: Option<Peg>,
    /// The location's level right after.
    pub level: StockLevel,
    /// The SKU's total right after.
    pub total: StockLevel,
}

/// Why a line could not be placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unplaced {
    /// The line pins a location that does not exist.
    UnknownLocation(LocationId),
    /// Not enough units at the locations the line may use; `available` is what they have.
    Short(Shortfall),
}

impl SkuStock {
    /// The SKU's total as it stands, with its `apart` worked out over its rows (a row whose
    /// location is not among `locations` counts as inactive).
    fn total_now(&self, locations: &[Location]) -> StockLevel {
        let active = |row: &StockLevel| {
            locations
                .iter()
                .any(|l| Some(&l.id) == row.location.as_ref() && l.active)
        };
        StockLevel {
            apart: StockLevel::apart_over(self.at.iter().map(|row| (row, active(row)))),
            ..self.total.clone()
        }
    }

    /// The locations `line` may take units from, in the order the policy tries them, with
    /// what each has available.
    fn candidates(
        &self,
        line: &Line,
        policy: AllocationPolicy,
        locations: &[Location],
    ) -> Result<Vec<(usize, i64)>, Unplaced> {
        let configured = |id: &LocationId| locations.iter().find(|l| &l.id == id);
        if let Some(pinned) = &line.location {
            let Some(location) = configured(pinned) else {
                return Err(Unplaced::UnknownLocation(pinned.clone()));
            };
            return Ok(self
                .at
                .iter()
                .position(|row| row.location.as_ref() == Some(pinned))
                .filter(|_| location.active)
                .map(|index| vec![(index, self.at[index].available())])
                .unwrap_or_default());
        }
        let mut found: Vec<(usize, i64, i32, &LocationId)> = self
            .at
            .iter()
            .enumerate()
            .filter_map(|(index, row)| {
                let id = row.location.as_ref()?;
                let location = configured(id).filter(|l| l.active)?;
                Some((index, row.available(), location.priority, id))
            })
            .collect();
        match policy.strategy {
            AllocationStrategy::Priority => found.sort_by(|a, b| (a.2, a.3).cmp(&(b.2, b.3))),
            AllocationStrategy::MostAvailable => {
                found.sort_by(|a, b| (b.1, a.2, a.3).cmp(&(a.1, b.2, b.3)))
            }
        }
        Ok(found
            .into_iter()
            .map(|(i, available, ..)| (i, available))
            .collect())
    }

    /// Places `line` by `policy` among `locations` (every configured location) and applies
    /// it to this stock, so the next line of the same SKU sees what is left. Nothing changes
    /// when the line cannot be placed.
    pub fn place(
        &mut self,
        line: &Line,
        policy: AllocationPolicy,
        locations: &[Location],
    ) -> Result<Vec<Placement>, Unplaced> {
        let units = line.quantity.get();
        let candidates = self.candidates(line, policy, locations)?;
        let mut takes: Vec<(usize, i64)> = Vec::new();
        if policy.allow_split {
            let mut left = units;
            for &(index, available) in &candidates {
                if left == 0 {
                    break;
                }
                let take = available.min(left);
                if take > 0 {
                    takes.push((index, take));
                    left -= take;
                }
            }
            if left > 0 {
                takes.clear();
            }
        } else if let Some(&(index, _)) = candidates.iter().find(|(_, a)| *a >= units) {
            takes.push((index, units));
        }
        if takes.is_empty() {
            return Err(Unplaced::Short(Shortfall {
                sku: line.sku.clone(),
                requested: units,
                available: candidates.iter().map(|(_, a)| a.max(&0)).sum(),
            }));
        }
        // One movement per location, in location order, like every write.
        takes.sort_by(|a, b| self.at[a.0].location.cmp(&self.at[b.0].location));
        Ok(takes
            .into_iter()
            .map(|(index, take)| {
                self.total.reserved += take;
                self.total.version += 1;
                let row = &mut self.at[index];
                row.reserved += take;
                row.version = self.total.version;
                let level = row.clone();
                Placement {
                    location: level.location.clone().expect("a location's row"),
                    units: take,
                    waiting: States::default(),
                    receipt: None,
                    level,
                    total: self.total_now(locations),
                }
            })
            .collect())
    }

    /// Places a line [`SkuStock::place`] could not serve from available units, letting the
    /// rest of it wait: at the first location (in the policy's order, or the pinned one)
    /// where it fits, holding every unit available there and pegging the rest to the open
    /// receipt expected earliest there (by [`SkuStock::waits_until`]) with that many
    /// unpromised units whose date `available_to_promise` there covers the whole line
    /// (`allow_preorder`: demand already waiting is served first), or else backordering it within the location's backorder
    /// limit (`allow_backorder`; pre-orders of closed receipts there count as backorders).
    /// Never split. `None`: nowhere fits, and nothing changes.
    pub fn place_waiting(
        &mut self,
        line: &Line,
        policy: AllocationPolicy,
        locations: &[Location],
    ) -> Option<Placement> {
        let units = line.quantity.get();
        let candidates = self.candidates(line, policy, locations).ok()?;
        for (index, available) in candidates {
            let held = available.clamp(0, units);
            let rest = units - held;
            let row = &self.at[index];
            let location = row.location.clone()?;
            let here: Vec<&Receipt> = self
                .receipts
                .iter()
                .filter(|r| r.location == location)
                .collect();
            let at_risk: i64 = here.iter().map(|r| r.at_risk()).sum();
            let promise = crate::rules::available_to_promise(row, &here);
            let peg = policy
                .allow_preorder
                .then(|| {
                    here.iter()
                        .filter(|r| {
                            r.state == ReceiptState::Open
                                && self.waits_until.is_none_or(|end| r.expected_at <= end)
                                && r.unpromised() >= rest
                                && crate::rules::promised_by(&promise, r.expected_at) >= units
                        })
                        .min_by_key(|r| (r.expected_at, r.id.clone()))
                })
                .flatten()
                .map(|r| Peg {
                    receipt: r.id.clone(),
                    expected_at: r.expected_at,
                });
            let after_hold = StockLevel {
                reserved: row.reserved + held,
                ..row.clone()
            };
            let waiting = match &peg {
                Some(_) => States {
                    preordered: rest,
                    ..States::default()
                },
                None if policy.allow_backorder && after_hold.backorder_room(at_risk) >= rest => {
                    States {
                        backordered: rest,
                        ..States::default()
                    }
                }
                None => continue,
            };
            if let Some(peg) = &peg
                && let Some(receipt) = self.receipts.iter_mut().find(|r| r.id == peg.receipt)
            {
                receipt.preordered += rest;
            }
            self.total.reserved += held;
            self.total.states = self.total.states.plus(&waiting);
            self.total.version += 1;
            let row = &mut self.at[index];
            row.reserved += held;
            row.states = row.states.plus(&waiting);
            row.version = self.total.version;
            let level = row.clone();
            return Some(Placement {
                location,
                units: held,
                waiting,
                receipt: peg,
                level,
                total: self.total_now(locations),
            });
        }
        None
    }
}

#[cfg(test)]
mod tests;
