//! The clients in other languages (`clients/`), run against the real server as their users
//! would run them, and the retry rules every gRPC client takes from
//! `deploy/grpc/service-config.json`.
//!
//! `make test` installs and generates the clients first and says where they are
//! (`CLIENTS_PYTHON`, `CLIENTS_TSX`); run `deploy/local/services.sh clients` before running
//! these tests by hand.

use std::{path::Path, process::Stdio, time::Duration};

use inventory_core::pause::PausePoint;

use crate::{
    helpers::{TestApp, fresh_database, reserve, spawn_app_with, stock, test_settings},
    telemetry::scrape,
};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn tool(variable: &str) -> String {
    std::env::var(variable).unwrap_or_else(|_| {
        panic!("{variable} is unset: run `make test`, or `deploy/local/services.sh clients` and export it")
    })
}

/// Runs `program script` against `app` with `env`; its output, if it exited 0.
async fn run(program: &str, script: &str, app: &TestApp, env: &[(&str, String)]) -> String {
    let mut command = tokio::process::Command::new(program);
    command
        .arg(script)
        .current_dir(root())
        .env("INVENTORY_TARGET", app.addr.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = tokio::time::timeout(Duration::from_secs(180), command.output())
        .await
        .unwrap_or_else(|_| panic!("{script} did not finish"))
        .unwrap_or_else(|error| panic!("{program}: {error}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{script} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// A server whose `WatchEvents` cap is small, so the sagas can provoke a refusal with
/// `RetryInfo` by opening streams.
async fn saga_server() -> TestApp {
    let mut settings = test_settings(fresh_database().await);
    settings.server.max_watchers = 4;
    spawn_app_with(settings).await
}

#[tokio::test]
async fn the_python_order_saga_runs_against_the_server() {
    let app = saga_server().await;
    let out = run(
        &tool("CLIENTS_PYTHON"),
        "clients/python/saga.py",
        &app,
        &[("INVENTORY_MAX_WATCHERS", "4".into())],
    )
    .await;
    assert!(out.contains("RetryInfo"), "{out}");
}

#[tokio::test]
async fn the_typescript_order_saga_runs_against_the_server() {
    let app = saga_server().await;
    let out = run(
        &tool("CLIENTS_TSX"),
        "clients/typescript/src/saga.ts",
        &app,
        &[("INVENTORY_MAX_WATCHERS", "4".into())],
    )
    .await;
    assert!(out.contains("RetryInfo"), "{out}");
}

/// How many `GetStock` calls the server answered `RESOURCE_EXHAUSTED`, by its own count.
async fn exhausted_reads(app: &TestApp) -> f64 {
    let page = scrape(app.admin_addr.unwrap()).await;
    page.lines()
        .filter(|line| {
            line.starts_with("inventory_rpc_duration_seconds_count")
                && line.contains("rpc_method=\"/inventory.v1.InventoryService/GetStock\"")
                && line.contains("rpc_grpc_status_code=\"ResourceExhausted\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_saturated_server_receives_about_one_attempt_per_call_from_throttling_clients() {
    let mut settings = test_settings(fresh_database().await);
    settings.server.max_in_flight = 1;
    settings.server.admin_listen_addr = Some("127.0.0.1:0".parse().unwrap());
    // This process's meter provider, so `/metrics` shows what the RPC layer records.
    let telemetry = inventory_server::telemetry::init(
        inventory_server::config::LogFormat::Text,
        &inventory_server::telemetry::TelemetrySettings::default(),
    )
    .unwrap();
    let app = crate::helpers::spawn_app_exporting(settings, telemetry.registry().clone()).await;
    stock(&app, "SKU-1", 10).await;
    // One call in flight, held after its lease: every other call is refused at once.
    let mut held = app.pauses.arm(PausePoint::LeaseGranted);
    let mut client = app.client.clone();
    let holder = tokio::spawn(async move { client.reserve(reserve("a", &[("SKU-1", 1)])).await });
    held.reached().await;

    let python = tool("CLIENTS_PYTHON");
    let offered = 200;
    let out = run(
        &python,
        "clients/python/throttle.py",
        &app,
        &[("INVENTORY_CALLS", offered.to_string())],
    )
    .await;
    let report: serde_json::Value =
        serde_json::from_str(out.trim().lines().last().unwrap()).unwrap();
    assert_eq!(report["codes"]["RESOURCE_EXHAUSTED"], offered, "{report}");
    let received = exhausted_reads(&app).await;
    // retryThrottling (maxTokens 10): retries stop once the channel's tokens fall to half,
    // after about five failures; five attempts per call would be 1,000.
    assert!(
        received >= f64::from(offered) && received <= f64::from(offered) + 10.0,
        "{received} attempts for {offered} calls"
    );

    // The same rules without throttling: every call is tried maxAttempts (5) times. This is
    // what the throttling policy saves.
    let scratch = inventory_testkit::Scratch::new("service-config");
    let mut config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("deploy/grpc/service-config.json")).unwrap(),
    )
    .unwrap();
    assert!(
        config
            .as_object_mut()
            .unwrap()
            .remove("retryThrottling")
            .is_some()
    );
    let unthrottled = scratch.0.join("service-config.json");
    std::fs::write(&unthrottled, config.to_string()).unwrap();
    let before = exhausted_reads(&app).await;
    let calls = 10;
    run(
        &python,
        "clients/python/throttle.py",
        &app,
        &[
            ("INVENTORY_CALLS", calls.to_string()),
            (
                "INVENTORY_SERVICE_CONFIG",
                unthrottled.display().to_string(),
            ),
        ],
    )
    .await;
    let received = exhausted_reads(&app).await - before;
    assert_eq!(
        received,
        f64::from(calls * 5),
        "every call tried five times"
    );

    held.resume();
    holder.await.unwrap().unwrap();
}

/// Every Python and TypeScript block of the README's "Calling it from other languages"
/// section is, line for line (indentation aside), a run of lines of the `clients/` file the
/// text names last before it: the snippets are the code the sagas above run.
#[test]
fn the_readmes_client_snippets_are_the_code_the_sagas_run() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme
        .find("## Calling it from other languages")
        .expect("the section");
    let end = readme[start + 3..]
        .find("\n## ")
        .map_or(readme.len(), |at| start + 3 + at);
    let section = &readme[start..end];
    let mut checked = 0;
    let mut rest = section;
    while let Some(open) = [rest.find("```python\n"), rest.find("```typescript\n")]
        .into_iter()
        .flatten()
        .min()
    {
        let before = &section[..section.len() - rest.len() + open];
        let body_start = open + rest[open..].find('\n').unwrap() + 1;
        let body_end = body_start + rest[body_start..].find("```").unwrap();
        let block: Vec<&str> = rest[body_start..body_end].lines().map(str::trim).collect();
        let named = before
            .match_indices("clients/")
            .filter_map(|(at, _)| {
                let path: String = before[at..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || "/._-".contains(*c))
                    .collect();
                (path.ends_with(".py") || path.ends_with(".ts")).then_some(path)
            })
            .last()
            .expect("a clients/ file named before the block");
        let source = std::fs::read_to_string(root().join(&named)).unwrap();
        let lines: Vec<&str> = source.lines().map(str::trim).collect();
        assert!(
            lines
                .windows(block.len())
                .any(|window| window == block.as_slice()),
            "a README block is not in {named}:\n{}",
            block.join("\n")
        );
        checked += 1;
        rest = &rest[body_end + 3..];
    }
    assert!(checked >= 4, "only {checked} snippets found");
}
