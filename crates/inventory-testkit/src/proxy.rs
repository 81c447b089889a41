//! A TCP proxy on loopback with three switches: added latency, cut-off and stall.
//!
//! Servers under test reach PostgreSQL (and a single Redis) through one of these, so a fault
//! can make the path slow, sever it or silence it without touching the process behind it.
//! Cutting drops every open connection at once and refuses new ones until the cut is lifted,
//! like a network partition with a firewall that answers; latency delays every chunk in both
//! directions; stalling keeps every connection open and holds the bytes both ways until it
//! is lifted, as a hung database or a network that went silent does.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};

#[derive(Debug)]
struct Switches {
    latency_us: AtomicU64,
    cut: AtomicBool,
    /// Bumped on every cut, so connections opened before it end.
    generation: watch::Sender<u64>,
    stalled: watch::Sender<bool>,
}

/// A running proxy; it stops when dropped.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    switches: Arc<Switches>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on an ephemeral loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), upstream).await
    }

    /// Listens on `listen` and forwards to `upstream`.
    pub async fn start_on(listen: SocketAddr, upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let switches = Arc::new(Switches {
            latency_us: AtomicU64::new(0),
            cut: AtomicBool::new(false),
            generation: watch::channel(0).0,
            stalled: watch::channel(false).0,
        });
        let accept = tokio::spawn(accept_loop(listener, upstream, switches.clone()));
        Ok(Self {
            addr,
            switches,
            accept,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Delay added to every chunk, each way.
    pub fn set_latency(&self, latency: Duration) {
        self.switches
            .latency_us
            .store(latency.as_micros() as u64, Ordering::SeqCst);
    }

    /// Severs every connection and refuses new ones (`true`), or lets them through again.
    pub fn set_cut(&self, cut: bool) {
        self.switches.cut.store(cut, Ordering::SeqCst);
        if cut {
            self.switches.generation.send_modify(|g| *g += 1);
        }
    }

    /// Holds every byte, both ways, on open connections and new ones alike (`true`), or
    /// delivers them again, held ones first.
    pub fn set_stalled(&self, stalled: bool) {
        self.switches.stalled.send_replace(stalled);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.switches.generation.send_modify(|g| *g += 1);
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, switches: Arc<Switches>) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        if switches.cut.load(Ordering::SeqCst) {
            drop(inbound);
            continue;
        }
        let switches = switches.clone();
        tokio::spawn(async move {
            let mut severed = switches.generation.subscribe();
            let Ok(outbound) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let (client_read, client_write) = inbound.into_split();
            let (server_read, server_write) = outbound.into_split();
            tokio::select! {
                _ = pump(client_read, server_write, &switches) => {}
                _ = pump(server_read, client_write, &switches) => {}
                _ = severed.changed() => {}
            }
        });
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    switches: &Switches,
) {
    let mut stalled = switches.stalled.subscribe();
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        if stalled.wait_for(|on| !*on).await.is_err() {
            return;
        }
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            _ = stalled.wait_for(|on| *on) => continue,
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Bytes read just as the stall began wait for it to end.
        if stalled.wait_for(|on| !*on).await.is_err() {
            return;
        }
        let latency = switches.latency_us.load(Ordering::SeqCst);
        if latency > 0 {
            tokio::time::sleep(Duration::from_micros(latency)).await;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
