//! Hot-SKU coalescing: single-line `Reserve` calls for one SKU in one replica queue behind
//! one lease, and the batches of all SKUs that are ready at the same moment are written in
//! one transaction (group commit).
//!
//! Without it, every request for a hot SKU takes the lease and then the row lock in turn,
//! and the SKU sells no faster than one commit after another. With it, a SKU has at most one
//! *leader* per replica: the request that found no leader. The leader takes up to
//! `max_batch` queued requests (in arrival order), takes the lease once, and hands the batch
//! to the replica's [`Committer`]. Requests that arrive meanwhile queue; when the leader is
//! done it passes leadership to the oldest of them. A lone request is its own batch of one and
//! never waits for company.
//!
//! The committer does the same one level up: the first batch to arrive while no transaction
//! of this replica's is being written writes, together with every batch that queued in the
//! meantime (up to [`MAX_GROUPS`]), through
//! [`ReservationStore::reserve_groups`](crate::ports::ReservationStore::reserve_groups),
//! which decides each request on its own, in order. One commit then serves many SKUs, which
//! is what a spread-out load needs: its SKUs are rarely contended, but every commit costs.
//! The next transaction starts as soon as the one before has sent its `COMMIT`, so its
//! statements run while the earlier commit is flushed to disk. A SKU is never in both: its
//! leader waits for its batch's outcome, which comes after the flush.
//!
//! While requests keep queuing, a leader does not give its lease back: it renews it (the same
//! holder, the next fencing token, one Redis round trip) while its batch commits, and hands it
//! to the next leader with the lead ([`Kept`]), so neither a release nor an acquire stands
//! between two batches of a hot SKU. A hold writes at most [`MAX_HELD_BATCHES`] batches, then
//! the lease is released so other replicas get their turn. The fencing rules do not change:
//! every batch carries a token above the one it follows, and a leader that stalls past the
//! lease is fenced off like any other holder.
//!
//! A queued request gives up at its own deadline, and is then removed from the queue under
//! the same lock the leader takes batches with: a request is either answered by its batch or
//! left the queue untouched, never both.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::oneshot;

use crate::{
    command::Reserve,
    domain::{Reservation, Sku, Ttl},
    error::Error,
    ports::{Answers, Lease, Peer, ReserveGroup, WriteOutcome},
};

/// Where a `Reserve` came from, which decides whether it may be forwarded to the replica
/// holding its SKU's lease (one hop at most, see [`crate::ports::Forwarder`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// From a client: forwarded when a peer holds the lease.
    Client,
    /// Forwarded by a peer: run here while this replica can take the lease, else answered
    /// [`Error::NotHolder`] so the sender runs it; never forwarded again.
    Peer,
    /// From a client, after its forward failed or was refused: waits for the lease here.
    Local,
}

/// Most SKU batches one transaction of the committer writes.
pub const MAX_GROUPS: usize = 64;

/// Most batches one hold of a SKU's lease writes before it is released, so a replica with a
/// steady queue does not keep a hot SKU from the others.
pub const MAX_HELD_BATCHES: u32 = 8;

/// A lease a leader kept for the SKU's next batch: renewed, so still held, with a fencing
/// token newer than the batch it wrote.
#[derive(Debug)]
pub(crate) struct Kept {
    pub lease: Lease,
    /// Batches this hold has written so far.
    pub batches: u32,
}

/// How coalescing behaves.
#[derive(Clone, Debug)]
pub struct CoalesceConfig {
    /// Most requests one transaction writes. `1` turns coalescing off: every request takes the
    /// lease and writes on its own.
    pub max_batch: usize,
    /// How long a leader that found others queued waits for more before it writes (`0`: not at
    /// all). A request that finds nobody queued never waits.
    pub linger: Duration,
    /// Most requests of this replica queued for one SKU; more get
    /// [`Error::TooManyWaiters`].
    pub max_queued: usize,
    /// Most group-commit transactions of this replica in flight at once. A batch that finds
    /// them all busy joins the next one to start. One SKU is never in two at once (its
    /// leader waits for its batch's outcome). 1 by default: on a 2-core PostgreSQL, 2 gained
    /// nothing at 8 uniform clients and lost throughput at 64 (smaller batches).
    pub max_commits: usize,
}

impl Default for CoalesceConfig {
    fn default() -> Self {
        Self {
            max_batch: 64,
            linger: Duration::ZERO,
            max_queued: 256,
            max_commits: 1,
        }
    }
}

/// One request waiting in a SKU's queue.
#[derive(Debug)]
pub(crate) struct Queued {
    id: u64,
    origin: Origin,
    pub command: Reserve,
    pub ttl: Ttl,
    pub deadline: Instant,
    pub enqueued: Instant,
    reply: oneshot::Sender<Turn>,
}

impl Queued {
    /// Sends the request its answer; a request whose task is gone is not waiting for one.
    pub fn answer(self, result: Result<Reservation, Error>) {
        Reply(self.reply).answer(result);
    }

    /// Whether a peer forwarded it here.
    pub fn forwarded(&self) -> bool {
        self.origin == Origin::Peer
    }

    /// The request, to write, and where its answer goes.
    pub fn into_parts(self) -> ((Reserve, Ttl), Reply) {
        ((self.command, self.ttl), Reply(self.reply))
    }
}

/// Where a taken request's answer goes.
#[derive(Debug)]
pub(crate) struct Reply(oneshot::Sender<Turn>);

impl Reply {
    pub fn answer(self, result: Result<Reservation, Error>) {
        let _ = self.0.send(Turn::Done(result));
    }
}

/// What a queued request is told.
#[derive(Debug)]
pub(crate) enum Turn {
    /// Lead the next batch: the request was taken off the queue and is first in it. With the
    /// lease the last leader kept, if it kept it.
    Lead(Option<Kept>),
    /// The request was written; this is its answer.
    Done(Result<Reservation, Error>),
    /// Another replica holds the lease: forward the request there.
    Forward(Peer),
}

/// The result of joining a queue.
#[derive(Debug)]
pub(crate) enum Joined {
    /// Nobody leads this SKU: the caller does.
    Lead,
    /// Wait for a [`Turn`]; `id` names the entry for [`Queues::leave`].
    Wait {
        id: u64,
        turn: oneshot::Receiver<Turn>,
    },
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    /// A SKU is present exactly while it has a leader; its queue holds the others.
    queues: HashMap<Sku, VecDeque<Queued>>,
}

/// The per-SKU queues of one replica.
#[derive(Debug, Default)]
pub(crate) struct Queues {
    state: Mutex<State>,
}

impl Queues {
    /// Becomes the SKU's leader, or queues behind the current one.
    pub fn join(
        &self,
        sku: &Sku,
        command: &Reserve,
        origin: Origin,
        ttl: Ttl,
        deadline: Instant,
        max_queued: usize,
    ) -> Result<Joined, Error> {
        let mut state = self.state.lock().expect("queues lock");
        let State { next_id, queues } = &mut *state;
        let Some(queue) = queues.get_mut(sku) else {
            queues.insert(sku.clone(), VecDeque::new());
            crate::metrics::queue_depth().record(0, &[]);
            return Ok(Joined::Lead);
        };
        if queue.len() >= max_queued {
            // Recorded too: a full queue is the depth that matters most.
            crate::metrics::queue_depth().record(queue.len() as u64, &[]);
            return Err(Error::TooManyWaiters { sku: sku.clone() });
        }
        *next_id += 1;
        let (reply, turn) = oneshot::channel();
        queue.push_back(Queued {
            id: *next_id,
            origin,
            command: command.clone(),
            ttl,
            deadline,
            enqueued: Instant::now(),
            reply,
        });
        crate::metrics::queue_depth().record(queue.len() as u64, &[]);
        Ok(Joined::Wait { id: *next_id, turn })
    }

    /// Removes a request that gave up waiting. `false`: a leader already took it, and its
    /// answer is on the way.
    pub fn leave(&self, sku: &Sku, id: u64) -> bool {
        let mut state = self.state.lock().expect("queues lock");
        let Some(queue) = state.queues.get_mut(sku) else {
            return false;
        };
        match queue.iter().position(|q| q.id == id) {
            Some(at) => {
                queue.remove(at);
                true
            }
            None => false,
        }
    }

    /// Whether the SKU has a leader here: its lease is held or being taken by this replica.
    pub fn has_leader(&self, sku: &Sku) -> bool {
        let state = self.state.lock().expect("queues lock");
        state.queues.contains_key(sku)
    }

    /// The lease was found held by another replica: every queued client request is sent to
    /// `peer` (when the holder takes forwarded calls), every forwarded one is told
    /// [`Error::NotHolder`]; the rest stay queued to wait for the lease here.
    pub fn redirect(&self, sku: &Sku, peer: Option<&Peer>) {
        let mut state = self.state.lock().expect("queues lock");
        let Some(queue) = state.queues.get_mut(sku) else {
            return;
        };
        let mut kept = VecDeque::with_capacity(queue.len());
        for queued in queue.drain(..) {
            match (queued.origin, peer) {
                (Origin::Client, Some(peer)) => {
                    let _ = queued.reply.send(Turn::Forward(peer.clone()));
                }
                (Origin::Peer, _) => queued.answer(Err(Error::NotHolder { sku: sku.clone() })),
                _ => kept.push_back(queued),
            }
        }
        *queue = kept;
    }

    /// How many requests wait behind the leader.
    pub fn queued(&self, sku: &Sku) -> usize {
        let state = self.state.lock().expect("queues lock");
        state.queues.get(sku).map_or(0, VecDeque::len)
    }

    /// Takes up to `max` queued requests in arrival order for the leader's batch. A request
    /// whose idempotency key is already in the batch stays queued for the next one (where it
    /// replays the first's outcome); one past its deadline is answered at once.
    pub fn take(&self, sku: &Sku, max: usize, leader: &Reserve) -> Vec<Queued> {
        let mut state = self.state.lock().expect("queues lock");
        let Some(queue) = state.queues.get_mut(sku) else {
            return Vec::new();
        };
        let now = Instant::now();
        let mut batch: Vec<Queued> = Vec::new();
        let mut kept = VecDeque::new();
        while let Some(next) = queue.pop_front() {
            if batch.len() >= max {
                kept.push_back(next);
                continue;
            }
            if next.reply.is_closed() {
                continue;
            }
            if next.deadline <= now {
                let waited = now.saturating_duration_since(next.enqueued);
                next.answer(Err(Error::LeaseBusy {
                    sku: sku.clone(),
                    waited,
                }));
                continue;
            }
            let same_key = |c: &Reserve| {
                c.caller == next.command.caller && c.idempotency_key == next.command.idempotency_key
            };
            if same_key(leader) || batch.iter().any(|q| same_key(&q.command)) {
                kept.push_back(next);
                continue;
            }
            batch.push(next);
        }
        *queue = kept;
        batch
    }

    /// The leader is done: the oldest queued request leads next (with `kept`), or the SKU has
    /// no leader. A kept lease nobody takes is left to expire (its holder is gone).
    pub fn hand_off(&self, sku: &Sku, kept: Option<Kept>) {
        let _ = self.pass(sku, kept, true);
    }

    /// Hands the lead (with `kept`) to the oldest queued request still waiting. When there is
    /// none, gives `kept` back and either ends the SKU's leadership (`give_up`) or leaves the
    /// caller leading; under the one lock, so no request can join in between and be lost.
    fn pass(&self, sku: &Sku, mut kept: Option<Kept>, give_up: bool) -> Result<(), Option<Kept>> {
        let mut state = self.state.lock().expect("queues lock");
        let Some(queue) = state.queues.get_mut(sku) else {
            return Ok(());
        };
        while let Some(next) = queue.pop_front() {
            match next.reply.send(Turn::Lead(kept)) {
                Ok(()) => return Ok(()),
                Err(Turn::Lead(back)) => kept = back,
                Err(_) => unreachable!("a lead was sent"),
            }
        }
        if give_up {
            state.queues.remove(sku);
            if kept.is_some() {
                tracing::debug!(%sku, "kept lease not handed on; it will expire");
            }
        }
        Err(kept)
    }
}

/// Leadership of one SKU's queue, with the lease the last leader kept, if any; dropping it
/// (however the leader ends) passes both on.
#[derive(Debug)]
pub(crate) struct Leadership<'a> {
    queues: &'a Queues,
    sku: &'a Sku,
    kept: Option<Kept>,
    passed: bool,
}

impl<'a> Leadership<'a> {
    pub fn new(queues: &'a Queues, sku: &'a Sku, kept: Option<Kept>) -> Self {
        Self {
            queues,
            sku,
            kept,
            passed: false,
        }
    }

    /// The lease handed to this leader, to write with.
    pub fn take_kept(&mut self) -> Option<Kept> {
        self.kept.take()
    }

    /// Hands the lead and `kept` to the next queued request; gives `kept` back (to release)
    /// when nobody waits, and this leader still leads until dropped.
    pub fn pass(&mut self, kept: Kept) -> Result<(), Kept> {
        match self.queues.pass(self.sku, Some(kept), false) {
            Ok(()) => {
                self.passed = true;
                Ok(())
            }
            Err(kept) => Err(kept.expect("the kept lease comes back")),
        }
    }
}

impl Drop for Leadership<'_> {
    fn drop(&mut self) {
        if !self.passed {
            self.queues.hand_off(self.sku, self.kept.take());
        }
    }
}

/// What one SKU batch's write came to.
pub(crate) type GroupOutcome = Result<WriteOutcome<Answers>, Error>;

/// What a batch waiting for the committer is told.
#[derive(Debug)]
pub(crate) enum CommitTurn {
    /// Write the next transaction: here is the batch back, first in it.
    Lead(ReserveGroup),
    Done(GroupOutcome),
}

/// The result of submitting a batch.
#[derive(Debug)]
pub(crate) enum Submitted {
    Lead(ReserveGroup),
    Wait(oneshot::Receiver<CommitTurn>),
}

/// A batch queued for the next transaction, with where its outcome goes.
#[derive(Debug)]
pub(crate) struct PendingGroup {
    pub group: ReserveGroup,
    pub reply: oneshot::Sender<CommitTurn>,
}

#[derive(Debug, Default)]
struct CommitState {
    /// Transactions being written that have not reached their commit yet.
    writing: usize,
    waiting: VecDeque<PendingGroup>,
}

/// The replica's group commit: up to `max_in_flight` transactions being written, the batches
/// that arrive while all are busy go into the next to start. A transaction whose commit is
/// being flushed no longer counts: the next one runs its statements meanwhile.
#[derive(Debug)]
pub(crate) struct Committer {
    state: Mutex<CommitState>,
    max_in_flight: usize,
}

impl Default for Committer {
    fn default() -> Self {
        Self::new(1)
    }
}

impl Committer {
    pub fn new(max_in_flight: usize) -> Self {
        Self {
            state: Mutex::default(),
            max_in_flight: max_in_flight.max(1),
        }
    }

    pub fn submit(&self, group: ReserveGroup) -> Submitted {
        let mut state = self.state.lock().expect("committer lock");
        if state.writing < self.max_in_flight {
            state.writing += 1;
            return Submitted::Lead(group);
        }
        let (reply, turn) = oneshot::channel();
        state.waiting.push_back(PendingGroup { group, reply });
        Submitted::Wait(turn)
    }

    pub fn waiting(&self) -> usize {
        self.state.lock().expect("committer lock").waiting.len()
    }

    /// The batches queued for the next transaction, oldest first. A batch with an
    /// idempotency key or a SKU already in the transaction (`own`'s or an earlier one's) stays
    /// queued for the one after, where it replays or conflicts as it would alone.
    pub fn take(&self, max: usize, own: &ReserveGroup) -> Vec<PendingGroup> {
        let mut state = self.state.lock().expect("committer lock");
        let key = |c: &Reserve| (c.caller.clone(), c.idempotency_key.clone());
        let mut keys: HashSet<_> = own.batch.iter().map(|(c, _)| key(c)).collect();
        let mut skus: HashSet<Sku> = HashSet::from([own.sku.clone()]);
        let mut taken: Vec<PendingGroup> = Vec::new();
        let mut kept = VecDeque::new();
        while let Some(next) = state.waiting.pop_front() {
            if next.reply.is_closed() {
                // Its leader is gone: nobody would be told the outcome.
                continue;
            }
            let overlaps = skus.contains(&next.group.sku)
                || next.group.batch.iter().any(|(c, _)| keys.contains(&key(c)));
            if taken.len() >= max || overlaps {
                kept.push_back(next);
                continue;
            }
            keys.extend(next.group.batch.iter().map(|(c, _)| key(c)));
            skus.insert(next.group.sku.clone());
            taken.push(next);
        }
        state.waiting = kept;
        taken
    }

    /// A transaction is written: the oldest queued batch writes the next one.
    pub fn hand_off(&self) {
        let mut state = self.state.lock().expect("committer lock");
        while let Some(next) = state.waiting.pop_front() {
            match next.reply.send(CommitTurn::Lead(next.group)) {
                Ok(()) => return,
                // Its leader is gone; nobody waits for this batch.
                Err(_) => continue,
            }
        }
        state.writing -= 1;
    }
}

/// Writing the committer's transaction. The turn passes on once, at [`Self::committing`]
/// (the transaction's writes are done and its commit is being flushed) or, if it never got
/// there, when this is dropped.
#[derive(Debug)]
pub(crate) struct Writing<'a> {
    committer: &'a Committer,
    handed: AtomicBool,
}

impl<'a> Writing<'a> {
    pub fn new(committer: &'a Committer) -> Self {
        Self {
            committer,
            handed: AtomicBool::new(false),
        }
    }

    /// The transaction only waits for its commit now: the next one may start.
    pub fn committing(&self) {
        if !self.handed.swap(true, Ordering::AcqRel) {
            self.committer.hand_off();
        }
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.committing();
    }
}

/// A queued request's wait for its turn. If the waiting task ends before it read a
/// [`Turn::Lead`] sent to it (cancelled, panicked), dropping this passes the lead on, so the
/// SKU's queue is never left without a leader.
#[derive(Debug)]
pub(crate) struct TurnWait<'a> {
    pub turn: oneshot::Receiver<Turn>,
    queues: &'a Queues,
    sku: &'a Sku,
}

impl<'a> TurnWait<'a> {
    pub fn new(turn: oneshot::Receiver<Turn>, queues: &'a Queues, sku: &'a Sku) -> Self {
        Self { turn, queues, sku }
    }
}

impl Drop for TurnWait<'_> {
    fn drop(&mut self) {
        // Closed before the read: a lead sent after this fails and goes to the next in line,
        // one sent before is read here and passed on. Reading first would lose a lead sent
        // between the read and the drop of the receiver.
        self.turn.close();
        if let Ok(Turn::Lead(kept)) = self.turn.try_recv() {
            self.queues.hand_off(self.sku, kept);
        }
    }
}

/// A batch's wait for the committer; like [`TurnWait`], passes an unread turn on.
#[derive(Debug)]
pub(crate) struct CommitWait<'a> {
    pub turn: oneshot::Receiver<CommitTurn>,
    committer: &'a Committer,
}

impl<'a> CommitWait<'a> {
    pub fn new(turn: oneshot::Receiver<CommitTurn>, committer: &'a Committer) -> Self {
        Self { turn, committer }
    }
}

impl Drop for CommitWait<'_> {
    fn drop(&mut self) {
        // As in `TurnWait`: closed first, so no lead can arrive after the read.
        self.turn.close();
        if let Ok(CommitTurn::Lead(_)) = self.turn.try_recv() {
            self.committer.hand_off();
        }
    }
}

#[cfg(test)]
mod tests;
