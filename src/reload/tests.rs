use std::path::PathBuf;

use tonic::Request;

use super::*;
use crate::auth::Authenticator;
use crate::{
    auth::{Action, digest_hex},
    config::{TlsFiles, TlsSettings},
};

struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let path = std::env::temp_dir().join(format!(
            "inventory-reload-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn admin(token: &str) -> String {
    format!("ops admin token-sha256:{}\n", digest_hex(token.as_bytes()))
}

fn allows(gate: &Gate, token: &str) -> bool {
    let mut request = Request::new(crate::proto::GetStockRequest::default());
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    gate.authorize(&request, Action::Adjust).is_ok()
}

#[test]
fn a_broken_credentials_file_is_refused_whole_and_a_good_one_replaces_the_set() {
    let scratch = Scratch::new();
    let file = scratch.0.join("tokens");
    std::fs::write(&file, admin("first")).unwrap();
    let gate = Gate::new(Authenticator::from_file(&file).unwrap());
    let sources = ReloadSources {
        auth: Some(crate::auth::AuthSources {
            tokens_file: Some(file.clone()),
            ..Default::default()
        }),
        tls: None,
    };
    let mut reloader = Reloader::new(sources, gate.clone(), None);

    // One good line and one bad: nothing of it applies.
    std::fs::write(
        &file,
        format!("{}ops boss token-sha256:00\n", admin("second")),
    )
    .unwrap();
    reloader.reload();
    assert!(allows(&gate, "first"));
    assert!(!allows(&gate, "second"));

    // A file that vanished (mid-swap) changes nothing either.
    std::fs::remove_file(&file).unwrap();
    reloader.reload();
    assert!(allows(&gate, "first"));

    std::fs::write(&file, admin("second")).unwrap();
    reloader.reload();
    assert!(allows(&gate, "second"));
    assert!(!allows(&gate, "first"));
}

#[test]
fn broken_tls_material_is_refused_and_the_certificate_in_force_stays() {
    use rcgen::{CertificateParams, KeyPair};
    let scratch = Scratch::new();
    let files = TlsFiles {
        cert: scratch.0.join("tls.crt"),
        key: scratch.0.join("tls.key"),
        client_ca: None,
    };
    let write = |cert: &str, key: &str| {
        std::fs::write(&files.cert, cert).unwrap();
        std::fs::write(&files.key, key).unwrap();
    };
    let issue = || {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (first_cert, first_key) = issue();
    write(&first_cert, &first_key);
    let material: TlsSettings = files.read().unwrap();
    let server_tls = ServerTls::new(&material).unwrap();
    let sources = ReloadSources {
        auth: None,
        tls: Some(files.clone()),
    };
    let mut reloader = Reloader::new(
        sources,
        Gate::new(Authenticator::disabled()),
        Some(server_tls),
    );
    // The first pass takes what is on disk as the material in force.
    reloader.reload();
    let in_force = reloader.tls_digest;
    assert!(in_force.is_some());

    // A certificate with another certificate's key: refused.
    let (second_cert, second_key) = issue();
    write(&second_cert, &first_key);
    reloader.reload();
    assert_eq!(
        reloader.tls_digest, in_force,
        "the mismatched pair was not applied"
    );

    write("garbage", "garbage");
    reloader.reload();
    assert_eq!(reloader.tls_digest, in_force);

    write(&second_cert, &second_key);
    reloader.reload();
    assert_ne!(reloader.tls_digest, in_force, "a good pair is applied");
}
