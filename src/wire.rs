//! The wire format, both directions: [`Decode`] turns a protobuf request into a core command
//! for its caller (or every field violation at once), [`Encode`] turns a core value into its
//! protobuf message. The gRPC handlers only call these two; no protobuf type is built or
//! read anywhere else in the server.

mod decode;
mod encode;
mod feeds;
pub mod forward;

pub use decode::Decode;
pub use encode::{BatchLevels, Encode};
pub use feeds::{Deleted, heartbeat};

#[cfg(test)]
mod tests;
