//! Domain values. Each newtype has a private field and a `parse`, so a value that exists past
//! the gRPC boundary is valid by construction.

use std::{
    fmt,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use uuid::Uuid;

/// A time as whole microseconds since the Unix epoch, the precision storage, fingerprints and
/// page tokens keep (0 before the epoch, `i64::MAX` past what it can count).
pub fn micros(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// The time [`micros`] counted (the epoch for a negative count).
pub fn from_micros(micros: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(micros.max(0) as u64)
}

/// Longest SKU, in bytes. SKUs become part of Redis keys, so they are short and plain.
pub const MAX_SKU_LEN: usize = 64;
/// Longest idempotency key or order id, in bytes.
pub const MAX_KEY_LEN: usize = 128;
/// Longest free-text reason, in characters.
pub const MAX_REASON_CHARS: usize = 256;
/// Largest stock change one `AdjustStock` may make, in either direction.
pub const MAX_DELTA: i64 = 1_000_000_000;
/// Largest `on_hand` a SKU may reach; the `stock` table enforces the same bound.
pub const MAX_ON_HAND: i64 = 1_000_000_000_000;
/// Most SKUs one `GetStock` may read.
pub const MAX_SKUS_PER_READ: usize = 100;
/// Most lines one reservation may have.
pub const MAX_LINES: usize = 100;
/// Largest quantity of one reservation line.
pub const MAX_QUANTITY: i64 = 1_000_000;
/// Shortest hold a reservation may ask for.
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// How long waiting demand (backorders, pre-orders) may wait from when its reservation was
/// made, unless configured otherwise (`WAIT_HORIZON`): a year.
pub const DEFAULT_WAIT_HORIZON: Duration = Duration::from_secs(365 * 86_400);
/// The longest wait horizon a deployment may configure: ten years.
pub const MAX_WAIT_HORIZON: Duration = Duration::from_secs(3_650 * 86_400);
/// Longest hold a reservation may ask for.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Checks a name made of `A-Z a-z 0-9 . _ - :`, 1 to `max` bytes: safe in Redis keys (no
/// braces, so hash tags stay intact), logs and metrics labels.
pub fn check_plain_name(raw: &str, max: usize) -> Result<(), String> {
    if raw.is_empty() {
        return Err("must not be empty".into());
    }
    if raw.len() > max {
        return Err(format!("must be at most {max} characters"));
    }
    if !raw
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'))
    {
        return Err("may contain only A-Z, a-z, 0-9, '.', '_', '-' and ':'".into());
    }
    Ok(())
}

/// Longest tenant name, in bytes.
pub const MAX_TENANT_LEN: usize = 31;

/// A tenant: a brand, sales channel or seller whose SKUs, locations, reservations, orders,
/// idempotency keys, ledger and events are its own. 1 to [`MAX_TENANT_LEN`] characters of
/// `a-z 0-9 _`, starting with a letter: a PostgreSQL identifier (its schema is
/// `tenant_<name>`), a Redis key segment and a metric label as it stands. It comes from the
/// authenticated caller, never from a request field.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tenant(String);

impl Tenant {
    /// The tenant of a deployment that configures none, of every caller without one, and of
    /// every row written before tenants existed.
    pub const DEFAULT: &'static str = "default";

    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() || raw.len() > MAX_TENANT_LEN {
            return Err(format!("must be 1 to {MAX_TENANT_LEN} characters"));
        }
        let mut bytes = raw.bytes();
        let first_is_letter = bytes.next().is_some_and(|b| b.is_ascii_lowercase());
        if !first_is_letter
            || !bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err("must start with a-z and contain only a-z, 0-9 and '_'".into());
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn default_tenant() -> Self {
        Self(Self::DEFAULT.to_owned())
    }

    pub fn is_default(&self) -> bool {
        self.0 == Self::DEFAULT
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A stock keeping unit: 1 to [`MAX_SKU_LEN`] characters from `A-Z a-z 0-9 . _ - :`.
///
/// The alphabet keeps SKUs safe inside Redis hash tags (no braces) and free of anything that
/// could be customer data or need escaping in logs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sku(String);

impl Sku {
    pub fn parse(raw: &str) -> Result<Self, String> {
        check_plain_name(raw, MAX_SKU_LEN)?;
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Sku {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Longest location id, in bytes.
pub const MAX_LOCATION_LEN: usize = 32;

/// Where stock is kept: 1 to [`MAX_LOCATION_LEN`] characters of `a-z 0-9 -`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LocationId(String);

impl LocationId {
    /// The location every deployment has: stock given without a location lives here.
    pub const DEFAULT: &'static str = "default";

    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() {
            return Err("must not be empty".into());
        }
        if raw.len() > MAX_LOCATION_LEN {
            return Err(format!("must be at most {MAX_LOCATION_LEN} characters"));
        }
        if !raw
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err("may contain only a-z, 0-9 and '-'".into());
        }
        Ok(Self(raw.to_owned()))
    }

    /// `default`.
    pub fn default_location() -> Self {
        Self(Self::DEFAULT.to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LocationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A location as configured: allocation tries active ones by `priority` (lowest first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub id: LocationId,
    pub priority: i32,
    pub active: bool,
}

/// The order a Reserve tries locations in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AllocationStrategy {
    /// By `priority`, lowest first, then id.
    #[default]
    Priority,
    /// By available units, most first, then priority, then id.
    MostAvailable,
}

/// How a Reserve's lines are placed: the strategy, and whether one line may be served from
/// several locations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AllocationPolicy {
    pub strategy: AllocationStrategy,
    pub allow_split: bool,
    /// A line short of available units may wait for stock against a location's backorder
    /// limit.
    pub allow_backorder: bool,
    /// A line short of available units may be pegged to an open receipt's unpromised units.
    pub allow_preorder: bool,
}

impl AllocationPolicy {
    /// Whether a line short of available units may wait.
    pub fn may_wait(&self) -> bool {
        self.allow_backorder || self.allow_preorder
    }
}

/// 1 to [`MAX_KEY_LEN`] printable ASCII characters, no spaces.
fn parse_token(raw: &str) -> Result<String, String> {
    if raw.is_empty() {
        return Err("must not be empty".into());
    }
    if raw.len() > MAX_KEY_LEN {
        return Err(format!("must be at most {MAX_KEY_LEN} characters"));
    }
    if !raw.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("may contain only printable ASCII characters without spaces".into());
    }
    Ok(raw.to_owned())
}

/// The caller's key that makes a mutating request safe to retry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn parse(raw: &str) -> Result<Self, String> {
        parse_token(raw).map(Self)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The caller's order reference, kept with a reservation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OrderId(String);

impl OrderId {
    pub fn parse(raw: &str) -> Result<Self, String> {
        parse_token(raw).map(Self)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The authenticated client a request comes from; it scopes idempotency keys, so one client's
/// key can never replay or collide with another's. Empty when authentication is disabled.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Caller(String);

impl Caller {
    /// A configured caller name: 1 to 64 characters from `A-Z a-z 0-9 . _ - :`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        check_plain_name(raw, 64)?;
        Ok(Self(raw.to_owned()))
    }

    /// The one caller of a server running without authentication.
    pub fn anonymous() -> Self {
        Self(String::new())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whose reservations a call may read or change. A caller sees only the reservations it made;
/// an operator (the `admin` role, or a server running without authentication) sees all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    Own(Caller),
    All,
}

impl Scope {
    /// The caller the scope is limited to, or `None` for every caller.
    pub fn owner(&self) -> Option<&Caller> {
        match self {
            Self::Own(caller) => Some(caller),
            Self::All => None,
        }
    }
}

/// Free text explaining a stock adjustment: at most [`MAX_REASON_CHARS`], no control characters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reason(String);

impl Reason {
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.chars().count() > MAX_REASON_CHARS {
            return Err(format!("must be at most {MAX_REASON_CHARS} characters"));
        }
        if raw.chars().any(char::is_control) {
            return Err("must not contain control characters".into());
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A non-zero change to `on_hand`, at most [`MAX_DELTA`] either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StockDelta(i64);

impl StockDelta {
    pub fn parse(raw: i64) -> Result<Self, String> {
        if raw == 0 {
            return Err("must not be zero".into());
        }
        if !(-MAX_DELTA..=MAX_DELTA).contains(&raw) {
            return Err(format!("must be between -{MAX_DELTA} and {MAX_DELTA}"));
        }
        Ok(Self(raw))
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

/// Units of one reservation line: 1 to [`MAX_QUANTITY`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity(i64);

impl Quantity {
    pub fn parse(raw: i64) -> Result<Self, String> {
        if !(1..=MAX_QUANTITY).contains(&raw) {
            return Err(format!("must be between 1 and {MAX_QUANTITY}"));
        }
        Ok(Self(raw))
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

/// How long a reservation holds its stock: [`MIN_TTL`] to [`MAX_TTL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ttl(Duration);

impl Ttl {
    pub fn parse(raw: Duration) -> Result<Self, String> {
        if !(MIN_TTL..=MAX_TTL).contains(&raw) {
            return Err(format!(
                "must be between {}s and {}s",
                MIN_TTL.as_secs(),
                MAX_TTL.as_secs()
            ));
        }
        Ok(Self(raw))
    }

    pub fn get(self) -> Duration {
        self.0
    }
}

/// A reservation's identifier: a UUID, printed in its hyphenated form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReservationId(Uuid);

impl ReservationId {
    pub fn new_random() -> Self {
        Self(Uuid::new_v4())
    }

    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() {
            return Err("must not be empty".into());
        }
        // Only the canonical hyphenated form: one id, one spelling.
        if raw.len() != 36 {
            return Err("must be a UUID like 0b7e5a4c-3f1d-4a9e-9c2b-6d8f0e1a2b3c".into());
        }
        Uuid::try_parse(raw)
            .map(Self)
            .map_err(|_| "must be a UUID like 0b7e5a4c-3f1d-4a9e-9c2b-6d8f0e1a2b3c".into())
    }

    pub fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

/// Where a reservation is in its life. `Held` is the only state that changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReservationState {
    Held,
    Confirmed,
    Released,
    Expired,
}

impl ReservationState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Held => "HELD",
            Self::Confirmed => "CONFIRMED",
            Self::Released => "RELEASED",
            Self::Expired => "EXPIRED",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Some(match raw {
            "HELD" => Self::Held,
            "CONFIRMED" => Self::Confirmed,
            "RELEASED" => Self::Released,
            "EXPIRED" => Self::Expired,
            _ => return None,
        })
    }
}

impl fmt::Display for ReservationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One SKU and the units held of it; in a Reserve, optionally pinned to one location, and in
/// a partial confirm or release, optionally taken from one location's allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub sku: Sku,
    pub quantity: Quantity,
    pub location: Option<LocationId>,
}

impl Line {
    /// A line without a location.
    pub fn new(sku: Sku, quantity: Quantity) -> Self {
        Self {
            sku,
            quantity,
            location: None,
        }
    }
}

/// The units of a reservation line that come from one location, and where they are now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub location: LocationId,
    pub quantity: i64,
    pub held: i64,
    pub confirmed: i64,
    pub released: i64,
    /// Units waiting for stock, with no receipt.
    pub backordered: i64,
    /// Units waiting for the receipt `receipt`.
    pub preordered: i64,
    pub receipt: Option<Peg>,
}

/// The receipt pre-ordered units wait for, and when it is due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peg {
    pub receipt: ReceiptId,
    pub expected_at: std::time::SystemTime,
}

impl Allocation {
    /// Units just held here.
    pub fn new_hold(location: LocationId, quantity: i64) -> Self {
        Self {
            location,
            quantity,
            held: quantity,
            confirmed: 0,
            released: 0,
            backordered: 0,
            preordered: 0,
            receipt: None,
        }
    }

    /// Units just reserved here: `held` of them held, the rest waiting (pre-ordered with a
    /// receipt, backordered without).
    pub fn new_waiting(
        location: LocationId,
        held: i64,
        waiting: i64,
        receipt: Option<Peg>,
    ) -> Self {
        let (backordered, preordered) = match receipt {
            Some(_) => (0, waiting),
            None => (waiting, 0),
        };
        Self {
            quantity: held + waiting,
            backordered,
            preordered,
            receipt,
            ..Self::new_hold(location, held)
        }
    }

    /// Units waiting for stock.
    pub fn waiting(&self) -> i64 {
        self.backordered + self.preordered
    }

    /// With `held` units held.
    pub fn with_held(mut self, held: i64) -> Self {
        self.held = held;
        self
    }

    /// Units ever confirmed or released here.
    pub fn touched(&self) -> bool {
        self.confirmed > 0 || self.released > 0
    }

    /// An allocation as stored: see [`ReservationLine::from_allocations`].
    pub fn stored(
        location: LocationId,
        quantity: i64,
        confirmed: i64,
        released: i64,
        stored_state: ReservationState,
        live: bool,
    ) -> Self {
        let rest = quantity - confirmed - released;
        let mut allocation = Self {
            location,
            quantity,
            held: 0,
            confirmed,
            released,
            backordered: 0,
            preordered: 0,
            receipt: None,
        };
        match stored_state {
            ReservationState::Held if live => allocation.held = rest,
            ReservationState::Confirmed => allocation.confirmed += rest,
            _ => allocation.released += rest,
        }
        allocation
    }

    /// An allocation as stored, with its waiting units: they wait while the hold is live
    /// (the rest is read as [`Allocation::stored`] reads it); a hold past its expiry
    /// released them with its held units.
    pub fn stored_waiting(
        mut self,
        backordered: i64,
        preordered: i64,
        receipt: Option<Peg>,
    ) -> Self {
        let waiting = backordered + preordered;
        if waiting == 0 {
            return self;
        }
        if self.held >= waiting {
            self.held -= waiting;
            self.backordered = backordered;
            self.preordered = preordered;
            self.receipt = receipt;
        }
        // Otherwise the hold ended: its stored state said where every unit went.
        self
    }
}

/// One line of a reservation: the units first reserved and where they are now.
/// `quantity = held + confirmed + released + backordered + preordered` (expiry counts as
/// released; waiting units given up with their hold too).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReservationLine {
    pub sku: Sku,
    /// The units first reserved; never changes.
    pub quantity: Quantity,
    pub held: i64,
    pub confirmed: i64,
    pub released: i64,
    /// Units waiting for stock: backordered, and pre-ordered against a receipt.
    pub backordered: i64,
    pub preordered: i64,
    /// Where the units come from, by location id; the counts above are their sums.
    pub allocations: Vec<Allocation>,
}

impl ReservationLine {
    /// A line just held in full, from these locations.
    pub fn new_hold(line: &Line, mut allocations: Vec<Allocation>) -> Self {
        allocations.sort_by(|a, b| a.location.cmp(&b.location));
        let mut held = Self {
            sku: line.sku.clone(),
            quantity: line.quantity,
            held: 0,
            confirmed: 0,
            released: 0,
            backordered: 0,
            preordered: 0,
            allocations,
        };
        held.recount();
        held
    }

    /// A line from its stored allocations (by location id). Storage keeps `confirmed` and
    /// `released` exactly while units are held and once a reservation was settled in parts;
    /// the rest of the units (`quantity` minus both) went where the reservation's stored
    /// state says: still held in a live hold, released in an overdue one (expiry takes it),
    /// confirmed in a `CONFIRMED` one, released in a `RELEASED` or `EXPIRED` one.
    /// Reservations settled in one step, and every one stored before lines kept counts, are
    /// read by that rule alone (see [`Allocation::stored`]).
    pub fn from_allocations(sku: Sku, allocations: Vec<Allocation>) -> Result<Self, String> {
        let quantity = Quantity::parse(allocations.iter().map(|a| a.quantity).sum())?;
        let mut line = Self {
            sku,
            quantity,
            held: 0,
            confirmed: 0,
            released: 0,
            backordered: 0,
            preordered: 0,
            allocations,
        };
        line.recount();
        Ok(line)
    }

    /// Sets the line's counts to the sums of its allocations'.
    pub fn recount(&mut self) {
        self.held = self.allocations.iter().map(|a| a.held).sum();
        self.confirmed = self.allocations.iter().map(|a| a.confirmed).sum();
        self.released = self.allocations.iter().map(|a| a.released).sum();
        self.backordered = self.allocations.iter().map(|a| a.backordered).sum();
        self.preordered = self.allocations.iter().map(|a| a.preordered).sum();
    }

    /// Units waiting for stock.
    pub fn waiting(&self) -> i64 {
        self.backordered + self.preordered
    }

    /// The one location all the line's units come from, if they come from one.
    pub fn single_location(&self) -> Option<&LocationId> {
        match self.allocations.as_slice() {
            [only] => Some(&only.location),
            _ => None,
        }
    }

    /// The line before any of its units moved, for a request that names lines.
    pub fn as_line(&self) -> Line {
        Line::new(self.sku.clone(), self.quantity)
    }

    /// Units ever confirmed or released: the line was settled, at least in part.
    pub fn touched(&self) -> bool {
        self.allocations.iter().any(Allocation::touched)
    }
}

/// A reservation as stored; `state` is already `Expired` (or `Confirmed`, if units were
/// confirmed in part) for a hold past `expires_at` with no units waiting. One with waiting
/// units stays `HELD` past it: waiting demand is a commitment, not a checkout hold, and the
/// sweeper moves its expiry to the wait horizon (from when it was made), where it ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub id: ReservationId,
    pub order_id: OrderId,
    pub state: ReservationState,
    pub lines: Vec<ReservationLine>,
    pub created_at: std::time::SystemTime,
    pub expires_at: std::time::SystemTime,
}

impl Reservation {
    /// Units of its lines waiting for stock (backordered or pre-ordered).
    pub fn waiting(&self) -> i64 {
        self.lines.iter().map(ReservationLine::waiting).sum()
    }
}

/// A fencing token: handed out with each lease, strictly increasing per SKU while Redis keeps
/// its counter. PostgreSQL accepts a write only with a token above the last one it accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FenceToken(i64);

impl FenceToken {
    pub fn new(value: i64) -> Self {
        Self(value)
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for FenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The stock of one SKU as stored: its total over every location (`location: None`), or its
/// units at one location. `available` is derived, never stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StockLevel {
    pub sku: Sku,
    pub on_hand: i64,
    pub reserved: i64,
    /// Grows with every change to this SKU: of two levels, the higher version is the newer.
    /// A location's level carries the SKU's version of the last change there.
    pub version: i64,
    pub location: Option<LocationId>,
    /// Unsellable units, policy and waiting demand.
    pub states: States,
    /// Of a SKU's total: the units its [`free`](Self::free) counts that no active location
    /// can sell (the free units of inactive locations, and a safety stock not met at an
    /// active one, which other locations' units do not make up), so that the total's
    /// [`available`](Self::available) is the sum of its active locations' own (see
    /// [`StockLevel::apart_over`]). 0 for a location's level, and in a total stored before
    /// it was worked out (which then reads the older figure of the summed rows).
    pub apart: i64,
}

impl StockLevel {
    /// A SKU's total, with no states.
    pub fn total(sku: Sku, on_hand: i64, reserved: i64, version: i64) -> Self {
        Self {
            sku,
            on_hand,
            reserved,
            version,
            location: None,
            states: States::default(),
            apart: 0,
        }
    }

    /// What a new hold may take: `on_hand - reserved - safety_stock - unsellable`, never
    /// below 0. Of a SKU's total: the sum of what each active location has available.
    pub fn available(&self) -> i64 {
        (self.free() - self.apart).max(0)
    }

    /// The level as its rows sum it: without the [`apart`](Self::apart) a total answers
    /// with (the core decides on the sums; what the active locations have is worked out
    /// where all the rows are read).
    pub fn summed(&self) -> StockLevel {
        StockLevel {
            apart: 0,
            ..self.clone()
        }
    }

    /// A total's [`apart`](Self::apart) over its location rows `at`, each with whether its
    /// location is active.
    pub fn apart_over<'a>(at: impl IntoIterator<Item = (&'a StockLevel, bool)>) -> i64 {
        at.into_iter()
            .map(|(level, active)| level.share_apart(active))
            .sum()
    }

    /// This location level's share of its total's [`apart`](Self::apart): all its free
    /// units while its location is inactive, what its safety stock lacks while it is active.
    pub fn share_apart(&self, active: bool) -> i64 {
        if active {
            self.free().min(0)
        } else {
            self.free()
        }
    }

    /// Units on the shelf that may be sold: `on_hand` less the unsellable ones.
    pub fn sellable(&self) -> i64 {
        self.on_hand - self.states.unsellable()
    }

    /// Sellable units no hold has and no safety stock keeps back; negative when a safety
    /// stock was raised above what was free.
    pub fn free(&self) -> i64 {
        self.sellable() - self.reserved - self.states.safety_stock
    }

    /// Units promised against stock that is not there yet (backordered), a new line may
    /// still take: what `backorder_limit` allows beyond the sellable units, less what
    /// holds and waiting backorders have (0 when free units are left: those go first).
    /// `at_risk`: pre-ordered units of closed receipts here, which wait as backorders do.
    pub fn backorder_room(&self, at_risk: i64) -> i64 {
        let room =
            self.states.backorder_limit - self.states.backordered - at_risk + self.free().min(0);
        room.max(0)
    }
}

/// A (SKU, location)'s units besides `on_hand` and `reserved`, and its policy: each a
/// count, and in a movement each a delta.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct States {
    /// Unsellable units, part of `on_hand`.
    pub damaged: i64,
    /// Unsellable units, part of `on_hand`, until quality control passes them.
    pub quality_control: i64,
    /// Sellable units kept back from sale (a level, not units set aside).
    pub safety_stock: i64,
    /// Units that may be promised beyond what is on hand (0: no backorders).
    pub backorder_limit: i64,
    /// Units of held lines waiting for stock to arrive.
    pub backordered: i64,
    /// Units of held lines pegged to an incoming receipt.
    pub preordered: i64,
    /// What open receipts have still to bring.
    pub incoming: i64,
}

impl States {
    pub fn unsellable(&self) -> i64 {
        self.damaged + self.quality_control
    }

    /// Units of held lines that wait for stock.
    pub fn waiting(&self) -> i64 {
        self.backordered + self.preordered
    }

    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }

    /// Each count plus `delta`'s.
    pub fn plus(self, delta: &States) -> Self {
        Self {
            damaged: self.damaged + delta.damaged,
            quality_control: self.quality_control + delta.quality_control,
            safety_stock: self.safety_stock + delta.safety_stock,
            backorder_limit: self.backorder_limit + delta.backorder_limit,
            backordered: self.backordered + delta.backordered,
            preordered: self.preordered + delta.preordered,
            incoming: self.incoming + delta.incoming,
        }
    }

    /// Each count less `delta`'s.
    pub fn minus(self, delta: &States) -> Self {
        self.plus(&delta.negated())
    }

    pub fn negated(&self) -> Self {
        Self {
            damaged: -self.damaged,
            quality_control: -self.quality_control,
            safety_stock: -self.safety_stock,
            backorder_limit: -self.backorder_limit,
            backordered: -self.backordered,
            preordered: -self.preordered,
            incoming: -self.incoming,
        }
    }

    /// The counts in column order: damaged, quality_control, safety_stock, backorder_limit,
    /// backordered, preordered, incoming.
    pub fn to_array(self) -> [i64; 7] {
        [
            self.damaged,
            self.quality_control,
            self.safety_stock,
            self.backorder_limit,
            self.backordered,
            self.preordered,
            self.incoming,
        ]
    }

    pub fn from_array(a: [i64; 7]) -> Self {
        Self {
            damaged: a[0],
            quality_control: a[1],
            safety_stock: a[2],
            backorder_limit: a[3],
            backordered: a[4],
            preordered: a[5],
            incoming: a[6],
        }
    }
}

/// A receipt's id (a purchase order line): 1 to 64 characters from `A-Z a-z 0-9 . _ - :`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReceiptId(String);

impl ReceiptId {
    pub fn parse(raw: &str) -> Result<Self, String> {
        Sku::parse(raw).map(|valid| Self(valid.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ReceiptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a receipt is: still bringing units, all of them received, or cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReceiptState {
    Open,
    Received,
    Cancelled,
}

impl ReceiptState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "OPEN",
            Self::Received => "RECEIVED",
            Self::Cancelled => "CANCELLED",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        [Self::Open, Self::Received, Self::Cancelled]
            .into_iter()
            .find(|state| state.as_str() == raw)
    }
}

/// Units expected at a location (a purchase order line): `incoming` until received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    pub id: ReceiptId,
    pub sku: Sku,
    pub location: LocationId,
    /// The units expected.
    pub quantity: i64,
    /// The units received so far (may exceed `quantity`: an over-delivery).
    pub received: i64,
    /// Units of held lines pegged to this receipt, waiting for it.
    pub preordered: i64,
    pub expected_at: std::time::SystemTime,
    pub state: ReceiptState,
    pub created_at: std::time::SystemTime,
}

impl Receipt {
    /// What it has still to bring: its quantity less what was received while it is open,
    /// nothing once received or cancelled.
    pub fn remainder(&self) -> i64 {
        match self.state {
            ReceiptState::Open => (self.quantity - self.received).max(0),
            _ => 0,
        }
    }

    /// What of the remainder no pre-order has taken yet.
    pub fn unpromised(&self) -> i64 {
        (self.remainder() - self.preordered).max(0)
    }

    /// Open and past its expected date at `now`.
    pub fn late(&self, now: std::time::SystemTime) -> bool {
        self.state == ReceiptState::Open && self.expected_at < now
    }

    /// Pre-ordered units pegged to it that it can no longer bring: every one once it is
    /// closed (cancelled, or received without filling them), and while open those beyond its
    /// remainder (units that arrived into quality control, or whose fill skipped a hold).
    /// Demand with no receipt behind it, counted as backorders are.
    pub fn at_risk(&self) -> i64 {
        (self.preordered - self.remainder()).max(0)
    }
}

/// Where a unit on the shelf is: sellable, or unsellable for a reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StockState {
    Sellable,
    Damaged,
    QualityControl,
}

impl StockState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sellable => "SELLABLE",
            Self::Damaged => "DAMAGED",
            Self::QualityControl => "QUALITY_CONTROL",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        [Self::Sellable, Self::Damaged, Self::QualityControl]
            .into_iter()
            .find(|state| state.as_str() == raw)
    }

    /// The units in this state at `level`.
    pub fn units(self, level: &StockLevel) -> i64 {
        match self {
            Self::Sellable => level.sellable(),
            Self::Damaged => level.states.damaged,
            Self::QualityControl => level.states.quality_control,
        }
    }

    /// The change of the states' counts when `units` enter this state (negative: leave it).
    /// Sellable units are `on_hand` less the others, so entering it changes none of them.
    pub fn delta(self, units: i64) -> States {
        match self {
            Self::Sellable => States::default(),
            Self::Damaged => States {
                damaged: units,
                ..States::default()
            },
            Self::QualityControl => States {
                quality_control: units,
                ..States::default()
            },
        }
    }
}

/// What changed a SKU's level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MovementKind {
    /// The level when the ledger began: the sum of every change before.
    Opening,
    Adjusted,
    Set,
    Held,
    Confirmed,
    Released,
    Expired,
    /// Units moved to or from another location.
    Transferred,
    /// SetStockPolicy: safety stock or backorder limit.
    PolicySet,
    /// MoveStockState: units between sellable and an unsellable state.
    StateMoved,
    /// ExpectStock: a receipt's units became incoming.
    ReceiptExpected,
    /// ReceiveStock: units of a receipt arrived (from incoming to on hand).
    Received,
    /// CancelReceipt: what a receipt had still to bring is no longer incoming.
    ReceiptCancelled,
    /// Waiting (backordered or pre-ordered) units of a hold became held.
    Filled,
}

impl MovementKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Opening => "OPENING",
            Self::Adjusted => "ADJUSTED",
            Self::Set => "SET",
            Self::Held => "HELD",
            Self::Confirmed => "CONFIRMED",
            Self::Released => "RELEASED",
            Self::Expired => "EXPIRED",
            Self::Transferred => "TRANSFERRED",
            Self::PolicySet => "POLICY_SET",
            Self::StateMoved => "STATE_MOVED",
            Self::ReceiptExpected => "RECEIPT_EXPECTED",
            Self::Received => "RECEIVED",
            Self::ReceiptCancelled => "RECEIPT_CANCELLED",
            Self::Filled => "FILLED",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        [
            Self::Opening,
            Self::Adjusted,
            Self::Set,
            Self::Held,
            Self::Confirmed,
            Self::Released,
            Self::Expired,
            Self::Transferred,
            Self::PolicySet,
            Self::StateMoved,
            Self::ReceiptExpected,
            Self::Received,
            Self::ReceiptCancelled,
            Self::Filled,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == raw)
    }
}

/// One change of a SKU's level, as the ledger keeps it: the version it produced, its deltas,
/// the level after it, and who made it and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Movement {
    pub kind: MovementKind,
    /// The level of the location that changed, right after the change; `level.version` is
    /// the version the change produced.
    pub level: StockLevel,
    pub on_hand_delta: i64,
    pub reserved_delta: i64,
    /// How the states changed.
    pub states_delta: States,
    /// The receipt the movement belongs to (expected, received, cancelled, or a pre-order
    /// pegged to it).
    pub receipt_id: Option<String>,
    pub reason: String,
    /// The caller that made the change (empty without authentication, or for expiry).
    pub actor: String,
    pub reservation_id: Option<ReservationId>,
    pub order_id: Option<OrderId>,
    pub idempotency_key: Option<String>,
    pub occurred_at: std::time::SystemTime,
}

#[cfg(test)]
mod tests;
