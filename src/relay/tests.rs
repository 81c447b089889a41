use inventory_core::events::Epoch;

use super::*;

fn bounds(head: i64, pruned_through: i64, epochs: &[(i64, i64)]) -> StreamBounds {
    StreamBounds {
        head,
        pruned_through,
        epochs: epochs
            .iter()
            .map(|&(id, starts_after)| Epoch {
                id: EpochId(id),
                starts_after,
            })
            .collect(),
    }
}

fn end(sequence: u64, last: Option<(i64, i64)>) -> SinkEnd {
    SinkEnd {
        sequence,
        last: last.map(|(position, epoch)| (position, EpochId(epoch))),
    }
}

const ACKED: Cursor = Cursor {
    after: 40,
    epoch: Some(EpochId(1)),
};

#[test]
fn the_relay_goes_on_from_where_the_copy_ends_not_from_its_cursor() {
    let stream = bounds(100, 0, &[(1, 0)]);
    // The copy has more than the cursor says (a relay stopped before recording): no repeat.
    assert_eq!(
        resume_from(&end(55, Some((55, 1))), ACKED, &stream)
            .unwrap()
            .after,
        55
    );
    // The copy lost a tail the cursor had passed (a broker that crashed): published again.
    assert_eq!(
        resume_from(&end(30, Some((30, 1))), ACKED, &stream)
            .unwrap()
            .after,
        30
    );
}

#[test]
fn an_empty_copy_gets_everything_kept_and_an_aged_out_one_the_rest() {
    let stream = bounds(100, 10, &[(1, 0)]);
    assert_eq!(
        resume_from(&end(0, None), ACKED, &stream).unwrap().after,
        10
    );
    assert_eq!(
        resume_from(&end(70, None), ACKED, &stream).unwrap().after,
        40
    );
}

#[test]
fn a_copy_past_a_cut_goes_on_from_the_cut() {
    // Restored to position 50: epoch 2 starts there, and the copy reached 60 in epoch 1.
    let stream = bounds(52, 0, &[(1, 0), (2, 50)]);
    assert_eq!(
        resume_from(&end(60, Some((60, 1))), ACKED, &stream)
            .unwrap()
            .after,
        50
    );
    // A copy that stopped before the cut goes on as usual.
    assert_eq!(
        resume_from(&end(45, Some((45, 1))), ACKED, &stream)
            .unwrap()
            .after,
        45
    );
}

#[test]
fn a_copy_behind_retention_stops_the_relay_unless_its_cursor_had_passed() {
    let stream = bounds(100, 50, &[(1, 0)]);
    // Never published, and pruned: no hole is left unsaid.
    let behind = Cursor {
        after: 20,
        epoch: Some(EpochId(1)),
    };
    assert!(resume_from(&end(20, Some((20, 1))), behind, &stream).is_err());
    // Published once, lost by the sink, pruned here since: it goes on from what is kept.
    let from = resume_from(&end(20, Some((20, 1))), ACKED_PAST, &stream).unwrap();
    assert_eq!((from.after, from.epoch), (50, Some(EpochId(1))));
}

const ACKED_PAST: Cursor = Cursor {
    after: 60,
    epoch: Some(EpochId(1)),
};

#[test]
fn past_several_cuts_the_copy_goes_on_from_the_first() {
    // The copy reached 60 in epoch 1; epoch 2 began at 50 and epoch 3 at 55.
    let stream = bounds(58, 0, &[(1, 0), (2, 50), (3, 55)]);
    let from = resume_from(&end(60, Some((60, 1))), ACKED, &stream).unwrap();
    assert_eq!((from.after, from.epoch), (50, Some(EpochId(1))));
}
