//! The real processes a run starts, pauses, kills and restarts: one PostgreSQL, Redis in one
//! of three topologies, and the `inventory-server` replicas. All on loopback, each on its own
//! ports, with its data and logs under the run's folder.

use std::{
    fs::File,
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use tokio::process::{Child, Command};

use crate::proxy::Proxy;

/// A free loopback port below the kernel's ephemeral range, so that while a process is down
/// for a restart no outgoing connection can take its port.
pub fn free_port() -> anyhow::Result<u16> {
    let ephemeral_low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768);
    let low = ephemeral_low.saturating_sub(12_000).max(1_024);
    for _ in 0..200 {
        let port = rand::random_range(low..ephemeral_low);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free port in {low}..{ephemeral_low}")
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Runs a command to completion and returns its standard output.
async fn output(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed: {} {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Sends a signal by name (`STOP`, `CONT`, `KILL`, `TERM`) to a child.
async fn signal(child: &Child, name: &str) -> anyhow::Result<()> {
    let pid = child.id().context("the process has already exited")?;
    output("kill", &[&format!("-{name}"), &pid.to_string()]).await?;
    Ok(())
}

/// A child process the faults act on: killed (SIGKILL), paused (SIGSTOP), resumed (SIGCONT).
/// Dropping it kills the process (`kill_on_drop`), stopped or not.
#[derive(Debug, Default)]
struct Process(Option<Child>);

impl Process {
    fn running(&self) -> anyhow::Result<&Child> {
        self.0.as_ref().context("not running")
    }

    async fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.0.take() {
            child.kill().await?;
        }
        Ok(())
    }

    async fn pause(&self) -> anyhow::Result<()> {
        signal(self.running()?, "STOP").await
    }

    async fn resume(&self) -> anyhow::Result<()> {
        signal(self.running()?, "CONT").await
    }
}

async fn poll<F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    while started.elapsed() < timeout {
        if check().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{what} within {timeout:?}")
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL

/// A throwaway PostgreSQL cluster of the run's own, so it can be restarted without disturbing
/// anything else on the machine.
#[derive(Debug)]
pub struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    /// PostgreSQL refuses to run as root: as root, it runs as the `postgres` user.
    as_postgres: bool,
}

fn pg_bin() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("PG_BIN") {
        return Ok(dir.into());
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .context("PostgreSQL is not installed (no /usr/lib/postgresql); set PG_BIN")?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|d| d.join("initdb").exists())
        .collect();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
        .context("no initdb under /usr/lib/postgresql/*/bin")
}

/// Whether the `postgres` user can reach `path` (every folder above it lets it through).
async fn postgres_reaches(path: &Path) -> bool {
    tokio::process::Command::new("runuser")
        .args(["-u", "postgres", "--", "test", "-x"])
        .arg(path.parent().unwrap_or(path))
        .status()
        .await
        .is_ok_and(|status| status.success())
}

/// One folder per requested path, the same on every run, so a run that was killed is found
/// and stopped by the next.
fn fallback_data_dir(requested: &Path) -> PathBuf {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::hash::DefaultHasher::new();
    requested.hash(&mut hasher);
    PathBuf::from(format!("/var/tmp/inventory-chaos-{:016x}", hasher.finish())).join("postgres")
}

impl Postgres {
    /// Creates a fresh cluster in `data` (or, when the `postgres` user cannot reach it, in a
    /// folder of its own under /var/tmp) and starts it on a free port.
    pub async fn start(data: &Path) -> anyhow::Result<Self> {
        let as_postgres = output("id", &["-u"]).await?.trim() == "0";
        std::fs::create_dir_all(data)?;
        let mut data = std::fs::canonicalize(data)?;
        if as_postgres && !postgres_reaches(&data).await {
            // A checkout under a folder closed to other users (a 0700 home): the postgres
            // user cannot reach it, so the cluster lives in a folder of its own under /var/tmp.
            data = fallback_data_dir(&data);
            std::fs::create_dir_all(&data)?;
        }
        let postgres = Self {
            bin: pg_bin()?,
            data,
            port: free_port()?,
            as_postgres,
        };
        // A run that was killed may have left its server running here.
        if postgres.data.join("postmaster.pid").exists() {
            postgres.stop().await;
        }
        std::fs::remove_dir_all(&postgres.data)?;
        std::fs::create_dir_all(&postgres.data)?;
        if as_postgres {
            output("chown", &["postgres:", &postgres.data_str()]).await?;
            output("chmod", &["700", &postgres.data_str()]).await?;
        }
        postgres
            .ctl("initdb", &["-D", &postgres.data_str(), "-U", "postgres"])
            .arg_list(&["--auth=trust", "-E", "UTF8", "--no-sync"])
            .run()
            .await
            .context("initdb")?;
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} \
             -c max_connections=200 -c fsync=off -c synchronous_commit=off",
            postgres.port,
            postgres.data_str()
        );
        let log = format!("{}/server.log", postgres.data_str());
        postgres
            .ctl(
                "pg_ctl",
                &["-D", &postgres.data_str(), "-l", &log, "-w", "-t", "60"],
            )
            .arg_list(&["-o", &options, "start"])
            .run()
            .await
            .context("pg_ctl start")?;
        Ok(postgres)
    }

    fn data_str(&self) -> String {
        self.data.display().to_string()
    }

    fn ctl(&self, tool: &str, args: &[&str]) -> PgCommand {
        let program = self.bin.join(tool).display().to_string();
        let mut argv = Vec::new();
        if self.as_postgres {
            argv.extend(["runuser", "-u", "postgres", "--"].map(String::from));
        }
        argv.push(program);
        argv.extend(args.iter().map(|a| a.to_string()));
        PgCommand(argv)
    }

    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    pub fn url_via(&self, addr: SocketAddr, database: &str) -> String {
        format!("postgres://postgres@{addr}/{database}")
    }

    /// Fast shutdown (open transactions are rolled back, connections cut), then start again.
    pub async fn restart_fast(&self) -> anyhow::Result<()> {
        // With its log file, or the new postmaster would hold this process's stdout open.
        let log = format!("{}/server.log", self.data_str());
        self.ctl(
            "pg_ctl",
            &[
                "-D",
                &self.data_str(),
                "-l",
                &log,
                "-m",
                "fast",
                "-w",
                "-t",
                "60",
            ],
        )
        .arg_list(&["restart"])
        .run()
        .await
        .context("pg_ctl restart")
    }

    pub async fn stop(&self) {
        let _ = self
            .ctl("pg_ctl", &["-D", &self.data_str(), "-m", "immediate", "-w"])
            .arg_list(&["stop"])
            .run()
            .await;
    }
}

impl Drop for Postgres {
    /// Best effort, for a run that ends early: the server is a daemon, not a child.
    fn drop(&mut self) {
        if self.data.join("postmaster.pid").exists() {
            let command = self.ctl("pg_ctl", &["-D", &self.data_str(), "-m", "immediate"]);
            let _ = std::process::Command::new(&command.0[0])
                .args(&command.0[1..])
                .arg("stop")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

struct PgCommand(Vec<String>);

impl PgCommand {
    fn arg_list(mut self, args: &[&str]) -> Self {
        self.0.extend(args.iter().map(|a| a.to_string()));
        self
    }

    async fn run(self) -> anyhow::Result<()> {
        let args: Vec<&str> = self.0[1..].iter().map(String::as_str).collect();
        output(&self.0[0], &args).await.map(drop)
    }
}

// ---------------------------------------------------------------------------------------------
// Redis

/// One `redis-server` process (a data node or a Sentinel) that can be killed, paused and
/// started again on the same port. Data nodes keep nothing on disk: a restart comes back empty.
#[derive(Debug)]
pub struct RedisNode {
    pub port: u16,
    dir: PathBuf,
    args: Vec<String>,
    sentinel: bool,
    process: Process,
}

impl RedisNode {
    async fn start(dir: PathBuf, args: Vec<String>) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let mut node = Self {
            port: free_port()?,
            dir,
            sentinel: args.iter().any(|a| a == "--sentinel"),
            args,
            process: Process::default(),
        };
        node.spawn().await?;
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
        self.process = Process(Some(command.spawn().context("start redis-server")?));
        let port = self.port.to_string();
        poll(
            "redis-server did not answer PING",
            Duration::from_secs(10),
            || async {
                output("redis-cli", &["-p", &port, "ping"])
                    .await
                    .is_ok_and(|o| o.trim() == "PONG")
            },
        )
        .await
    }

    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    pub async fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let port = self.port.to_string();
        let mut argv = vec!["-p", &port];
        argv.extend_from_slice(args);
        output("redis-cli", &argv).await
    }

    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.process.kill().await
    }

    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill().await?;
        self.spawn().await
    }

    pub async fn pause(&self) -> anyhow::Result<()> {
        self.process.pause().await
    }

    pub async fn resume(&self) -> anyhow::Result<()> {
        self.process.resume().await
    }
}

/// How Redis is laid out for a run.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// One instance, reached through the fault proxy.
    Single,
    /// A primary, one replica and three Sentinels; the service connects through the Sentinels.
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
    /// `Single` only: the servers reach Redis through it.
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
        poll(
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
        poll(
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
            let args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
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

    /// The URL the servers are given.
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
                poll("the cluster is not ok", Duration::from_secs(30), || async {
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
                poll(
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

// ---------------------------------------------------------------------------------------------
// inventory-server replicas

/// One `inventory-server` process; its port stays the same across restarts, so clients
/// reconnect to it.
#[derive(Debug)]
pub struct Replica {
    pub index: usize,
    pub port: u16,
    server: PathBuf,
    env: Vec<(String, String)>,
    log: PathBuf,
    process: Process,
}

impl Replica {
    pub async fn start(
        index: usize,
        server: &Path,
        env: Vec<(String, String)>,
        dir: &Path,
    ) -> anyhow::Result<Self> {
        let mut replica = Self {
            index,
            port: free_port()?,
            server: server.to_owned(),
            env,
            log: dir.join(format!("replica-{index}.log")),
            process: Process::default(),
        };
        replica.spawn().await?;
        Ok(replica)
    }

    pub fn addr(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let log = File::options().create(true).append(true).open(&self.log)?;
        let mut command = Command::new(&self.server);
        command
            .arg("serve")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("LISTEN_ADDR", format!("127.0.0.1:{}", self.port))
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        let mut child = command.spawn().context("start inventory-server")?;
        let addr = self.addr();
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "inventory-server exited during start-up ({status}); see {}",
                    self.log.display()
                );
            }
            if ready(&addr).await {
                break;
            }
            if started.elapsed() > Duration::from_secs(30) {
                bail!("inventory-server did not become ready within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.process = Process(Some(child));
        Ok(())
    }

    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.process.kill().await
    }

    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill().await?;
        self.spawn().await
    }

    pub async fn pause(&self) -> anyhow::Result<()> {
        self.process.pause().await
    }

    pub async fn resume(&self) -> anyhow::Result<()> {
        self.process.resume().await
    }

    /// SIGTERM, as an orchestrator stops a pod, then wait.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.process.0.take() {
            let _ = signal(&child, "CONT").await;
            let _ = signal(&child, "TERM").await;
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }
}

/// Serving: a read of a SKU nobody has answers `NOT_FOUND`.
async fn ready(addr: &str) -> bool {
    use inventory_proto::{GetStockRequest, inventory_service_client::InventoryServiceClient};
    let Ok(mut client) = InventoryServiceClient::connect(addr.to_owned()).await else {
        return false;
    };
    client
        .get_stock(GetStockRequest {
            skus: vec!["READY-CHECK".into()],
        })
        .await
        .is_err_and(|s| s.code() == tonic::Code::NotFound)
}
