//! The schema, as versioned migrations embedded in the binary.
//!
//! refinery takes no lock of its own, so two replicas starting at once could both try to
//! apply the same migration. Every run holds a session-level advisory lock on its own
//! connection for its whole duration; the second runner waits, then finds nothing to do.

use crate::PgConfig;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// Advisory lock key shared by every migration run: "inventory" in ASCII.
const MIGRATION_LOCK_KEY: i64 = 0x696e_7665_6e74_6f72;

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("cannot connect to PostgreSQL")]
    Connect(#[source] tokio_postgres::Error),
    #[error("cannot take the migration lock")]
    Lock(#[source] tokio_postgres::Error),
    #[error("migration failed")]
    Migration(#[source] refinery::Error),
}

/// Names of the migrations this run applied (empty when the schema was already current).
pub async fn run(config: &PgConfig) -> Result<Vec<String>, MigrateError> {
    let (mut client, connection) = config.open().await.map_err(MigrateError::Connect)?;
    let connection = tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::warn!(%error, "migration connection closed");
        }
    });

    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await
        .map_err(MigrateError::Lock)?;
    let report = embedded::migrations::runner()
        .set_abort_divergent(true)
        .run_async(&mut client)
        .await;
    // Closing the session would release the lock too; unlocking first keeps the waiter's wait
    // short and the intent visible.
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY])
        .await;
    drop(client);
    let _ = connection.await;

    let report = report.map_err(MigrateError::Migration)?;
    unlocked.map_err(MigrateError::Lock)?;
    Ok(report
        .applied_migrations()
        .iter()
        .map(ToString::to_string)
        .collect())
}

/// The newest migration this binary carries: the schema version it needs.
pub fn expected_version() -> i32 {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(refinery::Migration::version)
        .max()
        .unwrap_or(0)
}

/// The newest migration applied to the database; `None` before the first `migrate`.
pub async fn applied_version(
    client: &impl deadpool_postgres::GenericClient,
) -> Result<Option<i32>, tokio_postgres::Error> {
    let exists: bool = client
        .query_one(
            "SELECT to_regclass('refinery_schema_history') IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
    if !exists {
        return Ok(None);
    }
    client
        .query_one("SELECT max(version) FROM refinery_schema_history", &[])
        .await?
        .try_get(0)
}
