use super::*;

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
    };
    let fields: Vec<_> = violations(AdjustStock::try_from(request).unwrap_err())
        .into_iter()
        .map(|(field, _)| field)
        .collect();
    assert_eq!(fields, ["sku", "delta", "idempotency_key", "reason"]);
}

#[test]
fn adjust_stock_parses_a_valid_request() {
    let command = AdjustStock::try_from(proto::AdjustStockRequest {
        sku: "SKU-1".into(),
        delta: -3,
        idempotency_key: "k-1".into(),
        reason: "recount".into(),
    })
    .unwrap();
    assert_eq!(command.sku.as_str(), "SKU-1");
    assert_eq!(command.delta.get(), -3);
}

#[test]
fn get_stock_names_duplicates_and_bad_entries_by_index() {
    let request = proto::GetStockRequest {
        skus: vec!["A".into(), "bad sku".into(), "A".into()],
    };
    assert_eq!(
        violations(GetStock::try_from(request).unwrap_err()),
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
        violations(GetStock::try_from(proto::GetStockRequest { skus: vec![] }).unwrap_err())[0].0,
        "skus"
    );
    let many = (0..=MAX_SKUS_PER_READ).map(|i| format!("S{i}")).collect();
    let error = GetStock::try_from(proto::GetStockRequest { skus: many }).unwrap_err();
    assert_eq!(violations(error).len(), 1);
}
