use super::*;

#[test]
fn sku_accepts_the_documented_alphabet() {
    let sku = Sku::parse("Widget-01.blue_L:2").unwrap();
    assert_eq!(sku.as_str(), "Widget-01.blue_L:2");
    assert!(Sku::parse(&"a".repeat(MAX_SKU_LEN)).is_ok());
}

#[test]
fn sku_rejects_empty_long_and_unsafe_characters() {
    assert!(Sku::parse("").is_err());
    assert!(Sku::parse(&"a".repeat(MAX_SKU_LEN + 1)).is_err());
    for bad in ["a b", "{tag}", "a\nb", "é", "a*b", "a/b"] {
        assert!(Sku::parse(bad).is_err(), "{bad:?} should be refused");
    }
}

#[test]
fn keys_are_printable_ascii_without_spaces() {
    assert!(IdempotencyKey::parse("order-17/attempt#2").is_ok());
    assert!(IdempotencyKey::parse("").is_err());
    assert!(IdempotencyKey::parse("has space").is_err());
    assert!(IdempotencyKey::parse("tab\t").is_err());
    assert!(IdempotencyKey::parse(&"k".repeat(MAX_KEY_LEN + 1)).is_err());
    assert!(OrderId::parse(&"o".repeat(MAX_KEY_LEN)).is_ok());
}

#[test]
fn reason_counts_characters_and_refuses_control_characters() {
    assert!(Reason::parse("").is_ok());
    assert!(Reason::parse(&"é".repeat(MAX_REASON_CHARS)).is_ok());
    assert!(Reason::parse(&"é".repeat(MAX_REASON_CHARS + 1)).is_err());
    assert!(Reason::parse("bell\u{7}").is_err());
}

#[test]
fn delta_is_non_zero_and_bounded() {
    assert_eq!(StockDelta::parse(-5).unwrap().get(), -5);
    assert!(StockDelta::parse(0).is_err());
    assert!(StockDelta::parse(MAX_DELTA).is_ok());
    assert!(StockDelta::parse(-MAX_DELTA).is_ok());
    assert!(StockDelta::parse(MAX_DELTA + 1).is_err());
    assert!(StockDelta::parse(i64::MIN).is_err());
}

#[test]
fn quantity_and_ttl_are_bounded() {
    assert!(Quantity::parse(0).is_err());
    assert!(Quantity::parse(-1).is_err());
    assert!(Quantity::parse(MAX_QUANTITY).is_ok());
    assert!(Quantity::parse(MAX_QUANTITY + 1).is_err());
    assert!(Ttl::parse(Duration::from_millis(999)).is_err());
    assert!(Ttl::parse(MIN_TTL).is_ok());
    assert!(Ttl::parse(MAX_TTL).is_ok());
    assert!(Ttl::parse(MAX_TTL + Duration::from_nanos(1)).is_err());
}

#[test]
fn reservation_ids_are_canonical_uuids() {
    let id = ReservationId::new_random();
    assert_eq!(ReservationId::parse(&id.to_string()), Ok(id));
    assert!(ReservationId::parse("").is_err());
    assert!(ReservationId::parse("not-a-uuid").is_err());
    // The simple (unhyphenated) and braced spellings are refused: one id, one spelling.
    assert!(ReservationId::parse(&id.as_uuid().simple().to_string()).is_err());
    assert!(ReservationId::parse(&format!("{{{id}}}")).is_err());
}

#[test]
fn states_round_trip_through_their_names() {
    for state in [
        ReservationState::Held,
        ReservationState::Confirmed,
        ReservationState::Released,
        ReservationState::Expired,
    ] {
        assert_eq!(ReservationState::parse(state.as_str()), Some(state));
    }
    assert_eq!(ReservationState::parse("held"), None);
}

#[test]
fn a_stored_line_puts_its_unrecorded_units_where_the_state_says() {
    use ReservationState::*;
    let read = |confirmed, released, state, live| {
        let allocation = Allocation::stored(
            LocationId::default_location(),
            5,
            confirmed,
            released,
            state,
            live,
        );
        let line =
            ReservationLine::from_allocations(Sku::parse("A").unwrap(), vec![allocation]).unwrap();
        assert_eq!(line.quantity, Quantity::parse(5).unwrap());
        assert_eq!(line.held + line.confirmed + line.released, 5);
        (line.held, line.confirmed, line.released)
    };
    // Settled in one step (or stored before counts were kept): all by the state.
    assert_eq!(read(0, 0, Held, true), (5, 0, 0));
    assert_eq!(
        read(0, 0, Held, false),
        (0, 0, 5),
        "an overdue hold: expiry takes it"
    );
    assert_eq!(read(0, 0, Confirmed, false), (0, 5, 0));
    assert_eq!(read(0, 0, Released, false), (0, 0, 5));
    assert_eq!(read(0, 0, Expired, false), (0, 0, 5));
    // Settled in parts: the counts, and the rest by the state.
    assert_eq!(read(2, 1, Held, true), (2, 2, 1));
    assert_eq!(read(2, 1, Held, false), (0, 2, 3));
    assert_eq!(read(2, 3, Confirmed, false), (0, 2, 3));
}

#[test]
fn tenant_names_are_plain_identifiers() {
    for good in ["default", "brand_a", "b2", &"t".repeat(MAX_TENANT_LEN)] {
        assert!(Tenant::parse(good).is_ok(), "{good:?} should be accepted");
    }
    for bad in [
        "",
        "Brand",
        "2brand",
        "_a",
        "a-b",
        "a.b",
        "a:b",
        "a b",
        &"t".repeat(MAX_TENANT_LEN + 1),
    ] {
        assert!(Tenant::parse(bad).is_err(), "{bad:?} should be refused");
    }
    assert!(Tenant::parse("default").unwrap().is_default());
    assert!(!Tenant::parse("brand_a").unwrap().is_default());
}
