use std::time::Duration;

use inventory_core::{
    Error,
    domain::{Caller, MAX_LINES, MAX_SKUS_PER_READ, Scope},
};

use super::Decode;
use crate::{
    auth::{Principal, Role},
    proto,
};

/// Decodes for an anonymous caller with every right.
fn decode<R: Decode>(request: R) -> Result<R::Command, Error> {
    request.into_command(&Principal::new(Caller::anonymous(), Role::Admin))
}

fn violations(error: Error) -> Vec<(String, String)> {
    match error {
        Error::InvalidArgument(violations) => violations
            .into_iter()
            .map(|v| (v.field, v.description))
            .collect(),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn adjust_stock_reports_every_bad_field_at_once() {
    let request = proto::AdjustStockRequest {
        sku: String::new(),
        delta: 0,
        idempotency_key: "has space".into(),
        reason: "\u{0}".into(),
        ..Default::default()
    };
    let fields: Vec<_> = violations(decode(request).unwrap_err())
        .into_iter()
        .map(|(field, _)| field)
        .collect();
    assert_eq!(fields, ["sku", "delta", "idempotency_key", "reason"]);
}

#[test]
fn adjust_stock_parses_a_valid_request() {
    let command = decode(proto::AdjustStockRequest {
        sku: "SKU-1".into(),
        delta: -3,
        idempotency_key: "k-1".into(),
        reason: "recount".into(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(command.sku.as_str(), "SKU-1");
    assert_eq!(command.delta.get(), -3);
}

#[test]
fn get_stock_names_duplicates_and_bad_entries_by_index() {
    let request = proto::GetStockRequest {
        skus: vec!["A".into(), "bad sku".into(), "A".into()],
        ..Default::default()
    };
    assert_eq!(
        violations(decode(request).unwrap_err()),
        [
            (
                "skus[1]".to_string(),
                "may contain only A-Z, a-z, 0-9, '.', '_', '-' and ':'".to_string()
            ),
            ("skus[2]".to_string(), "duplicates skus[0]".to_string()),
        ]
    );
}

#[test]
fn get_stock_refuses_empty_and_oversized_lists() {
    assert_eq!(
        violations(
            decode(proto::GetStockRequest {
                skus: vec![],
                ..Default::default()
            })
            .unwrap_err()
        )[0]
        .0,
        "skus"
    );
    let many = (0..=MAX_SKUS_PER_READ).map(|i| format!("S{i}")).collect();
    let error = decode(proto::GetStockRequest {
        skus: many,
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(violations(error).len(), 1);
}

fn line(sku: &str, quantity: i64) -> proto::ReservationLine {
    proto::ReservationLine {
        sku: sku.into(),
        quantity,
        ..Default::default()
    }
}

fn reserve_request(lines: Vec<proto::ReservationLine>) -> proto::ReserveRequest {
    proto::ReserveRequest {
        idempotency_key: "k".into(),
        order_id: "order-1".into(),
        lines,
        ttl: None,
        ..Default::default()
    }
}

fn fields(error: Error) -> Vec<String> {
    violations(error)
        .into_iter()
        .map(|(field, _)| field)
        .collect()
}

#[test]
fn reserve_names_each_bad_line_field_by_index() {
    let request = reserve_request(vec![line("A", 1), line("", 0), line("A", 2)]);
    assert_eq!(
        fields(decode(request).unwrap_err()),
        ["lines[1].sku", "lines[1].quantity", "lines[2].sku"]
    );
}

#[test]
fn reserve_checks_the_envelope() {
    let mut request = reserve_request(vec![]);
    request.idempotency_key.clear();
    request.order_id = "x".repeat(129);
    request.ttl = Some(prost_types::Duration {
        seconds: 0,
        nanos: 500_000_000,
    });
    assert_eq!(
        fields(decode(request).unwrap_err()),
        ["idempotency_key", "order_id", "ttl", "lines"]
    );
}

#[test]
fn reserve_refuses_malformed_durations() {
    for (seconds, nanos) in [(-1, 0), (5, -1), (5, 1_000_000_000), (86_401, 0)] {
        let mut request = reserve_request(vec![line("A", 1)]);
        request.ttl = Some(prost_types::Duration { seconds, nanos });
        assert_eq!(fields(decode(request).unwrap_err()), ["ttl"]);
    }
}

#[test]
fn reserve_refuses_too_many_lines_without_echoing_them() {
    let lines = (0..=MAX_LINES).map(|i| line(&format!("S{i}"), 1)).collect();
    assert_eq!(
        fields(decode(reserve_request(lines)).unwrap_err()),
        ["lines"]
    );
}

#[test]
fn reserve_parses_a_valid_request() {
    let mut request = reserve_request(vec![line("B", 2), line("A", 1)]);
    request.ttl = Some(prost_types::Duration {
        seconds: 30,
        nanos: 0,
    });
    let command = decode(request).unwrap();
    assert_eq!(command.lines().len(), 2);
    assert_eq!(command.ttl.unwrap().get(), Duration::from_secs(30));
}

#[test]
fn reservation_ids_must_be_uuids() {
    let get = |id: &str| proto::GetReservationRequest {
        reservation_id: id.into(),
    };
    assert_eq!(fields(decode(get("nope")).unwrap_err()), ["reservation_id"]);
    let id = "0190a4d2-58c4-7c1e-9f2a-3b4c5d6e7f80";
    let target = decode(get(id)).unwrap();
    assert_eq!(target.id.to_string(), id);
}

#[test]
fn a_reference_reaches_what_its_caller_may_see_or_change() {
    let id = "0190a4d2-58c4-7c1e-9f2a-3b4c5d6e7f80";
    let caller = Caller::parse("svc").unwrap();
    let reservation_id = || id.to_string();
    let as_role = |role: Role| Principal::new(caller.clone(), role);
    let own = Scope::Own(caller.clone());
    for (role, read, write) in [
        (Role::Reserver, own.clone(), own.clone()),
        (Role::Reader, own.clone(), own.clone()),
        (Role::Watcher, Scope::All, own.clone()),
        (Role::Admin, Scope::All, Scope::All),
    ] {
        let who = as_role(role);
        let get = proto::GetReservationRequest {
            reservation_id: reservation_id(),
        };
        assert_eq!(
            get.into_command(&who).unwrap().scope,
            read,
            "{role:?} reads"
        );
        let confirm = proto::ConfirmReservationRequest {
            reservation_id: reservation_id(),
            ..Default::default()
        };
        assert_eq!(
            confirm.into_command(&who).unwrap().target.scope,
            write,
            "{role:?} confirms"
        );
        let release = proto::ReleaseReservationRequest {
            reservation_id: reservation_id(),
            ..Default::default()
        };
        assert_eq!(
            release.into_command(&who).unwrap().target.scope,
            write,
            "{role:?} releases"
        );
    }
}

#[test]
fn commands_carry_the_caller_that_sent_them() {
    let who = Principal::new(Caller::parse("checkout").unwrap(), Role::Reserver);
    let command = proto::ReserveRequest {
        idempotency_key: "k".into(),
        order_id: "o".into(),
        lines: vec![line("A", 1)],
        ttl: None,
        ..Default::default()
    }
    .into_command(&who)
    .unwrap();
    assert_eq!(command.caller.as_str(), "checkout");
    let adjust = proto::AdjustStockRequest {
        sku: "A".into(),
        delta: 1,
        idempotency_key: "k".into(),
        reason: "r".into(),
        ..Default::default()
    }
    .into_command(&who)
    .unwrap();
    assert_eq!(adjust.caller.as_str(), "checkout");
}

mod hostile {
    //! Whatever arrives, the boundary answers a valid command or `INVALID_ARGUMENT`: never a
    //! panic, never another error.
    use proptest::prelude::*;

    use super::*;

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            ".{0,80}",
            "[A-Za-z0-9._:-]{0,70}",
            "[\\x00-\\x1f\\x7f{} ]{0,8}",
            Just("x".repeat(300)),
        ]
    }

    fn number() -> impl Strategy<Value = i64> {
        prop_oneof![
            any::<i64>(),
            -3i64..3,
            Just(i64::MIN),
            Just(i64::MAX),
            999_990i64..1_000_010
        ]
    }

    fn invalid_only<T>(result: Result<T, Error>) {
        match result {
            Ok(_) => {}
            Err(Error::InvalidArgument(violations)) => assert!(!violations.is_empty()),
            Err(other) => panic!("not INVALID_ARGUMENT: {other:?}"),
        }
    }

    proptest! {
        #[test]
        fn adjust_stock(sku in text(), delta in number(), key in text(), reason in text()) {
            let parsed = decode(proto::AdjustStockRequest {
                sku: sku.clone(), delta, idempotency_key: key, reason,
                ..Default::default()
            });
            if let Ok(command) = &parsed {
                prop_assert_eq!(command.sku.as_str(), sku.as_str());
                prop_assert!(command.delta.get() != 0);
            }
            invalid_only(parsed);
        }

        #[test]
        fn reserve(
            key in text(),
            order in text(),
            lines in prop::collection::vec((text(), number()), 0..120),
            ttl in prop::option::of((any::<i64>(), any::<i32>())),
        ) {
            let request = proto::ReserveRequest {
                idempotency_key: key,
                order_id: order,
                lines: lines
                    .into_iter()
                    .map(|(sku, quantity)| proto::ReservationLine { sku, quantity, ..Default::default() })
                    .collect(),
                ttl: ttl.map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
                ..Default::default()
            };
            let parsed = decode(request);
            if let Ok(command) = &parsed {
                prop_assert!(!command.lines().is_empty() && command.lines().len() <= MAX_LINES);
            }
            invalid_only(parsed);
        }

        #[test]
        fn get_stock(skus in prop::collection::vec(text(), 0..130)) {
            invalid_only(decode(proto::GetStockRequest { skus , ..Default::default() }));
        }

        #[test]
        fn reservation_refs_and_cursors(id in text(), after in number(), epoch in text()) {
            invalid_only(decode(proto::GetReservationRequest { reservation_id: id }));
            invalid_only(decode(proto::WatchEventsRequest { after_sequence: after, epoch, ..Default::default() }));
        }

        /// Raw bytes off the wire: either not a message at all (the gRPC layer refuses it), or
        /// a message the boundary judges like any other.
        #[test]
        fn any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(request) = <proto::ReserveRequest as prost::Message>::decode(bytes.as_slice()) {
                invalid_only(decode(request));
            }
            if let Ok(request) = <proto::AdjustStockRequest as prost::Message>::decode(bytes.as_slice()) {
                invalid_only(decode(request));
            }
            if let Ok(request) = <proto::GetStockRequest as prost::Message>::decode(bytes.as_slice()) {
                invalid_only(decode(request));
            }
        }
    }
}

#[test]
fn partial_settling_needs_a_key_and_checks_its_lines_like_reserve() {
    let id = "0190a4d2-58c4-7c1e-9f2a-3b4c5d6e7f80";
    let confirm =
        |lines: Vec<proto::ReservationLine>, key: &str| proto::ConfirmReservationRequest {
            reservation_id: id.into(),
            lines,
            idempotency_key: key.into(),
        };
    // Without lines: the whole hold, with or without a key.
    let whole = decode(confirm(vec![], "")).unwrap();
    assert!(whole.lines.is_empty() && whole.idempotency_key.is_none());
    assert!(
        decode(confirm(vec![], "k"))
            .unwrap()
            .idempotency_key
            .is_some()
    );
    // With lines: a key is required.
    assert_eq!(
        fields(decode(confirm(vec![line("A", 1)], "")).unwrap_err()),
        ["idempotency_key"]
    );
    let release = proto::ReleaseReservationRequest {
        reservation_id: id.into(),
        lines: vec![line("A", 0), line("B", 1), line("B", 2), line("bad sku", 1)],
        idempotency_key: "has space".into(),
    };
    assert_eq!(
        fields(decode(release).unwrap_err()),
        [
            "idempotency_key",
            "lines[0].quantity",
            "lines[2].sku",
            "lines[3].sku"
        ]
    );
    let many = (0..=MAX_LINES).map(|i| line(&format!("S{i}"), 1)).collect();
    assert_eq!(fields(decode(confirm(many, "k")).unwrap_err()), ["lines"]);
    // The output-only counts of a line are ignored.
    let mut echoed = line("A", 2);
    echoed.held = 7;
    echoed.confirmed = 1;
    let parsed = decode(confirm(vec![echoed], "k")).unwrap();
    assert_eq!(parsed.lines[0].quantity.get(), 2);
    assert_eq!(parsed.settle, inventory_core::command::Settle::Confirm);
}
