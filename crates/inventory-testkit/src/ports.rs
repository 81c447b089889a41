//! Free loopback ports.

use std::net::{SocketAddr, TcpListener};

use anyhow::bail;

/// A free loopback port below the kernel's ephemeral range, so that while a process is down
/// for a restart no outgoing connection can take its port. Bound, then released: the caller
/// hands it to the process that listens on it. Not port 0: the kernel answers that from the
/// ephemeral range itself, where the port is up for grabs again the moment it is released.
pub fn free_port() -> anyhow::Result<u16> {
    let (low, high) = range();
    for _ in 0..200 {
        let port = rand::random_range(low..high);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free port in {low}..{high}")
}

/// The range [`free_port`] picks from: the 12,000 ports below the ephemeral range (never below
/// 1024).
fn range() -> (u16, u16) {
    let ephemeral_low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768);
    (
        ephemeral_low.saturating_sub(12_000).max(1_024),
        ephemeral_low,
    )
}

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

#[cfg(test)]
mod tests;
