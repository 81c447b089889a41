//! TLS to the datastores, against real servers that accept nothing else: a PostgreSQL whose
//! `pg_hba.conf` has only `hostssl` lines, a `redis-server` with `--port 0 --tls-port`, and a
//! least-privilege Redis ACL user. Certificates are made here, per test.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use fred::prelude::{ClientLike as _, KeysInterface as _};
use inventory_postgres::PgConfig;
use inventory_server::{proto::WatchEventsRequest, startup::Application};
use inventory_testkit::{
    free_port,
    postgres::{Postgres, PostgresOptions},
    process::eventually,
};
use tokio_stream::StreamExt as _;

use crate::{
    helpers::{
        Scratch, TestApp, adjust, redis_url, reserve, spawn_app_with, test_settings,
        test_settings_with_redis,
    },
    tls::{ca, leaf},
};

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|output| output.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

/// A PostgreSQL of the test's own with `ssl=on`, listening on 127.0.0.1 and 127.0.0.2 (the
/// second is not in its certificate), accepting TCP clients only over TLS.
#[derive(Debug)]
struct TlsPostgres {
    postgres: Postgres,
    ca: PathBuf,
    /// Certificates and data; removed after the cluster has stopped.
    _scratch: Scratch,
}

impl TlsPostgres {
    async fn start() -> Self {
        let scratch = Scratch::new("pg-tls");
        let authority = ca("inventory test database CA");
        let (cert, key) = leaf(&["localhost", "127.0.0.1"], &authority);
        let ca = scratch.write("ca.pem", &authority.pem());
        let cert_path = scratch.write("server.crt", &cert);
        let key_path = scratch.write("server.key", &key);
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(&scratch.0)
                .status()
                .unwrap();
            assert!(status.success());
        }
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let options = PostgresOptions {
            listen: vec!["127.0.0.1".into(), "127.0.0.2".into()],
            settings: vec![
                ("ssl".into(), "on".into()),
                ("ssl_cert_file".into(), cert_path.display().to_string()),
                ("ssl_key_file".into(), key_path.display().to_string()),
            ],
            // Only TLS over TCP; the Unix socket stays for pg_ctl.
            hba: Some("local all all trust\nhostssl all all 127.0.0.0/8 trust\n".into()),
        };
        let postgres = Postgres::start_with(&scratch.0.join("data"), &options)
            .await
            .expect("PostgreSQL with ssl=on (make test installs PostgreSQL)");
        Self {
            postgres,
            ca,
            _scratch: scratch,
        }
    }

    fn url(&self, host: &str, params: &str) -> String {
        format!(
            "postgres://postgres@{host}:{}/postgres?{params}",
            self.postgres.port()
        )
    }
}

async fn build_error(database: PgConfig) -> String {
    let error = Application::build(test_settings(database))
        .await
        .expect_err("the server must not start");
    format!("{error:#}")
}

#[tokio::test]
async fn verify_full_postgres_migrates_reserves_and_streams_while_weaker_settings_fail_at_start_up()
{
    let pg = TlsPostgres::start().await;
    let root = pg.ca.display().to_string();

    // sslmode=disable: the database refuses, and start-up says so.
    let refused = build_error(pg.url("127.0.0.1", "sslmode=disable").parse().unwrap()).await;
    assert!(
        refused.contains("PostgreSQL refused the connection"),
        "{refused}"
    );
    assert!(refused.contains("pg_hba.conf"), "{refused}");

    // verify-full to an address the certificate does not name: refused at start-up.
    let wrong_host: PgConfig = pg
        .url(
            "127.0.0.2",
            &format!("sslmode=verify-full&sslrootcert={root}"),
        )
        .parse()
        .unwrap();
    let refused = build_error(wrong_host).await;
    assert!(
        refused.contains("PostgreSQL refused the connection"),
        "{refused}"
    );
    assert!(refused.contains("not valid for name"), "{refused}");

    // A CA that did not sign the server's certificate: refused, even with verify-ca.
    let stranger = Scratch::new("pg-stranger-ca");
    let other_ca = stranger.write("ca.pem", &ca("someone else").pem());
    let refused = build_error(
        pg.url(
            "127.0.0.1",
            &format!("sslmode=verify-ca&sslrootcert={}", other_ca.display()),
        )
        .parse()
        .unwrap(),
    )
    .await;
    assert!(refused.contains("UnknownIssuer"), "{refused}");

    // verify-ca checks the chain and not the name, as libpq does.
    let chain_only: PgConfig = pg
        .url(
            "127.0.0.2",
            &format!("sslmode=verify-ca&sslrootcert={root}"),
        )
        .parse()
        .unwrap();
    inventory_postgres::probe(&chain_only, Duration::from_secs(5))
        .await
        .expect("verify-ca accepts a certificate for another name");

    // verify-full, the production setting: migrate, then serve and stream.
    let database: PgConfig = pg
        .url(
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={root}"),
        )
        .parse()
        .unwrap();
    inventory_postgres::migrate::run(&database)
        .await
        .expect("migrate over verify-full");
    let app = spawn_app_with(test_settings(database.clone())).await;
    let mut client = app.client.clone();
    client
        .adjust_stock(adjust("TLS-1", 3, "seed"))
        .await
        .unwrap();
    let hold = app.hold("k-1", &[("TLS-1", 2)]).await;
    assert_eq!(hold.lines[0].quantity, 2);
    let mut events = client
        .watch_events(WatchEventsRequest {
            after_sequence: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut types = Vec::new();
    while types.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("events arrive through the TLS LISTEN connection")
            .unwrap()
            .unwrap();
        types.push(event.r#type);
    }
    assert_eq!(
        types,
        [
            inventory_server::proto::EventType::StockAdjusted as i32,
            inventory_server::proto::EventType::ReservationHeld as i32
        ]
    );
    // The pool's sessions and the LISTEN connection's (named apart) are all over TLS; the
    // listener being there at all shows the stream is pushed, not only polled.
    let (check, connection) = database.open().await.unwrap();
    tokio::spawn(connection);
    let sessions: Vec<(String, bool)> = check
        .query(
            "SELECT a.application_name, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
             WHERE a.application_name LIKE 'inventory-server%'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert!(
        sessions
            .iter()
            .any(|(name, _)| name == "inventory-server-listen"),
        "{sessions:?}"
    );
    assert!(
        sessions.iter().any(|(name, _)| name == "inventory-server"),
        "{sessions:?}"
    );
    assert!(sessions.iter().all(|(_, ssl)| *ssl), "{sessions:?}");
    app.stop().await.unwrap();
}

/// A `redis-server` that speaks only TLS, with a least-privilege ACL user for the test's key
/// prefix.
#[derive(Debug)]
struct TlsRedis {
    /// The certificates, kept until the server is gone.
    _scratch: Scratch,
    port: u16,
    ca: PathBuf,
    /// A client certificate the server's CA signed, as files.
    client: (PathBuf, PathBuf),
    child: std::process::Child,
}

/// Exactly what the service runs: its Lua scripts (loaded on first use), the commands
/// inside them, `GET` of a lease and `PING`. Keys only under the prefix.
fn acl_rules(prefix: &str) -> Vec<String> {
    [
        "on",
        ">acl-user-password",
        &format!("~{prefix}:*"),
        "resetchannels",
        &format!("&{prefix}:lease-released"),
        // Each tenant's releases (`<prefix>:<tenant>:lease-released`).
        &format!("&{prefix}:*:lease-released"),
        "-@all",
        "+evalsha",
        "+script|load",
        "+get",
        "+set",
        "+incr",
        "+pexpire",
        "+del",
        "+publish",
        "+subscribe",
        "+ping",
        "+role",
    ]
    .iter()
    .map(ToString::to_string)
    .collect()
}

impl TlsRedis {
    /// `client_certificates`: whether Redis demands one (`tls-auth-clients yes`).
    fn start(client_certificates: bool) -> Self {
        let scratch = Scratch::new("redis-tls");
        let authority = ca("inventory test Redis CA");
        let (cert, key) = leaf(&["localhost", "127.0.0.1"], &authority);
        let ca = scratch.write("ca.pem", &authority.pem());
        let cert_path = scratch.write("redis.crt", &cert);
        let key_path = scratch.write("redis.key", &key);
        let (client_cert, client_key) = leaf(&["inventory-server"], &authority);
        let client = (
            scratch.write("client.crt", &client_cert),
            scratch.write("client.key", &client_key),
        );
        let port = free_port().unwrap();
        let child = Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .arg("--tls-cert-file")
            .arg(&cert_path)
            .arg("--tls-key-file")
            .arg(&key_path)
            .arg("--tls-ca-cert-file")
            .arg(&ca)
            .args([
                "--tls-auth-clients",
                if client_certificates { "yes" } else { "no" },
            ])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&scratch.0)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server (make test installs it)");
        Self {
            _scratch: scratch,
            port,
            ca,
            client,
            child,
        }
    }

    fn url(&self, credentials: &str) -> String {
        format!("rediss://{credentials}localhost:{}", self.port)
    }

    /// The default user, over TLS: to set up the ACL user and to check what it may do.
    async fn admin(&self) -> fred::clients::Client {
        let files = inventory_redis::RedisTlsFiles {
            ca: Some(self.ca.clone()),
            cert: Some(self.client.0.clone()),
            key: Some(self.client.1.clone()),
        };
        let config = inventory_redis::parse_url_with_tls(&self.url(""), &files).unwrap();
        let client = fred::types::Builder::from_config(config).build().unwrap();
        let _ = inventory_testkit::process::eventually_ok(
            "the TLS Redis listens",
            Duration::from_secs(2),
            || tokio::net::TcpStream::connect(("127.0.0.1", self.port)),
        )
        .await;
        client.init().await.expect("connect to the TLS Redis");
        client
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn rediss_with_an_acl_user_serves_reserve_and_a_wrong_ca_fails_at_start_up() {
    let redis = TlsRedis::start(false);
    let admin = redis.admin().await;
    let prefix = format!("test:{}", uuid::Uuid::new_v4().simple());
    let mut setuser = vec!["SETUSER".to_string(), "inventory".to_string()];
    setuser.extend(acl_rules(&prefix));
    let _: () = admin
        .custom(fred::cmd!("ACL"), setuser)
        .await
        .expect("ACL SETUSER");

    let files = inventory_redis::RedisTlsFiles {
        ca: Some(redis.ca.clone()),
        ..Default::default()
    };
    let url = redis.url("inventory:acl-user-password@");
    let database = crate::helpers::fresh_database().await;

    // A CA that did not sign the server's certificate: start-up fails with the reason.
    let stranger = Scratch::new("redis-stranger-ca");
    let wrong = inventory_redis::RedisTlsFiles {
        ca: Some(stranger.write("ca.pem", &ca("someone else").pem())),
        ..Default::default()
    };
    let mut settings = test_settings(database.clone());
    settings.redis.config = inventory_redis::parse_url_with_tls(&url, &wrong).unwrap();
    let error = format!("{:#}", Application::build(settings).await.unwrap_err());
    assert!(error.contains("Redis refused the connection"), "{error}");

    // A wrong password: also a configuration error, also at start-up.
    let mut settings = test_settings(database.clone());
    settings.redis.config =
        inventory_redis::parse_url_with_tls(&redis.url("inventory:wrong@"), &files).unwrap();
    let error = format!("{:#}", Application::build(settings).await.unwrap_err());
    assert!(error.contains("Redis refused the connection"), "{error}");

    // The right CA and the ACL user: Reserve works, its lease and fence under the prefix.
    let mut settings = test_settings_with_redis(database, &redis_url());
    settings.redis.config = inventory_redis::parse_url_with_tls(&url, &files).unwrap();
    settings.redis.client.key_prefix = inventory_redis::KeyPrefix::parse(&prefix).unwrap();
    let app: TestApp = spawn_app_with(settings).await;
    app.client
        .clone()
        .adjust_stock(adjust("ACL-1", 2, "seed"))
        .await
        .unwrap();
    let hold = app
        .client
        .clone()
        .reserve(reserve("k-1", &[("ACL-1", 1)]))
        .await
        .expect("Reserve over rediss:// as the ACL user");
    assert_eq!(hold.into_inner().lines[0].quantity, 1);
    let fence: Option<i64> = admin.get(app.fence_key("ACL-1")).await.unwrap();
    assert_eq!(fence, Some(1), "the fence counter lives under the prefix");
    eventually(
        "the ACL user subscribed to lease releases",
        Duration::from_secs(10),
        || async { app.inventory.leases().hears_releases() },
    )
    .await
    .unwrap();

    // What the ACL user may not do: anything else, or any key outside the prefix.
    let user_config = inventory_redis::parse_url_with_tls(&url, &files).unwrap();
    let user = fred::types::Builder::from_config(user_config)
        .build()
        .unwrap();
    user.init().await.unwrap();
    let flush: Result<(), _> = user
        .custom(fred::cmd!("FLUSHALL"), Vec::<String>::new())
        .await;
    let error = flush.expect_err("FLUSHALL is not the service's to run");
    assert!(error.details().contains("NOPERM"), "{error:?}");
    let outside: Result<Option<String>, _> = user.get("someone-else:key").await;
    assert!(
        outside
            .expect_err("keys outside the prefix")
            .details()
            .contains("NOPERM"),
        "keys outside the prefix are refused"
    );
    let _ = user.quit().await;
    app.stop().await.unwrap();
}

#[tokio::test]
async fn a_redis_that_demands_client_certificates_gets_one_from_the_settings() {
    let redis = TlsRedis::start(true);
    // The harness's own connection (with the client certificate) waits for the port.
    let _ = redis.admin().await;
    let database = crate::helpers::fresh_database().await;
    let url = redis.url("");
    let without = inventory_redis::RedisTlsFiles {
        ca: Some(redis.ca.clone()),
        ..Default::default()
    };
    let mut settings = test_settings(database.clone());
    settings.redis.config = inventory_redis::parse_url_with_tls(&url, &without).unwrap();
    let error = format!("{:#}", Application::build(settings).await.unwrap_err());
    assert!(error.contains("Redis refused the connection"), "{error}");

    let with = inventory_redis::RedisTlsFiles {
        ca: Some(redis.ca.clone()),
        cert: Some(redis.client.0.clone()),
        key: Some(redis.client.1.clone()),
    };
    let mut settings = test_settings(database);
    settings.redis.config = inventory_redis::parse_url_with_tls(&url, &with).unwrap();
    let app = spawn_app_with(settings).await;
    app.client
        .clone()
        .adjust_stock(adjust("MTLS-1", 1, "seed"))
        .await
        .unwrap();
    app.hold("k-1", &[("MTLS-1", 1)]).await;
    app.stop().await.unwrap();
}

#[test]
fn tls_settings_that_cannot_work_are_refused_before_anything_connects() {
    let files = inventory_redis::RedisTlsFiles {
        ca: Some("/nonexistent/ca.pem".into()),
        ..Default::default()
    };
    let plain = inventory_redis::parse_url_with_tls("redis://127.0.0.1:6379", &files).unwrap_err();
    assert!(
        plain.details().contains("need a rediss:// URL"),
        "{plain:?}"
    );
    let missing =
        inventory_redis::parse_url_with_tls("rediss://127.0.0.1:6379", &files).unwrap_err();
    assert!(
        missing.details().contains("/nonexistent/ca.pem"),
        "{missing:?}"
    );

    let no_root = "postgres://db/x?sslmode=verify-full"
        .parse::<PgConfig>()
        .unwrap_err();
    assert!(
        no_root.to_string().contains("needs sslrootcert"),
        "{no_root}"
    );
    let bad_mode = "host=db sslmode=verify".parse::<PgConfig>().unwrap_err();
    assert!(bad_mode.to_string().contains("sslmode"), "{bad_mode}");
}
