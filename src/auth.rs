//! Who may call what. Callers present a bearer token (`authorization: Bearer <token>`) or, with
//! mutual TLS, their client certificate. Credentials are configured only as SHA-256 digests
//! and never logged. Each caller has one role:
//!
//! | role | may call |
//! |---|---|
//! | `reader` | `GetStock`, `GetReservation`, `WatchEvents` |
//! | `reserver` | the above, `Reserve`, `ConfirmReservation`, `ReleaseReservation` |
//! | `admin` | the above, `AdjustStock` |
//!
//! The caller's name scopes idempotency keys, so one client can never replay or collide with
//! another's key. Health and reflection need no credentials.

use std::{collections::HashMap, fmt, path::Path};

use inventory_core::domain::Caller;
use sha2::{Digest, Sha256};
use tonic::{Request, Status};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Reader,
    Reserver,
    Admin,
}

impl Role {
    fn parse(raw: &str) -> Option<Self> {
        Some(match raw {
            "reader" => Self::Reader,
            "reserver" => Self::Reserver,
            "admin" => Self::Admin,
            _ => return None,
        })
    }
}

/// What a call needs: the least role allowed to make it.
#[derive(Clone, Copy, Debug)]
pub enum Action {
    Read,
    Reserve,
    Adjust,
}

impl Action {
    fn needs(self) -> Role {
        match self {
            Self::Read => Role::Reader,
            Self::Reserve => Role::Reserver,
            Self::Adjust => Role::Admin,
        }
    }
}

#[derive(Clone, Debug)]
struct Principal {
    caller: Caller,
    role: Role,
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
                    "AUTH_TOKENS_FILE line {number}: role must be reader, reserver or admin"
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

    /// The caller, if its credentials allow `action`.
    pub fn authorize<T>(&self, request: &Request<T>, action: Action) -> Result<Caller, Status> {
        if self.disabled {
            return Ok(Caller::anonymous());
        }
        let principal = self.identify(request)?;
        if principal.role < action.needs() {
            return Err(Status::permission_denied(format!(
                "caller {} may not make this call",
                principal.caller.as_str()
            )));
        }
        Ok(principal.caller.clone())
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
mod tests {
    use super::*;

    #[test]
    fn a_credentials_file_is_parsed_and_checked_line_by_line() {
        let good = format!(
            "# who  role  credential\norder-service reserver token-sha256:{}\nops admin cert-sha256:{} # pinned\n",
            digest_hex(b"secret-1"),
            "ab".repeat(32)
        );
        let auth = Authenticator::parse(&good).unwrap();
        assert_eq!(auth.tokens.len(), 1);
        assert_eq!(auth.certificates.len(), 1);

        let bad = "a reserver token-sha256:xyz\nb boss token-sha256:00\nc reserver password:1\nd\n";
        let problems = Authenticator::parse(bad).unwrap_err();
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].contains("line 1") && problems[0].contains("64 hex"));
        assert!(problems[1].contains("line 2") && problems[1].contains("role"));
        assert!(problems[3].contains("line 4"));
        assert!(Authenticator::parse("# nothing\n").is_err());
    }

    #[test]
    fn roles_are_ordered_by_what_they_may_do() {
        assert!(Role::Reader < Role::Reserver && Role::Reserver < Role::Admin);
        assert_eq!(Action::Adjust.needs(), Role::Admin);
    }
}
