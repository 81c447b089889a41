//! The coalesced `Reserve`: the batches of several SKUs (each many single-line requests) in
//! one transaction. The core decides every request ([`rules::decide_group`]); this module
//! reads what the decision needs and writes what it decided, with no SQL of its own.
//!
//! The transaction takes four round trips whatever its size, because each step sends its
//! statements together (tokio-postgres pipelines queries issued concurrently on one
//! connection) and every per-request statement is one array statement (`unnest`):
//!
//! 1. `BEGIN`
//! 2. claim every idempotency key, read the outcomes stored for keys already used, take the
//!    orders' locks (shared) and read which were cancelled, lock the stock rows (`FOR UPDATE`,
//!    in SKU order; those locks cover their location rows, read next), read the configured
//!    locations — in this order, the same order as the one-request path (keys, orders,
//!    then stock), with keys sorted, so two transactions never wait on each other in a cycle;
//! 3. decide each group in memory (fenced groups have their claims deleted again), then
//!    write through [`holds::write`], as the one-request path does: one statement updating
//!    the SKU totals and then their location rows, each guarded by its group's fence, the
//!    reservations, their lines, their outbox events, movements and every executed request's
//!    outcome;
//! 4. `COMMIT`, announced to the caller first: while it is flushed, the replica's next group
//!    commit may already run its steps 1 to 3 (see `inventory_core::coalesce`).

use std::collections::{HashMap, HashSet};

use deadpool_postgres::Transaction;
use inventory_core::{
    Error,
    command::Reserve,
    pause::PausePoint,
    ports::{self, Answers, ReserveGroup, WriteOutcome},
    rules::{self, Earlier, GroupVerdict},
};
use tokio_postgres::types::Json;

use crate::{
    PgStore,
    plumbing::durable,
    plumbing::error::{from_db, from_pool},
    tables::idempotency::outcome::{RESERVE, ReserveOutcome},
    tables::idempotency::{self, Key, Stored},
    tables::locations,
    tables::orders,
    tables::stock,
    usecases::holds::{self, Hold, Record},
};

fn key_of(command: &Reserve) -> Key {
    (
        command.caller.as_str().to_owned(),
        command.idempotency_key.as_str().to_owned(),
    )
}

/// What a request's key held, from the claims and records read in step 2. A claimed key is
/// used up by the first request that has it.
fn earlier(
    command: &Reserve,
    claimed: &mut HashSet<Key>,
    stored: &mut HashMap<Key, Stored>,
) -> Result<Earlier, Error> {
    let key = key_of(command);
    let metrics = crate::plumbing::metrics::store();
    if let Some((fingerprint, outcome)) = stored.remove(&key) {
        if fingerprint != command.fingerprint().as_bytes() {
            metrics
                .conflicts
                .add(1, &crate::plumbing::metrics::operation(RESERVE));
            return Ok(Earlier::KeyReused);
        }
        metrics
            .replays
            .add(1, &crate::plumbing::metrics::operation(RESERVE));
        // An outcome this release cannot read fails its own call, not the batch.
        let replayed = serde_json::from_value::<ReserveOutcome>(outcome)
            .map_err(crate::tables::idempotency::outcome::unreadable)
            .and_then(ReserveOutcome::into_result)
            .unwrap_or_else(Err);
        return Ok(Earlier::Replay(replayed));
    }
    Ok(if claimed.remove(&key) {
        Earlier::Claimed
    } else {
        Earlier::Vanished
    })
}

impl PgStore {
    #[tracing::instrument(name = "sql.reserve_batch", skip_all, fields(skus = groups.len(), batch))]
    pub(crate) async fn write_groups(
        &self,
        groups: &[ReserveGroup],
        committing: &(dyn Fn() + Sync),
    ) -> Result<Vec<WriteOutcome<Answers>>, Error> {
        let requests: usize = groups.iter().map(|g| g.batch.len()).sum();
        tracing::Span::current().record("batch", requests);
        let started = std::time::Instant::now();
        let mut client = self.pool().get().await.map_err(from_pool)?;
        let tx = client.transaction().await.map_err(from_db)?;
        prepare(&tx).await?;

        // Step 2. Keys in sorted order: the order their row locks are taken in.
        let fingerprints: Vec<_> = groups
            .iter()
            .flat_map(|g| &g.batch)
            .map(|(c, _)| (c, c.fingerprint()))
            .collect();
        let mut keys: Vec<(&str, &str, &[u8])> = fingerprints
            .iter()
            .map(|(c, f)| {
                let fingerprint: &[u8] = f.as_bytes();
                (c.caller.as_str(), c.idempotency_key.as_str(), fingerprint)
            })
            .collect();
        keys.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        let skus: Vec<&str> = groups.iter().map(|g| g.sku.as_str()).collect();
        // `biased`: polled in this order, and every statement prepared already, so each is
        // sent when first polled and they reach PostgreSQL in this order. Keys, then order
        // locks, then stock rows, like every writer; the claim before the read of stored
        // outcomes (read first, a key another transaction is committing would be neither
        // claimed nor seen); the tombstones read once the order locks are held.
        let orders: Vec<(&str, &str)> = groups
            .iter()
            .flat_map(|g| &g.batch)
            .map(|(c, _)| (c.caller.as_str(), c.order_id.as_str()))
            .collect();
        let (mut claimed, mut stored, cancelled, locked, configured) = tokio::try_join!(
            biased;
            idempotency::claim_many(&tx, &keys, RESERVE),
            idempotency::read_stored_many(&tx, &keys),
            orders::lock_and_read_cancelled(&tx, self.order_lock_space(), &orders),
            stock::lock_many(&tx, &skus),
            locations::all(&tx),
        )?;
        self.pauses.reach(PausePoint::OrderChecked).await;
        let is_cancelled = |command: &Reserve| {
            cancelled.contains(&(
                command.caller.as_str().to_owned(),
                command.order_id.as_str().to_owned(),
            ))
        };

        // Step 3: decide.
        let metrics = crate::plumbing::metrics::store();
        let mut outcomes: Vec<WriteOutcome<Answers>> = Vec::with_capacity(groups.len());
        let mut holds: Vec<Hold<'_>> = Vec::new();
        let mut unclaim: Vec<(&str, &str)> = Vec::new();
        let mut records: Vec<Record<'_>> = Vec::new();
        for group in groups {
            let verdict = rules::decide_group(
                group,
                locked.get(&group.sku),
                &configured,
                |command| earlier(command, &mut claimed, &mut stored),
                is_cancelled,
            )?;
            let decided = match verdict {
                GroupVerdict::Fenced(stored_fence) => {
                    metrics.fence_rejected.add(1, &[]);
                    // A lost lease is transient: this group's claims are undone, nothing stored.
                    unclaim.extend(
                        group
                            .batch
                            .iter()
                            .filter(|(c, _)| claimed.contains(&key_of(c)))
                            .map(|(c, _)| (c.caller.as_str(), c.idempotency_key.as_str())),
                    );
                    outcomes.push(WriteOutcome::Fenced(vec![(
                        group.sku.clone(),
                        stored_fence,
                    )]));
                    continue;
                }
                GroupVerdict::Decided(decided) => decided,
            };
            let mut answers = Vec::with_capacity(decided.len());
            let mut unknown = Vec::new();
            for ((command, _), decision) in group.batch.iter().zip(decided) {
                if decision.executed {
                    // Decided now, not replayed: only such a refusal says the SKU is unknown.
                    unknown.extend(ports::unknown_skus(&decision.answer).iter().cloned());
                    if let Err(Error::InsufficientStock(_)) = &decision.answer {
                        metrics.insufficient.add(1, &[]);
                    }
                    records.push((
                        command.caller.as_str(),
                        command.idempotency_key.as_str(),
                        Json(ReserveOutcome::of(&decision.answer)),
                    ));
                }
                if let Ok(reservation) = &decision.answer
                    && !decision.placements.is_empty()
                {
                    holds.push(Hold {
                        command,
                        reservation: reservation.clone(),
                        fences: vec![group.fence],
                        placements: decision.placements,
                    });
                }
                answers.push(decision.answer);
            }
            unknown.dedup();
            outcomes.push(WriteOutcome::decided(answers, unknown));
        }

        // Step 3: write. Step 4: commit.
        let wrote = !(holds.is_empty() && records.is_empty() && unclaim.is_empty());
        holds::write(&tx, &holds, &records, &unclaim).await?;
        committing();
        self.pauses.reach(PausePoint::Committing).await;
        let commit_started = std::time::Instant::now();
        tx.commit().await.map_err(from_db)?;
        crate::plumbing::metrics::reserve_committed(true, started, commit_started);
        // Only replays, decided by reads: confirmed before they are answered. A commit that
        // wrote was acknowledged with everything read before it.
        let answered = outcomes
            .iter()
            .any(|o| matches!(o, WriteOutcome::Answered { answer, .. } if !answer.is_empty()));
        if !wrote && answered {
            durable::answer(&client, Ok(())).await?;
        }

        metrics.batch_size.record(requests as u64, &[]);
        if !holds.is_empty() {
            self.outbox_written();
        }
        for outcome in &outcomes {
            if let WriteOutcome::Answered {
                answer: answers, ..
            } = outcome
            {
                for answer in answers {
                    crate::plumbing::metrics::reservation(if answer.is_ok() {
                        "HELD"
                    } else {
                        "REFUSED"
                    });
                }
            }
        }
        Ok(outcomes)
    }
}

/// Every statement the transaction's step 2 may send, in the order it sends them; step 3's
/// are [`holds::WRITES`].
const READS: [&str; 7] = [
    idempotency::CLAIM_MANY,
    idempotency::READ_STORED_MANY,
    orders::LOCK_SHARED,
    orders::CANCELLED_AMONG,
    stock::LOCK_MANY,
    stock::READ_LOCATIONS_MANY,
    locations::ALL,
];

/// Prepares every statement of the transaction before any is sent (one round trip for those
/// the connection lacks, none once it has them all). The steps rely on their statements
/// reaching PostgreSQL in the order they are polled, and a statement that must be prepared
/// first is sent a round trip after the cached ones polled behind it: on a connection that
/// served a one-request `Reserve` (which caches the stock lock but not the batch's key
/// claim), stock rows were locked before keys were claimed, the reverse of every other
/// writer, and a retry holding its key deadlocked with the batch.
async fn prepare(tx: &Transaction<'_>) -> Result<(), Error> {
    let statements = READS.iter().chain(&holds::WRITES);
    futures::future::try_join_all(statements.map(|sql| tx.prepare_cached(sql)))
        .await
        .map_err(from_db)?;
    Ok(())
}
