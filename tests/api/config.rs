//! The binary's configuration: bad settings end the process early with a clear message.

use std::process::Command;

fn server() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_inventory-server"));
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    command
}

#[test]
fn bad_settings_are_all_reported_before_anything_starts() {
    let output = server()
        .args(["serve"])
        .env("DATABASE_URL", "postgres://user:s3cret@host:notaport/db")
        .env("REDIS_URL", "memcached://nope")
        .env("REDIS_KEY_PREFIX", "has space")
        .env("REDIS_COMMAND_TIMEOUT", "0s")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    for expected in [
        "DATABASE_URL",
        "REDIS_URL",
        "REDIS_KEY_PREFIX",
        "REDIS_COMMAND_TIMEOUT",
    ] {
        assert!(
            stderr.contains(expected),
            "{expected} missing from: {stderr}"
        );
    }
    assert!(!stderr.contains("s3cret"), "the password leaked: {stderr}");
}

#[test]
fn a_missing_required_setting_names_the_variable() {
    let output = server()
        .args(["serve"])
        .env("DATABASE_URL", "postgres://localhost/db")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--redis-url"), "{stderr}");
}

#[test]
fn an_unparsable_duration_is_refused() {
    let output = server()
        .args(["serve", "--shutdown-grace", "soon"])
        .env("DATABASE_URL", "postgres://localhost/db")
        .env("REDIS_URL", "redis://localhost")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--shutdown-grace"));
}

#[test]
fn reservations_are_kept_at_least_as_long_as_the_keys_that_replay_them() {
    let output = server()
        .args(["serve", "--auth-disabled"])
        .env("DATABASE_URL", "postgres://localhost/db")
        .env("REDIS_URL", "redis://localhost")
        .env("IDEMPOTENCY_RETENTION", "72h")
        .env("RESERVATION_RETENTION", "48h")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("RESERVATION_RETENTION") && stderr.contains("IDEMPOTENCY_RETENTION"),
        "{stderr}"
    );
}

/// Serving several tenants, nothing makes a caller tenant `default`'s by omission: without
/// authentication every call would be, so the server refuses to start; and a credentials line
/// without `tenant=` stops it, naming the line.
#[test]
fn serving_several_tenants_no_caller_is_of_a_tenant_by_omission() {
    let base = |command: &mut Command| {
        command
            .args(["serve"])
            .env("DATABASE_URL", "postgres://localhost/db")
            .env("REDIS_URL", "redis://localhost")
            .env("TENANTS", "default,brand_a");
    };
    let mut disabled = server();
    base(&mut disabled);
    let output = disabled.env("AUTH_DISABLED", "true").output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("AUTH_DISABLED") && stderr.contains("TENANTS"),
        "{stderr}"
    );

    let file = std::env::temp_dir().join(format!("tenantless-{}", std::process::id()));
    std::fs::write(
        &file,
        format!(
            "shop reserver token-sha256:{}\noutlet reserver token-sha256:{} tenant=brand_a\n",
            "ab".repeat(32),
            "cd".repeat(32)
        ),
    )
    .unwrap();
    let mut named = server();
    base(&mut named);
    let output = named.env("AUTH_TOKENS_FILE", &file).output().unwrap();
    std::fs::remove_file(&file).unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("line 1") && stderr.contains("tenant="),
        "{stderr}"
    );
    assert!(!stderr.contains("line 2"), "{stderr}");
}
