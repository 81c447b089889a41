use super::*;

fn call(key: &str) -> ForwardedReserve {
    ForwardedReserve {
        request: Some(proto::ReserveRequest {
            idempotency_key: key.into(),
            order_id: "order-1".into(),
            lines: vec![proto::ReservationLine {
                sku: "SKU-1".into(),
                quantity: 2,
                ..Default::default()
            }],
            strategy: proto::AllocationStrategy::Priority.into(),
            ..Default::default()
        }),
        caller: "checkout".into(),
        lease_wait: None,
        tenant: String::new(),
    }
}

const HERE: &str = "10.0.0.1:50053";

#[test]
fn a_call_signed_for_this_replica_is_taken_once() {
    let secret = PeerSecret::new(&[7; 32]);
    let signed = secret.sign(&call_context(HERE), &call("k-1"));
    assert!(secret.verify(&call_context(HERE), &signed));
    let mut seen = Seen::default();
    let now = unix_ms(SystemTime::now());
    assert!(seen.take(&signed.signature, signed.signed_at_ms, now));
    assert!(
        !seen.take(&signed.signature, signed.signed_at_ms, now),
        "a replayed call is refused"
    );
    // Once its time can no longer pass the skew check, it is forgotten.
    let later = now + i64::try_from(MAX_CLOCK_SKEW.as_millis()).unwrap() + 1;
    assert!(seen.take(b"another", later, later));
    assert_eq!(seen.order.len(), 1);
}

#[test]
fn a_call_for_another_replica_a_changed_body_or_a_wrong_secret_is_refused() {
    let secret = PeerSecret::new(&[7; 32]);
    let signed = secret.sign(&call_context(HERE), &call("k-1"));
    assert!(!secret.verify(&call_context("10.0.0.2:50053"), &signed));
    let mut changed = signed.clone();
    changed.body = call("k-2").encode_to_vec();
    assert!(!secret.verify(&call_context(HERE), &changed));
    let mut retimed = signed.clone();
    retimed.signed_at_ms += 1;
    assert!(!secret.verify(&call_context(HERE), &retimed));
    assert!(!PeerSecret::new(&[8; 32]).verify(&call_context(HERE), &signed));
}

#[test]
fn an_answer_is_good_for_the_call_it_answers_only() {
    let secret = PeerSecret::new(&[7; 32]);
    let first = secret.sign(&call_context(HERE), &call("k-1"));
    let second = secret.sign(&call_context(HERE), &call("k-2"));
    let sku = inventory_core::domain::Sku::parse("SKU-1").unwrap();
    let answered = secret.sign(
        &answer_context(&first.signature),
        &answer(Err(Error::NotHolder { sku })),
    );
    assert!(secret.verify(&answer_context(&first.signature), &answered));
    assert!(!secret.verify(&answer_context(&second.signature), &answered));
}

#[test]
fn not_holder_travels_as_its_own_answer_and_errors_as_their_status() {
    let sku = inventory_core::domain::Sku::parse("SKU-1").unwrap();
    assert!(matches!(
        answer(Err(Error::NotHolder { sku: sku.clone() })).answer,
        Some(Answer::NotHolder(_))
    ));
    let Some(Answer::Error(status)) = answer(Err(Error::UnknownSkus(vec![sku]))).answer else {
        panic!("an error travels as its status");
    };
    assert_eq!(status.code, tonic::Code::NotFound as i32);
    assert!(!status.details.is_empty(), "the details travel too");
}

#[test]
fn a_forwarded_call_decodes_to_the_command_it_was_made_from() {
    let (command, lease_wait) = command(call("k-1")).expect("decodes");
    assert_eq!(lease_wait, None);
    let again = forward::reserve_request(&command);
    assert_eq!(again, call("k-1").request.unwrap());
    assert_eq!(command.caller.as_str(), "checkout");
}
