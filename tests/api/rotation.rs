//! Rotation without a restart: the credentials file and the gRPC port's certificate change on
//! disk while the server runs, the way a Kubernetes Secret update changes them.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use inventory_server::{
    auth::{AuthSources, Authenticator, digest_hex},
    config::TlsFiles,
    proto::{WatchEventsRequest, inventory_service_client::InventoryServiceClient},
};
use tokio_stream::StreamExt as _;
use tonic::{
    Code,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
};

use crate::{
    helpers::{
        Scratch, adjust, fresh_database, get_stock, spawn_app_with, test_settings, with_token,
    },
    tls::{ca, leaf},
};

/// Replaces `path` whole, as `mv` and most tools do: readers see the old file or the new one.
fn replace(path: &Path, contents: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, contents).unwrap();
    std::fs::rename(next, path).unwrap();
}

fn credentials(lines: &[(&str, &str, &str)]) -> String {
    lines
        .iter()
        .map(|(name, role, token)| {
            format!(
                "{name} {role} token-sha256:{}\n",
                digest_hex(token.as_bytes())
            )
        })
        .collect()
}

async fn read_code(client: &mut InventoryServiceClient<Channel>, token: &str) -> Code {
    let request = with_token(get_stock(&["ROT-1"]), Some(token));
    match client.get_stock(request).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test]
async fn a_rotated_token_file_takes_effect_within_a_second_and_open_streams_go_on() {
    let scratch = Scratch::new("rotation");
    let file = scratch.0.join("tokens");
    std::fs::write(
        &file,
        credentials(&[
            ("ops", "admin", "old-admin"),
            ("feed", "watcher", "old-feed"),
        ]),
    )
    .unwrap();
    let mut settings = test_settings(fresh_database().await);
    settings.auth.authenticator = Authenticator::from_file(&file).unwrap();
    settings.auth.sources = Some(AuthSources {
        tokens_file: Some(file.clone()),
        ..AuthSources::default()
    });
    let app = spawn_app_with(settings).await;
    let mut client = app.client.clone();
    assert_eq!(read_code(&mut client, "old-admin").await, Code::NotFound);

    // A stream opened under the old credentials.
    let mut events = client
        .watch_events(with_token(
            WatchEventsRequest {
                after_sequence: 0,
                ..Default::default()
            },
            Some("old-feed"),
        ))
        .await
        .unwrap()
        .into_inner();

    // The new set: the admin token rotated, the feed's kept.
    replace(
        &file,
        &credentials(&[
            ("ops", "admin", "new-admin"),
            ("feed", "watcher", "old-feed"),
        ]),
    );
    let changed = Instant::now();
    while read_code(&mut client, "new-admin").await != Code::NotFound {
        assert!(
            changed.elapsed() < Duration::from_secs(1),
            "the new token works within a second of the file change"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        read_code(&mut client, "old-admin").await,
        Code::Unauthenticated
    );

    // The stream opened before the change still delivers.
    client
        .adjust_stock(with_token(
            adjust("ROT-1", 1, "after-rotation"),
            Some("new-admin"),
        ))
        .await
        .unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("the open stream is unaffected by the rotation")
        .unwrap()
        .unwrap();
    assert_eq!(
        event.r#type,
        inventory_server::proto::EventType::StockAdjusted as i32
    );
}

/// A Secret volume as the kubelet lays it out: the files are symlinks through `..data`, and an
/// update swaps `..data` to a new folder in one rename.
struct SecretVolume {
    root: Scratch,
    version: u32,
}

impl SecretVolume {
    fn new(cert: &str, key: &str) -> Self {
        let mut volume = Self {
            root: Scratch::new("rotation"),
            version: 0,
        };
        volume.update(cert, key);
        for name in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{name}"), volume.root.0.join(name)).unwrap();
        }
        volume
    }

    fn update(&mut self, cert: &str, key: &str) {
        self.version += 1;
        let folder = format!("..{}", self.version);
        std::fs::create_dir(self.root.0.join(&folder)).unwrap();
        std::fs::write(self.root.0.join(&folder).join("tls.crt"), cert).unwrap();
        std::fs::write(self.root.0.join(&folder).join("tls.key"), key).unwrap();
        let staged = self.root.0.join("..data_tmp");
        std::os::unix::fs::symlink(&folder, &staged).unwrap();
        std::fs::rename(staged, self.root.0.join("..data")).unwrap();
    }

    fn files(&self) -> TlsFiles {
        TlsFiles {
            cert: self.root.0.join("tls.crt"),
            key: self.root.0.join("tls.key"),
            client_ca: None,
        }
    }
}

async fn connect_tls(addr: std::net::SocketAddr, ca_pem: &str) -> Result<Channel, String> {
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca_pem))
                .domain_name("localhost"),
        )
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|error| format!("{error:?}"))
}

async fn reaches_service(channel: Channel) -> bool {
    let answer = InventoryServiceClient::new(channel)
        .get_stock(get_stock(&["ROT-1"]))
        .await;
    matches!(answer, Err(status) if status.code() == Code::NotFound)
}

#[tokio::test]
async fn a_swapped_certificate_serves_new_connections_and_old_ones_go_on() {
    let (old_ca, new_ca) = (ca("old CA"), ca("new CA"));
    let (old_cert, old_key) = leaf(&["localhost"], &old_ca);
    let (new_cert, new_key) = leaf(&["localhost"], &new_ca);
    let mut volume = SecretVolume::new(&old_cert, &old_key);
    let mut settings = test_settings(fresh_database().await);
    settings.server.tls = Some(volume.files().read().unwrap());
    settings.server.tls_files = Some(volume.files());
    let app = spawn_app_with(settings).await;

    let before = connect_tls(app.addr, &old_ca.pem()).await.unwrap();
    assert!(reaches_service(before.clone()).await);

    volume.update(&new_cert, &new_key);
    let new_ca_pem = new_ca.pem();
    let after = inventory_testkit::process::eventually_ok(
        "the new certificate is served",
        Duration::from_secs(2),
        || connect_tls(app.addr, &new_ca_pem),
    )
    .await
    .unwrap();
    assert!(reaches_service(after).await);
    assert!(
        connect_tls(app.addr, &old_ca.pem()).await.is_err(),
        "new connections get the new certificate only"
    );
    assert!(
        reaches_service(before).await,
        "a connection made before the swap goes on serving"
    );
}
