//! Domain values. Each newtype has a private field and a `parse`, so a value that exists past
//! the gRPC boundary is valid by construction.

use std::fmt;

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

/// A stock keeping unit: 1 to [`MAX_SKU_LEN`] characters from `A-Z a-z 0-9 . _ - :`.
///
/// The alphabet keeps SKUs safe inside Redis hash tags (no braces) and free of anything that
/// could be customer data or need escaping in logs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sku(String);

impl Sku {
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() {
            return Err("must not be empty".into());
        }
        if raw.len() > MAX_SKU_LEN {
            return Err(format!("must be at most {MAX_SKU_LEN} characters"));
        }
        if !raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'))
        {
            return Err("may contain only A-Z, a-z, 0-9, '.', '_', '-' and ':'".into());
        }
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

/// The stock of one SKU as stored. `available` is derived, never stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StockLevel {
    pub sku: Sku,
    pub on_hand: i64,
    pub reserved: i64,
}

impl StockLevel {
    pub fn available(&self) -> i64 {
        self.on_hand - self.reserved
    }
}

#[cfg(test)]
mod tests;
