use std::time::{Duration, UNIX_EPOCH};

use super::*;
use crate::domain::Quantity;

fn adjust(sku: &str, delta: i64, key: &str, reason: &str) -> AdjustStock {
    AdjustStock {
        caller: crate::domain::Caller::anonymous(),
        sku: Sku::parse(sku).unwrap(),
        delta: StockDelta::parse(delta).unwrap(),
        idempotency_key: IdempotencyKey::parse(key).unwrap(),
        reason: Reason::parse(reason).unwrap(),
        expected_version: None,
        location: LocationId::default_location(),
        state: None,
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

fn reserve(lines: &[(&str, i64)], ttl: Option<u64>) -> Reserve {
    Reserve::new(
        crate::domain::Caller::anonymous(),
        IdempotencyKey::parse("k").unwrap(),
        OrderId::parse("order-1").unwrap(),
        lines
            .iter()
            .map(|(sku, quantity)| Line {
                sku: Sku::parse(sku).unwrap(),
                quantity: Quantity::parse(*quantity).unwrap(),
                location: None,
            })
            .collect(),
        ttl.map(|secs| Ttl::parse(Duration::from_secs(secs)).unwrap()),
    )
}

#[test]
fn reserve_fingerprint_ignores_line_order_but_not_content() {
    let base = reserve(&[("A", 1), ("B", 2)], None).fingerprint();
    assert_eq!(base, reserve(&[("B", 2), ("A", 1)], None).fingerprint());
    assert_ne!(base, reserve(&[("A", 1), ("B", 3)], None).fingerprint());
    assert_ne!(base, reserve(&[("A", 1)], None).fingerprint());
    assert_ne!(base, reserve(&[("A", 1), ("B", 2)], Some(60)).fingerprint());
}

#[test]
fn lines_are_locked_in_sku_order() {
    let command = reserve(&[("C", 1), ("A", 1), ("B", 1)], None);
    let order: Vec<&str> = command
        .lines_by_sku()
        .iter()
        .map(|l| l.sku.as_str())
        .collect();
    assert_eq!(order, ["A", "B", "C"]);
}

fn cursor() -> Cursor {
    Cursor {
        created_at: UNIX_EPOCH + Duration::from_micros(1_796_000_000_123_456),
        id: ReservationId::new_random(),
    }
}

fn by_order(order: &str) -> ReservationFilter {
    ReservationFilter {
        order_id: Some(OrderId::parse(order).unwrap()),
        ..ReservationFilter::default()
    }
}

#[test]
fn a_page_token_gives_back_its_cursor_for_the_same_filters_and_scope() {
    let scope = Scope::Own(Caller::parse("shop").unwrap());
    let at = cursor();
    let token = page_token::encode(&at, &by_order("o-1"), &scope);
    assert_eq!(page_token::decode(&token, &by_order("o-1"), &scope), Ok(at));
}

#[test]
fn a_page_token_is_refused_for_other_filters_another_scope_or_when_damaged() {
    let scope = Scope::Own(Caller::parse("shop").unwrap());
    let token = page_token::encode(&cursor(), &by_order("o-1"), &scope);
    let other_filters = page_token::decode(&token, &by_order("o-2"), &scope).unwrap_err();
    assert!(other_filters.contains("other filters"), "{other_filters}");
    let with_state = ReservationFilter {
        state: Some(ReservationState::Held),
        ..by_order("o-1")
    };
    assert!(page_token::decode(&token, &with_state, &scope).is_err());
    let other_caller = Scope::Own(Caller::parse("other").unwrap());
    assert!(page_token::decode(&token, &by_order("o-1"), &other_caller).is_err());
    assert!(page_token::decode(&token, &by_order("o-1"), &Scope::All).is_err());
    // One flipped character, a cut token, junk.
    let mut damaged = token.clone().into_bytes();
    damaged[20] = if damaged[20] == b'0' { b'1' } else { b'0' };
    let damaged = String::from_utf8(damaged).unwrap();
    for bad in [damaged.as_str(), &token[..40], "not-a-token", "é", ""] {
        assert!(
            page_token::decode(bad, &by_order("o-1"), &scope).is_err(),
            "{bad:?}"
        );
    }
}

#[test]
fn a_movement_token_gives_back_its_version_only_for_its_sku_and_start() {
    let sku = Sku::parse("MUG").unwrap();
    let token = movement_token::encode(42, &sku, 7);
    assert_eq!(movement_token::decode(&token, &sku, 7), Ok(42));
    let other = Sku::parse("CAP").unwrap();
    assert!(movement_token::decode(&token, &other, 7).is_err());
    assert!(movement_token::decode(&token, &sku, 8).is_err());
    let mut damaged = token.clone().into_bytes();
    damaged[4] = if damaged[4] == b'0' { b'1' } else { b'0' };
    let damaged = String::from_utf8(damaged).unwrap();
    assert!(movement_token::decode(&damaged, &sku, 7).is_err());
    assert!(movement_token::decode("zz", &sku, 7).is_err());
}
