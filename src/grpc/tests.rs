use super::*;

fn metadata(timeout: &str) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    metadata.insert("grpc-timeout", timeout.parse().unwrap());
    metadata
}

#[test]
fn grpc_timeout_header_is_parsed_in_every_unit() {
    assert_eq!(
        client_timeout(&metadata("2S")),
        Some(Duration::from_secs(2))
    );
    assert_eq!(
        client_timeout(&metadata("50m")),
        Some(Duration::from_millis(50))
    );
    assert_eq!(
        client_timeout(&metadata("1H")),
        Some(Duration::from_secs(3600))
    );
    assert_eq!(
        client_timeout(&metadata("7u")),
        Some(Duration::from_micros(7))
    );
    assert_eq!(client_timeout(&metadata("x")), None);
    assert_eq!(client_timeout(&metadata("10q")), None);
    assert_eq!(client_timeout(&MetadataMap::new()), None);
}
