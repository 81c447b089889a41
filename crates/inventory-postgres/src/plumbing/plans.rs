//! Plan caching around the array statements of a `Reserve` (the order check, `stock`'s lock,
//! location read and apply). Left to choose (`plan_cache_mode = auto`), PostgreSQL plans each
//! of them afresh on every call: a generic plan's estimate for an array of unknown length
//! stays above a short array's custom plan. That measured about 0.5 ms of a 2.8 ms single
//! `Reserve`. Their generic plans are keyed lookups whatever the arrays hold, so they are
//! sent by [`generic`] between `SET LOCAL`s of the plan cache mode, in the same pipeline (no round trip of their
//! own). Not for every statement: a connection keeps a generic plan made while a table was
//! nearly empty (a fresh deployment) until the table is analyzed, however much it grew; the
//! statements here read tables that change slowly (`stock`, `stock_locations`,
//! `cancelled_orders`) or are read by key only.

use std::future::Future;

use deadpool_postgres::Transaction;

/// One generic plan per prepared statement, until [`DEFAULT`] or the transaction's end.
const GENERIC: &str = "SET LOCAL plan_cache_mode = force_generic_plan";

/// Back to the session's own setting (`DATABASE_URL` options included).
const DEFAULT: &str = "SET LOCAL plan_cache_mode = DEFAULT";

/// Runs `statements` with one generic plan each: [`GENERIC`], the statements and [`DEFAULT`]
/// are sent in this order and answered in one round trip. `statements` must send its
/// requests when first polled (prepared statements, not `prepare_cached` on a cold cache), or
/// they would reach PostgreSQL after the setting is back to the session's.
pub(crate) async fn generic<T>(
    tx: &Transaction<'_>,
    statements: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, tokio_postgres::Error> {
    let (_, answered, _) = tokio::try_join!(
        biased;
        tx.batch_execute(GENERIC),
        statements,
        tx.batch_execute(DEFAULT),
    )?;
    Ok(answered)
}
