//! Redis: `redis-server` processes that can be killed, paused and restarted on the same port,
//! alone or in one of three topologies.

use std::{
    fs::File,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, bail};
use tokio::process::Command;

use crate::{
    ports::{free_port, loopback},
    process::{Process, eventually, output},
    proxy::Proxy,
    scratch::Scratch,
};

/// One `redis-server` process (a data node or a Sentinel) that can be killed, paused and
/// started again on the same port. Data nodes keep nothing on disk, as a cache-only Redis
/// runs: a restart comes back empty.
#[derive(Debug)]
pub struct RedisNode {
    pub port: u16,
    dir: PathBuf,
    args: Vec<String>,
    sentinel: bool,
    process: Process,
    /// A folder of the node's own, removed after the process is gone.
    _scratch: Option<Scratch>,
}

impl RedisNode {
    /// Starts a node on a free port with its files in `dir`; `args` come first on its command
    /// line (a configuration file, `--sentinel`, replication or cluster options).
    pub async fn start(dir: PathBuf, args: Vec<String>) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let mut node = Self {
            port: free_port()?,
            dir,
            sentinel: args.iter().any(|a| a == "--sentinel"),
            args,
            process: Process::default(),
            _scratch: None,
        };
        node.spawn().await?;
        Ok(node)
    }

    /// A lone node in a scratch folder removed when the node is dropped.
    pub async fn start_scratch() -> anyhow::Result<Self> {
        let scratch = Scratch::new("redis");
        let mut node = Self::start(scratch.0.clone(), Vec::new()).await?;
        node._scratch = Some(scratch);
        Ok(node)
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("redis.log"))?;
        let mut command = Command::new("redis-server");
        command.args(&self.args);
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--protected-mode", "no"]);
        if !self.sentinel {
            command.args(["--save", "", "--appendonly", "no"]);
        }
        command
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        self.process = Process::new(
            command
                .spawn()
                .context("start redis-server (make test installs it)")?,
        );
        eventually(
            "redis-server did not answer PING",
            Duration::from_secs(10),
            || async { self.cli(&["ping"]).await.is_ok_and(|o| o.trim() == "PONG") },
        )
        .await
    }

    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// Runs `redis-cli` against this node.
    pub async fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let port = self.port.to_string();
        let mut argv = vec!["-p", &port];
        argv.extend_from_slice(args);
        output("redis-cli", &argv).await
    }

    /// SIGKILL: the node is gone at once, with everything it held.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.process.kill().await
    }

    /// Starts again on the same port (killing the node first if it runs), empty.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill().await?;
        self.spawn().await
    }

    /// SIGSTOP: the node keeps its connections but answers nothing until [`Self::resume`].
    pub async fn pause(&self) -> anyhow::Result<()> {
        self.process.pause().await
    }

    /// SIGCONT: a paused node reads what queued up meanwhile and answers it.
    pub async fn resume(&self) -> anyhow::Result<()> {
        self.process.resume().await
    }
}

/// How Redis is laid out.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// One instance, reached through a fault proxy.
    Single,
    /// A primary, one replica and three Sentinels; clients connect through the Sentinels.
    Sentinel,
    /// Three primaries sharing the 16384 slots, no replicas.
    Cluster,
}

impl Topology {
    pub const ALL: [Topology; 3] = [Topology::Single, Topology::Sentinel, Topology::Cluster];

    pub fn name(self) -> &'static str {
        match self {
            Topology::Single => "single",
            Topology::Sentinel => "sentinel",
            Topology::Cluster => "cluster",
        }
    }
}

const SENTINEL_SERVICE: &str = "chaos";

/// Redis in one topology.
#[derive(Debug)]
pub struct Redis {
    pub topology: Topology,
    /// Data nodes: the one instance; primary then replica; the three cluster primaries.
    pub nodes: Vec<RedisNode>,
    pub sentinels: Vec<RedisNode>,
    /// `Single` only: clients reach Redis through it.
    pub proxy: Option<Proxy>,
}

impl Redis {
    /// Starts the topology afresh in `dir` (whatever an earlier run left there is removed:
    /// cluster nodes remember their cluster in `nodes.conf`).
    pub async fn start(topology: Topology, dir: &Path) -> anyhow::Result<Self> {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        let mut redis = Self {
            topology,
            nodes: Vec::new(),
            sentinels: Vec::new(),
            proxy: None,
        };
        match topology {
            Topology::Single => {
                let node = RedisNode::start(dir.join("redis-0"), Vec::new()).await?;
                redis.proxy = Some(Proxy::start(node.addr()).await?);
                redis.nodes.push(node);
            }
            Topology::Sentinel => redis.start_sentinel(dir).await?,
            Topology::Cluster => redis.start_cluster(dir).await?,
        }
        Ok(redis)
    }

    async fn start_sentinel(&mut self, dir: &Path) -> anyhow::Result<()> {
        let primary = RedisNode::start(dir.join("redis-0"), Vec::new()).await?;
        let primary_port = primary.port.to_string();
        let replica = RedisNode::start(
            dir.join("redis-1"),
            vec![
                "--replicaof".into(),
                "127.0.0.1".into(),
                primary_port.clone(),
            ],
        )
        .await?;
        eventually(
            "the replica did not sync",
            Duration::from_secs(20),
            || async {
                replica
                    .cli(&["info", "replication"])
                    .await
                    .is_ok_and(|o| o.contains("master_link_status:up"))
            },
        )
        .await?;
        self.nodes = vec![primary, replica];
        for i in 0..3 {
            let sentinel_dir = dir.join(format!("sentinel-{i}"));
            std::fs::create_dir_all(&sentinel_dir)?;
            // Sentinel rewrites its configuration file, so each has its own writable one.
            let conf = sentinel_dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {primary_port} 2\n\
                     sentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\n\
                     sentinel failover-timeout {SENTINEL_SERVICE} 5000\n\
                     sentinel parallel-syncs {SENTINEL_SERVICE} 1\n"
                ),
            )?;
            let args = vec![conf.display().to_string(), "--sentinel".into()];
            self.sentinels
                .push(RedisNode::start(sentinel_dir, args).await?);
        }
        let first = &self.sentinels[0];
        eventually(
            "the Sentinels did not find each other",
            Duration::from_secs(30),
            || async {
                first
                    .cli(&["sentinel", "ckquorum", SENTINEL_SERVICE])
                    .await
                    .is_ok_and(|o| o.contains("3 usable"))
            },
        )
        .await
    }

    async fn start_cluster(&mut self, dir: &Path) -> anyhow::Result<()> {
        for i in 0..3 {
            // The bus port is chosen too: by default it is the node's port + 10,000, which
            // lands in the ephemeral range, where an outgoing connection may already hold it.
            let bus_port = free_port()?.to_string();
            let args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
                "--cluster-port",
                &bus_port,
            ]
            .map(String::from)
            .to_vec();
            self.nodes
                .push(RedisNode::start(dir.join(format!("redis-{i}")), args).await?);
        }
        let addrs: Vec<String> = self.nodes.iter().map(|n| n.addr().to_string()).collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        output("redis-cli", &args).await.context("cluster create")?;
        self.wait_healthy().await
    }

    /// The URL clients are given.
    pub fn url(&self) -> String {
        match self.topology {
            Topology::Single => format!(
                "redis://{}",
                self.proxy.as_ref().expect("single has a proxy").addr()
            ),
            Topology::Sentinel => {
                let mut url = format!(
                    "redis-sentinel://{}/0?sentinelServiceName={SENTINEL_SERVICE}",
                    self.sentinels[0].addr()
                );
                for s in &self.sentinels[1..] {
                    url.push_str(&format!("&node={}", s.addr()));
                }
                url
            }
            Topology::Cluster => {
                let mut url = format!("redis-cluster://{}", self.nodes[0].addr());
                for (i, n) in self.nodes[1..].iter().enumerate() {
                    url.push_str(if i == 0 { "?" } else { "&" });
                    url.push_str(&format!("node={}", n.addr()));
                }
                url
            }
        }
    }

    /// The data node Sentinel currently names primary.
    pub async fn sentinel_primary(&self) -> anyhow::Result<usize> {
        for sentinel in &self.sentinels {
            if let Ok(out) = sentinel
                .cli(&["sentinel", "get-master-addr-by-name", SENTINEL_SERVICE])
                .await
            {
                let port: Option<u16> = out.lines().nth(1).and_then(|p| p.trim().parse().ok());
                if let Some(i) = self.nodes.iter().position(|n| Some(n.port) == port) {
                    return Ok(i);
                }
            }
        }
        bail!("no Sentinel names a primary")
    }

    /// Waits until the topology serves writes again: every cluster node reports `ok`, or
    /// Sentinel names a primary that answers as one.
    pub async fn wait_healthy(&self) -> anyhow::Result<()> {
        match self.topology {
            Topology::Single => Ok(()),
            Topology::Cluster => {
                eventually("the cluster is not ok", Duration::from_secs(30), || async {
                    for node in &self.nodes {
                        if !node
                            .cli(&["cluster", "info"])
                            .await
                            .is_ok_and(|o| o.contains("cluster_state:ok"))
                        {
                            return false;
                        }
                    }
                    true
                })
                .await
            }
            Topology::Sentinel => {
                eventually(
                    "Sentinel names no live primary",
                    Duration::from_secs(30),
                    || async {
                        match self.sentinel_primary().await {
                            Ok(i) => self.nodes[i]
                                .cli(&["info", "replication"])
                                .await
                                .is_ok_and(|o| o.contains("role:master")),
                            Err(_) => false,
                        }
                    },
                )
                .await
            }
        }
    }

    /// Which cluster node serves a hash slot (as `redis-cli --cluster create` splits them).
    pub fn cluster_node_of_slot(&self, slot: u16) -> usize {
        match slot {
            0..=5460 => 0,
            5461..=10922 => 1,
            _ => 2,
        }
    }
}

#[cfg(test)]
mod tests;
