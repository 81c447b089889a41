//! The schema, as versioned migrations embedded in the binary, and its compatibility
//! contract: the floor, the oldest release that may still write (see docs/design.md,
//! "Changing the schema").
//!
//! refinery takes no lock of its own, so two replicas starting at once could both try to
//! apply the same migration. Every run holds a session-level advisory lock on its own
//! connection for its whole duration; the second runner waits, then finds nothing to do.
//! Its DDL waits at most [`LOCK_TIMEOUT`] for a table lock (a lock queued behind one long
//! transaction would queue every checkout behind it), and a migration refused that way is
//! tried again, up to [`LOCK_ATTEMPTS`] times.

use std::time::Duration;

use crate::PgConfig;

mod embedded {
    refinery::embed_migrations!("migrations");
}

// `FLOORS` (`(migration, floor)` for every embedded migration) and `RELEASE`, from
// `build.rs`.
include!(concat!(env!("OUT_DIR"), "/floors.rs"));

/// How long a migration's statement waits for a lock before the migration is rolled back
/// and tried again.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// Tries of a migration refused by [`LOCK_TIMEOUT`] before `migrate` gives up.
pub const LOCK_ATTEMPTS: u32 = 5;

/// The first migration that has the `schema_floor` table.
const FLOOR_TABLE: i32 = 14;

/// Advisory lock key shared by every migration run: "inventory" in ASCII.
const MIGRATION_LOCK_KEY: i64 = 0x696e_7665_6e74_6f72;

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("cannot connect to PostgreSQL")]
    Connect(#[source] tokio_postgres::Error),
    #[error("cannot take the migration lock")]
    Lock(#[source] tokio_postgres::Error),
    #[error("cannot read or raise the schema floor")]
    Floor(#[source] tokio_postgres::Error),
    #[error("migration failed")]
    Migration(#[source] refinery::Error),
    #[error("cannot create or enter the tenant's schema")]
    Schema(#[source] tokio_postgres::Error),
}

/// A tenant's schema (not `public`) is created on its first migration, with the `USAGE`
/// grants `public` has (so the roles of `deploy/sql/roles.sql` reach it as they reach
/// `public`; the tables' own grants come from the migrating role's default privileges),
/// and the session then works in it: every migration, the history and the floor are the
/// tenant's own.
async fn enter_schema(
    client: &tokio_postgres::Client,
    config: &PgConfig,
) -> Result<(), tokio_postgres::Error> {
    let schema = config.schema();
    if !schema.is_public() {
        let created = client
            .query_opt(
                "SELECT 1 FROM pg_namespace WHERE nspname = $1",
                &[&schema.as_str()],
            )
            .await?
            .is_none();
        if created {
            client
                .batch_execute(&format!(
                    "CREATE SCHEMA IF NOT EXISTS {schema};
                     DO $$
                     DECLARE granted record;
                     BEGIN
                         FOR granted IN
                             SELECT DISTINCT a.grantee
                             FROM pg_namespace n, aclexplode(n.nspacl) a
                             WHERE n.nspname = 'public' AND a.privilege_type = 'USAGE'
                         LOOP
                             EXECUTE format('GRANT USAGE ON SCHEMA {schema} TO %s',
                                 CASE WHEN granted.grantee = 0 THEN 'PUBLIC'
                                      ELSE quote_ident(pg_get_userbyid(granted.grantee)) END);
                         END LOOP;
                     END $$"
                ))
                .await?;
            tracing::info!(%schema, "tenant schema created");
        }
    }
    config.enter_schema(client).await
}

/// Names of the migrations this run applied (empty when the schema was already current).
/// Before it applies any, it raises the schema floor to what its newest migration declares
/// (logged as `schema floor`), so replicas the migrations would leave behind stop writing
/// first; if a migration then fails, the floor goes back to what it was.
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
    let report = match enter_schema(&client, config).await {
        Ok(()) => migrate_locked(&mut client).await,
        Err(error) => Err(MigrateError::Schema(error)),
    };
    // Closing the session would release the lock too; unlocking first keeps the waiter's wait
    // short and the intent visible.
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY])
        .await;
    drop(client);
    let _ = connection.await;

    let applied = report?;
    unlocked.map_err(MigrateError::Lock)?;
    Ok(applied)
}

/// The run itself, under the migration lock.
async fn migrate_locked(client: &mut tokio_postgres::Client) -> Result<Vec<String>, MigrateError> {
    client
        .batch_execute(&format!(
            "SET lock_timeout = '{}ms'",
            LOCK_TIMEOUT.as_millis()
        ))
        .await
        .map_err(MigrateError::Lock)?;
    let applied = applied_version(client)
        .await
        .map_err(MigrateError::Floor)?
        .unwrap_or(0);
    let release = expected_version();
    if applied > release {
        // A rollback: its init container migrates with the older release. Nothing to apply
        // (refinery leaves migrations it does not carry alone), and the floor says whether
        // this release may still write; the server's readiness tells.
        tracing::warn!(
            applied,
            release,
            "the schema is newer than this release: nothing to apply"
        );
        return Ok(Vec::new());
    }
    let before = floor(client).await.map_err(MigrateError::Floor)?;
    let target = declared_floor();
    let raised = match before {
        Some(before) if before < target => {
            set_floor(client, target).await?;
            Some(before)
        }
        _ => None,
    };
    tracing::info!(
        floor_before = before,
        floor = before.map_or(target, |b| b.max(target)),
        release,
        "schema floor: replicas of releases below it may not write"
    );
    let mut attempt = 1;
    let report = loop {
        let report = embedded::migrations::runner()
            .set_abort_divergent(true)
            .run_async(client)
            .await;
        match report {
            Err(error) if attempt < LOCK_ATTEMPTS && lock_refused(&error) => {
                tracing::warn!(
                    %error,
                    attempt,
                    "a migration waited {LOCK_TIMEOUT:?} for a table lock and was rolled back; \
                     trying again"
                );
                attempt += 1;
                tokio::time::sleep(LOCK_TIMEOUT / 2 * attempt).await;
            }
            report => break report,
        }
    };
    let report = match report {
        Ok(report) => report,
        Err(error) => {
            if let Some(before) = raised {
                // The schema did not move on: the releases it kept working keep writing.
                set_floor(client, before).await?;
            }
            return Err(MigrateError::Migration(error));
        }
    };
    // The first run to create the table finds it only now.
    if before.is_none() && expected_version() >= FLOOR_TABLE {
        set_floor(client, target).await?;
    }
    keep_records_to_owner(client)
        .await
        .map_err(MigrateError::Floor)?;
    Ok(report
        .applied_migrations()
        .iter()
        .map(ToString::to_string)
        .collect())
}

/// Whether a migration was refused because a lock was not granted within `lock_timeout`.
fn lock_refused(error: &refinery::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    while let Some(error) = cause {
        if let Some(db) = error.downcast_ref::<tokio_postgres::Error>() {
            return db.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE);
        }
        cause = error.source();
    }
    false
}

/// The schema's own records (the migrations' history and the floor) are written by `migrate`
/// only: whatever default privileges granted others on them when they were created (a
/// serving role's `INSERT, UPDATE, DELETE` on every new table, `deploy/sql/roles.sql`) is
/// taken back, so a serving credential can read the floor but never lower it. Only grants on
/// tables this session's role owns (or is a member of their owner) are touched; reading
/// stays granted.
async fn keep_records_to_owner(
    client: &tokio_postgres::Client,
) -> Result<(), tokio_postgres::Error> {
    client
        .batch_execute(
            "DO $$
             DECLARE granted record;
             BEGIN
                 FOR granted IN
                     SELECT DISTINCT c.oid::regclass AS tab, a.grantee
                     FROM pg_class c, aclexplode(c.relacl) a
                     WHERE c.oid IN (to_regclass('refinery_schema_history'),
                                     to_regclass('schema_floor'))
                       AND a.grantee <> c.relowner
                       AND a.privilege_type IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE')
                       AND pg_has_role(current_user, c.relowner, 'MEMBER')
                 LOOP
                     EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON %s FROM %s',
                         granted.tab,
                         CASE WHEN granted.grantee = 0 THEN 'PUBLIC'
                              ELSE quote_ident(pg_get_userbyid(granted.grantee)) END);
                 END LOOP;
             END $$",
        )
        .await
}

/// Raises (or, after a failed run, restores) the floor.
async fn set_floor(client: &tokio_postgres::Client, floor: i32) -> Result<(), MigrateError> {
    client
        .execute(
            "UPDATE schema_floor SET floor = $1, raised_at = now()",
            &[&floor],
        )
        .await
        .map_err(MigrateError::Floor)?;
    Ok(())
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

/// This binary's release, as the schema contract knows it: its newest migration.
pub fn release() -> i32 {
    RELEASE
}

/// The floor this binary's newest migration declares: what `migrate` raises the schema's to.
pub fn declared_floor() -> i32 {
    FLOORS.last().map_or(0, |(_, floor)| *floor)
}

/// The floor the database records: the oldest release that may still write; `None` before
/// the migration that records it.
pub async fn floor(client: &tokio_postgres::Client) -> Result<Option<i32>, tokio_postgres::Error> {
    if !table_exists(client, "schema_floor").await? {
        return Ok(None);
    }
    client
        .query_opt("SELECT floor FROM schema_floor", &[])
        .await
        .map(|row| row.map(|row| row.get(0)))
}

/// The newest migration applied to the database; `None` before the first `migrate`.
pub async fn applied_version(
    client: &tokio_postgres::Client,
) -> Result<Option<i32>, tokio_postgres::Error> {
    if !table_exists(client, "refinery_schema_history").await? {
        return Ok(None);
    }
    client
        .query_one("SELECT max(version) FROM refinery_schema_history", &[])
        .await?
        .try_get(0)
}

async fn table_exists(
    client: &tokio_postgres::Client,
    table: &str,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await?
        .get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_embedded_migration_has_a_floor_that_never_goes_down() {
        let versions: Vec<i32> = embedded::migrations::runner()
            .get_migrations()
            .iter()
            .map(refinery::Migration::version)
            .collect();
        let mut sorted = versions.clone();
        sorted.sort_unstable();
        let declared: Vec<i32> = FLOORS.iter().map(|(version, _)| *version).collect();
        assert_eq!(declared, sorted);
        assert!(FLOORS.windows(2).all(|w| w[0].1 <= w[1].1));
        assert!(FLOORS.iter().all(|(version, floor)| floor <= version));
        assert!(declared_floor() <= release());
        assert_eq!(release(), expected_version());
    }
}
