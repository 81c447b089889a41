//! Where a `WatchEvents` consumer is, so that it resumes in the history it read.

use inventory_proto::{Event, WatchEventsRequest};

use crate::Error;

/// The last event a consumer processed: its `sequence` and its `epoch`. Store both together
/// (with the state they produced) and resume with
/// [`InventoryClient::watch_events_from`](crate::InventoryClient::watch_events_from).
///
/// The epoch changes when the stream's history can have been cut (a database restored to an
/// earlier point, a failover that lost the last commits). A cursor past the cut is refused
/// with `CURSOR_NOT_IN_HISTORY` (on opening, or as the stream's last item): events it read
/// may never have happened in the history that goes on, so the consumer rebuilds its state
/// from a snapshot (`GetStock`, `ListReservations`) and goes on from [`Self::after_cut`].
/// Changes between that cursor and the snapshot arrive again; apply a level only if its
/// `version` is newer than the one held.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventCursor {
    sequence: i64,
    epoch: String,
}

impl EventCursor {
    /// From the oldest event kept.
    pub fn start() -> Self {
        Self::default()
    }

    /// A cursor the consumer stored.
    pub fn new(sequence: i64, epoch: impl Into<String>) -> Self {
        Self {
            sequence,
            epoch: epoch.into(),
        }
    }

    pub fn sequence(&self) -> i64 {
        self.sequence
    }

    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// The consumer processed `event` (or a heartbeat: it says the stream scanned through it).
    pub fn advance(&mut self, event: &Event) {
        self.sequence = event.sequence;
        self.epoch.clone_from(&event.epoch);
    }

    /// The request that resumes after this cursor.
    pub fn request(&self) -> WatchEventsRequest {
        WatchEventsRequest {
            after_sequence: self.sequence,
            epoch: self.epoch.clone(),
            ..WatchEventsRequest::default()
        }
    }

    /// If `error` says the cursor is not in the stream's current history: the cursor to go
    /// on from (the current epoch's head when the server answered) once the consumer has
    /// rebuilt its state from a snapshot read after this call.
    pub fn after_cut(error: &Error) -> Option<Self> {
        let Error::Refused {
            reason, metadata, ..
        } = error
        else {
            return None;
        };
        if reason != "CURSOR_NOT_IN_HISTORY" {
            return None;
        }
        Some(Self {
            sequence: metadata.get("head")?.parse().ok()?,
            epoch: metadata.get("epoch")?.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tonic::Code;

    use super::*;

    #[test]
    fn a_cursor_follows_events_and_a_cut_names_where_to_go_on() {
        let mut cursor = EventCursor::start();
        assert_eq!(cursor.request().after_sequence, 0);
        assert_eq!(cursor.request().epoch, "");
        cursor.advance(&Event {
            sequence: 7,
            epoch: "00000000000000aa".into(),
            ..Default::default()
        });
        assert_eq!(cursor, EventCursor::new(7, "00000000000000aa"));
        assert_eq!(cursor.request().after_sequence, 7);

        let cut = Error::Refused {
            code: Code::OutOfRange,
            reason: "CURSOR_NOT_IN_HISTORY".into(),
            message: String::new(),
            metadata: HashMap::from([
                ("epoch".to_string(), "00000000000000bb".to_string()),
                ("head".to_string(), "5".to_string()),
            ]),
        };
        assert_eq!(
            EventCursor::after_cut(&cut),
            Some(EventCursor::new(5, "00000000000000bb"))
        );
        let pruned = Error::Refused {
            code: Code::OutOfRange,
            reason: "CURSOR_PRUNED".into(),
            message: String::new(),
            metadata: HashMap::new(),
        };
        assert_eq!(EventCursor::after_cut(&pruned), None);
    }
}
