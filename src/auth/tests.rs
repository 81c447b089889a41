use super::*;

#[test]
fn a_credentials_file_is_parsed_and_checked_line_by_line() {
    let good = format!(
        "# who  role  credential\norder-service reserver token-sha256:{}\nops admin cert-sha256:{} # pinned\n",
        digest_hex(b"secret-1"),
        "ab".repeat(32)
    );
    let auth = Authenticator::parse(&good).unwrap();
    assert_eq!(auth.tokens.len(), 1);
    assert_eq!(auth.certificates.len(), 1);

    let bad = "a reserver token-sha256:xyz\nb boss token-sha256:00\nc reserver password:1\nd\n";
    let problems = Authenticator::parse(bad).unwrap_err();
    assert_eq!(problems.len(), 4, "{problems:?}");
    assert!(problems[0].contains("line 1") && problems[0].contains("64 hex"));
    assert!(problems[1].contains("line 2") && problems[1].contains("role"));
    assert!(problems[3].contains("line 4"));
    assert!(Authenticator::parse("# nothing\n").is_err());
}

#[test]
fn the_role_table_gives_each_role_exactly_its_calls() {
    use Action::*;
    let table = [
        (Role::Reader, [true, false, false, false]),
        (Role::Reserver, [true, true, false, false]),
        (Role::Watcher, [true, false, true, false]),
        (Role::Admin, [true, true, true, true]),
        (Role::Operator, [true, true, true, true]),
    ];
    for (role, allowed) in table {
        for (action, allowed) in [Read, Reserve, Watch, Adjust].into_iter().zip(allowed) {
            assert_eq!(role.may(action), allowed, "{role:?} {action:?}");
        }
    }
}

#[test]
fn only_admin_changes_and_only_watcher_and_admin_read_every_callers_reservations() {
    let name = Caller::parse("svc").unwrap();
    let principal = |role| Principal::new(name.clone(), role);
    let own = Scope::Own(name.clone());
    for role in [Role::Reader, Role::Reserver] {
        assert_eq!(principal(role).read_scope(), own);
        assert_eq!(principal(role).write_scope(), own);
    }
    assert_eq!(principal(Role::Watcher).read_scope(), Scope::All);
    assert_eq!(principal(Role::Watcher).write_scope(), own);
    assert_eq!(principal(Role::Admin).read_scope(), Scope::All);
    assert_eq!(principal(Role::Admin).write_scope(), Scope::All);
}

#[test]
fn san_credentials_and_limits_are_read_and_each_bad_one_named() {
    let good = format!(
        "checkout reserver spiffe://shop.example/ns/orders/sa/checkout max_in_flight=8 max_holds=100\n\
         checkout reserver token-sha256:{}\n\
         erp admin dns:ERP-Sync.shop.example max_held_units=5000\n",
        digest_hex(b"t")
    );
    let auth = Authenticator::parse(&good).unwrap();
    assert_eq!(auth.uris.len(), 1);
    assert_eq!(auth.dns_names.len(), 1);
    assert!(
        auth.dns_names.contains_key("erp-sync.shop.example"),
        "lower case"
    );
    // Limits given on one line hold for every credential of the caller.
    let token = &auth.tokens[&sha256(b"t")];
    assert_eq!(token.limits.max_in_flight, Some(8));
    assert_eq!(token.limits.caps.max_holds, Some(100));
    assert_eq!(auth.named["erp"].caps.max_held_units, Some(5000));

    let bad = "a reserver spiffe:/nope\n\
               b reserver dns:*.shop.example\n\
               c reserver uri:x max_holds=0\n\
               d reserver uri:y max_everything=1\n\
               e reserver uri:z max_holds=1\n\
               e reserver uri:w max_holds=2\n";
    let problems = Authenticator::parse(bad).unwrap_err();
    assert_eq!(problems.len(), 5, "{problems:#?}");
    assert!(problems[0].contains("line 1") && problems[0].contains("spiffe://"));
    assert!(problems[1].contains("line 2"));
    assert!(problems[2].contains("line 3") && problems[2].contains("positive"));
    assert!(problems[3].contains("line 4") && problems[3].contains("unknown limit"));
    assert!(problems[4].contains("line 6") && problems[4].contains("line 5"));
}

#[test]
fn metrics_name_only_configured_callers() {
    let auth = Authenticator::parse(&format!(
        "orders reserver token-sha256:{}\n",
        digest_hex(b"t")
    ))
    .unwrap();
    assert_eq!(auth.label(&Caller::parse("orders").unwrap()), "orders");
    assert_eq!(
        auth.label(&Caller::parse("someone").unwrap()),
        OTHER_CALLERS
    );
    assert_eq!(
        Authenticator::disabled().label(&Caller::anonymous()),
        ANONYMOUS
    );
}

#[test]
fn a_callers_in_flight_places_are_counted_and_given_back() {
    let gate = Gate::new(Authenticator::disabled());
    let mut limited = Principal::new(Caller::parse("orders").unwrap(), Role::Reserver);
    limited.limits.max_in_flight = Some(2);
    let first = gate.admit(&limited).unwrap();
    let _second = gate.admit(&limited).unwrap();
    assert!(matches!(
        gate.admit(&limited),
        Err(Error::CallerSaturated { limit: 2, .. })
    ));
    drop(first);
    assert!(gate.admit(&limited).is_ok());
    let unlimited = Principal::new(Caller::parse("pos").unwrap(), Role::Reserver);
    for _ in 0..10 {
        std::mem::forget(gate.admit(&unlimited).unwrap());
    }
}

#[test]
fn jwt_names_are_kept_for_signed_callers_and_subjects_need_a_jwks() {
    let problems = Authenticator::parse(&format!(
        "jwt:ops admin token-sha256:{}\ncheckout reserver jwt:spiffe://shop.example/sa/checkout\n",
        digest_hex(b"t")
    ))
    .unwrap_err();
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].contains("line 1") && problems[0].contains("jwt:"));
    assert!(problems[1].contains("line 2") && problems[1].contains("JWT_JWKS_FILE"));
    let mapped = Authenticator::parse_with(
        "checkout reserver jwt:spiffe://shop.example/sa/checkout max_holds=3\n",
        CallerLimits::default(),
        true,
        false,
    )
    .unwrap();
    let principal = &mapped.subjects["spiffe://shop.example/sa/checkout"];
    assert_eq!(principal.caller.as_str(), "checkout");
    assert_eq!(principal.limits.caps.max_holds, Some(3));
}

#[test]
fn without_authentication_the_anonymous_caller_has_the_default_limits() {
    let defaults = CallerLimits {
        max_in_flight: Some(4),
        caps: HoldCaps {
            max_holds: Some(10),
            max_held_units: None,
        },
    };
    let principal = Authenticator::disabled_with(defaults)
        .authorize(&Request::new(()), Action::Adjust)
        .unwrap();
    assert_eq!(principal.limits, defaults);
    assert_eq!(principal.caller.as_str(), "");
}

#[test]
fn a_line_names_its_callers_one_tenant_and_only_an_operator_chooses_another() {
    let token = |t: &str| digest_hex(t.as_bytes());
    let text = format!(
        "shop reserver token-sha256:{} tenant=outlet max_holds=5\n\
         shop reserver cert-sha256:{}\n\
         plain reserver token-sha256:{}\n\
         support operator token-sha256:{}\n",
        token("shop"),
        "cd".repeat(32),
        token("plain"),
        token("support"),
    );
    // A caller's second line may leave the tenant out only if the first named `default`:
    // here it names outlet, so the second line is a different tenant and refused.
    let problems = Authenticator::parse(&text).unwrap_err();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("line 2") && problems[0].contains("one tenant"));
    let text = text.replace(
        &"cd".repeat(32),
        &format!("{} tenant=outlet", "cd".repeat(32)),
    );
    let auth = Authenticator::parse(&text).unwrap();
    let as_caller = |token: &str, header: Option<&str>| {
        let mut request = Request::new(());
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        if let Some(tenant) = header {
            request
                .metadata_mut()
                .insert(TENANT_HEADER, tenant.parse().unwrap());
        }
        auth.authorize(&request, Action::Read)
    };
    let shop = as_caller("shop", None).unwrap();
    assert_eq!(shop.tenant().as_str(), "outlet");
    assert_eq!(shop.limits().caps.max_holds, Some(5));
    assert!(as_caller("plain", None).unwrap().tenant().is_default());
    // Naming its own tenant is allowed; another is not, for anyone but an operator.
    assert!(as_caller("shop", Some("outlet")).is_ok());
    let refused = as_caller("shop", Some("default")).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    let support = as_caller("support", Some("outlet")).unwrap();
    assert_eq!(support.tenant().as_str(), "outlet");
    assert!(support.is_operator());
    assert!(as_caller("support", None).unwrap().tenant().is_default());
    let bad = as_caller("support", Some("Not-A-Tenant")).unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);

    for (line, expected) in [
        (
            "x reserver token-sha256:{} tenant=Outlet",
            "tenant must start",
        ),
        ("x reserver token-sha256:{} tenant=a tenant=b", "one tenant"),
    ] {
        let problems = Authenticator::parse(&line.replace("{}", &token("x"))).unwrap_err();
        assert!(problems[0].contains(expected), "{problems:?}");
    }
}

#[test]
fn without_authentication_the_one_caller_is_tenant_defaults_and_names_no_other() {
    let auth = Authenticator::disabled();
    let with_header = |tenant: Option<&str>| {
        let mut request = Request::new(());
        if let Some(tenant) = tenant {
            request
                .metadata_mut()
                .insert(TENANT_HEADER, tenant.parse().unwrap());
        }
        auth.authorize(&request, Action::Adjust)
    };
    assert!(with_header(None).unwrap().tenant().is_default());
    assert!(with_header(Some("default")).unwrap().tenant().is_default());
    let refused = with_header(Some("outlet")).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
}

#[test]
fn the_same_caller_name_in_two_tenants_has_a_place_in_flight_in_each() {
    let gate = Gate::new(Authenticator::disabled());
    let limits = CallerLimits {
        max_in_flight: Some(1),
        ..CallerLimits::default()
    };
    let caller = |tenant: &str| {
        let mut principal = Principal::new(Caller::parse("jwt:checkout").unwrap(), Role::Reserver)
            .in_tenant(Tenant::parse(tenant).unwrap());
        principal.limits = limits;
        principal
    };
    let first = gate.admit(&caller("brand_a")).unwrap();
    let other_tenant = gate.admit(&caller("brand_b")).unwrap();
    assert!(gate.admit(&caller("brand_a")).is_err());
    drop((first, other_tenant));
    assert!(gate.admit(&caller("brand_a")).is_ok());
}

/// Serving several tenants, a caller's tenant is never implied: a line without `tenant=` is
/// refused at load, naming the line (and `tenant=default` is as good as any). Serving one,
/// a line without it stays `default`'s, as before tenants.
#[test]
fn with_several_tenants_served_every_line_names_its_tenant() {
    let text = format!(
        "shop reserver token-sha256:{}\noutlet reserver token-sha256:{} tenant=outlet\nold reserver token-sha256:{} tenant=default\n",
        digest_hex(b"shop"),
        digest_hex(b"outlet"),
        digest_hex(b"old"),
    );
    let problems =
        Authenticator::parse_with(&text, CallerLimits::default(), false, true).unwrap_err();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("line 1") && problems[0].contains("tenant="),
        "{problems:?}"
    );
    let one = Authenticator::parse_with(&text, CallerLimits::default(), false, false).unwrap();
    assert_eq!(
        one.tokens[&sha256(b"shop")].tenant,
        Tenant::default_tenant()
    );
}
