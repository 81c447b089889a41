//! The `inventory.v1.InventoryService` implementation: parse the request, call the core, map
//! the answer. No rule lives here.

use std::{pin::Pin, sync::Arc};

use inventory_core::{
    command::{AdjustStock, GetStock},
    domain::StockLevel,
    service::Inventory,
};
use inventory_postgres::PgStore;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::{proto, status::to_status};

#[derive(Debug)]
pub struct InventoryApi {
    inventory: Arc<Inventory<PgStore>>,
}

impl InventoryApi {
    pub fn new(inventory: Arc<Inventory<PgStore>>) -> Self {
        Self { inventory }
    }
}

impl From<StockLevel> for proto::StockLevel {
    fn from(level: StockLevel) -> Self {
        Self {
            available: level.available(),
            sku: level.sku.as_str().to_owned(),
            on_hand: level.on_hand,
            reserved: level.reserved,
        }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<proto::Event, Status>> + Send>>;

#[tonic::async_trait]
impl proto::inventory_service_server::InventoryService for InventoryApi {
    #[tracing::instrument(skip_all, fields(rpc = "AdjustStock"))]
    async fn adjust_stock(
        &self,
        request: Request<proto::AdjustStockRequest>,
    ) -> Result<Response<proto::StockLevel>, Status> {
        let command = AdjustStock::try_from(request.into_inner()).map_err(to_status)?;
        let level = self
            .inventory
            .adjust_stock(&command)
            .await
            .map_err(to_status)?;
        Ok(Response::new(level.into()))
    }

    #[tracing::instrument(skip_all, fields(rpc = "GetStock"))]
    async fn get_stock(
        &self,
        request: Request<proto::GetStockRequest>,
    ) -> Result<Response<proto::GetStockResponse>, Status> {
        let query = GetStock::try_from(request.into_inner()).map_err(to_status)?;
        let levels = self.inventory.get_stock(&query).await.map_err(to_status)?;
        Ok(Response::new(proto::GetStockResponse {
            levels: levels.into_iter().map(Into::into).collect(),
        }))
    }

    async fn reserve(
        &self,
        _request: Request<proto::ReserveRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        Err(Status::unimplemented("Reserve is not implemented yet"))
    }

    async fn confirm_reservation(
        &self,
        _request: Request<proto::ConfirmReservationRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        Err(Status::unimplemented(
            "ConfirmReservation is not implemented yet",
        ))
    }

    async fn release_reservation(
        &self,
        _request: Request<proto::ReleaseReservationRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        Err(Status::unimplemented(
            "ReleaseReservation is not implemented yet",
        ))
    }

    async fn get_reservation(
        &self,
        _request: Request<proto::GetReservationRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        Err(Status::unimplemented(
            "GetReservation is not implemented yet",
        ))
    }

    type WatchEventsStream = EventStream;

    async fn watch_events(
        &self,
        _request: Request<proto::WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        Err(Status::unimplemented("WatchEvents is not implemented yet"))
    }
}
