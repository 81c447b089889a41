use super::*;

fn adjust(sku: &str, delta: i64, key: &str, reason: &str) -> AdjustStock {
    AdjustStock {
        sku: Sku::parse(sku).unwrap(),
        delta: StockDelta::parse(delta).unwrap(),
        idempotency_key: IdempotencyKey::parse(key).unwrap(),
        reason: Reason::parse(reason).unwrap(),
    }
}

#[test]
fn equal_requests_share_a_fingerprint_whatever_their_key() {
    assert_eq!(
        adjust("A", 5, "k1", "restock").fingerprint(),
        adjust("A", 5, "k2", "restock").fingerprint()
    );
}

#[test]
fn any_field_change_changes_the_fingerprint() {
    let base = adjust("A", 5, "k", "restock").fingerprint();
    assert_ne!(base, adjust("B", 5, "k", "restock").fingerprint());
    assert_ne!(base, adjust("A", 6, "k", "restock").fingerprint());
    assert_ne!(base, adjust("A", 5, "k", "recount").fingerprint());
}

#[test]
fn field_boundaries_are_part_of_the_fingerprint() {
    assert_ne!(
        adjust("AB", 5, "k", "C").fingerprint(),
        adjust("A", 5, "k", "BC").fingerprint()
    );
}
