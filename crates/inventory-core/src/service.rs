//! The use cases the gRPC layer calls. Today they delegate to the store, whose single
//! transaction already carries the rules; reservations will add lease coordination here.

use crate::{
    command::{AdjustStock, GetStock},
    domain::StockLevel,
    error::Error,
    ports::StockStore,
};

#[derive(Debug)]
pub struct Inventory<S> {
    store: S,
}

impl<S: StockStore> Inventory<S> {
    pub fn new(store: S) -> Self {
        Self { store }
    }

    pub async fn adjust_stock(&self, command: &AdjustStock) -> Result<StockLevel, Error> {
        self.store.adjust_stock(command).await
    }

    pub async fn get_stock(&self, query: &GetStock) -> Result<Vec<StockLevel>, Error> {
        self.store.get_stock(query).await
    }
}
