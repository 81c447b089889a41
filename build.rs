//! Compiles `proto/` with the pure-Rust `protox` compiler, so building needs no `protoc`.
//!
//! This is the build script of `crates/inventory-proto` (its manifest points here): the API
//! is compiled once, in one crate, and every other crate depends on that crate. The descriptor
//! set is also written to `OUT_DIR` for server reflection, which is what lets `grpcurl` call
//! the service without a local copy of the proto files.
//!
//! It also names the commit being built (`INVENTORY_BUILD_COMMIT`, read by the crate as
//! `BUILD_COMMIT` and exported as `inventory_build_info`): `GIT_COMMIT` when set (the
//! Dockerfile's build argument: its context has no `.git`), else the checkout's `HEAD`.

use std::{env, fs, path::Path, path::PathBuf, process::Command};

use protox::prost::Message as _;

/// The public API: compiled, and served by reflection.
const PROTOS: &[&str] = &["inventory/v1/inventory.proto"];
/// Replica-to-replica calls: compiled, never served by reflection.
const INTERNAL_PROTOS: &[&str] = &["inventory/peer/v2/peer.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The script runs in the crate's folder; `proto/` stays at the top of the workspace.
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("../../proto");
    println!("cargo:rerun-if-changed={}", proto_root.display());
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    let files: Vec<PathBuf> = PROTOS.iter().map(|p| proto_root.join(p)).collect();
    let descriptors = protox::compile(&files, [&proto_root])?;
    fs::write(
        out_dir.join("inventory_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;

    // The peer file imports the public one, so this set holds both.
    let internal: Vec<PathBuf> = INTERNAL_PROTOS.iter().map(|p| proto_root.join(p)).collect();
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(protox::compile(&internal, [&proto_root])?)?;

    println!(
        "cargo:rustc-env=INVENTORY_BUILD_COMMIT={}",
        build_commit(&manifest_dir.join("../.."))
    );
    Ok(())
}

fn build_commit(workspace: &Path) -> String {
    println!("cargo:rerun-if-env-changed=GIT_COMMIT");
    if let Some(commit) = env::var("GIT_COMMIT").ok().filter(|c| !c.trim().is_empty()) {
        return commit.trim().to_owned();
    }
    // Built again when HEAD moves: a commit, a checkout, a reset. HEAD's reflog records
    // every move (in a worktree too: git names the files of this checkout); HEAD itself
    // covers a repository without a reflog. Only files that exist are named: one that does
    // not would run this script on every build.
    for file in ["logs/HEAD", "HEAD"] {
        if let Some(path) = git(workspace, &["rev-parse", "--git-path", file]) {
            let path = workspace.join(path);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    git(workspace, &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
}

/// What `git args` prints in `workspace`, trimmed; `None` without git or a repository.
fn git(workspace: &Path, args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .current_dir(workspace)
        .output()
        .ok()
        .filter(|output| output.status.success())
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .map(|text| text.trim().to_owned())
        .filter(|text| !text.is_empty())
}
