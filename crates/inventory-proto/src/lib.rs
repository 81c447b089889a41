//! The API of `inventory-server` as Rust types: messages, the client and server stubs, and
//! the encoded descriptors served by reflection.
//!
//! Generated from the top-level `proto/` by the workspace's `build.rs` with the pure-Rust
//! `protox` compiler, so no `protoc` is needed. Every crate that speaks the API depends on
//! this one, never on the server.

pub mod inventory {
    pub mod v1 {
        tonic::include_proto!("inventory.v1");
    }
    /// Replica-to-replica calls (the internal peer port); not part of the public API.
    pub mod peer {
        pub mod v2 {
            tonic::include_proto!("inventory.peer.v2");
        }
    }
}

pub use inventory::v1::*;

/// The encoded descriptors of `proto/`, served by reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("inventory_descriptor");

/// The commit this build was made from: `GIT_COMMIT` at build time, else the checkout's
/// `HEAD`, else `unknown`.
pub const BUILD_COMMIT: &str = env!("INVENTORY_BUILD_COMMIT");
