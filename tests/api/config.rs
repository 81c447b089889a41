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
