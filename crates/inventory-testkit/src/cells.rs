//! Cells: complete, independent copies of the service, each serving a fixed set of tenants.
//!
//! A [`Cell`] is its own PostgreSQL cluster, its own `redis-server` and its own
//! `inventory-server` replicas, sharing nothing with another cell; [`cell_map`] writes the
//! static map the client kit reads (`inventory_client::CellMap`) to find a tenant's cell.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, bail};

use crate::{postgres::Postgres, redis::RedisNode, scratch::Scratch, server::ServerProcess};

/// What a cell serves and how many replicas it runs.
#[derive(Clone, Debug)]
pub struct CellSpec {
    /// The cell's name in the map (`[a-z0-9][a-z0-9_-]*`).
    pub name: String,
    /// The tenants it serves (its `TENANTS`).
    pub tenants: Vec<String>,
    pub replicas: usize,
    /// The credentials file its replicas read (`AUTH_TOKENS_FILE`).
    pub credentials: PathBuf,
}

/// One running cell. Dropping it stops its replicas, its Redis and its PostgreSQL.
#[derive(Debug)]
pub struct Cell {
    pub spec: CellSpec,
    pub replicas: Vec<ServerProcess>,
    pub redis: RedisNode,
    pub postgres: Postgres,
    /// The cell's database URL (as the cluster's superuser).
    pub database_url: String,
    _scratch: Scratch,
}

impl Cell {
    /// Starts the cell's PostgreSQL and Redis, migrates every tenant's schema with `binary
    /// migrate`, then starts its replicas and waits until each is ready.
    pub async fn start(binary: &Path, spec: CellSpec) -> anyhow::Result<Self> {
        let scratch = Scratch::new(&format!("cell-{}", spec.name));
        let postgres = Postgres::start(&scratch.0.join("postgres")).await?;
        let database_url = postgres.url("postgres");
        let redis = RedisNode::start(scratch.0.join("redis"), Vec::new()).await?;
        let tenants = spec.tenants.join(",");
        let migrated = tokio::process::Command::new(binary)
            .args(["migrate", "--database-url", &database_url])
            .env("TENANTS", &tenants)
            .output()
            .await
            .with_context(|| format!("run {} migrate", binary.display()))?;
        if !migrated.status.success() {
            bail!(
                "cell {}: migrate failed: {}",
                spec.name,
                String::from_utf8_lossy(&migrated.stderr)
            );
        }
        let env = vec![
            ("DATABASE_URL".to_owned(), database_url.clone()),
            ("REDIS_URL".to_owned(), redis.url()),
            ("REDIS_KEY_PREFIX".to_owned(), format!("cell:{}", spec.name)),
            ("TENANTS".to_owned(), tenants),
            (
                "AUTH_TOKENS_FILE".to_owned(),
                spec.credentials.display().to_string(),
            ),
            ("SHUTDOWN_GRACE".to_owned(), "1s".to_owned()),
            ("ACCESS_LOG".to_owned(), "false".to_owned()),
            ("RUST_LOG".to_owned(), "warn".to_owned()),
        ];
        let mut replicas = Vec::new();
        for replica in 0..spec.replicas {
            let log = scratch.0.join(format!("server-{replica}.log"));
            replicas.push(ServerProcess::start(binary, env.clone(), log).await?);
        }
        Ok(Self {
            spec,
            replicas,
            redis,
            postgres,
            database_url,
            _scratch: scratch,
        })
    }

    /// The address the cell is reached at: its first replica (a load balancer's, in a real
    /// deployment).
    pub fn endpoint(&self) -> String {
        self.replicas[0].addr()
    }

    /// The whole cell goes down: every replica killed, Redis killed, PostgreSQL stopped.
    pub async fn outage(&mut self) -> anyhow::Result<()> {
        for replica in &mut self.replicas {
            replica.kill().await?;
        }
        self.redis.kill().await?;
        self.postgres.stop().await;
        Ok(())
    }

    /// A connection to the cell's database.
    pub async fn database(&self) -> anyhow::Result<tokio_postgres::Client> {
        let config = self.postgres.admin_config()?;
        tokio::time::timeout(Duration::from_secs(10), crate::postgres::connect(&config))
            .await
            .context("connect to the cell's database")?
    }
}

/// The map of `cells` in the client kit's format: one line per cell, its name, its endpoint
/// and its tenants.
pub fn cell_map(cells: &[&Cell]) -> String {
    cells
        .iter()
        .map(|cell| {
            format!(
                "{} {} {}\n",
                cell.spec.name,
                cell.endpoint(),
                cell.spec.tenants.join(" ")
            )
        })
        .collect()
}
