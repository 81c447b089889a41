//! Per-caller caps on what a caller may hold at once: live holds and held units.
//!
//! A cap is checked against the caller's holdings as the system of record has them just
//! before the reservation is written, so calls of one caller racing each other may pass the
//! cap by what they reserve together; it bounds what one client can take from the others,
//! it is not a stock rule (those are enforced in SQL). A retry of a reservation already made
//! (its idempotency key already used) is never refused by a cap: it replays its answer.

use crate::{command::Reserve, domain::Tenant, error::Error};

/// The caps of one caller; `None` means unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HoldCaps {
    /// Live holds (reservations still `HELD`, not yet expired).
    pub max_holds: Option<u64>,
    /// Units those holds keep from being sold.
    pub max_held_units: Option<u64>,
}

impl HoldCaps {
    pub fn is_unlimited(&self) -> bool {
        self.max_holds.is_none() && self.max_held_units.is_none()
    }

    /// Whether `command` fits beside what its caller holds now.
    pub fn check(&self, command: &Reserve, holdings: &Holdings) -> Result<(), Error> {
        self.check_with(command, holdings, |quota, limit, current| {
            Error::QuotaExceeded {
                caller: command.caller.clone(),
                quota,
                limit,
                current,
            }
        })
    }

    /// Whether `command` fits beside what all the callers of `tenant` hold now.
    pub fn check_tenant(
        &self,
        tenant: &Tenant,
        command: &Reserve,
        holdings: &Holdings,
    ) -> Result<(), Error> {
        self.check_with(command, holdings, |quota, limit, current| {
            Error::TenantQuotaExceeded {
                tenant: tenant.clone(),
                quota,
                limit,
                current,
            }
        })
    }

    fn check_with(
        &self,
        command: &Reserve,
        holdings: &Holdings,
        refuse: impl Fn(Quota, u64, u64) -> Error,
    ) -> Result<(), Error> {
        if holdings.key_used {
            return Ok(());
        }
        if let Some(limit) = self.max_holds
            && holdings.holds.saturating_add(1) > limit
        {
            return Err(refuse(Quota::Holds, limit, holdings.holds));
        }
        let units: u64 = command
            .lines()
            .iter()
            .map(|line| line.quantity.get().unsigned_abs())
            .sum();
        if let Some(limit) = self.max_held_units
            && holdings.units.saturating_add(units) > limit
        {
            return Err(refuse(Quota::HeldUnits, limit, holdings.units));
        }
        Ok(())
    }
}

/// What a caller holds now, and whether the key of the call at hand was used already.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holdings {
    pub holds: u64,
    pub units: u64,
    pub key_used: bool,
}

/// Which cap a reservation would pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quota {
    Holds,
    HeldUnits,
}

impl Quota {
    /// The name the caps are configured under, and that refusals carry.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Holds => "max_holds",
            Self::HeldUnits => "max_held_units",
        }
    }
}

impl std::fmt::Display for Quota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Caller, IdempotencyKey, Line, OrderId, Quantity, Sku};

    fn reserve(units: &[i64]) -> Reserve {
        let lines = units
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                Line::new(
                    Sku::parse(&format!("SKU-{i}")).unwrap(),
                    Quantity::parse(q).unwrap(),
                )
            })
            .collect();
        Reserve::new(
            Caller::parse("orders").unwrap(),
            IdempotencyKey::parse("k").unwrap(),
            OrderId::parse("o").unwrap(),
            lines,
            None,
        )
    }

    #[test]
    fn a_reservation_fits_up_to_each_cap_and_not_past_it() {
        let caps = HoldCaps {
            max_holds: Some(2),
            max_held_units: Some(10),
        };
        let held = |holds, units| Holdings {
            holds,
            units,
            key_used: false,
        };
        assert!(caps.check(&reserve(&[3, 2]), &held(1, 5)).is_ok());
        let Err(Error::QuotaExceeded {
            quota,
            limit,
            current,
            ..
        }) = caps.check(&reserve(&[1]), &held(2, 0))
        else {
            panic!("a third hold passes max_holds 2");
        };
        assert_eq!((quota, limit, current), (Quota::Holds, 2, 2));
        let Err(Error::QuotaExceeded { quota, current, .. }) =
            caps.check(&reserve(&[3, 3]), &held(1, 5))
        else {
            panic!("11 units pass max_held_units 10");
        };
        assert_eq!((quota, current), (Quota::HeldUnits, 5));
        assert!(
            HoldCaps::default()
                .check(&reserve(&[9]), &held(99, 99))
                .is_ok()
        );
    }

    #[test]
    fn a_retry_of_a_reservation_already_made_is_never_refused() {
        let caps = HoldCaps {
            max_holds: Some(1),
            max_held_units: Some(1),
        };
        let retry = Holdings {
            holds: 1,
            units: 1,
            key_used: true,
        };
        assert!(caps.check(&reserve(&[1]), &retry).is_ok());
    }
}
