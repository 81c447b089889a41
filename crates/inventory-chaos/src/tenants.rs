//! The tenants a run's replicas serve, and each tenant's callers.
//!
//! By default every run serves two tenants, `default` and `brand_b` (`TENANTS`), with the
//! same SKU names, the same idempotency keys and the same order ids: in the service they are
//! different SKUs, keys and orders, and the checker judges each tenant against its own rows.
//! Each tenant has two callers in the replicas' credentials file (`AUTH_TOKENS_FILE`), each
//! with a bearer token of the run's own: a `reserver` the shoppers share, and an `admin` that
//! stocks, snapshots and watches the tenant's stream.
//!
//! A rolling upgrade serves tenant `default` alone, without authentication: the release it
//! starts from may predate tenants (and `tenant=` on a credentials line).

use sha2::{Digest as _, Sha256};
use tonic::metadata::MetadataValue;

use crate::history::DEFAULT_TENANT;

/// The tenants of a run unless told otherwise.
pub const TENANTS: [&str; 2] = [DEFAULT_TENANT, "brand_b"];

/// Who a call is made as: a caller named on the credentials file, with its bearer token; or,
/// without authentication, the anonymous caller (`None`).
#[derive(Clone, Debug)]
pub struct Credentials {
    token: Option<String>,
    pub caller: String,
}

impl Credentials {
    /// Adds `authorization: Bearer <token>` to a request (nothing without authentication).
    pub fn authorize<T>(&self, request: &mut tonic::Request<T>) {
        if let Some(token) = &self.token {
            let value = MetadataValue::try_from(format!("Bearer {token}"))
                .expect("a token of plain characters");
            request.metadata_mut().insert("authorization", value);
        }
    }
}

/// One tenant of the run and its two callers.
#[derive(Clone, Debug)]
pub struct TenantCallers {
    pub tenant: String,
    /// `reserver`: every shopper's `Reserve`, confirms, releases, extends and cancels.
    pub shopper: Credentials,
    /// `admin`: locations, `AdjustStock`, `GetStock` and `WatchEvents`.
    pub admin: Credentials,
}

impl TenantCallers {
    /// The names its callers have in the tenant's rows (`caller`, `actor`): `""` alone
    /// without authentication.
    pub fn caller_names(&self) -> Vec<&str> {
        let mut names = vec![self.shopper.caller.as_str(), self.admin.caller.as_str()];
        names.dedup();
        names
    }

    /// The PostgreSQL schema the tenant's rows live in.
    pub fn schema(&self) -> String {
        schema(&self.tenant)
    }
}

/// The PostgreSQL schema of `tenant`: `public` for `default`, `tenant_<name>` for any other.
pub fn schema(tenant: &str) -> String {
    if tenant == DEFAULT_TENANT {
        "public".to_owned()
    } else {
        format!("tenant_{tenant}")
    }
}

/// The Redis key of `kind` (`lease`, `fence`) of `tenant`'s `sku` under `prefix`:
/// `<prefix>:{<sku>}:<kind>` for `default`, `<prefix>:<tenant>:{<sku>}:<kind>` for any other.
pub fn redis_key(prefix: &str, tenant: &str, sku: &str, kind: &str) -> String {
    if tenant == DEFAULT_TENANT {
        format!("{prefix}:{{{sku}}}:{kind}")
    } else {
        format!("{prefix}:{tenant}:{{{sku}}}:{kind}")
    }
}

/// The tenants of one run and how their callers authenticate.
#[derive(Clone, Debug)]
pub struct Tenancy {
    pub tenants: Vec<TenantCallers>,
    /// Whether the replicas check credentials (`AUTH_TOKENS_FILE`) rather than serving every
    /// call as tenant `default`'s (`AUTH_DISABLED`).
    pub authenticated: bool,
}

impl Tenancy {
    /// `tenants` with callers named after each tenant and tokens made up for this run.
    pub fn with_tokens(tenants: &[String]) -> Self {
        let tenants = tenants
            .iter()
            .map(|tenant| {
                let credentials = |role: &str| Credentials {
                    token: Some(format!(
                        "chaos-{role}-{tenant}-{}",
                        uuid::Uuid::new_v4().simple()
                    )),
                    caller: format!("chaos-{role}-{tenant}"),
                };
                TenantCallers {
                    tenant: tenant.clone(),
                    shopper: credentials("shopper"),
                    admin: credentials("admin"),
                }
            })
            .collect();
        Self {
            tenants,
            authenticated: true,
        }
    }

    /// Tenant `default` alone, every call as the anonymous caller.
    pub fn unauthenticated() -> Self {
        let anonymous = Credentials {
            token: None,
            caller: String::new(),
        };
        Self {
            tenants: vec![TenantCallers {
                tenant: DEFAULT_TENANT.to_owned(),
                shopper: anonymous.clone(),
                admin: anonymous,
            }],
            authenticated: false,
        }
    }

    pub fn tenant_names(&self) -> Vec<String> {
        self.tenants.iter().map(|t| t.tenant.clone()).collect()
    }

    /// `TENANTS` of the replicas and of `migrate` and `verify`.
    pub fn names(&self) -> String {
        self.tenant_names().join(",")
    }

    /// The credentials file: one line per caller, `<name> <role> token-sha256:<hex>
    /// tenant=<tenant>`.
    pub fn credentials_file(&self) -> String {
        let mut text =
            String::from("# The fault suite's callers: a reserver and an admin per tenant.\n");
        for t in &self.tenants {
            for (role, credentials) in [("reserver", &t.shopper), ("admin", &t.admin)] {
                let Some(token) = &credentials.token else {
                    continue;
                };
                let digest: String = Sha256::digest(token.as_bytes())
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                text.push_str(&format!(
                    "{} {role} token-sha256:{digest} tenant={}\n",
                    credentials.caller, t.tenant
                ));
            }
        }
        text
    }

    /// The replicas' settings for tenants and authentication; `credentials` is where
    /// [`Self::credentials_file`] was written.
    pub fn env(&self, credentials: &std::path::Path) -> Vec<(String, String)> {
        let mut env = vec![("TENANTS".to_owned(), self.names())];
        if self.authenticated {
            env.push((
                "AUTH_TOKENS_FILE".to_owned(),
                credentials.display().to_string(),
            ));
        } else {
            env.push(("AUTH_DISABLED".to_owned(), "true".to_owned()));
        }
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tenant_has_a_reserver_and_an_admin_of_its_own() {
        let tenancy = Tenancy::with_tokens(&["default".into(), "brand_b".into()]);
        let file = tenancy.credentials_file();
        let lines: Vec<&str> = file.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(lines.len(), 4, "{file}");
        assert!(lines[0].starts_with("chaos-shopper-default reserver token-sha256:"));
        assert!(lines[3].starts_with("chaos-admin-brand_b admin token-sha256:"));
        assert!(lines[3].ends_with(" tenant=brand_b"));
        let token = tenancy.tenants[1].admin.token.as_deref().unwrap();
        let digest = format!("{:x}", Sha256::digest(token.as_bytes()));
        assert!(lines[3].contains(&digest), "{file}");
        assert_eq!(tenancy.names(), "default,brand_b");
        assert_eq!(
            tenancy.tenants[1].caller_names(),
            ["chaos-shopper-brand_b", "chaos-admin-brand_b"]
        );

        let mut request = tonic::Request::new(());
        tenancy.tenants[0].shopper.authorize(&mut request);
        let header = request.metadata().get("authorization").unwrap();
        assert!(
            header
                .to_str()
                .unwrap()
                .starts_with("Bearer chaos-shopper-default-")
        );
        let anonymous = Tenancy::unauthenticated();
        let mut request = tonic::Request::new(());
        anonymous.tenants[0].shopper.authorize(&mut request);
        assert!(request.metadata().get("authorization").is_none());
        assert_eq!(anonymous.tenants[0].caller_names(), [""]);
    }

    #[test]
    fn a_tenants_rows_and_keys_are_its_own() {
        assert_eq!(schema("default"), "public");
        assert_eq!(schema("brand_b"), "tenant_brand_b");
        assert_eq!(
            redis_key("chaos:si1", "default", "CH-0", "lease"),
            "chaos:si1:{CH-0}:lease"
        );
        assert_eq!(
            redis_key("chaos:si1", "brand_b", "CH-0", "fence"),
            "chaos:si1:brand_b:{CH-0}:fence"
        );
    }
}
