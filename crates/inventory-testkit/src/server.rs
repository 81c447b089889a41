//! `inventory-server` processes, ready once the standard health service says so.

use std::{
    fs::File,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use tokio::process::Command;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::{ports::free_port, process::Process};

/// How long a server may take to become ready.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// The service whose health is readiness: the server reports it SERVING once PostgreSQL
/// answered with a schema it can use (the empty name is liveness only).
pub const READINESS_SERVICE: &str = inventory_proto::inventory_service_server::SERVICE_NAME;

/// Whether the server at `addr` (`http://host:port`) is ready: `grpc.health.v1.Health/Check`
/// for [`READINESS_SERVICE`] answers SERVING.
pub async fn ready(addr: &str) -> bool {
    let Ok(endpoint) = tonic::transport::Endpoint::from_shared(addr.to_owned()) else {
        return false;
    };
    let Ok(channel) = endpoint
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
    else {
        return false;
    };
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: READINESS_SERVICE.into(),
        })
        .await
        .is_ok_and(|answer| answer.into_inner().status() == ServingStatus::Serving)
}

/// Runs `binary migrate` against `database_url`: what it printed, or an error with it.
pub async fn migrate(binary: &Path, database_url: &str) -> anyhow::Result<String> {
    migrate_tenants(binary, database_url, "default").await
}

/// [`migrate`] for every tenant of `tenants` (`TENANTS`, comma-separated): `public` for
/// `default`, a schema of its own created and migrated for each other.
pub async fn migrate_tenants(
    binary: &Path,
    database_url: &str,
    tenants: &str,
) -> anyhow::Result<String> {
    let (succeeded, printed) = run_on_database(binary, "migrate", database_url, tenants).await?;
    if !succeeded {
        bail!("{} migrate failed: {printed}", binary.display());
    }
    Ok(printed)
}

/// Runs `binary verify` (every SKU recomputed from its ledger and live holds) against
/// `database_url`: whether it found no drift, and what it printed.
pub async fn verify(binary: &Path, database_url: &str) -> anyhow::Result<(bool, String)> {
    verify_tenants(binary, database_url, "default").await
}

/// [`verify`] of every tenant of `tenants`, each in its own schema.
pub async fn verify_tenants(
    binary: &Path,
    database_url: &str,
    tenants: &str,
) -> anyhow::Result<(bool, String)> {
    run_on_database(binary, "verify", database_url, tenants).await
}

/// `TENANTS=<tenants> binary <command> --database-url <database_url>`: whether it
/// succeeded, and its output.
async fn run_on_database(
    binary: &Path,
    command: &str,
    database_url: &str,
    tenants: &str,
) -> anyhow::Result<(bool, String)> {
    let output = tokio::process::Command::new(binary)
        .args([command, "--database-url", database_url])
        .env("TENANTS", tenants)
        .output()
        .await
        .with_context(|| format!("run {} {command}", binary.display()))?;
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Ok((output.status.success(), text.trim().to_owned()))
}

/// One `inventory-server serve` process on loopback; its port stays the same across
/// restarts, so clients reconnect to it.
#[derive(Debug)]
pub struct ServerProcess {
    pub port: u16,
    binary: PathBuf,
    env: Vec<(String, String)>,
    log: PathBuf,
    process: Process,
}

impl ServerProcess {
    /// Starts `binary serve` on a free port with `env` (`LISTEN_ADDR` is set here), its output
    /// in `log` (emptied first, appended to on restarts), and waits until it is ready.
    pub async fn start(
        binary: &Path,
        env: Vec<(String, String)>,
        log: PathBuf,
    ) -> anyhow::Result<Self> {
        File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let mut server = Self {
            port: free_port()?,
            binary: binary.to_owned(),
            env,
            log,
            process: Process::default(),
        };
        server.spawn().await?;
        Ok(server)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let log = File::options().create(true).append(true).open(&self.log)?;
        let child = Command::new(&self.binary)
            .arg("serve")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("LISTEN_ADDR", format!("127.0.0.1:{}", self.port))
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {}", self.binary.display()))?;
        self.process = Process::new(child);
        let addr = self.addr();
        let started = Instant::now();
        loop {
            if let Some(status) = self.process.try_wait()? {
                bail!(
                    "inventory-server exited during start-up ({status}); see {}",
                    self.log.display()
                );
            }
            if ready(&addr).await {
                return Ok(());
            }
            if started.elapsed() > READY_WITHIN {
                bail!(
                    "inventory-server did not become ready within {} s; see {}",
                    READY_WITHIN.as_secs(),
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sets (or replaces) one variable of its environment, taken at the next (re)start.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
    }

    /// SIGKILL.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.process.kill().await
    }

    /// Starts again on the same port (killing it first if it runs) and waits until ready.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill().await?;
        self.spawn().await
    }

    /// SIGSTOP.
    pub async fn pause(&self) -> anyhow::Result<()> {
        self.process.pause().await
    }

    /// SIGCONT.
    pub async fn resume(&self) -> anyhow::Result<()> {
        self.process.resume().await
    }

    /// SIGTERM, as an orchestrator stops a pod, then up to `grace` for the drain before
    /// SIGKILL.
    pub async fn stop(&mut self, grace: Duration) {
        self.process.terminate(grace).await;
    }

    /// A rollout's step for this replica: stopped as [`Self::stop`] does, then `binary` (a
    /// newer or an older release) started on the same port, and ready.
    pub async fn replace(&mut self, binary: &Path, grace: Duration) -> anyhow::Result<()> {
        self.stop(grace).await;
        binary.clone_into(&mut self.binary);
        self.spawn().await
    }

    /// The binary this replica runs.
    pub fn binary(&self) -> &Path {
        &self.binary
    }
}

#[cfg(test)]
mod tests;
