//! Who may call what. Callers present a bearer token (`authorization: Bearer <token>`) or, with
//! mutual TLS, their client certificate. Credentials are configured only as SHA-256 digests
//! and never logged. Each caller has one role:
//!
//! | role | may call | reservations it sees |
//! |---|---|---|
//! | `reader` | `GetStock`, `GetReservation`, `ListReservations` | its own |
//! | `reserver` | the above, `Reserve`, `ExtendReservation`, `ConfirmReservation`, `ReleaseReservation`, `CancelOrder` | its own |
//! | `watcher` | `GetStock`, `GetReservation`, `ListReservations`, `WatchEvents` | every caller's (read only) |
//! | `admin` | every call | every caller's |
//!
//! A reservation outside what a caller sees answers `NOT_FOUND`, exactly like one that does
//! not exist. The caller's name also scopes idempotency keys, so one client can never replay
//! or collide with another's key. Health and reflection need no credentials.
//!
//! The credentials file is re-read while the server runs ([`Gate::replace`]), so tokens rotate
//! without a restart.

use std::{collections::HashMap, fmt, path::Path, sync::Arc};

use arc_swap::ArcSwap;

use inventory_core::domain::{Caller, Scope};
use sha2::{Digest, Sha256};
use tonic::{Request, Status};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Reader,
    Reserver,
    Watcher,
    Admin,
}

impl Role {
    fn parse(raw: &str) -> Option<Self> {
        Some(match raw {
            "reader" => Self::Reader,
            "reserver" => Self::Reserver,
            "watcher" => Self::Watcher,
            "admin" => Self::Admin,
            _ => return None,
        })
    }

    /// The role table: whether this role may make calls of this kind.
    fn may(self, action: Action) -> bool {
        match action {
            Action::Read => true,
            Action::Reserve => matches!(self, Self::Reserver | Self::Admin),
            Action::Watch => matches!(self, Self::Watcher | Self::Admin),
            Action::Adjust => self == Self::Admin,
        }
    }
}

/// What a call needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Stock levels and reservations (`GetStock`, `GetReservation`).
    Read,
    /// Making and settling reservations.
    Reserve,
    /// The event stream: every caller's orders, so a role of its own.
    Watch,
    /// Changing stock.
    Adjust,
}

/// An authenticated caller and its role.
#[derive(Clone, Debug)]
pub struct Principal {
    caller: Caller,
    role: Role,
}

impl Principal {
    pub fn new(caller: Caller, role: Role) -> Self {
        Self { caller, role }
    }

    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    /// The reservations this caller may read: `watcher` and `admin` read every caller's.
    pub fn read_scope(&self) -> Scope {
        match self.role {
            Role::Watcher | Role::Admin => Scope::All,
            Role::Reader | Role::Reserver => Scope::Own(self.caller.clone()),
        }
    }

    /// The reservations this caller may change: only `admin` changes another's.
    pub fn write_scope(&self) -> Scope {
        match self.role {
            Role::Admin => Scope::All,
            _ => Scope::Own(self.caller.clone()),
        }
    }
}

/// The configured credentials, or the explicit choice to run without.
#[derive(Clone)]
pub struct Authenticator {
    disabled: bool,
    tokens: HashMap<[u8; 32], Principal>,
    certificates: HashMap<[u8; 32], Principal>,
}

impl fmt::Debug for Authenticator {
    /// Lists counts only: digests are not secrets, but there is no reason to print them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("disabled", &self.disabled)
            .field("tokens", &self.tokens.len())
            .field("certificates", &self.certificates.len())
            .finish()
    }
}

impl Authenticator {
    /// Every call is allowed, as the anonymous caller. Only ever chosen explicitly.
    pub fn disabled() -> Self {
        Self {
            disabled: true,
            tokens: HashMap::new(),
            certificates: HashMap::new(),
        }
    }

    pub fn is_disabled(&self) -> bool {
        self.disabled
    }

    /// Reads a credentials file: one `<name> <role> <credential>` per line, where credential
    /// is `token-sha256:<64 hex>` or `cert-sha256:<64 hex>` (of the certificate's DER);
    /// `#` starts a comment. Every problem is reported with its line number.
    pub fn from_file(path: &Path) -> Result<Self, Vec<String>> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| vec![format!("AUTH_TOKENS_FILE {}: {error}", path.display())])?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Self, Vec<String>> {
        let mut authenticator = Self {
            disabled: false,
            tokens: HashMap::new(),
            certificates: HashMap::new(),
        };
        let mut problems = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let number = index + 1;
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, role, credential] = fields[..] else {
                problems.push(format!(
                    "AUTH_TOKENS_FILE line {number}: expected <name> <role> <credential>"
                ));
                continue;
            };
            let Some(role) = Role::parse(role) else {
                problems.push(format!(
                    "AUTH_TOKENS_FILE line {number}: role must be reader, reserver, watcher or admin"
                ));
                continue;
            };
            let caller = match Caller::parse(name) {
                Ok(caller) => caller,
                Err(problem) => {
                    problems.push(format!("AUTH_TOKENS_FILE line {number}: name {problem}"));
                    continue;
                }
            };
            let (table, digest) = match credential.split_once(':') {
                Some(("token-sha256", hex)) => (&mut authenticator.tokens, hex),
                Some(("cert-sha256", hex)) => (&mut authenticator.certificates, hex),
                _ => {
                    problems.push(format!(
                        "AUTH_TOKENS_FILE line {number}: credential must be token-sha256:<hex> or cert-sha256:<hex>"
                    ));
                    continue;
                }
            };
            let Some(digest) = parse_digest(digest) else {
                problems.push(format!(
                    "AUTH_TOKENS_FILE line {number}: the digest must be 64 hex digits"
                ));
                continue;
            };
            if table.insert(digest, Principal { caller, role }).is_some() {
                problems.push(format!(
                    "AUTH_TOKENS_FILE line {number}: this credential is listed twice"
                ));
            }
        }
        if problems.is_empty()
            && authenticator.tokens.is_empty()
            && authenticator.certificates.is_empty()
        {
            problems.push("AUTH_TOKENS_FILE lists no credentials".into());
        }
        if problems.is_empty() {
            Ok(authenticator)
        } else {
            Err(problems)
        }
    }

    /// The caller, if its credentials allow `action`. Without authentication every call is
    /// the anonymous caller's, with every right.
    pub fn authorize<T>(&self, request: &Request<T>, action: Action) -> Result<Principal, Status> {
        if self.disabled {
            return Ok(Principal {
                caller: Caller::anonymous(),
                role: Role::Admin,
            });
        }
        let principal = self.identify(request)?;
        if !principal.role.may(action) {
            return Err(Status::permission_denied(format!(
                "caller {} may not make this call",
                principal.caller.as_str()
            )));
        }
        Ok(principal.clone())
    }

    fn identify<T>(&self, request: &Request<T>) -> Result<&Principal, Status> {
        if let Some(header) = request.metadata().get("authorization") {
            // Never echo the header: it holds the secret.
            let token = header
                .to_str()
                .ok()
                .and_then(|value| value.strip_prefix("Bearer "))
                .ok_or_else(|| {
                    Status::unauthenticated("the authorization header must be 'Bearer <token>'")
                })?;
            return self
                .tokens
                .get(&sha256(token.as_bytes()))
                .ok_or_else(|| Status::unauthenticated("unknown token"));
        }
        if let Some(leaf) = request
            .peer_certs()
            .and_then(|certificates| certificates.first().cloned())
        {
            return self
                .certificates
                .get(&sha256(leaf.as_ref()))
                .ok_or_else(|| Status::unauthenticated("unknown client certificate"));
        }
        Err(Status::unauthenticated(
            "credentials required: send 'authorization: Bearer <token>'",
        ))
    }
}

/// The credentials in force, swapped whole when the credentials file changes: a call in
/// flight keeps the set it was authorized with, the next call sees the new one.
#[derive(Clone, Debug)]
pub struct Gate(Arc<ArcSwap<Authenticator>>);

impl Gate {
    pub fn new(authenticator: Authenticator) -> Self {
        Self(Arc::new(ArcSwap::from_pointee(authenticator)))
    }

    pub fn authorize<T>(&self, request: &Request<T>, action: Action) -> Result<Principal, Status> {
        self.0.load().authorize(request, action)
    }

    pub fn replace(&self, authenticator: Authenticator) {
        self.0.store(Arc::new(authenticator));
    }
}

/// The digest to put in the credentials file for `secret` (`inventory-server hash-token`).
pub fn digest_hex(secret: &[u8]) -> String {
    sha256(secret).iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(digest)
}

#[cfg(test)]
mod tests;
