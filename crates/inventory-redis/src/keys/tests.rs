use super::*;

#[test]
fn lease_and_fence_of_a_sku_share_one_hash_tag() {
    let prefix = KeyPrefix::parse("inventory:test").unwrap();
    let sku = Sku::parse("SKU-1").unwrap();
    assert_eq!(prefix.lease(&sku), "inventory:test:{SKU-1}:lease");
    assert_eq!(prefix.fence(&sku), "inventory:test:{SKU-1}:fence");
    assert_eq!(
        fred::util::redis_keyslot(prefix.lease(&sku).as_bytes()),
        fred::util::redis_keyslot(prefix.fence(&sku).as_bytes())
    );
}

#[test]
fn prefix_is_plain_and_bounded() {
    assert!(KeyPrefix::parse("").is_err());
    assert!(KeyPrefix::parse("a{b}").is_err());
    assert!(KeyPrefix::parse("has space").is_err());
    assert!(KeyPrefix::parse(&"p".repeat(65)).is_err());
    assert!(KeyPrefix::parse("inventory:prod:tenant-7").is_ok());
}
