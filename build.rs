//! Compiles `proto/` with the pure-Rust `protox` compiler, so building needs no `protoc`.
//!
//! This is the build script of `crates/inventory-proto` (its manifest points here): the API
//! is compiled once, in one crate, and every other crate depends on that crate. The descriptor
//! set is also written to `OUT_DIR` for server reflection, which is what lets `grpcurl` call
//! the service without a local copy of the proto files.

use std::{env, fs, path::PathBuf};

use protox::prost::Message as _;

const PROTOS: &[&str] = &["inventory/v1/inventory.proto"];

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

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
