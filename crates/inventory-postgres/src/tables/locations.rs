//! SQL for the `locations` table: where stock is kept, and the order allocation tries them
//! in. Rows are never deleted, and never locked by a Reserve (a few rows every Reserve reads
//! would otherwise serialize them all): a location changed while a Reserve runs is seen by
//! the Reserve's next statement, and allocation is judged on what it read.

use deadpool_postgres::GenericClient;
use inventory_core::{
    Error,
    domain::{Location, LocationId},
};

use crate::plumbing::error::from_db;

pub(crate) const ALL: &str = "
    SELECT location_id, priority, active FROM locations
    ORDER BY priority, location_id COLLATE \"C\"";

const UPSERT: &str = "
    INSERT INTO locations (location_id, priority, active) VALUES ($1, $2, $3)
    ON CONFLICT (location_id) DO UPDATE
    SET priority = excluded.priority, active = excluded.active, updated_at = now()
    RETURNING location_id, priority, active";

/// Every location, by priority, then id.
pub(crate) async fn all(client: &impl GenericClient) -> Result<Vec<Location>, Error> {
    let statement = client.prepare_cached(ALL).await.map_err(from_db)?;
    let rows = client.query(&statement, &[]).await.map_err(from_db)?;
    rows.iter().map(location).collect()
}

/// Whether `id` names a location, among `all`.
pub(crate) fn check(all: &[Location], id: &LocationId) -> Result<(), Error> {
    if all.iter().any(|l| &l.id == id) {
        Ok(())
    } else {
        Err(Error::UnknownLocation(id.clone()))
    }
}

pub(crate) async fn upsert(
    client: &impl GenericClient,
    wanted: &Location,
) -> Result<Location, Error> {
    let statement = client.prepare_cached(UPSERT).await.map_err(from_db)?;
    let row = client
        .query_one(
            &statement,
            &[&wanted.id.as_str(), &wanted.priority, &wanted.active],
        )
        .await
        .map_err(from_db)?;
    location(&row)
}

fn location(row: &tokio_postgres::Row) -> Result<Location, Error> {
    let id: &str = row.try_get(0).map_err(Error::internal)?;
    Ok(Location {
        id: LocationId::parse(id).map_err(Error::internal)?,
        priority: row.try_get(1).map_err(Error::internal)?,
        active: row.try_get(2).map_err(Error::internal)?,
    })
}
