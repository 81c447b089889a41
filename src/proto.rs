//! Code generated from `proto/` by `build.rs`.

pub mod inventory {
    pub mod v1 {
        tonic::include_proto!("inventory.v1");
    }
}

pub use inventory::v1::*;

/// The encoded descriptors of `proto/`, served by reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("inventory_descriptor");
