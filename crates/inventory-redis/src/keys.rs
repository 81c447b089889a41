//! Key layout: `<prefix>:<tenant>:{<sku>}:<kind>`, and `<prefix>:{<sku>}:<kind>` for tenant
//! `default` (the layout of releases before tenants, kept so a rolling upgrade never has two
//! lease keys for one SKU).
//!
//! The prefix separates environments sharing one Redis, the tenant segment tenants; both are
//! plain names, never customer data. The SKU sits inside a
//! hash tag, so a SKU's lease and its fence counter always live in the same Redis Cluster slot
//! and one Lua script may touch both. SKUs cannot contain braces (`Sku::parse`), so the tag is
//! exactly the SKU. Keys carry SKUs only, never customer data.

use std::fmt;

use inventory_core::domain::Sku;

const MAX_PREFIX_LEN: usize = 64;

/// The namespace every key of this deployment starts with, e.g. `inventory:prod`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPrefix(String);

impl KeyPrefix {
    pub fn parse(raw: &str) -> Result<Self, String> {
        inventory_core::domain::check_plain_name(raw, MAX_PREFIX_LEN)?;
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The prefix of `tenant`'s keys (see the module's layout). Tenant names are short
    /// (`Tenant::parse`), so the result may pass the configured prefix's length limit.
    pub fn for_tenant(&self, tenant: &inventory_core::domain::Tenant) -> Self {
        if tenant.is_default() {
            self.clone()
        } else {
            Self(format!("{}:{}", self.0, tenant))
        }
    }

    /// The lease key of a SKU: holds the current holder's random token, with a TTL.
    pub fn lease(&self, sku: &Sku) -> String {
        format!("{}:{{{}}}:lease", self.0, sku)
    }

    /// The channel a release publishes the SKU on, so replicas waiting for it try again.
    pub fn released_channel(&self) -> String {
        format!("{}:lease-released", self.0)
    }

    /// The fence counter of a SKU: the last fencing token handed out.
    pub fn fence(&self, sku: &Sku) -> String {
        format!("{}:{{{}}}:fence", self.0, sku)
    }
}

impl fmt::Display for KeyPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests;
