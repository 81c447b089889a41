//! Tenants: the brands, sales channels or sellers one deployment (one cell) serves, each
//! isolated by construction.
//!
//! Every tenant gets its own wired core ([`TenantCore`]): a PostgreSQL pool whose
//! connections work in the tenant's schema only (`public` for `default`, `tenant_<name>`
//! otherwise, `inventory_postgres::Schema`), Redis leases under the tenant's key segment,
//! its own event stream (sequencer, tailer, watchers) and its own upkeep. A call reaches the
//! core of its caller's tenant ([`Tenants::core`]) and nothing else, so no statement a call
//! runs can name another tenant's rows: another tenant's SKU, reservation or order is not
//! there for it, and answers exactly as a missing one does.
//!
//! What all of a tenant's callers share in one replica: its calls in flight
//! (`TENANT_MAX_IN_FLIGHT`); fleet-wide, its live holds and held units
//! (`TENANT_MAX_HOLDS`, `TENANT_MAX_HELD_UNITS`, checked by the core). A caller's own caps
//! nest inside these.

use std::{collections::BTreeMap, sync::Arc};

use inventory_core::{Error, domain::Tenant, quota::HoldCaps};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{Service, events::EventHub};

/// The tenants configured (`TENANTS`) and the limits each has.
#[derive(Clone, Debug)]
pub struct TenantSettings {
    /// Never empty; sorted, without repeats.
    pub tenants: Vec<Tenant>,
    pub limits: TenantLimits,
}

impl Default for TenantSettings {
    /// Tenant `default` alone, unlimited: a deployment that configures no tenants.
    fn default() -> Self {
        Self {
            tenants: vec![Tenant::default_tenant()],
            limits: TenantLimits::default(),
        }
    }
}

impl TenantSettings {
    /// Parses `TENANTS`: names separated by commas or white space. Every problem is reported.
    pub fn parse(raw: &str, limits: TenantLimits) -> Result<Self, Vec<String>> {
        let mut tenants = Vec::new();
        let mut problems = Vec::new();
        for name in raw
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|n| !n.is_empty())
        {
            match Tenant::parse(name) {
                Ok(tenant) if tenants.contains(&tenant) => {
                    problems.push(format!("TENANTS names {tenant} twice"));
                }
                Ok(tenant) => tenants.push(tenant),
                Err(problem) => problems.push(format!("TENANTS: '{name}' {problem}")),
            }
        }
        if tenants.is_empty() && problems.is_empty() {
            problems.push("TENANTS must name at least one tenant".into());
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        tenants.sort();
        Ok(Self { tenants, limits })
    }

    pub fn serves(&self, tenant: &Tenant) -> bool {
        self.tenants.contains(tenant)
    }
}

/// What one tenant's callers may take together. `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantLimits {
    /// Calls of the tenant's callers in flight in one replica (`TENANT_SATURATED`).
    pub max_in_flight: Option<u32>,
    /// Live holds and held units of all its callers, fleet-wide (`TENANT_QUOTA_EXCEEDED`).
    pub caps: HoldCaps,
    /// Its event subscriptions (`TOO_MANY_SUBSCRIPTIONS`); `None`: unlimited.
    pub max_subscriptions: Option<u32>,
}

/// One tenant's wired core and what its calls share.
#[derive(Debug)]
pub struct TenantCore {
    pub tenant: Tenant,
    pub inventory: Arc<Service>,
    pub events: EventHub,
    /// The tenant's calls in flight in this replica, when limited.
    in_flight: Option<(Arc<Semaphore>, u32)>,
}

impl TenantCore {
    pub fn new(
        tenant: Tenant,
        inventory: Arc<Service>,
        events: EventHub,
        limits: &TenantLimits,
    ) -> Self {
        Self {
            tenant,
            inventory,
            events,
            in_flight: limits
                .max_in_flight
                .map(|limit| (Arc::new(Semaphore::new(limit as usize)), limit)),
        }
    }

    /// A place among the tenant's calls in flight, or [`Error::TenantSaturated`].
    pub fn admit(&self) -> Result<Option<OwnedSemaphorePermit>, Error> {
        let Some((permits, limit)) = &self.in_flight else {
            return Ok(None);
        };
        Arc::clone(permits)
            .try_acquire_owned()
            .map(Some)
            .map_err(|_| Error::TenantSaturated {
                tenant: self.tenant.clone(),
                limit: *limit,
            })
    }
}

/// Every tenant this replica serves, by name.
#[derive(Clone, Debug)]
pub struct Tenants {
    cores: Arc<BTreeMap<Tenant, Arc<TenantCore>>>,
}

impl Tenants {
    pub fn new(cores: impl IntoIterator<Item = TenantCore>) -> Self {
        let cores: BTreeMap<_, _> = cores
            .into_iter()
            .map(|core| (core.tenant.clone(), Arc::new(core)))
            .collect();
        assert!(!cores.is_empty(), "a replica serves at least one tenant");
        Self {
            cores: Arc::new(cores),
        }
    }

    /// The core of `tenant`, or [`Error::TenantNotServed`]: its data is in another cell (or
    /// nowhere), and nothing here may answer for it.
    pub fn core(&self, tenant: &Tenant) -> Result<&Arc<TenantCore>, Error> {
        self.cores
            .get(tenant)
            .ok_or_else(|| Error::TenantNotServed {
                tenant: tenant.clone(),
                cell: None,
            })
    }

    /// Tenant `default`'s core if served, else the first by name: what a caller that names
    /// no tenant (a test, the single-tenant accessors) gets.
    pub fn primary(&self) -> &Arc<TenantCore> {
        self.cores
            .get(&Tenant::default_tenant())
            .or_else(|| self.cores.values().next())
            .expect("a replica serves at least one tenant")
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<TenantCore>> {
        self.cores.values()
    }

    /// The metric label of `tenant`: itself if served here, else `_OTHER`, so requests
    /// naming made-up tenants cannot grow a series each.
    pub fn label(&self, tenant: &Tenant) -> String {
        if self.cores.contains_key(tenant) {
            tenant.as_str().to_owned()
        } else {
            crate::auth::OTHER_CALLERS.to_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_are_plain_names_listed_once() {
        let settings =
            TenantSettings::parse("brand_b,\n default\tbrand_a", TenantLimits::default())
                .expect("three tenants");
        let names: Vec<_> = settings.tenants.iter().map(Tenant::as_str).collect();
        assert_eq!(names, ["brand_a", "brand_b", "default"]);
        let problems = TenantSettings::parse("a,Brand,a,x-y", TenantLimits::default()).unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(TenantSettings::parse(" , ", TenantLimits::default()).is_err());
    }
}
