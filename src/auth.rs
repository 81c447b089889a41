//! Who may call what, and how much. Callers present a bearer token (`authorization: Bearer
//! <token>`: an opaque token, or a JWT signed by a key of the configured JWKS) or, with mutual
//! TLS, their client certificate (pinned by digest, or named by its SPIFFE ID or DNS name
//! under the client CA). Opaque tokens and pinned certificates are configured only as SHA-256
//! digests; no credential is ever logged. Each caller has one role:
//!
//! | role | may call | reservations it sees |
//! |---|---|---|
//! | `reader` | `GetStock`, `GetReservation`, `ListReservations` | its own |
//! | `reserver` | the above, `Reserve`, `ExtendReservation`, `ConfirmReservation`, `ReleaseReservation`, `CancelOrder` | its own |
//! | `watcher` | `GetStock`, `GetReservation`, `ListReservations`, `WatchEvents`, the subscription calls | every caller's (read only) |
//! | `admin` | every call | every caller's |
//! | `operator` | every call, in the tenant its `inventory-tenant` header names (its own without one) | every caller's |
//!
//! Every caller also belongs to exactly one tenant (`tenant=` on its credentials line, the
//! tenant claim of its JWT; `default` without authentication, and without either while one
//! tenant is served: serving several, a tenant is never implied), and every call
//! works in that tenant's data only: another tenant's SKUs, reservations and events are not
//! there for it at all. An `admin` is the admin of its own tenant. Only an `operator` (for
//! support) acts in a tenant it chooses per call, and each of its calls is logged as such.
//!
//! A reservation outside what a caller sees answers `NOT_FOUND`, exactly like one that does
//! not exist. The caller's name also scopes idempotency keys, so one client can never replay
//! or collide with another's key. Health and reflection need no credentials.
//!
//! The credentials file and the JWKS file are re-read while the server runs
//! ([`Gate::replace`]), so tokens and signing keys rotate without a restart. A line of the
//! credentials file may also give its caller limits (`max_in_flight`, `max_holds`,
//! `max_held_units`), over the defaults every caller has ([`CallerLimits`]).

mod jwt;

use std::{
    collections::HashMap,
    fmt,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use arc_swap::ArcSwap;

use inventory_core::{
    Error,
    domain::{Caller, Scope, Tenant},
    quota::HoldCaps,
};

use crate::access::Subject;
use sha2::{Digest, Sha256};
use tonic::{Request, Status};

pub use jwt::JwtSettings;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Reader,
    Reserver,
    Watcher,
    Admin,
    /// An admin of every tenant, one per call: support, not applications.
    Operator,
}

impl Role {
    pub(crate) fn parse(raw: &str) -> Option<Self> {
        Some(match raw {
            "reader" => Self::Reader,
            "reserver" => Self::Reserver,
            "watcher" => Self::Watcher,
            "admin" => Self::Admin,
            "operator" => Self::Operator,
            _ => return None,
        })
    }

    /// The role table: whether this role may make calls of this kind.
    fn may(self, action: Action) -> bool {
        match action {
            Action::Read => true,
            Action::Reserve => matches!(self, Self::Reserver | Self::Admin | Self::Operator),
            Action::Watch => matches!(self, Self::Watcher | Self::Admin | Self::Operator),
            Action::Adjust => matches!(self, Self::Admin | Self::Operator),
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

/// What one caller may take at once. `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallerLimits {
    /// Calls of this caller in flight in one replica; more are refused with
    /// `RESOURCE_EXHAUSTED` (`CALLER_SATURATED`).
    pub max_in_flight: Option<u32>,
    /// Live holds and held units, fleet-wide (`CALLER_QUOTA_EXCEEDED`).
    pub caps: HoldCaps,
}

impl CallerLimits {
    /// Reads `key=value` options over `self`; a problem names the option.
    fn with_options<'a>(mut self, options: impl Iterator<Item = &'a str>) -> Result<Self, String> {
        for option in options {
            let Some((key, value)) = option.split_once('=') else {
                return Err(format!("'{option}' is not <limit>=<number>"));
            };
            let number: u64 = value
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{key} must be a positive whole number"))?;
            match key {
                "max_in_flight" => {
                    self.max_in_flight = Some(
                        u32::try_from(number)
                            .map_err(|_| "max_in_flight is too large".to_owned())?,
                    );
                }
                "max_holds" => self.caps.max_holds = Some(number),
                "max_held_units" => self.caps.max_held_units = Some(number),
                _ => {
                    return Err(format!(
                        "unknown limit '{key}' (max_in_flight, max_holds or max_held_units)"
                    ));
                }
            }
        }
        Ok(self)
    }
}

/// An authenticated caller, its role, its tenant and its limits.
#[derive(Clone, Debug)]
pub struct Principal {
    caller: Caller,
    role: Role,
    tenant: Tenant,
    limits: CallerLimits,
}

/// The metadata header an `operator` names the tenant of its call with.
pub const TENANT_HEADER: &str = "inventory-tenant";

impl Principal {
    pub fn new(caller: Caller, role: Role) -> Self {
        Self {
            caller,
            role,
            tenant: Tenant::default_tenant(),
            limits: CallerLimits::default(),
        }
    }

    /// The same caller, of `tenant`.
    pub fn in_tenant(mut self, tenant: Tenant) -> Self {
        self.tenant = tenant;
        self
    }

    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    /// The tenant whose data this call works in.
    pub fn tenant(&self) -> &Tenant {
        &self.tenant
    }

    /// Whether this call acts in a tenant by an operator's choice rather than its own.
    pub fn is_operator(&self) -> bool {
        self.role == Role::Operator
    }

    pub fn limits(&self) -> &CallerLimits {
        &self.limits
    }

    /// The reservations this caller may read: `watcher` and `admin` read every caller's.
    pub fn read_scope(&self) -> Scope {
        match self.role {
            Role::Watcher | Role::Admin | Role::Operator => Scope::All,
            Role::Reader | Role::Reserver => Scope::Own(self.caller.clone()),
        }
    }

    /// The reservations this caller may change: only `admin` changes another's.
    pub fn write_scope(&self) -> Scope {
        match self.role {
            Role::Admin | Role::Operator => Scope::All,
            _ => Scope::Own(self.caller.clone()),
        }
    }
}

/// Where the credentials come from, and the limits of callers no line names: what the
/// authenticator is built from, at start and at every reload.
#[derive(Clone, Debug, Default)]
pub struct AuthSources {
    pub tokens_file: Option<PathBuf>,
    pub jwt: Option<JwtSettings>,
    pub defaults: CallerLimits,
    /// More than one tenant is served: every caller names its tenant (`tenant=` on its
    /// credentials line, the tenant claim of its JWT), and none is `default`'s by omission.
    pub tenant_required: bool,
}

impl AuthSources {
    /// Every file whose change matters.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self.tokens_file.iter().cloned().collect();
        files.extend(self.jwt.iter().map(|jwt| jwt.jwks_file.clone()));
        files
    }

    /// The files' bytes, in [`Self::files`] order, or the first that cannot be read.
    pub fn read(&self) -> Result<Vec<Vec<u8>>, String> {
        self.files()
            .iter()
            .map(|path| std::fs::read(path).map_err(|error| format!("{}: {error}", path.display())))
            .collect()
    }

    /// The authenticator the files describe; every problem is reported.
    pub fn load(&self) -> Result<Authenticator, Vec<String>> {
        let contents = self.read().map_err(|problem| vec![problem])?;
        self.parse(&contents)
    }

    /// [`Self::load`] from bytes already read (see [`Self::read`]).
    pub fn parse(&self, contents: &[Vec<u8>]) -> Result<Authenticator, Vec<String>> {
        let mut contents = contents.iter();
        let mut authenticator = match &self.tokens_file {
            Some(_) => Authenticator::parse_with(
                &String::from_utf8_lossy(contents.next().map_or(&[][..], Vec::as_slice)),
                self.defaults,
                self.jwt.is_some(),
                self.tenant_required,
            )?,
            None => Authenticator::empty(self.defaults),
        };
        authenticator.tenant_required = self.tenant_required;
        if let Some(settings) = &self.jwt {
            let text = String::from_utf8_lossy(contents.next().map_or(&[][..], Vec::as_slice));
            authenticator.jwt = Some(jwt::Verifier::parse(settings, &text)?);
        }
        Ok(authenticator)
    }
}

/// The configured credentials, or the explicit choice to run without.
#[derive(Clone)]
pub struct Authenticator {
    disabled: bool,
    tokens: HashMap<[u8; 32], Principal>,
    certificates: HashMap<[u8; 32], Principal>,
    /// Client certificates by a URI SAN (a SPIFFE ID), exactly.
    uris: HashMap<String, Principal>,
    /// Client certificates by a DNS SAN, exactly (lower case).
    dns_names: HashMap<String, Principal>,
    /// JWT subjects mapped to a named caller (`jwt:<subject>` lines).
    subjects: HashMap<String, Principal>,
    /// Every caller a line names, with its limits: the callers metrics name.
    named: HashMap<String, CallerLimits>,
    defaults: CallerLimits,
    jwt: Option<jwt::Verifier>,
    /// Every caller names its tenant: a signed token of a subject no line maps needs the
    /// tenant claim (see [`AuthSources::tenant_required`]).
    tenant_required: bool,
}

impl fmt::Debug for Authenticator {
    /// Lists counts only: digests are not secrets, but there is no reason to print them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("disabled", &self.disabled)
            .field("tokens", &self.tokens.len())
            .field("certificates", &self.certificates.len())
            .field("uris", &self.uris.len())
            .field("dns_names", &self.dns_names.len())
            .field("subjects", &self.subjects.len())
            .field("jwt", &self.jwt.is_some())
            .finish()
    }
}

/// Which table a credential goes to, and its key there.
enum Credential {
    Token([u8; 32]),
    Certificate([u8; 32]),
    Uri(String),
    Dns(String),
    /// A JWT subject (the caller claim's value) mapped to this line's caller.
    Subject(String),
}

impl Credential {
    fn parse(raw: &str) -> Result<Self, String> {
        let digest = |hex| parse_digest(hex).ok_or("the digest must be 64 hex digits".to_owned());
        match raw.split_once(':') {
            Some(("token-sha256", hex)) => Ok(Self::Token(digest(hex)?)),
            Some(("cert-sha256", hex)) => Ok(Self::Certificate(digest(hex)?)),
            Some(("spiffe", _)) if raw.len() > "spiffe://".len() && raw.starts_with("spiffe://") => {
                Ok(Self::Uri(raw.to_owned()))
            }
            Some(("uri", uri)) if !uri.is_empty() => Ok(Self::Uri(uri.to_owned())),
            Some(("dns", name)) if !name.is_empty() && !name.contains('*') => {
                Ok(Self::Dns(name.to_ascii_lowercase()))
            }
            Some(("jwt", subject)) if !subject.is_empty() => Ok(Self::Subject(subject.to_owned())),
            _ => Err(
                "credential must be token-sha256:<hex>, cert-sha256:<hex>, spiffe://<trust domain>/<path>, uri:<uri>, dns:<name> or jwt:<subject>"
                    .into(),
            ),
        }
    }
}

impl Authenticator {
    /// Every call is allowed, as the anonymous caller. Only ever chosen explicitly.
    pub fn disabled() -> Self {
        Self::disabled_with(CallerLimits::default())
    }

    /// [`Self::disabled`], the anonymous caller bound by `defaults`.
    pub fn disabled_with(defaults: CallerLimits) -> Self {
        Self {
            disabled: true,
            ..Self::empty(defaults)
        }
    }

    fn empty(defaults: CallerLimits) -> Self {
        Self {
            disabled: false,
            tokens: HashMap::new(),
            certificates: HashMap::new(),
            uris: HashMap::new(),
            dns_names: HashMap::new(),
            subjects: HashMap::new(),
            named: HashMap::new(),
            defaults,
            jwt: None,
            tenant_required: false,
        }
    }

    pub fn is_disabled(&self) -> bool {
        self.disabled
    }

    /// A credentials file alone, with no default limits and no JWT.
    pub fn from_file(path: &std::path::Path) -> Result<Self, Vec<String>> {
        AuthSources {
            tokens_file: Some(path.to_owned()),
            ..AuthSources::default()
        }
        .load()
        .map_err(|problems| {
            problems
                .into_iter()
                .map(|problem| format!("AUTH_TOKENS_FILE {problem}"))
                .collect()
        })
    }

    /// A credentials file's text, with no default limits and no JWT.
    pub fn parse(text: &str) -> Result<Self, Vec<String>> {
        Self::parse_with(text, CallerLimits::default(), false, false)
    }

    /// Reads a credentials file: one `<name> <role> <credential> [<limit>=<n> ...]` per line,
    /// where credential is `token-sha256:<64 hex>` (of a bearer token),
    /// `cert-sha256:<64 hex>` (of a client certificate's DER), `spiffe://...` or `uri:<uri>`
    /// (a client certificate's URI SAN), `dns:<name>` (its DNS SAN), or `jwt:<subject>` (a
    /// JWT whose caller claim is `subject`: it is this line's caller, with this line's
    /// role); `#` starts a comment. Limits are `max_in_flight`, `max_holds`, `max_held_units`; a caller on
    /// several lines gives its limits on one, or the same on each. Every problem is
    /// reported with its line number. `jwt`: signed tokens are accepted too, so a file
    /// that names no credential (only limits, or nothing) is fine.
    fn parse_with(
        text: &str,
        defaults: CallerLimits,
        jwt: bool,
        tenant_required: bool,
    ) -> Result<Self, Vec<String>> {
        let mut authenticator = Self::empty(defaults);
        let mut problems = Vec::new();
        let mut limited: HashMap<String, (usize, CallerLimits)> = HashMap::new();
        let mut tenants: HashMap<String, (usize, Tenant)> = HashMap::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let number = index + 1;
            let problem = |text: String| format!("AUTH_TOKENS_FILE line {number}: {text}");
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, role, credential, options @ ..] = &fields[..] else {
                problems.push(problem(
                    "expected <name> <role> <credential> [tenant=<tenant>] [<limit>=<n> ...]"
                        .into(),
                ));
                continue;
            };
            let Some(role) = Role::parse(role) else {
                problems.push(problem(
                    "role must be reader, reserver, watcher, admin or operator".into(),
                ));
                continue;
            };
            let caller = match Caller::parse(name) {
                Ok(_) if name.starts_with(JWT_CALLERS) => {
                    problems.push(problem(format!(
                        "names starting with {JWT_CALLERS} are those of JWT callers no line maps"
                    )));
                    continue;
                }
                Ok(caller) => caller,
                Err(text) => {
                    problems.push(problem(format!("name {text}")));
                    continue;
                }
            };
            let credential = match Credential::parse(credential) {
                Ok(Credential::Subject(_)) if !jwt => {
                    problems.push(problem("jwt: credentials need JWT_JWKS_FILE".into()));
                    continue;
                }
                Ok(credential) => credential,
                Err(text) => {
                    problems.push(problem(text));
                    continue;
                }
            };
            let (tenant_options, options): (Vec<&str>, Vec<&str>) = options
                .iter()
                .copied()
                .partition(|option| option.starts_with("tenant="));
            let tenant = match tenant_options.as_slice() {
                [] if tenant_required => {
                    problems.push(problem(
                        "names no tenant=, and this server serves several (TENANTS): a caller's tenant is never implied".into(),
                    ));
                    continue;
                }
                [] => Tenant::default_tenant(),
                [option] => match Tenant::parse(&option["tenant=".len()..]) {
                    Ok(tenant) => tenant,
                    Err(text) => {
                        problems.push(problem(format!("tenant {text}")));
                        continue;
                    }
                },
                _ => {
                    problems.push(problem("a line names one tenant".into()));
                    continue;
                }
            };
            match tenants.get(*name) {
                Some((first, earlier)) if *earlier != tenant => {
                    problems.push(problem(format!(
                        "{name} is of tenant {earlier} on line {first}: a caller belongs to one tenant"
                    )));
                    continue;
                }
                Some(_) => {}
                None => {
                    tenants.insert((*name).to_owned(), (number, tenant.clone()));
                }
            }
            let limits = match defaults.with_options(options.iter().copied()) {
                Ok(limits) => limits,
                Err(text) => {
                    problems.push(problem(text));
                    continue;
                }
            };
            if !options.is_empty() {
                match limited.get(*name) {
                    Some((first, earlier)) if *earlier != limits => {
                        problems.push(problem(format!(
                            "{name} has other limits on line {first}: give them on one line"
                        )));
                        continue;
                    }
                    Some(_) => {}
                    None => {
                        limited.insert((*name).to_owned(), (number, limits));
                    }
                }
            }
            let principal = Principal {
                caller,
                role,
                tenant,
                limits,
            };
            let listed_twice = match credential {
                Credential::Token(digest) => authenticator.tokens.insert(digest, principal),
                Credential::Certificate(digest) => {
                    authenticator.certificates.insert(digest, principal)
                }
                Credential::Uri(uri) => authenticator.uris.insert(uri, principal),
                Credential::Dns(name) => authenticator.dns_names.insert(name, principal),
                Credential::Subject(subject) => authenticator.subjects.insert(subject, principal),
            }
            .is_some();
            if listed_twice {
                problems.push(problem("this credential is listed twice".into()));
            }
            authenticator
                .named
                .entry((*name).to_owned())
                .or_insert(defaults);
        }
        // Limits given on one line hold for every credential of that caller.
        for (name, (_, limits)) in limited {
            authenticator.named.insert(name.clone(), limits);
            for principal in authenticator.principals_mut() {
                if principal.caller.as_str() == name {
                    principal.limits = limits;
                }
            }
        }
        if problems.is_empty() && authenticator.named.is_empty() && !jwt {
            problems.push("AUTH_TOKENS_FILE lists no credentials".into());
        }
        if problems.is_empty() {
            Ok(authenticator)
        } else {
            Err(problems)
        }
    }

    fn principals_mut(&mut self) -> impl Iterator<Item = &mut Principal> {
        self.tokens
            .values_mut()
            .chain(self.certificates.values_mut())
            .chain(self.uris.values_mut())
            .chain(self.dns_names.values_mut())
            .chain(self.subjects.values_mut())
    }

    /// The caller, if its credentials allow `action`. Without authentication every call is
    /// the anonymous caller's, with every right.
    pub fn authorize<T>(&self, request: &Request<T>, action: Action) -> Result<Principal, Status> {
        let principal = chosen_tenant(self.identify_caller(request)?, request.metadata())?;
        self.allow(principal, action)
    }

    /// Who is calling, whatever it asks for, in its own tenant.
    fn identify_caller<T>(&self, request: &Request<T>) -> Result<Principal, Status> {
        if self.disabled {
            return Ok(Principal {
                caller: Caller::anonymous(),
                role: Role::Admin,
                tenant: Tenant::default_tenant(),
                limits: self.defaults,
            });
        }
        self.identify(request)
    }

    /// `principal`, if its role allows `action`.
    fn allow(&self, principal: Principal, action: Action) -> Result<Principal, Status> {
        if !principal.role.may(action) {
            return Err(Status::permission_denied(format!(
                "caller {} may not make this call",
                principal.caller.as_str()
            )));
        }
        Ok(principal)
    }

    /// The name metrics give `caller`: itself if a line of the credentials file names it
    /// (or it is the anonymous caller of a server without authentication), else
    /// [`OTHER_CALLERS`], so signed tokens cannot grow a series per subject.
    pub fn label(&self, caller: &Caller) -> String {
        if self.disabled && caller.as_str().is_empty() {
            ANONYMOUS.to_owned()
        } else if self.named.contains_key(caller.as_str()) {
            caller.as_str().to_owned()
        } else {
            OTHER_CALLERS.to_owned()
        }
    }

    fn identify<T>(&self, request: &Request<T>) -> Result<Principal, Status> {
        if let Some(header) = request.metadata().get("authorization") {
            // Never echo the header: it holds the secret.
            let token = header
                .to_str()
                .ok()
                .and_then(|value| value.strip_prefix("Bearer "))
                .ok_or_else(|| {
                    Status::unauthenticated("the authorization header must be 'Bearer <token>'")
                })?;
            if let Some(principal) = self.tokens.get(&sha256(token.as_bytes())) {
                return Ok(principal.clone());
            }
            return match &self.jwt {
                Some(verifier) if jwt::looks_like_jwt(token) => {
                    let (subject, role, claimed) = verifier.verify(token).map_err(|problem| {
                        Status::unauthenticated(format!("invalid token: {problem}"))
                    })?;
                    // A subject a line maps is that line's caller, with its role; any other
                    // is a caller of its own, `jwt:<subject>`, which no line can name, so a
                    // signed token never shares another caller's keys or reservations.
                    if let Some(principal) = self.subjects.get(&subject) {
                        // The line's tenant is the caller's; a token claiming another is not
                        // this line's caller (subjects may repeat across an issuer's realms).
                        if let Some(claimed) = claimed.filter(|c| c != &principal.tenant) {
                            return Err(Status::permission_denied(format!(
                                "the token's tenant {claimed} is not the tenant of the line that names its subject"
                            )));
                        }
                        return Ok(principal.clone());
                    }
                    // Power over every tenant comes from the operator's own configuration
                    // (a line naming the subject), never from a claim: whoever can shape a
                    // token's claims at the issuer (a tenant's admin editing its mappings)
                    // would otherwise make itself the admin of every tenant.
                    let role = role.map_err(|problem| {
                        Status::unauthenticated(format!("invalid token: {problem}"))
                    })?;
                    if role == Role::Operator {
                        return Err(Status::permission_denied(format!(
                            "a token's claims cannot make its caller an operator: name the subject on a line of role operator ({JWT_CALLERS}<subject>)"
                        )));
                    }
                    let caller = Caller::parse(&format!("{JWT_CALLERS}{subject}")).map_err(
                        |problem| {
                            Status::unauthenticated(format!(
                                "invalid token: as a caller name, {JWT_CALLERS}<caller claim> {problem}; map the subject with a jwt:<subject> line"
                            ))
                        },
                    )?;
                    let tenant = match claimed {
                        Some(tenant) => tenant,
                        None if self.tenant_required => {
                            return Err(Status::permission_denied(
                                "the token names no tenant, and this server serves several: a caller's tenant is never implied",
                            ));
                        }
                        None => Tenant::default_tenant(),
                    };
                    Ok(Principal {
                        caller,
                        role,
                        tenant,
                        limits: self.defaults,
                    })
                }
                _ => Err(Status::unauthenticated("unknown token")),
            };
        }
        if let Some(leaf) = request
            .peer_certs()
            .and_then(|certificates| certificates.first().cloned())
        {
            return self
                .certificate(leaf.as_ref())
                .ok_or_else(|| Status::unauthenticated("unknown client certificate"));
        }
        Err(Status::unauthenticated(
            "credentials required: send 'authorization: Bearer <token>'",
        ))
    }

    /// A client certificate the TLS layer already verified against the client CA: its
    /// pinned digest first, else its SANs (URI, then DNS). A certificate whose SANs name two
    /// different callers is refused rather than guessed at.
    fn certificate(&self, der: &[u8]) -> Option<Principal> {
        if let Some(principal) = self.certificates.get(&sha256(der)) {
            return Some(principal.clone());
        }
        if self.uris.is_empty() && self.dns_names.is_empty() {
            return None;
        }
        let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
        let names = certificate.subject_alternative_name().ok()??;
        let mut found: Option<&Principal> = None;
        for name in &names.value.general_names {
            let principal = match name {
                x509_parser::extensions::GeneralName::URI(uri) => self.uris.get(*uri),
                x509_parser::extensions::GeneralName::DNSName(dns) => {
                    self.dns_names.get(&dns.to_ascii_lowercase())
                }
                _ => None,
            };
            match (found, principal) {
                (_, None) => {}
                (None, Some(principal)) => found = Some(principal),
                (Some(first), Some(other)) if first.caller != other.caller => return None,
                (Some(_), Some(_)) => {}
            }
        }
        found.cloned()
    }
}

/// The tenant a call works in: its caller's, or for an `operator` the one its
/// [`TENANT_HEADER`] names (its own, from its credentials, without one). Any other caller
/// naming a tenant not its own is refused (the anonymous caller of a server without
/// authentication too: its tenant is `default`): a tenant comes from credentials, never
/// from the request.
fn chosen_tenant(
    principal: Principal,
    metadata: &tonic::metadata::MetadataMap,
) -> Result<Principal, Status> {
    let Some(header) = metadata.get(TENANT_HEADER) else {
        return Ok(principal);
    };
    let named = header
        .to_str()
        .ok()
        .and_then(|raw| Tenant::parse(raw).ok())
        .ok_or_else(|| {
            Status::invalid_argument(format!("{TENANT_HEADER} must be a tenant name"))
        })?;
    if principal.role == Role::Operator {
        return Ok(principal.in_tenant(named));
    }
    if named == principal.tenant {
        return Ok(principal);
    }
    Err(Status::permission_denied(format!(
        "caller {} may not choose a tenant: only an operator names one in {TENANT_HEADER}",
        principal.caller.as_str()
    )))
}

/// The prefix of the callers signed tokens name that no `jwt:<subject>` line maps.
pub const JWT_CALLERS: &str = "jwt:";

/// The metric label of calls whose caller no line names (or that were not authenticated).
pub const OTHER_CALLERS: &str = "_OTHER";
/// The metric label of the one caller of a server without authentication.
pub const ANONYMOUS: &str = "anonymous";

/// The credentials in force, swapped whole when the credentials or JWKS file changes: a call
/// in flight keeps the set it was authorized with, the next call sees the new one. Also
/// counts each limited caller's calls in flight in this replica, across reloads.
#[derive(Clone, Debug)]
pub struct Gate {
    current: Arc<ArcSwap<Authenticator>>,
    in_flight: InFlight,
}

impl Gate {
    pub fn new(authenticator: Authenticator) -> Self {
        Self {
            current: Arc::new(ArcSwap::from_pointee(authenticator)),
            in_flight: Arc::default(),
        }
    }

    /// The caller, if its credentials allow `action`; the call's note learns who it is
    /// either way, so a refusal for a missing role is attributed too.
    pub fn authorize<T: Subject>(
        &self,
        request: &Request<T>,
        action: Action,
    ) -> Result<Principal, Status> {
        let current = self.current.load();
        let principal = current.identify_caller(request)?;
        // Noted before the tenant it asks for is judged, so a refusal names its caller.
        crate::access::attribute(request, &principal, || current.label(principal.caller()));
        let principal = chosen_tenant(principal, request.metadata())?;
        if principal.is_operator() {
            crate::access::attribute(request, &principal, || current.label(principal.caller()));
        }
        current.allow(principal, action)
    }

    /// See [`Authenticator::label`].
    pub fn label(&self, caller: &Caller) -> String {
        self.current.load().label(caller)
    }

    pub fn replace(&self, authenticator: Authenticator) {
        self.current.store(Arc::new(authenticator));
    }

    /// A place among the caller's calls in flight, held until the permit drops, or
    /// [`Error::CallerSaturated`] when it has its `max_in_flight` already.
    pub fn admit(&self, principal: &Principal) -> Result<CallerPermit, Error> {
        let Some(limit) = principal.limits.max_in_flight else {
            return Ok(CallerPermit(None));
        };
        // By tenant and caller: the same JWT subject may call in two tenants.
        let name = format!("{}/{}", principal.tenant, principal.caller.as_str());
        let mut counts = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(name.clone()).or_default();
        if *count >= limit {
            return Err(Error::CallerSaturated {
                caller: principal.caller.clone(),
                limit,
            });
        }
        *count += 1;
        Ok(CallerPermit(Some((Arc::clone(&self.in_flight), name))))
    }
}

/// One call's place among its caller's calls in flight; given back on drop.
#[derive(Debug)]
pub struct CallerPermit(Option<(InFlight, String)>);

/// Calls in flight by caller, for the callers with a limit.
type InFlight = Arc<Mutex<HashMap<String, u32>>>;

impl Drop for CallerPermit {
    fn drop(&mut self) {
        if let Some((counts, name)) = self.0.take() {
            let mut counts = counts.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(count) = counts.get_mut(&name) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    counts.remove(&name);
                }
            }
        }
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
