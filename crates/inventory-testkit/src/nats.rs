//! NATS: a `nats-server` with JetStream that a test can kill and start again on the same
//! port, with its store kept (or wiped).

use std::{fs::File, net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context as _;
use tokio::process::Command;

use crate::{
    ports::{free_port, loopback},
    process::{Process, eventually},
    scratch::Scratch,
};

/// One `nats-server -js` process, its store in a scratch folder of its own.
#[derive(Debug)]
pub struct NatsNode {
    pub port: u16,
    dir: PathBuf,
    process: Process,
    _scratch: Scratch,
}

impl NatsNode {
    pub async fn start() -> anyhow::Result<Self> {
        let scratch = Scratch::new("nats");
        let mut node = Self {
            port: free_port()?,
            dir: scratch.0.clone(),
            process: Process::default(),
            _scratch: scratch,
        };
        node.spawn().await?;
        Ok(node)
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("nats.log"))?;
        let mut command = Command::new("nats-server");
        command
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.dir.join("store"))
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        self.process = Process::new(
            command
                .spawn()
                .context("start nats-server (make test installs it)")?,
        );
        let addr = self.addr();
        eventually(
            "nats-server did not accept connections",
            Duration::from_secs(10),
            || async move { tokio::net::TcpStream::connect(addr).await.is_ok() },
        )
        .await
    }

    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr())
    }

    /// SIGKILL: gone at once; what it had written to its store stays.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.process.kill().await
    }

    /// Starts again on the same port with the same store (killing the server first if it
    /// runs).
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill().await?;
        self.spawn().await
    }
}
