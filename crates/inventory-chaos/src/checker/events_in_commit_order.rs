//! Within one SKU, the stream is in commit order.

use std::collections::HashMap;

use super::{Check, Verdict};
use crate::history::SeenEvent;

/// Within one SKU, stream order is commit order: versions only go up along the stream.
pub(super) fn events_in_commit_order(stream: &[SeenEvent]) -> Check {
    let mut v = Verdict::new("events_in_commit_order_per_sku");
    let mut last: HashMap<&str, (i64, i64)> = HashMap::new();
    for e in stream {
        for (sku, _, _, version) in &e.levels {
            v.examined += 1;
            if let Some(&(before, at)) = last.get(sku.as_str())
                && *version <= before
            {
                v.fail(format!(
                    "{sku}: v{version} at sequence {} after v{before} at {at}",
                    e.sequence
                ));
            }
            last.insert(sku, (*version, e.sequence));
        }
    }
    v.note = format!(
        "{} levels along the stream, {} SKUs",
        v.examined,
        last.len()
    );
    v.done()
}
