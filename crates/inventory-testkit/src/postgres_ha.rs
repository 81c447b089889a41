//! PostgreSQL with automatic failover: a pg_auto_failover formation of a monitor, a primary
//! and a synchronous standby, every node behind fault proxies of its own.
//!
//! Each node's PostgreSQL listens on `127.0.0.2:<port>`; its proxy listens on
//! `127.0.0.1:<port>` and is the only way to it for everyone else: the servers under test,
//! the other node's replication and `pg_rewind`, and the monitor's health checks (the node
//! registers as `127.0.0.1:<port>`). Its keeper reaches the monitor through a second proxy of
//! the node's own. Cutting both isolates the node as a network partition does, while its
//! processes keep running.
//!
//! The monitor's timings are shortened (a dead or frozen primary is replaced in about 8 s, not
//! the minute of the defaults); the rules are pg_auto_failover's own.

use std::{
    fs::File,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context as _, bail};
use tokio::process::{Child, Command};

use crate::{
    ports::{free_port, loopback},
    postgres::{PgConfig, connect, fallback_data_dir, pg_bin, postgres_reaches},
    process::{eventually_ok, output},
    proxy::Proxy,
};

/// Where every node's PostgreSQL listens; the proxies hold the same ports on `127.0.0.1`.
const BACKEND_HOST: [u8; 4] = [127, 0, 0, 2];

/// The monitor's settings (`pgautofailover.*`, milliseconds): a node is unhealthy after 3 s
/// without a report and failed checks; the old primary gets 4 s to stop taking writes.
const MONITOR_SETTINGS: [(&str, u32); 7] = [
    ("health_check_period", 1000),
    ("health_check_timeout", 1000),
    ("health_check_max_retries", 1),
    ("health_check_retry_delay", 500),
    ("node_considered_unhealthy_timeout", 3000),
    ("primary_demote_timeout", 4000),
    ("startup_grace_period", 1000),
];

/// A primary cut off from the monitor and its standby stops itself after this many seconds
/// (keeper setting `timeout.network_partition_timeout`): sooner than the monitor lets the
/// standby take writes.
const PARTITION_TIMEOUT_S: &str = "3";

/// How long a formation may take to settle: start, failover, a node rejoining.
const SETTLE: Duration = Duration::from_secs(90);

/// One `pg_autoctl run` process group: the keeper, PostgreSQL and its backends.
#[derive(Debug)]
struct Service {
    pgdata: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// One PostgreSQL node of the formation.
#[derive(Debug)]
pub struct Node {
    pub name: String,
    /// The port the node is known by (its proxy's, on 127.0.0.1; PostgreSQL's, on 127.0.0.2).
    pub port: u16,
    /// Everyone's way to the node.
    proxy: Proxy,
    /// The node's keeper's way to the monitor.
    monitor_proxy: Proxy,
    service: Service,
}

/// A monitor and two PostgreSQL nodes, started fresh in a folder of their own.
#[derive(Debug)]
pub struct Formation {
    autoctl: Autoctl,
    monitor: Service,
    monitor_port: u16,
    pub nodes: Vec<Node>,
}

/// How to run `pg_autoctl`: as whom, and with the environment every call must share
/// (pg_autoctl finds its configuration and state through HOME and XDG_*).
#[derive(Clone, Debug)]
struct Autoctl {
    dir: PathBuf,
    as_postgres: bool,
    bin: PathBuf,
}

/// A node's reported and assigned state, as the monitor has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeState {
    pub name: String,
    pub reported: String,
    pub goal: String,
}

impl Formation {
    /// Creates the monitor and two nodes in `dir` (or, when the `postgres` user cannot reach
    /// it, in a folder of its own under /var/tmp), and waits until the second node is a
    /// synchronous standby of the first.
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        let as_postgres = output("id", &["-u"]).await?.trim() == "0";
        std::fs::create_dir_all(dir)?;
        let mut dir = std::fs::canonicalize(dir)?.join("formation");
        std::fs::create_dir_all(&dir)?;
        if as_postgres && !postgres_reaches(&dir).await {
            dir = fallback_data_dir(&dir);
        }
        kill_left_over(&dir).await;
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        for sub in ["home", "xdg/config", "xdg/share", "xdg/run"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        if as_postgres {
            output("chown", &["-R", "postgres:", &dir.display().to_string()]).await?;
        }
        output(
            "chmod",
            &["700", &dir.join("xdg/run").display().to_string()],
        )
        .await?;
        let monitor_port = free_port()?;
        let mut formation = Self {
            monitor: Service::new(&dir, "monitor"),
            autoctl: Autoctl {
                dir,
                as_postgres,
                bin: pg_bin()?,
            },
            monitor_port,
            nodes: Vec::new(),
        };
        formation.create_monitor().await.context("the monitor")?;
        for name in ["n1", "n2"] {
            formation
                .create_node(name)
                .await
                .with_context(|| format!("node {name}"))?;
        }
        formation.wait_stable().await?;
        Ok(formation)
    }

    async fn create_monitor(&mut self) -> anyhow::Result<()> {
        let pgdata = self.monitor.pgdata.display().to_string();
        let port = self.monitor_port.to_string();
        let pg_ctl = self.autoctl.pg_ctl();
        self.autoctl
            .run(&[
                "create",
                "monitor",
                "--pgdata",
                &pgdata,
                "--pgport",
                &port,
                "--hostname",
                "127.0.0.1",
                "--auth",
                "trust",
                "--no-ssl",
                "--pgctl",
                &pg_ctl,
            ])
            .await?;
        self.monitor.spawn(&self.autoctl).await?;
        let admin: PgConfig =
            format!("postgres://postgres@127.0.0.1:{port}/pg_auto_failover").parse()?;
        let client = eventually_ok("the monitor accepted connections", SETTLE, || {
            connect(&admin)
        })
        .await?;
        for (name, value) in MONITOR_SETTINGS {
            client
                .batch_execute(&format!("ALTER SYSTEM SET pgautofailover.{name} = {value}"))
                .await?;
        }
        client.batch_execute("SELECT pg_reload_conf()").await?;
        Ok(())
    }

    async fn create_node(&mut self, name: &str) -> anyhow::Result<()> {
        let port = free_port_pair()?;
        let proxy = Proxy::start_on(loopback(port), SocketAddr::from((BACKEND_HOST, port))).await?;
        let monitor_proxy = Proxy::start(loopback(self.monitor_port)).await?;
        let service = Service::new(&self.autoctl.dir, name);
        let pgdata = service.pgdata.display().to_string();
        let monitor = format!(
            "postgres://autoctl_node@{}/pg_auto_failover?sslmode=prefer",
            monitor_proxy.addr()
        );
        let pg_ctl = self.autoctl.pg_ctl();
        let backend = std::net::Ipv4Addr::from(BACKEND_HOST).to_string();
        self.autoctl
            .run(&[
                "create",
                "postgres",
                "--pgdata",
                &pgdata,
                "--pgport",
                &port.to_string(),
                "--hostname",
                "127.0.0.1",
                "--listen",
                &backend,
                "--name",
                name,
                "--auth",
                "trust",
                "--no-ssl",
                "--pgctl",
                &pg_ctl,
                "--monitor",
                &monitor,
                "--username",
                "postgres",
                "--dbname",
                "postgres",
            ])
            .await?;
        self.autoctl
            .run(&[
                "config",
                "set",
                "--pgdata",
                &pgdata,
                "timeout.network_partition_timeout",
                PARTITION_TIMEOUT_S,
            ])
            .await?;
        let mut node = Node {
            name: name.to_owned(),
            port,
            proxy,
            monitor_proxy,
            service,
        };
        node.service.spawn(&self.autoctl).await?;
        self.nodes.push(node);
        // The first node must be running alone before the second may copy it.
        let expected = if self.nodes.len() == 1 {
            "single"
        } else {
            "secondary"
        };
        eventually_ok(
            &format!("node {name} reached {expected}"),
            SETTLE,
            || async {
                let states = self.states().await?;
                match states.iter().find(|s| s.name == name) {
                    Some(s) if s.reported == expected && s.goal == expected => Ok(()),
                    other => Err(anyhow::anyhow!("{other:?}")),
                }
            },
        )
        .await
    }

    /// Every node's state, from the monitor.
    pub async fn states(&self) -> anyhow::Result<Vec<NodeState>> {
        let monitor: PgConfig = format!(
            "postgres://postgres@127.0.0.1:{}/pg_auto_failover",
            self.monitor_port
        )
        .parse()?;
        let client = connect(&monitor).await?;
        let rows = client
            .query(
                "SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node
                 WHERE formationid = 'default' ORDER BY nodeid",
                &[],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| NodeState {
                name: row.get(0),
                reported: row.get(1),
                goal: row.get(2),
            })
            .collect())
    }

    /// Waits until one node is primary and the other its synchronous standby, both as
    /// assigned; returns the primary's index.
    pub async fn wait_stable(&self) -> anyhow::Result<usize> {
        eventually_ok("a primary with a synchronous standby", SETTLE, || async {
            let states = self.states().await?;
            let settled = |role: &str| {
                states
                    .iter()
                    .filter(|s| s.reported == role && s.goal == role)
                    .count()
            };
            if states.len() == self.nodes.len()
                && settled("primary") == 1
                && settled("secondary") == self.nodes.len() - 1
            {
                let primary = states.iter().find(|s| s.reported == "primary");
                self.index_of(&primary.context("no primary")?.name)
            } else {
                Err(anyhow::anyhow!("{states:?}"))
            }
        })
        .await
    }

    fn index_of(&self, name: &str) -> anyhow::Result<usize> {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .context("an unknown node")
    }

    /// Waits until a node other than `old` is assigned writes (`wait_primary` or `primary`)
    /// and reports it: the failover is done, whether or not `old` has rejoined. Returns the
    /// new primary's index.
    pub async fn wait_promoted(&self, old: usize) -> anyhow::Result<usize> {
        eventually_ok("another node promoted", SETTLE, || async {
            let states = self.states().await?;
            let promoted = states.iter().find(|s| {
                s.name != self.nodes[old].name
                    && matches!(s.reported.as_str(), "wait_primary" | "primary")
                    && s.goal == s.reported
            });
            match promoted {
                Some(s) => self.index_of(&s.name),
                None => Err(anyhow::anyhow!("{states:?}")),
            }
        })
        .await
    }

    /// A URL of `database` on whichever node takes writes, through the nodes' proxies, as a
    /// service is configured: every host, `target_session_attrs=read-write`.
    pub fn url(&self, database: &str) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!(
            "postgres://postgres@{}/{database}?target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    /// Settings of the `postgres` database on the primary, for `TemplateDatabases`.
    pub fn admin_config(&self) -> anyhow::Result<PgConfig> {
        Ok(self.url("postgres").parse()?)
    }

    /// SIGKILL the node's whole process group: keeper, PostgreSQL and every backend.
    pub async fn kill(&mut self, node: usize) -> anyhow::Result<()> {
        self.nodes[node].service.signal("KILL").await?;
        if let Some(mut child) = self.nodes[node].service.child.take() {
            child.wait().await?;
        }
        Ok(())
    }

    /// Starts a killed node's keeper again: it rejoins, as a standby if it was replaced.
    pub async fn restart(&mut self, node: usize) -> anyhow::Result<()> {
        self.nodes[node].service.spawn(&self.autoctl).await
    }

    /// SIGSTOP the node's whole process group: it holds its connections and answers nothing.
    pub async fn pause(&self, node: usize) -> anyhow::Result<()> {
        self.nodes[node].service.signal("STOP").await
    }

    /// SIGCONT: the node runs on and learns from the monitor what happened meanwhile.
    pub async fn resume(&self, node: usize) -> anyhow::Result<()> {
        self.nodes[node].service.signal("CONT").await
    }

    /// Severs the node from everyone (its clients, the other node, the monitor) and refuses
    /// new connections (`true`), or joins it again.
    pub fn set_cut(&self, node: usize, cut: bool) {
        self.nodes[node].proxy.set_cut(cut);
        self.nodes[node].monitor_proxy.set_cut(cut);
    }

    /// A planned switchover (`pg_autoctl perform switchover`): the standby is promoted and the
    /// old primary rejoins as its standby.
    pub async fn switchover(&self) -> anyhow::Result<()> {
        let pgdata = self.monitor.pgdata.display().to_string();
        self.autoctl
            .run(&[
                "perform",
                "switchover",
                "--pgdata",
                &pgdata,
                "--formation",
                "default",
                "--group",
                "0",
                "--wait",
                "60",
            ])
            .await
            .map(drop)
    }

    /// Kills every process of the formation.
    pub async fn stop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.service.signal("KILL").await;
        }
        let _ = self.monitor.signal("KILL").await;
        let _ = std::fs::remove_file(self.autoctl.dir.join("groups"));
    }
}

impl Drop for Formation {
    /// Best effort, for a run that ends early: the process groups outlive their leaders.
    fn drop(&mut self) {
        let services = self.nodes.iter().map(|n| &n.service).chain([&self.monitor]);
        for service in services {
            if let Some(pid) = service.child.as_ref().and_then(Child::id) {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

impl Autoctl {
    /// Runs `pg_autoctl` to completion, as the user that owns the formation's files.
    async fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let argv = self.argv(args);
        let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
        output(&argv[0], &args).await
    }

    /// The command line of `pg_autoctl args`.
    fn argv(&self, args: &[&str]) -> Vec<String> {
        let dir = self.dir.display();
        let mut argv = Vec::new();
        if self.as_postgres {
            // setpriv runs pg_autoctl in its own place: signals reach it, not a wrapper.
            argv.extend(
                [
                    "setpriv",
                    "--reuid=postgres",
                    "--regid=postgres",
                    "--init-groups",
                    "--reset-env",
                    "--",
                ]
                .map(String::from),
            );
        }
        argv.push("env".into());
        argv.extend([
            format!("HOME={dir}/home"),
            format!("XDG_CONFIG_HOME={dir}/xdg/config"),
            format!("XDG_DATA_HOME={dir}/xdg/share"),
            format!("XDG_RUNTIME_DIR={dir}/xdg/run"),
            format!("PATH={}:/usr/bin:/bin", self.bin.display()),
            "LANG=C.UTF-8".into(),
            "pg_autoctl".into(),
        ]);
        argv.extend(args.iter().map(|a| a.to_string()));
        argv
    }

    fn pg_ctl(&self) -> String {
        self.bin.join("pg_ctl").display().to_string()
    }
}

impl Service {
    fn new(dir: &Path, name: &str) -> Self {
        Self {
            pgdata: dir.join(name).join("pgdata"),
            log: dir.join(format!("{name}.log")),
            child: None,
        }
    }

    /// Starts `pg_autoctl run` as the leader of a new process group, and notes the group
    /// so that a later start can end it if this harness dies without cleaning up.
    async fn spawn(&mut self, autoctl: &Autoctl) -> anyhow::Result<()> {
        let pgdata = self.pgdata.display().to_string();
        let argv = autoctl.argv(&["run", "--pgdata", &pgdata]);
        let log = File::options().create(true).append(true).open(&self.log)?;
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot run {}", argv.join(" ")))?;
        let pid = child.id().context("no pid")?;
        use std::io::Write as _;
        writeln!(
            File::options()
                .create(true)
                .append(true)
                .open(autoctl.dir.join("groups"))?,
            "{pid}"
        )?;
        self.child = Some(child);
        Ok(())
    }

    /// Signals the whole node: its process group (the keeper and the postmaster) and every
    /// process under it. PostgreSQL's backends, walsenders and workers each run in a session
    /// of their own, out of the group's reach: a freeze that missed them would leave them
    /// committing.
    async fn signal(&self, name: &str) -> anyhow::Result<()> {
        let pid = self
            .child
            .as_ref()
            .and_then(Child::id)
            .context("not running")?;
        // Listed first: once the postmaster is gone, its children are no longer below it. Once
        // it is stopped, it starts no new ones.
        let below = descendants(pid);
        output("kill", &[&format!("-{name}"), "--", &format!("-{pid}")]).await?;
        let below = if name == "STOP" {
            descendants(pid)
        } else {
            below
        };
        if !below.is_empty() {
            let mut args = vec![format!("-{name}"), "--".into()];
            args.extend(below.iter().map(u32::to_string));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            // One may have exited meanwhile: that is no failure.
            let _ = output("kill", &args).await;
        }
        Ok(())
    }
}

/// Every process below `root`, from /proc.
fn descendants(root: u32) -> Vec<u32> {
    let mut children: std::collections::HashMap<u32, Vec<u32>> = Default::default();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|ppid| ppid.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut found = Vec::new();
    let mut next = vec![root];
    while let Some(pid) = next.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            found.push(child);
            next.push(child);
        }
    }
    found
}

/// Kills the process groups a harness that died left running in `dir`.
async fn kill_left_over(dir: &Path) {
    let Ok(groups) = std::fs::read_to_string(dir.join("groups")) else {
        return;
    };
    for pid in groups.lines() {
        let _ = output("kill", &["-KILL", "--", &format!("-{pid}")]).await;
    }
}

/// A port free on both 127.0.0.1 (for the proxy) and 127.0.0.2 (for PostgreSQL).
fn free_port_pair() -> anyhow::Result<u16> {
    for _ in 0..50 {
        let port = free_port()?;
        if std::net::TcpListener::bind(SocketAddr::from((BACKEND_HOST, port))).is_ok() {
            return Ok(port);
        }
    }
    bail!("no port free on both 127.0.0.1 and 127.0.0.2")
}

#[cfg(test)]
mod tests;
