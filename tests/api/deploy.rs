//! The deployment contract: the manifests name only settings the binary has, their ports match,
//! and the real binary rolls out gracefully on SIGTERM.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use inventory_server::proto::{
    WatchEventsRequest, inventory_service_client::InventoryServiceClient,
};
use inventory_testkit::{free_port, process::eventually_ok};
use tokio_stream::StreamExt as _;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::helpers::{adjust, admin_url, connect, fresh_database, redis_url, reserve};

fn read(relative: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)).unwrap()
}

/// `KEY=value` entries of the base ConfigMap's generator file.
fn base_config() -> Vec<(String, String)> {
    read("deploy/k8s/base/server.env")
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

/// `- KEY=value` literals of an overlay's ConfigMap generator.
fn overlay_literals(overlay: &str) -> Vec<String> {
    let text = read(&format!("deploy/k8s/overlays/{overlay}/kustomization.yaml"));
    let section = text
        .split("configMapGenerator:")
        .nth(1)
        .expect("a configMapGenerator");
    section
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- "))
        .filter_map(|entry| entry.split_once('='))
        .map(|(key, _)| key.to_string())
        .take_while(|key| key.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .collect()
}

fn port(addr: &str) -> u16 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

#[test]
fn every_configured_key_is_a_setting_of_the_binary_and_the_ports_match() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_inventory-server"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let mut keys: Vec<String> = base_config().into_iter().map(|(key, _)| key).collect();
    keys.extend(overlay_literals("dev"));
    keys.extend(overlay_literals("production"));
    assert!(keys.len() > 15, "{keys:?}");
    for key in &keys {
        // OTEL_* are read by the OpenTelemetry SDK itself, not by the server's flags.
        if key.starts_with("OTEL_") {
            continue;
        }
        assert!(
            help.contains(&format!("[env: {key}")),
            "{key} is not a setting of serve"
        );
    }

    let config: std::collections::HashMap<_, _> = base_config().into_iter().collect();
    let deployment = read("deploy/k8s/base/deployment.yaml");
    let health = port(&config["HEALTH_LISTEN_ADDR"]);
    let probe_ports: Vec<u16> = deployment
        .lines()
        .skip_while(|line| !line.contains("startupProbe"))
        .filter_map(|line| line.trim().strip_prefix("port: "))
        .map(|value| value.parse().unwrap())
        .collect();
    assert_eq!(
        probe_ports,
        [health, health, health],
        "every probe targets the health port"
    );
    for (key, name) in [
        ("LISTEN_ADDR", "grpc"),
        ("HEALTH_LISTEN_ADDR", "health"),
        ("ADMIN_LISTEN_ADDR", "admin"),
        ("PEER_LISTEN_ADDR", "peer"),
    ] {
        let expected = format!(
            "- name: {name}\n              containerPort: {}",
            port(&config[key])
        );
        assert!(
            deployment.contains(&expected),
            "{key} and the {name} container port disagree"
        );
    }
    // The address peers are given is this pod's, on the peer port.
    assert!(
        deployment.contains(&format!(
            "value: \"$(POD_IP):{}\"",
            port(&config["PEER_LISTEN_ADDR"])
        )),
        "PEER_ADVERTISE_ADDR must name the pod IP and the peer port"
    );
    let policy = read("deploy/k8s/base/networkpolicy.yaml");
    assert!(
        policy
            .matches(&format!("port: {}", port(&config["PEER_LISTEN_ADDR"])))
            .count()
            == 2,
        "the network policy lets replicas reach each other's peer port, in and out"
    );
    // The pod is given the time preStop and the server's drain need.
    let grace: u64 = deployment
        .lines()
        .find_map(|line| line.trim().strip_prefix("terminationGracePeriodSeconds: "))
        .unwrap()
        .parse()
        .unwrap();
    let pre_stop: u64 = deployment
        .lines()
        .skip_while(|line| !line.contains("preStop"))
        .find_map(|line| line.trim().strip_prefix("seconds: "))
        .unwrap()
        .parse()
        .unwrap();
    let drain = humantime::parse_duration(&config["SHUTDOWN_GRACE"])
        .unwrap()
        .as_secs();
    assert!(grace > pre_stop + drain, "{grace} <= {pre_stop} + {drain}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_calls_and_exits_cleanly_with_a_stream_open() {
    let database = fresh_database().await;
    let (base, _) = admin_url()
        .rsplit_once('/')
        .map(|(b, d)| (b.to_string(), d.to_string()))
        .unwrap();
    let database_url = format!("{base}/{}", database.get_dbname().unwrap());
    let (grpc_port, health_port) = (free_port().unwrap(), free_port().unwrap());
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_inventory-server"))
        .arg("serve")
        .env("DATABASE_URL", &database_url)
        .env("REDIS_URL", redis_url())
        .env(
            "REDIS_KEY_PREFIX",
            format!("rollout:{}", uuid::Uuid::new_v4().simple()),
        )
        .env("LISTEN_ADDR", format!("127.0.0.1:{grpc_port}"))
        .env("HEALTH_LISTEN_ADDR", format!("127.0.0.1:{health_port}"))
        .env("AUTH_DISABLED", "true")
        .env("SHUTDOWN_GRACE", "5s")
        .env("LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let health_endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{health_port}")).unwrap();
    let mut health = HealthClient::new(
        eventually_ok("the server comes up", Duration::from_secs(5), || {
            health_endpoint.connect()
        })
        .await
        .unwrap(),
    );
    let mut health_watch = health
        .watch(HealthCheckRequest {
            service: "inventory.v1.InventoryService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        health_watch.next().await.unwrap().unwrap().status(),
        ServingStatus::Serving
    );

    let client = InventoryServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
        .await
        .unwrap();
    client
        .clone()
        .adjust_stock(adjust("SKU-1", 1_000_000, "seed"))
        .await
        .unwrap();
    let mut events = client
        .clone()
        .watch_events(WatchEventsRequest {
            after_sequence: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();

    // A steady stream of Reserve calls from four clients, each recording what was accepted.
    let accepted = Arc::new(Mutex::new(Vec::<String>::new()));
    let done = Arc::new(AtomicUsize::new(0));
    let loops: Vec<_> = (0..4)
        .map(|worker| {
            let mut client = client.clone();
            let accepted = Arc::clone(&accepted);
            let done = Arc::clone(&done);
            tokio::spawn(async move {
                for i in 0.. {
                    match client
                        .reserve(reserve(&format!("w{worker}-{i}"), &[("SKU-1", 1)]))
                        .await
                    {
                        Ok(reservation) => {
                            accepted
                                .lock()
                                .unwrap()
                                .push(reservation.into_inner().reservation_id);
                            done.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(_) => return,
                    }
                }
            })
        })
        .collect();
    while done.load(Ordering::SeqCst) < 40 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let pid = server.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());

    // Health turns NOT_SERVING while the process still runs.
    let next = tokio::time::timeout(Duration::from_secs(5), health_watch.next())
        .await
        .expect("a health update")
        .unwrap()
        .unwrap();
    assert_eq!(next.status(), ServingStatus::NotServing);

    let status = tokio::time::timeout(Duration::from_secs(15), server.wait())
        .await
        .expect("exits within the drain deadline")
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
    for task in loops {
        task.await.unwrap();
    }
    // The open event stream was ended, not left hanging.
    let mut seen = 0;
    while let Ok(Some(Ok(_))) = tokio::time::timeout(Duration::from_secs(5), events.next()).await {
        seen += 1;
    }
    assert!(seen >= 1);

    // Every accepted reservation exists exactly once, and nothing exists that was not accepted.
    let accepted = accepted.lock().unwrap().clone();
    let unique: HashSet<&String> = accepted.iter().collect();
    assert_eq!(
        unique.len(),
        accepted.len(),
        "no reservation was returned twice"
    );
    let db = connect(&database).await;
    let stored: HashSet<String> = db
        .query("SELECT reservation_id::text FROM reservations", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(stored, unique.into_iter().cloned().collect::<HashSet<_>>());
    let reserved: i64 = db
        .query_one("SELECT reserved FROM stock WHERE sku = 'SKU-1'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(reserved as usize, accepted.len());
}

/// As root, PostgreSQL runs as the `postgres` user, which cannot enter a clone under a 0700
/// folder (the usual `/root`): the local services must still start, with PostgreSQL's data in
/// a per-checkout folder under /var/tmp.
#[test]
fn local_services_start_from_a_folder_closed_to_other_users() {
    use std::os::unix::fs::PermissionsExt as _;
    let root_user = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| output.stdout.starts_with(b"0\n"));
    if !root_user {
        // Not root: PostgreSQL runs as this same user, who can reach its own folders.
        return;
    }
    let closed = std::env::temp_dir().join(format!(
        "inventory-closed-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let root = closed.join("repo");
    std::fs::create_dir_all(root.join("deploy/local")).unwrap();
    let script = root.join("deploy/local/services.sh");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/local/services.sh"),
        &script,
    )
    .unwrap();
    let (pg_port, redis_port) = (free_port().unwrap(), free_port().unwrap());
    let services = |args: &[&str]| {
        std::process::Command::new("bash")
            .arg(&script)
            .args(args)
            .env("LOCAL_PG_PORT", pg_port.to_string())
            .env("LOCAL_REDIS_PORT", redis_port.to_string())
            .output()
            .unwrap()
    };
    let fallback = {
        use sha2::{Digest as _, Sha256};
        let digest = Sha256::digest(root.to_str().unwrap().as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        PathBuf::from(format!("/var/tmp/inventory-{}", &hex[..12]))
    };

    let started = services(&["start", "run"]);
    let stderr = String::from_utf8_lossy(&started.stderr).to_string();
    let answered = std::process::Command::new("psql")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &pg_port.to_string(),
            "-U",
            "postgres",
        ])
        .args(["-d", "postgres", "-tAc", "SHOW data_directory"])
        .output()
        .unwrap();
    let stopped = services(&["stop"]);
    let _ = std::fs::remove_dir_all(&fallback);
    let _ = std::fs::remove_dir_all(&closed);

    assert!(started.status.success(), "{stderr}");
    assert!(stderr.contains("cannot reach"), "{stderr}");
    let data = String::from_utf8_lossy(&answered.stdout);
    assert!(
        data.trim().starts_with(fallback.to_str().unwrap()),
        "PostgreSQL serves from {data:?}, expected under {}",
        fallback.display()
    );
    assert!(
        stopped.status.success(),
        "{}",
        String::from_utf8_lossy(&stopped.stderr)
    );
}

/// The trimmed value of the first `key` line at or after the first line containing `marker`.
fn value_after(text: &str, marker: &str, key: &str) -> String {
    text.lines()
        .skip_while(|line| !line.contains(marker))
        .find_map(|line| line.trim().strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key:?} after {marker:?}"))
        .trim()
        .trim_matches('"')
        .to_string()
}

/// The Secrets each `DATABASE_URL` of a manifest is read from, in order.
fn database_url_secrets(manifest: &str) -> Vec<String> {
    let lines: Vec<&str> = manifest.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter(|(_, line)| line.trim() == "- name: DATABASE_URL")
        .map(|(at, _)| {
            lines[at..]
                .iter()
                .find_map(|line| line.trim().strip_prefix("name: "))
                .unwrap()
                .to_string()
        })
        .collect()
}

#[test]
fn the_hpa_owns_the_replica_count_and_its_maximum_fits_the_declared_connection_limit() {
    let deployment = read("deploy/k8s/base/deployment.yaml");
    assert!(
        !deployment
            .lines()
            .any(|line| line.trim_start().starts_with("replicas:")),
        "the Deployment must leave its replica count to the HPA"
    );
    assert!(
        !read("deploy/k8s/overlays/dev/kustomization.yaml")
            .lines()
            .any(|line| line.starts_with("replicas:")),
        "no overlay sets the count the HPA owns"
    );
    let number = |text: &str, marker: &str, key: &str| -> u32 {
        value_after(text, marker, key).parse().unwrap()
    };
    let max_replicas = number(&read("deploy/k8s/base/hpa.yaml"), "spec:", "maxReplicas:");
    let surge = number(&deployment, "rollingUpdate:", "maxSurge:");
    let config: std::collections::HashMap<_, _> = base_config().into_iter().collect();
    let pool: u32 = config["DATABASE_POOL_SIZE"].parse().unwrap();
    let kustomization = read("deploy/k8s/base/kustomization.yaml");
    let limits = "name: inventory-database-limits";
    let max_connections = number(&kustomization, limits, "- max_connections=");
    let reserved = number(&kustomization, limits, "- reserved_connections=");
    // Every pod's pool and LISTEN connection, the rollout's surge pods, verify's one.
    let needed = (max_replicas + surge) * (pool + 1) + 1 + reserved;
    assert!(
        needed <= max_connections,
        "({max_replicas} + {surge}) x ({pool} + 1) + 1 + {reserved} = {needed} > {max_connections}"
    );
    // The dev overlay's PostgreSQL is started with the declared limit.
    let postgres = read("deploy/k8s/overlays/dev/postgres.yaml");
    assert!(postgres.contains(r#"args: ["-c", "max_connections=$(MAX_CONNECTIONS)"]"#));
    assert_eq!(
        value_after(&postgres, "name: MAX_CONNECTIONS", "name: "),
        "inventory-database-limits"
    );
}

#[test]
fn migrate_serve_and_verify_connect_with_their_own_roles() {
    assert_eq!(
        database_url_secrets(&read("deploy/k8s/base/deployment.yaml")),
        ["inventory-database-migrate", "inventory-database"],
        "the migrate initContainer, then the server"
    );
    assert_eq!(
        database_url_secrets(&read("deploy/k8s/base/verify-cronjob.yaml")),
        ["inventory-database-verify"]
    );
    // The dev overlay's Secrets name the roles the script creates, one each.
    let roles = read("deploy/sql/roles.sql");
    let dev = read("deploy/k8s/overlays/dev/kustomization.yaml");
    for (secret, role) in [
        ("inventory-database-migrate", "inventory_migrator"),
        ("inventory-database", "inventory_server"),
        ("inventory-database-verify", "inventory_verifier"),
    ] {
        let url = dev
            .lines()
            .skip_while(|line| line.trim() != format!("- name: {secret}"))
            .find_map(|line| line.trim().strip_prefix("- url="))
            .unwrap_or_else(|| panic!("no Secret {secret} in the dev overlay"));
        assert!(
            url.starts_with(&format!("postgres://{role}:")),
            "{secret}: {url}"
        );
        assert!(
            roles.contains(&format!("CREATE ROLE {role} LOGIN")),
            "{role}"
        );
    }
    // kustomize reads no file outside the overlay: the dev database runs a copy.
    assert_eq!(
        read("deploy/k8s/overlays/dev/initdb/10-roles.sql"),
        roles,
        "copy deploy/sql/roles.sql to the dev overlay's initdb/10-roles.sql"
    );
}

#[test]
fn the_tls_port_claims_no_cleartext_protocol_and_the_dashboard_ignores_unlabelled_series() {
    // The production overlay serves TLS on the gRPC port and drops the base's h2c there.
    let production = read("deploy/k8s/overlays/production/kustomization.yaml");
    assert!(production.contains("- TLS_CERT_FILE="));
    assert!(
        production.contains("- op: remove\n        path: /spec/ports/0/appProtocol"),
        "the TLS port must not declare kubernetes.io/h2c"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/inventory.json")).unwrap();
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    for variable in variables.iter().filter(|v| v["includeAll"] == true) {
        assert_eq!(
            variable["allValue"], ".+",
            "{}: \"All\" must not match a missing label (series pushed without a pod)",
            variable["name"]
        );
    }
}
