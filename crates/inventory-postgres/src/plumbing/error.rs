//! Driver errors, classified: a connection problem means "retry later" (`UNAVAILABLE`); anything
//! else is a bug or an unexpected state and stays opaque to the caller.

use deadpool_postgres::PoolError;
use inventory_core::{Dependency, Error};
use tokio_postgres::error::SqlState;

/// The SQLSTATE of `inventory_writer_gate`'s refusal (migration V14): this release is below
/// the schema floor.
const BELOW_FLOOR: &str = "IV001";

pub(crate) fn from_db(error: tokio_postgres::Error) -> Error {
    if let Some(db) = error.as_db_error()
        && db.code().code() == BELOW_FLOOR
    {
        let floor = db.detail().and_then(|d| d.parse().ok()).unwrap_or(0);
        return Error::SchemaTooNew {
            release: crate::plumbing::migrate::RELEASE,
            floor,
        };
    }
    if is_unavailable(&error) {
        Error::unavailable(Dependency::Postgres, error)
    } else {
        Error::internal(error)
    }
}

pub(crate) fn from_pool(error: PoolError) -> Error {
    match error {
        PoolError::Backend(error) => from_db(error),
        PoolError::Timeout(_) | PoolError::Closed => {
            Error::unavailable(Dependency::Postgres, error)
        }
        // The session settings sent on a new connection: its failure is the connection's.
        PoolError::PostCreateHook(deadpool_postgres::HookError::Backend(error)) => from_db(error),
        PoolError::NoRuntimeSpecified | PoolError::PostCreateHook(_) => Error::internal(error),
    }
}

fn is_unavailable(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    match error.code() {
        // No SQLSTATE: unavailable if the cause is I/O (refused, reset, timed out); a decoding
        // failure, say, is a bug instead.
        None => std::error::Error::source(error).is_some_and(|s| s.is::<std::io::Error>()),
        Some(code) => {
            code.code().starts_with("08")
                || [
                    SqlState::ADMIN_SHUTDOWN,
                    SqlState::CRASH_SHUTDOWN,
                    SqlState::CANNOT_CONNECT_NOW,
                    SqlState::TOO_MANY_CONNECTIONS,
                    // statement_timeout and lock_timeout: the database is too slow right now.
                    SqlState::QUERY_CANCELED,
                    SqlState::LOCK_NOT_AVAILABLE,
                    // Nothing was written; the same call succeeds when retried.
                    SqlState::T_R_DEADLOCK_DETECTED,
                    SqlState::T_R_SERIALIZATION_FAILURE,
                ]
                .contains(code)
        }
    }
}
