use super::*;

fn split(raw: &str) -> (String, SslParams) {
    split_ssl_params(raw).unwrap()
}

#[test]
fn ssl_settings_leave_a_url_and_the_rest_stays_as_written() {
    let (rest, params) = split(
        "postgres://app:p%40ss@db:5432/inventory?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca%20dir%2Fca.pem",
    );
    assert_eq!(
        rest,
        "postgres://app:p%40ss@db:5432/inventory?application_name=x"
    );
    assert_eq!(params.mode.as_deref(), Some("verify-full"));
    assert_eq!(params.rootcert.as_deref(), Some("/etc/ca dir/ca.pem"));

    let (rest, params) = split("postgresql://db/inventory?sslmode=require");
    assert_eq!(rest, "postgresql://db/inventory");
    assert_eq!(params.mode.as_deref(), Some("require"));

    let (rest, params) = split("postgres://db/inventory");
    assert_eq!(rest, "postgres://db/inventory");
    assert_eq!(params, SslParams::default());

    // A raw `?` in the password is the driver's credentials, not the start of the query.
    let (rest, params) = split("postgres://app:s3cr?t@db/inv?sslmode=require&connect_timeout=5");
    assert_eq!(rest, "postgres://app:s3cr?t@db/inv?connect_timeout=5");
    assert_eq!(params.mode.as_deref(), Some("require"));
    let config: crate::PgConfig = "postgres://app:s3cr?t@db/inv?sslmode=require"
        .parse()
        .unwrap();
    assert_eq!(config.get_ssl_mode(), DriverSslMode::Require);
    assert_eq!(config.get_password(), Some(&b"s3cr?t"[..]));
}

#[test]
fn a_malformed_string_is_refused_without_quoting_it() {
    let error = split_ssl_params("host=db password=hunter2 secret sslmode=require").unwrap_err();
    assert!(
        !error.contains("hunter2") && !error.contains("secret"),
        "{error}"
    );
}

#[test]
fn ssl_settings_leave_a_key_value_string_whatever_the_quoting() {
    let (rest, params) = split(
        "host=db  sslmode = verify-ca password='it\\'s' sslrootcert='/ca dir/ca.pem' sslcert=/c\\ d.pem sslkey=/k.pem dbname=inv",
    );
    // The driver parses the rest; quoting of the pairs it keeps is untouched.
    assert_eq!(rest, "host=db password='it\\'s' dbname=inv");
    assert_eq!(params.mode.as_deref(), Some("verify-ca"));
    assert_eq!(params.rootcert.as_deref(), Some("/ca dir/ca.pem"));
    assert_eq!(params.cert.as_deref(), Some("/c d.pem"));
    assert_eq!(params.key.as_deref(), Some("/k.pem"));

    let (rest, params) = split("host=db password='a\\'b c' sslmode=disable");
    assert_eq!(rest, "host=db password='a\\'b c'");
    assert_eq!(params.mode.as_deref(), Some("disable"));

    assert!(split_ssl_params("host=db sslrootcert='unterminated").is_err());
    assert!(split_ssl_params("host").is_err());
    assert!(split_ssl_params("postgres://db/x?sslrootcert=%zz").is_err());
}

#[test]
fn every_libpq_mode_is_understood_and_others_are_refused() {
    for (raw, mode, driver) in [
        ("disable", SslMode::Disable, DriverSslMode::Disable),
        ("prefer", SslMode::Prefer, DriverSslMode::Prefer),
        ("require", SslMode::Require, DriverSslMode::Require),
        ("verify-ca", SslMode::VerifyCa, DriverSslMode::Require),
        ("verify-full", SslMode::VerifyFull, DriverSslMode::Require),
    ] {
        assert_eq!(SslMode::parse(raw).unwrap(), mode);
        assert_eq!(mode.driver(), driver);
    }
    assert!(
        SslMode::parse("allow")
            .unwrap_err()
            .contains("not supported")
    );
    assert!(SslMode::parse("VERIFY-FULL").is_err());
}

#[test]
fn verifying_modes_need_a_root_certificate_and_files_are_read_up_front() {
    let params = |mode: &str, rootcert: Option<&str>| SslParams {
        mode: Some(mode.into()),
        rootcert: rootcert.map(Into::into),
        ..SslParams::default()
    };
    let error = PgTls::from_params(&params("verify-full", None)).unwrap_err();
    assert!(error.contains("needs sslrootcert"), "{error}");
    let error = PgTls::from_params(&params("verify-ca", Some("/nonexistent/ca.pem"))).unwrap_err();
    assert!(error.contains("/nonexistent/ca.pem"), "{error}");

    let tls = PgTls::from_params(&params("require", None)).unwrap();
    assert_eq!(tls.mode(), SslMode::Require);
    assert!(!tls.verifies_chain);
    let tls = PgTls::from_params(&SslParams::default()).unwrap();
    assert_eq!(tls.mode(), SslMode::Prefer);

    let half = SslParams {
        cert: Some("/c.pem".into()),
        ..SslParams::default()
    };
    assert!(PgTls::from_params(&half).unwrap_err().contains("together"));
}
