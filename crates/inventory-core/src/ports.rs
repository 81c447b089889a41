//! What the core needs from the outside world. Adapters implement these traits; the core never
//! names a driver.

use std::future::Future;

use crate::{
    command::{AdjustStock, GetStock},
    domain::StockLevel,
    error::Error,
};

/// The system of record for stock. Every method is one transaction: it either happens entirely
/// or not at all.
pub trait StockStore: Send + Sync + 'static {
    /// Applies the adjustment and records its outbox event, unless the idempotency key was
    /// already used: then the stored outcome of that first request is returned (or
    /// [`Error::IdempotencyKeyReused`] if the request differs) and nothing changes.
    fn adjust_stock(
        &self,
        command: &AdjustStock,
    ) -> impl Future<Output = Result<StockLevel, Error>> + Send;

    /// The current levels of the requested SKUs, in request order, or
    /// [`Error::UnknownSkus`] naming every SKU that does not exist.
    fn get_stock(
        &self,
        query: &GetStock,
    ) -> impl Future<Output = Result<Vec<StockLevel>, Error>> + Send;
}
