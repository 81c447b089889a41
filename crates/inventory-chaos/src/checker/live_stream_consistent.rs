//! What the live watcher received, across its reconnections, is the stored stream: in order,
//! none missed, none changed.

use super::{Check, Verdict};
use crate::history::{History, SeenEvent};

pub(super) fn live_stream_consistent(history: &History, stream: &[SeenEvent]) -> Check {
    let mut v = Verdict::new("live_stream_consistent");
    let mut previous = 0;
    for e in &history.live_events {
        v.examined += 1;
        // The watcher resumes after the last event it saw, so delivery is contiguous.
        if e.sequence != previous + 1 {
            v.fail(format!(
                "sequence {} delivered after {previous}",
                e.sequence
            ));
        }
        previous = e.sequence;
        match usize::try_from(e.sequence - 1)
            .ok()
            .and_then(|i| stream.get(i))
        {
            Some(stored) if stored == e => {}
            _ => v.fail(format!(
                "sequence {} differs from the stored stream",
                e.sequence
            )),
        }
    }
    if history.live_events.is_empty() && !stream.is_empty() {
        v.fail("the live watcher received nothing".into());
    }
    v.note = format!(
        "{} events received live across reconnections, in order, none missed or changed",
        v.examined
    );
    v.done()
}
