//! Identities platforms issue (SPIFFE and DNS SANs under the client CA, JWTs signed by a
//! JWKS), per-caller limits, and who did what (the caller label, the access log).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use inventory_server::{
    access::{AccessLogSettings, Sink},
    auth::{AuthSources, CallerLimits, JwtSettings, digest_hex},
    config::TlsSettings,
    proto::inventory_service_client::InventoryServiceClient,
};
use jsonwebtoken::{Algorithm, EncodingKey, Header, jwk::Jwk};
use rcgen::{CertificateParams, KeyPair, SanType};
use tonic::{
    Code,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
};
use tonic_types::StatusExt as _;

use crate::{
    helpers::{
        Scratch, TestApp, adjust, error_reason, fresh_database, get_stock, reserve, spawn_app_with,
        test_settings, with_token,
    },
    tls::{ca, leaf},
};

/// A leaf certificate under `issuer` whose only name is the URI `uri`.
fn spiffe_leaf(uri: &str, issuer: &rcgen::CertifiedIssuer<'static, KeyPair>) -> (String, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .subject_alt_names
        .push(SanType::URI(uri.try_into().unwrap()));
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

async fn mtls_channel(app: &TestApp, ca: &str, identity: &(String, String)) -> Channel {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost")
        .identity(Identity::from_pem(&identity.0, &identity.1));
    Endpoint::from_shared(format!("https://{}", app.addr))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Reads a SKU that does not exist: `NOT_FOUND` means the call got through.
async fn read(channel: Channel, token: Option<&str>) -> Code {
    match InventoryServiceClient::new(channel)
        .get_stock(with_token(get_stock(&["NONE"]), token))
        .await
    {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test]
async fn a_renewed_certificate_with_the_same_spiffe_id_keeps_working_with_no_edit() {
    let authority = ca("platform CA");
    let checkout = "spiffe://shop.example/ns/orders/sa/checkout";
    let mut settings = test_settings(fresh_database().await);
    let server = leaf(&["localhost"], &authority);
    settings.server.tls = Some(TlsSettings {
        cert_pem: server.0.into_bytes(),
        key_pem: server.1.into_bytes().into(),
        client_ca_pem: Some(authority.pem().into_bytes()),
    });
    settings.auth.authenticator = inventory_server::auth::Authenticator::parse(&format!(
        "checkout reader {checkout}\nerp admin dns:erp-sync.shop.example\n"
    ))
    .unwrap();
    let app = spawn_app_with(settings).await;
    let ca_pem = authority.pem();

    let first = spiffe_leaf(checkout, &authority);
    let renewed = spiffe_leaf(checkout, &authority);
    assert_ne!(first.0, renewed.0, "a new leaf, with a new key");
    for identity in [&first, &renewed] {
        let channel = mtls_channel(&app, &ca_pem, identity).await;
        assert_eq!(read(channel.clone(), None).await, Code::NotFound);
        // The role is the line's: a reader may not reserve.
        let status = InventoryServiceClient::new(channel)
            .reserve(reserve("k", &[("SKU-1", 1)]))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    }

    // Another workload under the same CA is not the checkout.
    let other = spiffe_leaf("spiffe://shop.example/ns/orders/sa/refunds", &authority);
    let channel = mtls_channel(&app, &ca_pem, &other).await;
    assert_eq!(read(channel, None).await, Code::Unauthenticated);

    // A DNS SAN names a caller too; its role is admin, so it may adjust stock.
    let erp = leaf(&["erp-sync.shop.example"], &authority);
    let channel = mtls_channel(&app, &ca_pem, &erp).await;
    InventoryServiceClient::new(channel)
        .adjust_stock(adjust("SKU-1", 5, "erp-1"))
        .await
        .expect("the ERP's certificate is the admin's");
}

/// A signing key of the issuer, as the JWKS publishes it and as it signs.
struct Signer {
    kid: String,
    key: EncodingKey,
    jwk: Jwk,
}

impl Signer {
    fn new(kid: &str) -> Self {
        let pair = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let key = EncodingKey::from_ec_der(&pair.serialize_der());
        let mut jwk = Jwk::from_encoding_key(&key, Algorithm::ES256).unwrap();
        jwk.common.key_id = Some(kid.to_owned());
        Self {
            kid: kid.to_owned(),
            key,
            jwk,
        }
    }

    fn token(&self, claims: serde_json::Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, &claims, &self.key).unwrap()
    }
}

fn jwks(signers: &[&Signer]) -> String {
    serde_json::json!({ "keys": signers.iter().map(|s| &s.jwk).collect::<Vec<_>>() }).to_string()
}

/// How the tests' issuer signs: its `iss`, the `inventory` audience, the default claims.
fn jwt_settings(jwks_file: std::path::PathBuf) -> JwtSettings {
    JwtSettings {
        jwks_file,
        issuer: "https://id.shop.example".into(),
        audience: "inventory".into(),
        caller_claim: "sub".into(),
        role_claim: "inventory_role".into(),
        tenant_claim: "inventory_tenant".into(),
        leeway: Duration::from_secs(5),
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(sub: &str, role: &str, aud: &str, exp: u64) -> serde_json::Value {
    serde_json::json!({
        "iss": "https://id.shop.example",
        "aud": aud,
        "sub": sub,
        "exp": exp,
        "inventory_role": role,
    })
}

fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

#[tokio::test]
async fn signed_tokens_are_checked_for_key_issuer_audience_expiry_and_algorithm() {
    let scratch = Scratch::new("jwks");
    let jwks_file = scratch.0.join("jwks.json");
    let first = Signer::new("2026-12");
    std::fs::write(&jwks_file, jwks(&[&first])).unwrap();
    // A subject mapped to a named caller, and a file caller a token's subject could name.
    let tokens = scratch.0.join("tokens");
    std::fs::write(
        &tokens,
        [
            token_line("ops", "admin", "ops-token", ""),
            "checkout reserver jwt:spiffe://shop.example/ns/orders/sa/checkout\n".to_owned(),
        ]
        .concat(),
    )
    .unwrap();
    let sources = AuthSources {
        tokens_file: Some(tokens),
        jwt: Some(jwt_settings(jwks_file.clone())),
        defaults: CallerLimits::default(),
        tenant_required: false,
    };
    let mut settings = test_settings(fresh_database().await);
    settings.auth.authenticator = sources.load().unwrap();
    settings.auth.sources = Some(sources);
    let app = spawn_app_with(settings).await;
    let channel = app.channel().await;
    let hour = now() + 3600;

    let good = first.token(claims("checkout", "reader", "inventory", hour));
    assert_eq!(read(channel.clone(), Some(&good)).await, Code::NotFound);
    let status = app
        .client
        .clone()
        .reserve(with_token(reserve("k", &[("SKU-1", 1)]), Some(&good)))
        .await
        .unwrap_err();
    assert_eq!(
        status.code(),
        Code::PermissionDenied,
        "the role claim says reader"
    );

    // A subject that names a file caller is not that caller: it is `jwt:ops`, with keys and
    // reservations of its own.
    seed(&app, 10).await;
    let mut client = app.client.clone();
    let by_ops = client
        .reserve(with_token(
            reserve("k1", &[("SKU-1", 1)]),
            Some("ops-token"),
        ))
        .await
        .unwrap()
        .into_inner();
    let impersonator = first.token(claims("ops", "reserver", "inventory", hour));
    let status = client
        .get_reservation(with_token(
            crate::helpers::get_reservation(&by_ops.reservation_id),
            Some(&impersonator),
        ))
        .await
        .unwrap_err();
    assert_eq!(
        status.code(),
        Code::NotFound,
        "ops's reservation is not jwt:ops's"
    );
    let own = client
        .reserve(with_token(
            reserve("k1", &[("SKU-1", 1)]),
            Some(&impersonator),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(
        own.reservation_id, by_ops.reservation_id,
        "ops's key is not replayed"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM reservations WHERE caller = 'jwt:ops'")
            .await,
        1
    );

    // A mapped subject is its line's caller, with the line's role (reserver), whatever the
    // token's role claim says.
    let mapped = first.token(claims(
        "spiffe://shop.example/ns/orders/sa/checkout",
        "reader",
        "inventory",
        hour,
    ));
    client
        .reserve(with_token(reserve("k2", &[("SKU-1", 1)]), Some(&mapped)))
        .await
        .expect("the mapped subject reserves as checkout");
    assert_eq!(
        app.count("SELECT count(*) FROM reservations WHERE caller = 'checkout'")
            .await,
        1
    );
    // The line is tenant default's: a token of that subject claiming another tenant is not
    // this line's caller (an issuer's realms may repeat subjects), and reserves nothing.
    let mut elsewhere = claims(
        "spiffe://shop.example/ns/orders/sa/checkout",
        "reserver",
        "inventory",
        hour,
    );
    elsewhere["inventory_tenant"] = "outlet".into();
    let status = client
        .reserve(with_token(
            reserve("k3", &[("SKU-1", 1)]),
            Some(&first.token(elsewhere)),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(
        app.count("SELECT count(*) FROM reservations WHERE caller = 'checkout'")
            .await,
        1
    );

    // Operator power (every tenant's data) comes from a line only, never from a claim: a
    // token of an unmapped subject claiming `operator` is refused, with a tenant header too,
    // and reads nothing. A mapped subject needs no role claim at all: its line's role holds.
    let claims_operator = first.token(claims("tenant-admin", "operator", "inventory", hour));
    for tenant in [None, Some("outlet")] {
        let mut request = with_token(get_stock(&["SKU-1"]), Some(&claims_operator));
        if let Some(tenant) = tenant {
            request.metadata_mut().insert(
                inventory_server::auth::TENANT_HEADER,
                tenant.parse().unwrap(),
            );
        }
        let status = client.get_stock(request).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::PermissionDenied,
            "{tenant:?}: {status:?}"
        );
        assert!(status.message().contains("operator"), "{status:?}");
    }
    let mut roleless = claims(
        "spiffe://shop.example/ns/orders/sa/checkout",
        "",
        "inventory",
        hour,
    );
    roleless.as_object_mut().unwrap().remove("inventory_role");
    client
        .reserve(with_token(
            reserve("k4", &[("SKU-1", 1)]),
            Some(&first.token(roleless)),
        ))
        .await
        .expect("a mapped subject's role is its line's, with no role claim");

    let refused = [
        (
            "expired",
            first.token(claims("checkout", "reader", "inventory", now() - 60)),
        ),
        (
            "wrong audience",
            first.token(claims("checkout", "reader", "billing", hour)),
        ),
        ("wrong key", {
            let impostor = Signer::new("2026-12");
            impostor.token(claims("checkout", "admin", "inventory", hour))
        }),
        (
            "unknown role",
            first.token(claims("checkout", "owner", "inventory", hour)),
        ),
        ("alg none", {
            let header = base64url(br#"{"alg":"none","typ":"JWT"}"#);
            let body = base64url(
                claims("checkout", "admin", "inventory", hour)
                    .to_string()
                    .as_bytes(),
            );
            format!("{header}.{body}.")
        }),
        ("tampered", {
            let mut parts: Vec<String> = good.split('.').map(str::to_owned).collect();
            parts[1] = base64url(
                claims("checkout", "admin", "inventory", hour)
                    .to_string()
                    .as_bytes(),
            );
            parts.join(".")
        }),
    ];
    for (what, token) in &refused {
        let status = app
            .client
            .clone()
            .get_stock(with_token(get_stock(&["NONE"]), Some(token)))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{what}: {status:?}");
        assert!(
            !status.message().contains(token.as_str()),
            "{what}: never echoed"
        );
    }

    // The issuer rotates its key: the new JWKS is picked up with no restart, and tokens of
    // the retired key stop working.
    let second = Signer::new("2027-01");
    std::fs::write(&jwks_file, jwks(&[&second])).unwrap();
    let rotated = second.token(claims("checkout", "reader", "inventory", hour));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while read(channel.clone(), Some(&rotated)).await != Code::NotFound {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new JWKS was never read"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(read(channel, Some(&good)).await, Code::Unauthenticated);
}

/// `SKU-1` stocked with `units`, by the `ops` admin every token file here lists.
async fn seed(app: &TestApp, units: i64) {
    app.client
        .clone()
        .adjust_stock(with_token(
            adjust("SKU-1", units, "seed"),
            Some("ops-token"),
        ))
        .await
        .unwrap();
}

fn token_line(name: &str, role: &str, token: &str, limits: &str) -> String {
    format!(
        "{name} {role} token-sha256:{} {limits}\n",
        digest_hex(token.as_bytes())
    )
}

#[tokio::test]
async fn a_caller_past_its_caps_is_refused_with_a_reason_and_others_are_not() {
    let text = [
        token_line("ops", "admin", "ops-token", ""),
        token_line(
            "orders",
            "reserver",
            "orders-token",
            "max_holds=2 max_held_units=5",
        ),
        token_line("pos", "reserver", "pos-token", ""),
    ]
    .concat();
    let mut settings = test_settings(fresh_database().await);
    settings.auth.authenticator = inventory_server::auth::Authenticator::parse(&text).unwrap();
    let app = spawn_app_with(settings).await;
    seed(&app, 100).await;
    let mut client = app.client.clone();
    let as_orders =
        |key: &str, units: i64| with_token(reserve(key, &[("SKU-1", units)]), Some("orders-token"));

    let a = client
        .reserve(as_orders("a", 2))
        .await
        .unwrap()
        .into_inner();
    client.reserve(as_orders("b", 2)).await.unwrap();
    let status = client.reserve(as_orders("c", 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(error_reason(&status), "CALLER_QUOTA_EXCEEDED");
    let info = status.get_details_error_info().unwrap();
    assert_eq!(info.metadata["quota"], "max_holds");
    assert_eq!(info.metadata["current"], "2");
    assert!(status.get_details_retry_info().is_some());
    assert_eq!(
        status.get_details_quota_failure().unwrap().violations[0].subject,
        "max_holds"
    );
    // A retry of a reservation already made replays it, cap or not.
    let again = client
        .reserve(as_orders("a", 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.reservation_id, a.reservation_id);
    // Another caller is not held back by this one's caps.
    client
        .reserve(with_token(
            reserve("p", &[("SKU-1", 50)]),
            Some("pos-token"),
        ))
        .await
        .unwrap();

    // Releasing one hold makes room for a hold, but not for more units than the cap.
    client
        .release_reservation(with_token(
            crate::helpers::release(&a.reservation_id),
            Some("orders-token"),
        ))
        .await
        .unwrap();
    let status = client.reserve(as_orders("d", 4)).await.unwrap_err();
    assert_eq!(error_reason(&status), "CALLER_QUOTA_EXCEEDED");
    assert_eq!(
        status.get_details_error_info().unwrap().metadata["quota"],
        "max_held_units"
    );
    client.reserve(as_orders("e", 3)).await.unwrap();
    let stored = app
        .count("SELECT count(*) FROM reservations WHERE caller = 'orders' AND state = 'HELD'")
        .await;
    assert_eq!(stored, 2, "nothing was reserved by a refused call");
}

#[tokio::test]
async fn a_caller_at_its_in_flight_limit_is_refused_while_others_are_served() {
    use inventory_core::pause::PausePoint;
    let text = [
        token_line("ops", "admin", "ops-token", ""),
        token_line("orders", "reserver", "orders-token", "max_in_flight=1"),
    ]
    .concat();
    let mut settings = test_settings(fresh_database().await);
    settings.auth.authenticator = inventory_server::auth::Authenticator::parse(&text).unwrap();
    let app = spawn_app_with(settings).await;
    seed(&app, 10).await;
    let mut client = app.client.clone();

    let mut held = app.pauses.arm(PausePoint::LeaseGranted);
    let mut first = client.clone();
    let call = tokio::spawn(async move {
        first
            .reserve(with_token(
                reserve("a", &[("SKU-1", 1)]),
                Some("orders-token"),
            ))
            .await
    });
    held.reached().await;
    let status = client
        .get_stock(with_token(get_stock(&["SKU-1"]), Some("orders-token")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(error_reason(&status), "CALLER_SATURATED");
    assert!(status.get_details_retry_info().is_some());
    client
        .get_stock(with_token(get_stock(&["SKU-1"]), Some("ops-token")))
        .await
        .expect("another caller is served");
    held.resume();
    call.await.unwrap().unwrap();
    client
        .get_stock(with_token(get_stock(&["SKU-1"]), Some("orders-token")))
        .await
        .expect("its place is given back when the call ends");
}

#[tokio::test]
async fn metrics_name_configured_callers_and_the_access_log_says_who_did_what() {
    let text = [
        token_line("ops", "admin", "ops-token", ""),
        token_line("orders", "reserver", "orders-token", ""),
        token_line("viewer", "reader", "viewer-token", ""),
    ]
    .concat();
    let (lines, received) = std::sync::mpsc::channel();
    let mut settings = test_settings(fresh_database().await);
    settings.auth.authenticator = inventory_server::auth::Authenticator::parse(&text).unwrap();
    settings.server.admin_listen_addr = Some("127.0.0.1:0".parse().unwrap());
    settings.server.access_log = AccessLogSettings {
        enabled: true,
        read_sample: 0.0,
        sink: Sink::Channel(lines),
    };
    // This process's meter provider, so `/metrics` shows what the RPC layer records.
    let telemetry = inventory_server::telemetry::init(
        inventory_server::config::LogFormat::Text,
        &inventory_server::telemetry::TelemetrySettings::default(),
    )
    .unwrap();
    let app = crate::helpers::spawn_app_exporting(settings, telemetry.registry().clone()).await;
    seed(&app, 10).await;
    let mut client = app.client.clone();
    let held = client
        .reserve(with_token(
            reserve("a", &[("SKU-1", 1)]),
            Some("orders-token"),
        ))
        .await
        .unwrap()
        .into_inner();
    let status = client
        .get_stock(with_token(get_stock(&["SKU-1"]), Some("stolen")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    // A known caller refused for its role is named, not `_OTHER`.
    let status = client
        .reserve(with_token(
            reserve("v", &[("SKU-1", 1)]),
            Some("viewer-token"),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    // A successful read is sampled out (ACCESS_LOG_READ_SAMPLE=0)...
    client
        .get_stock(with_token(get_stock(&["SKU-1"]), Some("orders-token")))
        .await
        .unwrap();
    // ...and a refused call after it is logged: lines come in the order calls ended, so
    // once this one is read, the read's would have been too.
    client
        .list_locations(with_token(
            inventory_server::proto::ListLocationsRequest::default(),
            Some("stolen"),
        ))
        .await
        .unwrap_err();

    let mut log = Vec::new();
    loop {
        let line = received
            .recv_timeout(Duration::from_secs(20))
            .expect("an access-log line per logged call");
        let line: serde_json::Value = serde_json::from_str(&line).unwrap();
        let last = line["rpc.method"] == "inventory.v1.InventoryService/ListLocations";
        log.push(line);
        if last {
            break;
        }
    }
    assert_eq!(log.len(), 5, "{log:#?}");
    let denied = log
        .iter()
        .find(|line| line["code"] == "PermissionDenied")
        .expect("a refusal for the role is logged");
    assert_eq!(denied["caller"], "viewer");
    let reserve_line = log
        .iter()
        .find(|line| line["rpc.method"] == "inventory.v1.InventoryService/Reserve")
        .expect("the reserve is logged");
    assert_eq!(reserve_line["caller"], "orders");
    assert_eq!(reserve_line["code"], "Ok");
    assert_eq!(reserve_line["order_id"], "order-a");
    assert!(reserve_line["duration_ms"].as_f64().unwrap() > 0.0);
    let refused = log
        .iter()
        .find(|line| line["code"] == "Unauthenticated")
        .expect("a refused call is always logged");
    assert_eq!(refused["caller"], "_OTHER");
    assert!(
        !log.iter().any(|line| line["code"] == "Ok"
            && line["rpc.method"] == "inventory.v1.InventoryService/GetStock"),
        "{log:#?}"
    );
    assert!(!held.reservation_id.is_empty());

    let page = crate::telemetry::scrape(app.admin_addr.unwrap()).await;
    let series = |caller: &str| {
        page.lines().any(|line| {
            line.starts_with("rpc_server_duration_milliseconds_count")
                && line.contains(&format!("caller=\"{caller}\""))
                && line.contains("rpc_method=\"Reserve\"")
        })
    };
    assert!(series("orders"), "{page}");
    assert!(
        page.lines()
            .any(|line| line.starts_with("rpc_server_duration")
                && line.contains("caller=\"_OTHER\"")),
        "the unauthenticated call is _OTHER: {page}"
    );
    assert!(!page.contains("stolen"));
}

/// Serving several tenants, a signed token's tenant is never implied: a token without the
/// tenant claim is refused (`PERMISSION_DENIED`) rather than taken for `default`'s, whose
/// rows are every row written before tenants; one that names its tenant works in it.
#[tokio::test]
async fn with_several_tenants_a_token_without_its_tenant_claim_is_refused() {
    let scratch = Scratch::new("jwks-tenants");
    let jwks_file = scratch.0.join("jwks.json");
    let signer = Signer::new("2026-12");
    std::fs::write(&jwks_file, jwks(&[&signer])).unwrap();
    let sources = AuthSources {
        tokens_file: None,
        jwt: Some(jwt_settings(jwks_file)),
        defaults: CallerLimits::default(),
        tenant_required: true,
    };
    let database = fresh_database().await;
    crate::tenants::migrate_tenants(&database, &["brand_a"]).await;
    let mut settings = test_settings(database);
    settings.auth.authenticator = sources.load().unwrap();
    settings.auth.sources = Some(sources);
    settings.tenants = inventory_server::tenants::TenantSettings::parse(
        "default,brand_a",
        inventory_server::tenants::TenantLimits::default(),
    )
    .unwrap();
    let app = spawn_app_with(settings).await;
    let channel = app.channel().await;
    let hour = now() + 3600;

    let unnamed = signer.token(claims("checkout", "reader", "inventory", hour));
    assert_eq!(
        read(channel.clone(), Some(&unnamed)).await,
        Code::PermissionDenied
    );
    let mut named = claims("checkout", "reader", "inventory", hour);
    named["inventory_tenant"] = "brand_a".into();
    assert_eq!(
        read(channel, Some(&signer.token(named))).await,
        Code::NotFound,
        "brand_a's reader reads brand_a's stock (no such SKU there)"
    );
}
