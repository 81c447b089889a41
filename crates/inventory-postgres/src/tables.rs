//! The SQL, one module per table, each statement in the module of the table it writes. A
//! function here runs statements and maps rows; deciding is the core's, and the transaction
//! around it is a use case's.
//!
//! - `stock` — per-SKU totals and per-location rows, their conditional moves.
//! - `reservations` — holds and their lines.
//! - `idempotency` — claimed keys and the outcomes a retry gets back (`idempotency::outcome`,
//!   the stored format every later release reads).
//! - `outbox` — the events each commit appends.
//! - `ledger` — the stock movements every level change writes.
//! - `orders` — tombstones of cancelled orders and the order locks.
//! - `locations` — the configured locations.
//! - `receipts` — incoming receipts: what each brought and what pre-orders wait for it.

pub(crate) mod idempotency;
pub(crate) mod ledger;
pub(crate) mod locations;
pub(crate) mod orders;
pub(crate) mod outbox;
pub(crate) mod receipts;
pub(crate) mod reservations;
pub(crate) mod stock;
