//! A TCP proxy on loopback with two switches: added latency, and cut-off.
//!
//! The servers reach PostgreSQL (and a single Redis) through one of these, so a fault can make
//! the path slow or sever it without touching the process behind it. Cutting drops every open
//! connection at once and refuses new ones until the cut is lifted, like a network partition
//! with a firewall that answers; latency delays every chunk in both directions.

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
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let switches = Arc::new(Switches {
            latency_us: AtomicU64::new(0),
            cut: AtomicBool::new(false),
            generation: watch::channel(0).0,
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
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
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
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buffer = [0u8; 64];
                    while let Ok(n) = socket.read(&mut buffer).await {
                        if n == 0 || socket.write_all(&buffer[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
        stream.write_all(b"ping").await?;
        let mut reply = [0u8; 4];
        stream.read_exact(&mut reply).await?;
        Ok(reply.to_vec())
    }

    #[tokio::test]
    async fn forwards_then_cuts_then_heals() {
        let proxy = Proxy::start(echo_server().await).await.unwrap();
        let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut open).await.unwrap(), b"ping");

        proxy.set_cut(true);
        // The open connection is severed, and a new one gets no answer.
        assert!(round_trip(&mut open).await.is_err());
        let mut refused = TcpStream::connect(proxy.addr()).await.unwrap();
        assert!(round_trip(&mut refused).await.is_err());

        proxy.set_cut(false);
        let mut healed = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut healed).await.unwrap(), b"ping");
    }

    #[tokio::test]
    async fn latency_delays_each_direction() {
        let proxy = Proxy::start(echo_server().await).await.unwrap();
        proxy.set_latency(Duration::from_millis(100));
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        let started = tokio::time::Instant::now();
        assert_eq!(round_trip(&mut stream).await.unwrap(), b"ping");
        // Once on the way in and once on the way out: a lower bound, never flaky.
        assert!(started.elapsed() >= Duration::from_millis(200));
    }
}
