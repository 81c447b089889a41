use super::*;

#[test]
fn the_template_is_named_for_the_migrations() {
    let name = TemplateDatabases::template_name().unwrap();
    let prefix = format!(
        "inventory_template_v{}_",
        inventory_postgres::migrate::expected_version()
    );
    assert!(name.starts_with(&prefix), "{name}");
    assert_eq!(name.len(), prefix.len() + 12);
    assert_eq!(name, TemplateDatabases::template_name().unwrap());
}

#[test]
fn a_url_names_user_host_port_and_database() {
    let config: tokio_postgres::Config = "postgres://app:secret@db.example:6543/shop"
        .parse()
        .unwrap();
    assert_eq!(url(&config), "postgres://app@db.example:6543/shop");
}

#[test]
fn the_fallback_folder_is_the_same_for_the_same_request() {
    let a = fallback_data_dir(Path::new("/root/repo/target/chaos/postgres"));
    assert_eq!(
        a,
        fallback_data_dir(Path::new("/root/repo/target/chaos/postgres"))
    );
    assert_ne!(a, fallback_data_dir(Path::new("/root/other/postgres")));
    assert!(a.starts_with("/var/tmp"));
}
