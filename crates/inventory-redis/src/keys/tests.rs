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

#[test]
fn a_tenant_gets_its_own_segment_and_the_hash_tag_stays_the_sku() {
    use inventory_core::domain::Tenant;
    let prefix = KeyPrefix::parse("inventory:prod").unwrap();
    let sku = Sku::parse("SKU-1").unwrap();
    let brand = prefix.for_tenant(&Tenant::parse("brand_a").unwrap());
    assert_eq!(brand.lease(&sku), "inventory:prod:brand_a:{SKU-1}:lease");
    assert_eq!(brand.fence(&sku), "inventory:prod:brand_a:{SKU-1}:fence");
    assert_eq!(
        brand.released_channel(),
        "inventory:prod:brand_a:lease-released"
    );
    // Cluster placement stays per SKU: the same slot in every tenant.
    assert_eq!(
        fred::util::redis_keyslot(brand.lease(&sku).as_bytes()),
        fred::util::redis_keyslot(prefix.lease(&sku).as_bytes())
    );
    // Tenant `default` keeps the keys of releases before tenants.
    let default = prefix.for_tenant(&Tenant::default_tenant());
    assert_eq!(default.lease(&sku), "inventory:prod:{SKU-1}:lease");
}
