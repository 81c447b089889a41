//! Plan caching around the array statements of a `Reserve` (the order check, `stock`'s lock,
//! location read and apply). Left to choose (`plan_cache_mode = auto`), PostgreSQL plans each
//! of them afresh on every call: a generic plan's estimate for an array of unknown length
//! stays above a short array's custom plan. That measured about 0.5 ms of a 2.8 ms single
//! `Reserve`. Their generic plans are keyed lookups whatever the arrays hold, so they are
//! sent between [`GENERIC`] and [`DEFAULT`], in the same pipeline (no round trip of their
//! own). Not for every statement: a connection keeps a generic plan made while a table was
//! nearly empty (a fresh deployment) until the table is analyzed, however much it grew; the
//! statements here read tables that change slowly (`stock`, `stock_locations`,
//! `cancelled_orders`) or are read by key only.

/// One generic plan per prepared statement, until [`DEFAULT`] or the transaction's end.
pub(crate) const GENERIC: &str = "SET LOCAL plan_cache_mode = force_generic_plan";

/// Back to the session's own setting (`DATABASE_URL` options included).
pub(crate) const DEFAULT: &str = "SET LOCAL plan_cache_mode = DEFAULT";
