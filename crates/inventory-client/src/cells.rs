//! The cell map: which cell serves which tenant, so a client talks to the tenant's cell
//! directly.
//!
//! A deployment may run several cells, each a complete copy of the service (its own server
//! replicas, PostgreSQL and Redis) serving a fixed set of tenants. The map is static text,
//! one line per cell:
//!
//! ```text
//! # cell  endpoint                      tenants
//! c1      https://inventory-c1:50051    default brand_a
//! c2      https://inventory-c2:50051    brand_b marketplace
//! ```
//!
//! Fields are separated by spaces or tabs; `#` starts a comment (to the end of the line) and
//! blank lines are ignored. A cell name is 1 to 63 of `a-z`, `0-9`, `_` and `-`, starting with
//! a letter or digit; a tenant name is 1 to 31 of `a-z`, `0-9` and `_`, starting with a letter;
//! the endpoint is an `http://` or `https://` URI. Every tenant is in exactly one cell, every
//! cell has at least one tenant, no two cells share a name, and the map has at least one cell.
//! A map that breaks any of these is refused whole, with every problem and its line.
//!
//! ```no_run
//! use inventory_client::{CellClients, CellMap, ClientConfig, TlsOptions};
//! use inventory_client::proto::GetStockRequest;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let map = CellMap::from_file("/etc/inventory/cells".as_ref())?;
//! // One config for every cell: each client gets its cell's endpoint in place of this one.
//! let mut base = ClientConfig::default();
//! base.tls = Some(TlsOptions {
//!     ca_pem: std::fs::read("/etc/inventory/ca.pem")?,
//!     ..TlsOptions::default()
//! });
//! let cells = CellClients::new(map, &base)?;
//! let client = cells.for_tenant("brand_a")?;
//! let request = GetStockRequest { skus: vec!["DEMO-MUG".into()], ..Default::default() };
//! let stock = client.get_stock(request).await?;
//! # Ok(())
//! # }
//! ```

use std::{
    collections::HashMap,
    fmt,
    path::{Path, PathBuf},
    str::FromStr,
};

use crate::{ClientConfig, Error, InventoryClient};

/// One cell: its name, its endpoint and the tenants it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    name: String,
    endpoint: String,
    tenants: Vec<String>,
}

impl Cell {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the cell's servers answer, `http://host:port` or `https://host:port`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The tenants the cell serves, in the map's order.
    pub fn tenants(&self) -> &[String] {
        &self.tenants
    }
}

/// Which cell serves which tenant: a valid map (see the [module](self) for the format and its
/// rules).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CellMap {
    cells: Vec<Cell>,
    /// Tenant -> index in `cells`.
    by_tenant: HashMap<String, usize>,
}

impl CellMap {
    /// Reads a map from its text, refusing it with every problem found.
    pub fn parse(text: &str) -> Result<Self, CellMapError> {
        parse(text).map_err(|problems| CellMapError::Invalid {
            path: None,
            problems,
        })
    }

    /// Reads a map from a file.
    pub fn from_file(path: &Path) -> Result<Self, CellMapError> {
        let text = std::fs::read_to_string(path).map_err(|source| CellMapError::Read {
            path: path.to_owned(),
            source,
        })?;
        parse(&text).map_err(|problems| CellMapError::Invalid {
            path: Some(path.to_owned()),
            problems,
        })
    }

    /// The cell that serves `tenant`, if any does.
    pub fn cell_of(&self, tenant: &str) -> Option<&Cell> {
        self.by_tenant.get(tenant).map(|&index| &self.cells[index])
    }

    /// The cell named `name`, if the map has one.
    pub fn cell(&self, name: &str) -> Option<&Cell> {
        self.cells.iter().find(|cell| cell.name == name)
    }

    /// Every cell, in the map's order.
    pub fn cells(&self) -> &[Cell] {
        &self.cells
    }
}

impl FromStr for CellMap {
    type Err = CellMapError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

/// One thing wrong with a map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CellMapProblem {
    /// The line, counted from 1; `None` for a problem of the whole map (it names no cell).
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for CellMapProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Why a map could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CellMapError {
    /// The file could not be read.
    #[error("cannot read the cell map {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The map breaks its rules; `problems` lists each, in line order. `path` is the file's,
    /// when it was read from one.
    #[error("{}", Invalid(path.as_deref(), problems))]
    Invalid {
        path: Option<PathBuf>,
        problems: Vec<CellMapProblem>,
    },
}

impl CellMapError {
    /// What is wrong with the map (nothing for a file that could not be read).
    pub fn problems(&self) -> &[CellMapProblem] {
        match self {
            Self::Read { .. } => &[],
            Self::Invalid { problems, .. } => problems,
        }
    }
}

/// The message of [`CellMapError::Invalid`].
struct Invalid<'a>(Option<&'a Path>, &'a [CellMapProblem]);

impl fmt::Display for Invalid<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self(path, problems) = self;
        f.write_str("invalid cell map")?;
        if let Some(path) = path {
            write!(f, " {}", path.display())?;
        }
        for (index, problem) in problems.iter().enumerate() {
            f.write_str(if index == 0 { ": " } else { "; " })?;
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

fn parse(text: &str) -> Result<CellMap, Vec<CellMapProblem>> {
    let mut problems = Vec::new();
    let mut cells = Vec::new();
    let mut by_tenant = HashMap::new();
    // Where each cell name and tenant was first seen.
    let mut cell_lines: HashMap<&str, usize> = HashMap::new();
    let mut tenant_lines: HashMap<&str, (usize, &str)> = HashMap::new();
    let mut cell_count = 0;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let content = raw.split_once('#').map_or(raw, |(before, _)| before);
        let mut fields = content.split_whitespace();
        let Some(name) = fields.next() else {
            continue;
        };
        cell_count += 1;
        let mut problem = |message: String| {
            problems.push(CellMapProblem {
                line: Some(line),
                message,
            });
        };
        let Some(endpoint) = fields.next() else {
            problem(format!(
                "cell {name:?} has no endpoint and no tenant (expected `<cell> <endpoint> <tenant>...`)"
            ));
            continue;
        };
        let tenants: Vec<&str> = fields.collect();
        let mut valid = true;
        if !valid_cell_name(name) {
            problem(format!(
                "cell name {name:?} is not 1 to 63 of a-z, 0-9, `_` and `-`, starting with a letter or digit"
            ));
            valid = false;
        } else if let Some(first) = cell_lines.get(name) {
            problem(format!("cell {name:?} is already defined on line {first}"));
            valid = false;
        } else {
            cell_lines.insert(name, line);
        }
        if let Err(message) = check_endpoint(endpoint) {
            problem(format!("cell {name:?}: {message}"));
            valid = false;
        }
        if tenants.is_empty() {
            problem(format!("cell {name:?} has no tenant"));
            valid = false;
        }
        for &tenant in &tenants {
            if !valid_tenant(tenant) {
                problem(format!(
                    "tenant name {tenant:?} is not 1 to 31 of a-z, 0-9 and `_`, starting with a letter"
                ));
                valid = false;
            } else if let Some(&(first, cell)) = tenant_lines.get(tenant) {
                problem(format!(
                    "tenant {tenant:?} is already in cell {cell:?} (line {first})"
                ));
                valid = false;
            } else {
                tenant_lines.insert(tenant, (line, name));
            }
        }
        if valid {
            let index = cells.len();
            by_tenant.extend(tenants.iter().map(|&t| (t.to_owned(), index)));
            cells.push(Cell {
                name: name.to_owned(),
                endpoint: endpoint.to_owned(),
                tenants: tenants.into_iter().map(str::to_owned).collect(),
            });
        }
    }
    if cell_count == 0 {
        problems.push(CellMapProblem {
            line: None,
            message: "the map names no cell".into(),
        });
    }
    if problems.is_empty() {
        Ok(CellMap { cells, by_tenant })
    } else {
        Err(problems)
    }
}

/// `^[a-z0-9][a-z0-9_-]{0,62}$`
fn valid_cell_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=63).contains(&bytes.len())
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// `^[a-z][a-z0-9_]{0,30}$`
fn valid_tenant(tenant: &str) -> bool {
    let bytes = tenant.as_bytes();
    (1..=31).contains(&bytes.len())
        && bytes[0].is_ascii_lowercase()
        && bytes
            .iter()
            .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn check_endpoint(endpoint: &str) -> Result<(), String> {
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(format!(
            "endpoint {endpoint:?} does not start with http:// or https://"
        ));
    }
    let parsed = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .map_err(|_| format!("endpoint {endpoint:?} is not a valid URI"))?;
    let uri = parsed.uri();
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("endpoint {endpoint:?} has no host"));
    }
    // What follows the host: nothing, or `:` and a port (`h:port` parses as a host without
    // one).
    let authority = uri.authority().map_or("", |a| a.as_str());
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, rest)| rest);
    let after_host = match host_port.strip_prefix('[') {
        Some(ipv6) => ipv6.split_once(']').map_or("", |(_, rest)| rest),
        None => host_port.split_once(':').map_or("", |(_, port)| port),
    };
    let port = after_host.strip_prefix(':').unwrap_or(after_host);
    if !port.is_empty() && port.parse::<u16>().is_err() {
        return Err(format!(
            "endpoint {endpoint:?} has a port that is not a number"
        ));
    }
    Ok(())
}

/// One [`InventoryClient`] per cell of a [`CellMap`], so that each tenant's calls go to its
/// cell. Its methods take `&self`: share one (in an `Arc`) between tasks.
///
/// Every client is made from the same [`ClientConfig`] with the cell's endpoint in place of
/// the config's: the same TLS material, token and retry policy for every cell. With TLS,
/// every endpoint must be `https://` (and without, `http://`); leave
/// [`TlsOptions::domain`](crate::TlsOptions::domain) unset unless every cell's certificate
/// carries that name, so that each is checked against its own host.
#[derive(Clone, Debug)]
pub struct CellClients {
    map: CellMap,
    /// Parallel to `map.cells()`.
    clients: Vec<InventoryClient>,
}

impl CellClients {
    /// Makes a client for every cell of `map` now, each connecting on its first call
    /// ([`InventoryClient::connect_lazy`]), so a cell that is down fails only its own
    /// tenants' calls. A config a cell's endpoint cannot be used with (TLS towards an
    /// `http://` endpoint, or none towards an `https://` one) is an error here, naming the cell.
    /// Must be called within a Tokio runtime.
    pub fn new(map: CellMap, base: &ClientConfig) -> Result<Self, Error> {
        let clients = map
            .cells()
            .iter()
            .map(|cell| {
                let mut config = base.clone();
                config.endpoint.clone_from(&cell.endpoint);
                InventoryClient::connect_lazy(config).map_err(|error| match error {
                    Error::Invalid {
                        message,
                        violations,
                    } => Error::Invalid {
                        message: format!("cell {:?}: {message}", cell.name),
                        violations,
                    },
                    other => other,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { map, clients })
    }

    /// The client of `tenant`'s cell; [`Error::UnknownTenant`] when no cell serves it.
    pub fn for_tenant(&self, tenant: &str) -> Result<InventoryClient, Error> {
        self.map
            .by_tenant
            .get(tenant)
            .map(|&index| self.clients[index].clone())
            .ok_or_else(|| Error::UnknownTenant {
                tenant: tenant.to_owned(),
            })
    }

    /// The client of the cell named `name`, if the map has one (to reach every cell in
    /// turn, with [`CellMap::cells`]).
    pub fn for_cell(&self, name: &str) -> Option<InventoryClient> {
        self.map
            .cells()
            .iter()
            .position(|cell| cell.name == name)
            .map(|index| self.clients[index].clone())
    }

    /// The map the clients were made from.
    pub fn map(&self) -> &CellMap {
        &self.map
    }
}

#[cfg(test)]
mod tests;
