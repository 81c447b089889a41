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
        crate::server::migrate_tenants(binary, &database_url, &tenants)
            .await
            .with_context(|| format!("cell {}", spec.name))?;
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

    /// Serves `tenants` from now on: the configuration changes and every replica is
    /// restarted with it, one after another (a rollout). A tenant taken off answers
    /// `TENANT_NOT_SERVED` here from then on.
    pub async fn serve(&mut self, tenants: &[&str]) -> anyhow::Result<()> {
        self.spec.tenants = tenants.iter().map(|t| (*t).to_owned()).collect();
        let tenants = self.spec.tenants.join(",");
        for replica in &mut self.replicas {
            replica.set_env("TENANTS", &tenants);
            replica.stop(Duration::from_secs(5)).await;
            replica.restart().await?;
        }
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

/// Copies `tenant`'s schema, whole, from `source`'s database to `target`'s: its stock,
/// reservations, orders, idempotency keys, ledger, fences and event stream, with `pg_dump
/// --schema` and `psql`, as docs/operations.md ("Moving a tenant to another cell") does by
/// hand. The source should no longer serve the tenant ([`Cell::serve`]), so nothing is
/// written there during the copy.
pub async fn copy_tenant(source: &Cell, target: &Cell, tenant: &str) -> anyhow::Result<()> {
    let bin = crate::postgres::pg_bin()?;
    let dump = std::env::temp_dir().join(format!(
        "inventory-move-{tenant}-{}.sql",
        uuid::Uuid::new_v4().simple()
    ));
    let schema = format!("tenant_{tenant}");
    let dumped = tokio::process::Command::new(bin.join("pg_dump"))
        .args([
            "--dbname",
            &source.database_url,
            "--schema",
            &schema,
            "--no-owner",
        ])
        .arg("--file")
        .arg(&dump)
        .output()
        .await
        .context("run pg_dump")?;
    if !dumped.status.success() {
        bail!("pg_dump: {}", String::from_utf8_lossy(&dumped.stderr));
    }
    let restored = tokio::process::Command::new(bin.join("psql"))
        .args([
            "--dbname",
            &target.database_url,
            "--quiet",
            "--set",
            "ON_ERROR_STOP=1",
            "--file",
        ])
        .arg(&dump)
        .output()
        .await
        .context("run psql");
    let _ = std::fs::remove_file(&dump);
    let restored = restored?;
    if !restored.status.success() {
        bail!("psql: {}", String::from_utf8_lossy(&restored.stderr));
    }
    Ok(())
}
