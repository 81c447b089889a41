//! Compiles `proto/` with the pure-Rust `protox` compiler, so building needs no `protoc`.
//!
//! The descriptor set is also written to `OUT_DIR` for server reflection, which is what lets
//! `grpcurl` call the service without a local copy of the proto files.

use std::{env, fs, path::PathBuf};

use protox::prost::Message as _;

const PROTOS: &[&str] = &["proto/inventory/v1/inventory.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    let descriptors = protox::compile(PROTOS, ["proto"])?;
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
