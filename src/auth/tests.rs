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
    let principal = |role| Principal {
        caller: name.clone(),
        role,
    };
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
