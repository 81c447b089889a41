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
    }
}

fn signed(secret: &PeerSecret, call: &ForwardedReserve) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    metadata.insert(SIGNATURE, secret.sign(call).parse().unwrap());
    metadata
}

#[test]
fn a_call_signed_with_the_fleet_secret_is_accepted() {
    let secret = PeerSecret::new(&[7; 32]);
    let call = call("k-1");
    assert!(secret.verify(&signed(&secret, &call), &call).is_ok());
}

#[test]
fn a_changed_call_a_wrong_secret_or_no_signature_is_refused() {
    let secret = PeerSecret::new(&[7; 32]);
    let original = call("k-1");
    let metadata = signed(&secret, &original);
    let code = |result: Result<(), Status>| result.unwrap_err().code();
    assert_eq!(
        code(secret.verify(&metadata, &call("k-2"))),
        tonic::Code::Unauthenticated
    );
    let other = PeerSecret::new(&[8; 32]);
    assert_eq!(
        code(other.verify(&metadata, &original)),
        tonic::Code::Unauthenticated
    );
    assert_eq!(
        code(secret.verify(&MetadataMap::new(), &original)),
        tonic::Code::Unauthenticated
    );
}

#[test]
fn an_old_signature_is_refused() {
    let secret = PeerSecret::new(&[7; 32]);
    let call = call("k-1");
    let at_ms = unix_ms(SystemTime::now() - MAX_CLOCK_SKEW - Duration::from_secs(1));
    let tag = hmac::sign(&secret.0, &PeerSecret::signed(at_ms, &call));
    let mut metadata = MetadataMap::new();
    metadata.insert(
        SIGNATURE,
        format!("{at_ms}.{}", hex(tag.as_ref())).parse().unwrap(),
    );
    let refused = secret.verify(&metadata, &call).unwrap_err();
    assert!(refused.message().contains("too old"), "{refused:?}");
}

#[test]
fn hex_round_trips_and_rejects_odd_or_foreign_text() {
    assert_eq!(unhex(&hex(&[0, 1, 254, 255])), Some(vec![0, 1, 254, 255]));
    assert_eq!(unhex("abc"), None);
    assert_eq!(unhex("zz"), None);
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
    let command = command(call("k-1")).expect("decodes");
    let again = relay::reserve_request(&command);
    assert_eq!(again, call("k-1").request.unwrap());
    assert_eq!(command.caller.as_str(), "checkout");
}
