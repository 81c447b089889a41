//! A sequence of calls as `grpcurl` commands to paste, in order, into a shell against
//! `make run` (plaintext on 127.0.0.1:50051, a fresh database): each `Reserve` whose
//! reservation a later call names stores its id in a shell variable.

use std::fmt::Write as _;

use crate::call::{Call, Namespace, Request};

const SERVICE: &str = "inventory.v1.InventoryService";

/// The commands, one or two lines a call, after a comment naming the seed.
pub fn script(seed: u64, calls: &[Call], ns: &Namespace) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# seed {seed}: {} calls; paste against `make run` (grpcurl is the one it prints)",
        calls.len()
    );
    let named: std::collections::BTreeSet<&str> =
        calls.iter().filter_map(Call::reservation).collect();
    for (i, call) in calls.iter().enumerate() {
        let var = |key: &str| {
            format!(
                "R_{}",
                key.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
            )
        };
        let reservation = call
            .reservation()
            .map(|k| format!("${}", var(k)))
            .unwrap_or_default();
        let request = call.request(ns, &reservation);
        let body = json(&request);
        let command = format!(
            "grpcurl -plaintext -d '{body}' 127.0.0.1:50051 {SERVICE}/{}",
            call.method()
        );
        let _ = writeln!(out, "# {}: {}", i + 1, call);
        match call {
            Call::Reserve { key, .. } if named.contains(key.as_str()) => {
                let _ = writeln!(
                    out,
                    "{}=$({command} | sed -n 's/^  \"reservationId\": \"\\(.*\\)\",$/\\1/p'); echo \"reservation ${}\"",
                    var(key),
                    var(key)
                );
            }
            Call::Lapse { .. } => {
                let _ = writeln!(out, "{command}");
                let _ = writeln!(out, "sleep 2  # the hold runs out; the sweeper returns it");
            }
            _ => {
                let _ = writeln!(out, "{command}");
            }
        }
    }
    out
}

fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn reservation_id(id: &str) -> String {
    // A shell variable inside the single-quoted body: close the quote around it.
    if id.starts_with('$') {
        format!("\"'\"{id}\"'\"")
    } else {
        quote(id)
    }
}

fn lines(lines: &[inventory_proto::ReservationLine]) -> String {
    let items: Vec<String> = lines
        .iter()
        .map(|l| {
            let mut fields = vec![
                format!("\"sku\":{}", quote(&l.sku)),
                format!("\"quantity\":{}", l.quantity),
            ];
            if !l.location_id.is_empty() {
                fields.push(format!("\"location_id\":{}", quote(&l.location_id)));
            }
            format!("{{{}}}", fields.join(","))
        })
        .collect();
    format!("[{}]", items.join(","))
}

fn state(state: i32) -> String {
    let name = inventory_proto::StockState::try_from(state)
        .map(|s| s.as_str_name())
        .unwrap_or("STOCK_STATE_UNSPECIFIED");
    quote(name)
}

fn json(request: &Request) -> String {
    let mut f: Vec<String> = Vec::new();
    let mut put = |name: &str, value: String| f.push(format!("\"{name}\":{value}"));
    match request {
        Request::UpsertLocation(r) => {
            put("location_id", quote(&r.location_id));
            put("priority", r.priority.to_string());
            put("active", r.active.to_string());
        }
        Request::AdjustStock(r) => {
            put("sku", quote(&r.sku));
            put("delta", r.delta.to_string());
            put("idempotency_key", quote(&r.idempotency_key));
            if !r.location_id.is_empty() {
                put("location_id", quote(&r.location_id));
            }
            if r.state != 0 {
                put("state", state(r.state));
            }
        }
        Request::SetStock(r) => {
            put("sku", quote(&r.sku));
            put("on_hand", r.on_hand.to_string());
            put("idempotency_key", quote(&r.idempotency_key));
            if !r.location_id.is_empty() {
                put("location_id", quote(&r.location_id));
            }
        }
        Request::SetStockPolicy(r) => {
            put("sku", quote(&r.sku));
            if !r.location_id.is_empty() {
                put("location_id", quote(&r.location_id));
            }
            if let Some(s) = r.safety_stock {
                put("safety_stock", s.to_string());
            }
            if let Some(l) = r.backorder_limit {
                put("backorder_limit", l.to_string());
            }
            put("idempotency_key", quote(&r.idempotency_key));
        }
        Request::MoveStockState(r) => {
            put("sku", quote(&r.sku));
            if !r.location_id.is_empty() {
                put("location_id", quote(&r.location_id));
            }
            put("quantity", r.quantity.to_string());
            put("from_state", state(r.from_state));
            put("to_state", state(r.to_state));
            put("idempotency_key", quote(&r.idempotency_key));
        }
        Request::Reserve(r) => {
            put("idempotency_key", quote(&r.idempotency_key));
            put("order_id", quote(&r.order_id));
            put("lines", lines(&r.lines));
            put("ttl", quote("3600s"));
            if r.allow_split {
                put("allow_split", "true".into());
            }
            if r.allow_backorder {
                put("allow_backorder", "true".into());
            }
            if r.allow_preorder {
                put("allow_preorder", "true".into());
            }
        }
        Request::Confirm(r) => {
            put("reservation_id", reservation_id(&r.reservation_id));
            if !r.lines.is_empty() {
                put("lines", lines(&r.lines));
            }
            if !r.idempotency_key.is_empty() {
                put("idempotency_key", quote(&r.idempotency_key));
            }
        }
        Request::Release(r) => {
            put("reservation_id", reservation_id(&r.reservation_id));
            if !r.lines.is_empty() {
                put("lines", lines(&r.lines));
            }
            if !r.idempotency_key.is_empty() {
                put("idempotency_key", quote(&r.idempotency_key));
            }
        }
        Request::Extend(r) => {
            put("reservation_id", reservation_id(&r.reservation_id));
            put("ttl", quote("1s"));
        }
        Request::GetReservation(r) => put("reservation_id", reservation_id(&r.reservation_id)),
        Request::CancelOrder(r) => {
            put("order_id", quote(&r.order_id));
            put("idempotency_key", quote(&r.idempotency_key));
        }
        Request::ExpectStock(r) => {
            put("receipt_id", quote(&r.receipt_id));
            put("sku", quote(&r.sku));
            if !r.location_id.is_empty() {
                put("location_id", quote(&r.location_id));
            }
            put("quantity", r.quantity.to_string());
            let at = r.expected_at.unwrap_or_default();
            put("expected_at", quote(&rfc3339(at.seconds)));
            put("idempotency_key", quote(&r.idempotency_key));
        }
        Request::ReceiveStock(r) => {
            put("receipt_id", quote(&r.receipt_id));
            put("quantity", r.quantity.to_string());
            put("idempotency_key", quote(&r.idempotency_key));
            if r.state != 0 {
                put("state", state(r.state));
            }
        }
        Request::CancelReceipt(r) => {
            put("receipt_id", quote(&r.receipt_id));
            put("idempotency_key", quote(&r.idempotency_key));
        }
    }
    format!("{{{}}}", f.join(","))
}

/// Seconds since the epoch as an RFC 3339 date (midnight UTC: the model's receipts are due
/// at midnight).
fn rfc3339(seconds: i64) -> String {
    let days = seconds.div_euclid(86_400);
    // Civil date from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02}T00:00:00Z")
}

#[cfg(test)]
mod tests {
    use super::{rfc3339, script};
    use crate::call::{Call, LineSpec, Namespace, due};

    #[test]
    fn dates_print_as_rfc3339() {
        assert_eq!(rfc3339(due(1).seconds), "2030-01-01T00:00:00Z");
        assert_eq!(rfc3339(due(14).seconds), "2030-01-14T00:00:00Z");
    }

    #[test]
    fn a_reservation_named_later_is_kept_in_a_variable() {
        let calls = vec![
            Call::Reserve {
                key: "k1".into(),
                order: "o1".into(),
                lines: vec![LineSpec {
                    sku: "MUG".into(),
                    quantity: 2,
                    location: None,
                }],
                allow_split: false,
                allow_backorder: true,
                allow_preorder: false,
            },
            Call::Confirm {
                reservation: "k1".into(),
                key: None,
                lines: vec![],
            },
        ];
        let text = script(7, &calls, &Namespace::default());
        assert!(
            text.contains("R_k1=$(grpcurl -plaintext -d '{\"idempotency_key\":\"k1\""),
            "{text}"
        );
        assert!(text.contains("\"allow_backorder\":true"), "{text}");
        assert!(
            text.contains("{\"reservation_id\":\"'\"$R_k1\"'\"}"),
            "{text}"
        );
    }
}
