//! Answers decided by reading, made as durable as answers decided by writing.
//!
//! A write's answer leaves once its COMMIT has returned, which under synchronous replication
//! is once a standby has the commit: a primary replaced while it was frozen or cut off takes
//! no write the service acts on (its commits wait for a standby that is gone, and
//! `statement_timeout` does not end that wait: PostgreSQL turns it off before committing).
//! Reads are another matter. Such a primary, back for the moment before its keeper learns it
//! was replaced, still answers them, from rows the failover lost (a first commit only it has,
//! never acknowledged) or never had (what the new primary wrote since). A replay of a stored
//! outcome, an "unknown reservation" or the answer to a repeated confirm would then be acted
//! on and be wrong.
//!
//! So a call whose answer comes from its reads alone ends with [`answer`]: one more statement,
//! a transactional WAL message committed on its own, which a synchronous standby must
//! acknowledge like any write. It does so only if the standby has every record before it,
//! everything the reads saw included. On a replaced primary it never returns (the keeper ends
//! the session, the client-side bound answers `UNAVAILABLE`, and the retry reaches the new
//! primary). Without a synchronous standby it costs a local WAL flush. Plain reads
//! (`GetReservation`, `GetStock`, listings) are not confirmed: they may lag by that moment.

use inventory_core::Error;

use crate::plumbing::error::from_db;

/// A transactional message (it takes a transaction id, so its commit writes a record and waits
/// for the synchronous standby, where a commit of reads alone would not). Logical decoding
/// would see it under this prefix; nothing else reads it.
const BARRIER: &str = "SELECT pg_logical_emit_message(true, 'inventory-server', 'answer')";

/// Waits until a synchronous standby has everything this session has read, then gives
/// `answer`. Call it on the session whose transaction decided the answer, after that
/// transaction ended (committed with nothing written, or rolled back).
pub(crate) async fn answer<T>(
    client: &tokio_postgres::Client,
    answer: Result<T, Error>,
) -> Result<T, Error> {
    client.batch_execute(BARRIER).await.map_err(from_db)?;
    answer
}

/// Gives `decided`, the result of a transaction that has ended, through [`answer`] if it is a
/// refusal decided by reads alone in a use case that answers the others itself: a key used
/// for another request (`ALREADY_EXISTS`), a location that does not exist. Anything else as
/// it is.
pub(crate) async fn refused_by_reads<T>(
    client: &tokio_postgres::Client,
    decided: Result<T, Error>,
) -> Result<T, Error> {
    match decided {
        Err(refusal @ (Error::IdempotencyKeyReused | Error::UnknownLocation(_))) => {
            answer(client, Err(refusal)).await
        }
        decided => decided,
    }
}
