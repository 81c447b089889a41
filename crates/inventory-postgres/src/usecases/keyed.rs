//! The shape every write shares, written once: take a connection, open the transaction,
//! claim the idempotency key (or replay what the key stored), run the use case's own steps,
//! store the outcome on the key, commit, wake the sequencer. Each use case hands
//! [`PgStore::keyed`] its key, what a replay answers, and its body.
//!
//! An answer decided by reads alone leaves through [`durable::answer`] (see there why), and so
//! does a refusal that a use case answering its other outcomes itself decided by reading
//! ([`durable::refused_by_reads`]).

use std::time::Instant;

use deadpool_postgres::Transaction;
use inventory_core::{
    Error,
    command::Fingerprint,
    domain::{Caller, IdempotencyKey},
};
use serde::{Serialize, de::DeserializeOwned, de::IgnoredAny};

use crate::{
    PgStore,
    plumbing::{
        durable,
        error::{from_db, from_pool},
        metrics,
    },
    tables::idempotency,
};

/// The key a request runs under: who sent it, the key, the operation it names and the
/// fingerprint a repeat must match.
pub(crate) struct Key<'a> {
    pub caller: &'a str,
    pub key: &'a IdempotencyKey,
    pub operation: &'static str,
    pub fingerprint: Fingerprint,
}

impl<'a> Key<'a> {
    pub(crate) fn new(
        caller: &'a Caller,
        key: &'a IdempotencyKey,
        operation: &'static str,
        fingerprint: Fingerprint,
    ) -> Self {
        Self {
            caller: caller.as_str(),
            key,
            operation,
            fingerprint,
        }
    }
}

/// What a use case's body decided.
pub(crate) enum Step<T> {
    /// Commit, then answer.
    Commit(Commit<T>),
    /// Decided by what was read: the transaction (the claim with it) rolls back and the answer
    /// leaves once a synchronous standby has everything it was decided on.
    Read(Result<T, Error>),
    /// A transient refusal that must leave no trace: everything rolls back, the claim
    /// included, and the answer leaves as it is.
    Abandon(T),
}

/// A decision to commit: the answer, what is stored on the key, and what follows the commit.
pub(crate) struct Commit<T> {
    answer: Result<T, Error>,
    /// Stored on the key before the commit (`None`: the body stored it already, or no key).
    outcome: Option<serde_json::Value>,
    /// The transaction appended an outbox event: the sequencer is woken once it commits.
    wrote: bool,
    /// Reservations that reached this outcome, counted once committed.
    counted: Option<(&'static str, u64)>,
}

impl<T> Commit<T> {
    /// Commit, storing `outcome` on the key.
    pub(crate) fn storing(
        answer: Result<T, Error>,
        outcome: &impl Serialize,
    ) -> Result<Self, Error> {
        let outcome = serde_json::to_value(outcome).map_err(Error::internal)?;
        Ok(Self {
            outcome: Some(outcome),
            ..Self::stored(answer)
        })
    }

    /// Commit without storing anything on the key (the body stored it, or there is no key).
    pub(crate) fn stored(answer: Result<T, Error>) -> Self {
        Self {
            answer,
            outcome: None,
            wrote: false,
            counted: None,
        }
    }

    /// Whether the transaction appended an outbox event (the sequencer is woken).
    pub(crate) fn wrote(self, wrote: bool) -> Self {
        Self { wrote, ..self }
    }

    /// Counts `reservations` reservations that reached `outcome`, once committed.
    pub(crate) fn counting(self, outcome: &'static str, reservations: u64) -> Self {
        Self {
            counted: Some((outcome, reservations)),
            ..self
        }
    }

    pub(crate) fn step(self) -> Result<Step<T>, Error> {
        Ok(Step::Commit(self))
    }
}

/// How the commit of a single-request `Reserve` is timed (its commit and transaction
/// durations, on the `single` path).
#[derive(Clone, Copy)]
pub(crate) struct Timed {
    pub started: Instant,
}

impl PgStore {
    /// Runs one write under `key` (if the request has one). A repeat of a request that
    /// committed answers `replay(stored, tx)` (it may read in `tx`, which then rolls back); a
    /// different request with the same key is refused with `ALREADY_EXISTS`. Otherwise `body`
    /// runs in the transaction and its [`Step`] says what happens to it. `timed`: the commit
    /// of a single-request `Reserve`, whose durations are recorded.
    pub(crate) async fn keyed<'k, S, T>(
        &self,
        key: impl Into<Option<Key<'k>>>,
        timed: Option<Timed>,
        replay: impl AsyncFnOnce(S, &Transaction<'_>) -> Result<T, Error>,
        body: impl AsyncFnOnce(&mut Transaction<'_>) -> Result<Step<T>, Error>,
    ) -> Result<T, Error>
    where
        S: DeserializeOwned,
    {
        let key = key.into();
        self.bounded(async {
            let mut client = self.pool().get().await.map_err(from_pool)?;
            let decided = async {
                let mut tx = client.transaction().await.map_err(from_db)?;
                if let Some(key) = &key {
                    let claim = idempotency::claim(
                        &tx,
                        &self.pauses,
                        key.caller,
                        key.key,
                        key.operation,
                        &key.fingerprint,
                    )
                    .await?;
                    if let Some(stored) = claim.stored::<S>()? {
                        let answer = replay(stored, &tx).await;
                        drop(tx);
                        return durable::answer(&client, answer).await;
                    }
                }
                match body(&mut tx).await? {
                    Step::Abandon(answer) => Ok(answer),
                    Step::Read(answer) => {
                        drop(tx);
                        durable::answer(&client, answer).await
                    }
                    Step::Commit(commit) => {
                        if let (Some(key), Some(outcome)) = (&key, &commit.outcome) {
                            idempotency::record(&tx, key.caller, key.key, outcome).await?;
                        }
                        let committing = Instant::now();
                        tx.commit().await.map_err(from_db)?;
                        if let Some(Timed { started }) = timed {
                            metrics::reserve_committed(false, started, committing);
                        }
                        if commit.wrote {
                            self.outbox_written();
                        }
                        if let Some((outcome, reservations)) = commit.counted {
                            metrics::reservations(outcome, reservations);
                        }
                        commit.answer
                    }
                }
            }
            .await;
            durable::refused_by_reads(&client, decided).await
        })
        .await
    }

    /// Runs one write that has no key: a [`Commit`] stores nothing.
    pub(crate) async fn unkeyed<T>(
        &self,
        body: impl AsyncFnOnce(&mut Transaction<'_>) -> Result<Step<T>, Error>,
    ) -> Result<T, Error> {
        let no_replay = async |_: Unread, _: &Transaction<'_>| -> Result<T, Error> {
            unreachable!("a write without a key replays nothing")
        };
        self.keyed(None, None, no_replay, body).await
    }
}

/// Nothing was stored, or what was stored is not read: a replay answers from what is there now.
pub(crate) type Unread = IgnoredAny;
