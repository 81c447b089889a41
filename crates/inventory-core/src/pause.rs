//! Named pause points: the places in the reserve path where a pause changes the outcome
//! (a holder stalled after its lease was granted, a response lost after commit). Tests arm a
//! point and hold the first request that reaches it, so failure interleavings are driven by
//! latches instead of sleeps. Without the `pause-points` feature (every production build)
//! [`PausePoints::reach`] is empty and compiles away.

#[cfg(feature = "pause-points")]
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PausePoint {
    /// Every lease and fencing token of a `Reserve` is granted; the SQL write is next.
    LeaseGranted,
    /// A coalescing leader was handed the lease the last leader kept (renewed, with a newer
    /// fencing token); its batch's write is next.
    LeaseHanded,
    /// The `Reserve` transaction committed; the response is next.
    Committed,
    /// A coalesced batch has the replica's group-commit turn; the batches of other SKUs queued
    /// by now join its transaction next.
    GroupCommit,
    /// A group commit's statements are written and the replica's next group commit may start;
    /// its `COMMIT` is next.
    Committing,
    /// A claim found its idempotency key taken by a committed record; reading that record is
    /// next (retention may prune it in between).
    KeyTaken,
    /// A `Reserve` transaction found its order not cancelled (and holds the order's lock, so
    /// no cancel can commit until it does); its stock writes are next.
    OrderChecked,
    /// A sweep committed the expiry of the holds whose SKUs it could lock at once; taking the
    /// others again, SKU by SKU, waiting for each SKU's row, is next.
    ExpiryDeferred,
    /// The event relay's sink stored a batch; moving the relay's cursor past it is next.
    RelayPublished,
}

/// The pause points of one service instance.
#[derive(Clone, Debug, Default)]
pub struct PausePoints {
    #[cfg(feature = "pause-points")]
    armed: Arc<Mutex<HashMap<PausePoint, Armed>>>,
}

#[cfg(feature = "pause-points")]
#[derive(Debug)]
struct Armed {
    reached: futures_channel::oneshot::Sender<()>,
    resume: futures_channel::oneshot::Receiver<()>,
}

impl PausePoints {
    /// Called by the service at `point`. Holds the caller only if a test armed the point.
    #[inline(always)]
    pub async fn reach(&self, point: PausePoint) {
        #[cfg(feature = "pause-points")]
        {
            let armed = self.armed.lock().expect("pause points lock").remove(&point);
            if let Some(armed) = armed {
                let _ = armed.reached.send(());
                // A dropped `Held` resumes the request too.
                let _ = armed.resume.await;
            }
        }
        #[cfg(not(feature = "pause-points"))]
        let _ = point;
    }
}

#[cfg(feature = "pause-points")]
impl PausePoints {
    /// Arms `point`: the next request to reach it waits there until [`Held::resume`].
    pub fn arm(&self, point: PausePoint) -> Held {
        let (reached_tx, reached_rx) = futures_channel::oneshot::channel();
        let (resume_tx, resume_rx) = futures_channel::oneshot::channel();
        self.armed.lock().expect("pause points lock").insert(
            point,
            Armed {
                reached: reached_tx,
                resume: resume_rx,
            },
        );
        Held {
            reached: Some(reached_rx),
            resume: Some(resume_tx),
        }
    }
}

/// A request held at a pause point (or the promise of one).
#[cfg(feature = "pause-points")]
#[derive(Debug)]
pub struct Held {
    reached: Option<futures_channel::oneshot::Receiver<()>>,
    resume: Option<futures_channel::oneshot::Sender<()>>,
}

#[cfg(feature = "pause-points")]
impl Held {
    /// Waits until a request is held at the point.
    pub async fn reached(&mut self) {
        if let Some(reached) = self.reached.take() {
            reached.await.expect("the pause point was disarmed");
        }
    }

    /// Lets the held request go on.
    pub fn resume(mut self) {
        if let Some(resume) = self.resume.take() {
            let _ = resume.send(());
        }
    }
}
