//! PostgreSQL: a throwaway cluster of the harness's own, and fresh databases cloned from a
//! migrated template.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
};

use anyhow::Context as _;
pub use inventory_postgres::PgConfig;
use sha2::{Digest as _, Sha256};

use crate::{
    ports::{free_port, loopback},
    process::output,
};

/// Connects to a database and drives the connection in the background.
pub async fn connect(config: &PgConfig) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = config.open().await.with_context(|| {
        format!(
            "connect to PostgreSQL database {}",
            config.get_dbname().unwrap_or("(default)")
        )
    })?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

// ---------------------------------------------------------------------------------------------
// Template databases

/// Advisory lock serialising template creation across processes.
const TEMPLATE_LOCK_KEY: i64 = 0x7465_6d70_6c61_7465;

/// The migrations the template is built from (`inventory_postgres::migrate` embeds the same).
const MIGRATIONS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../inventory-postgres/migrations"
);

/// "A fresh, migrated database", fast: every database is a copy of one template migrated once
/// per schema version (with `inventory_postgres::migrate::run`, as `inventory-server migrate`
/// does), however many processes ask at once.
#[derive(Clone, Debug)]
pub struct TemplateDatabases {
    admin: PgConfig,
}

impl TemplateDatabases {
    /// `admin` names a role that may create databases, and the database it connects to.
    pub fn new(admin: PgConfig) -> Self {
        Self { admin }
    }

    /// The settings of database `name` on the same server.
    pub fn config_of(&self, name: &str) -> PgConfig {
        let mut config = self.admin.clone();
        config.dbname(name);
        config
    }

    /// The template's name: it changes whenever a migration or the embedded schema version
    /// does, so a stale template is never used. Away from the source tree (a binary copied elsewhere), it is named for the
    /// newest migration the binary embeds instead.
    pub fn template_name() -> anyhow::Result<String> {
        let Ok(entries) = std::fs::read_dir(MIGRATIONS) else {
            return Ok(format!(
                "inventory_template_v{}",
                inventory_postgres::migrate::expected_version()
            ));
        };
        let mut files: Vec<_> = entries
            .map(|entry| entry.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        files.sort();
        let mut hash = Sha256::new();
        for file in files {
            hash.update(file.file_name().unwrap_or_default().as_encoded_bytes());
            hash.update(std::fs::read(&file)?);
        }
        let digest = hash.finalize();
        let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
        // With the version this binary embeds: a binary built before a migration was added
        // must not name (and fill) the template of the newer schema.
        Ok(format!(
            "inventory_template_v{}_{hex}",
            inventory_postgres::migrate::expected_version()
        ))
    }

    /// Creates the migrated template once (under a lock, since every test process may try),
    /// and returns its name. It is built under a temporary name and renamed when complete, so
    /// a crash mid-way never leaves a half-migrated template behind.
    pub async fn template(&self) -> anyhow::Result<String> {
        let name = Self::template_name()?;
        // The lock is the session's: if anything below fails, closing the session frees it.
        let admin = connect(&self.admin).await?;
        admin
            .execute("SELECT pg_advisory_lock($1)", &[&TEMPLATE_LOCK_KEY])
            .await?;
        let exists = admin
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
            .await?
            .is_some();
        if !exists {
            let building = format!("{name}_building");
            admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {building}"))
                .await?;
            admin
                .batch_execute(&format!("CREATE DATABASE {building}"))
                .await?;
            inventory_postgres::migrate::run(&self.config_of(&building))
                .await
                .context("migrate the template")?;
            admin
                .batch_execute(&format!("ALTER DATABASE {building} RENAME TO {name}"))
                .await?;
        }
        admin
            .execute("SELECT pg_advisory_unlock($1)", &[&TEMPLATE_LOCK_KEY])
            .await?;
        Ok(name)
    }

    /// A new database with a random name and the current schema.
    pub async fn fresh_database(&self) -> anyhow::Result<PgConfig> {
        self.create(&random_name()).await
    }

    /// Database `name` with the current schema and nothing in it; whatever had that name is
    /// dropped first (sessions still on it are cut).
    pub async fn create(&self, name: &str) -> anyhow::Result<PgConfig> {
        let template = self.template().await?;
        let admin = connect(&self.admin).await?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {template}"))
            .await?;
        Ok(self.config_of(name))
    }

    /// Database `name` (dropped first if it exists) with no schema at all: for a release
    /// other than this build to migrate.
    pub async fn create_empty(&self, name: &str) -> anyhow::Result<PgConfig> {
        let admin = connect(&self.admin).await?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await?;
        Ok(self.config_of(name))
    }

    /// A new database with no schema at all.
    pub async fn empty_database(&self) -> anyhow::Result<PgConfig> {
        let name = random_name();
        connect(&self.admin)
            .await?
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await?;
        Ok(self.config_of(&name))
    }

    /// Drops database `name`, cutting the sessions still on it.
    pub async fn drop_database(&self, name: &str) -> anyhow::Result<()> {
        connect(&self.admin)
            .await?
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await?;
        Ok(())
    }
}

fn random_name() -> String {
    format!("inventory_test_{}", uuid::Uuid::new_v4().simple())
}

/// A `postgres://` URL of `config` (user, host, port and database; no password or TLS), for
/// tools that take one.
pub fn url(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => "127.0.0.1".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres");
    let db = config.get_dbname().unwrap_or("postgres");
    format!("postgres://{user}@{host}:{port}/{db}")
}

// ---------------------------------------------------------------------------------------------
// A throwaway cluster

/// How a [`Postgres`] cluster differs from the default: loopback only, any client trusted,
/// tuned for speed rather than durability.
#[derive(Clone, Debug)]
pub struct PostgresOptions {
    /// `listen_addresses`.
    pub listen: Vec<String>,
    /// More `-c name=value` settings (`ssl=on`, ...).
    pub settings: Vec<(String, String)>,
    /// The whole of `pg_hba.conf`, replacing initdb's.
    pub hba: Option<String>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            listen: vec!["127.0.0.1".into()],
            settings: Vec::new(),
            hba: None,
        }
    }
}

/// A throwaway PostgreSQL cluster of the harness's own, so it can be restarted without
/// disturbing anything else on the machine. Tuned for speed, not durability.
#[derive(Debug)]
pub struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    /// PostgreSQL refuses to run as root: as root, it runs as the `postgres` user.
    as_postgres: bool,
}

/// The newest PostgreSQL's programs: `PG_BIN`, or the newest `/usr/lib/postgresql/*/bin`.
pub fn pg_bin() -> anyhow::Result<PathBuf> {
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
pub(crate) async fn postgres_reaches(path: &Path) -> bool {
    tokio::process::Command::new("runuser")
        .args(["-u", "postgres", "--", "test", "-x"])
        .arg(path.parent().unwrap_or(path))
        .status()
        .await
        .is_ok_and(|status| status.success())
}

/// One folder per requested path, the same on every run, so a run that was killed is found
/// and stopped by the next.
pub(crate) fn fallback_data_dir(requested: &Path) -> PathBuf {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::hash::DefaultHasher::new();
    requested.hash(&mut hasher);
    PathBuf::from(format!("/var/tmp/inventory-chaos-{:016x}", hasher.finish())).join("postgres")
}

impl Postgres {
    /// Creates a fresh cluster in `data` (or, when the `postgres` user cannot reach it, in a
    /// folder of its own under /var/tmp) and starts it on a free port.
    pub async fn start(data: &Path) -> anyhow::Result<Self> {
        Self::start_with(data, &PostgresOptions::default()).await
    }

    /// [`Self::start`], with `options`. Files the settings name must be readable by the
    /// `postgres` user when the harness runs as root.
    pub async fn start_with(data: &Path, options: &PostgresOptions) -> anyhow::Result<Self> {
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
            .run(
                "initdb",
                &[
                    "-D",
                    &postgres.data_str(),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ],
            )
            .await
            .context("initdb")?;
        if let Some(hba) = &options.hba {
            // Written by this process: readable by the server whoever owns it.
            std::fs::write(postgres.data.join("pg_hba.conf"), hba)?;
        }
        postgres.launch(options).await?;
        Ok(postgres)
    }

    /// Starts the server of this cluster's data folder with `options`' settings.
    async fn launch(&self, options: &PostgresOptions) -> anyhow::Result<()> {
        let postgres = self;
        let mut settings = format!(
            "-p {} -c listen_addresses={} -c unix_socket_directories={} \
             -c max_connections=200 -c fsync=off -c synchronous_commit=off",
            postgres.port,
            options.listen.join(","),
            postgres.data_str()
        );
        for (name, value) in &options.settings {
            settings.push_str(&format!(" -c {name}={value}"));
        }
        postgres
            .run(
                "pg_ctl",
                &[
                    "-D",
                    &postgres.data_str(),
                    "-l",
                    &postgres.log(),
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    &settings,
                    "start",
                ],
            )
            .await
            .with_context(|| {
                let log = std::fs::read_to_string(postgres.log()).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                format!(
                    "pg_ctl start; the end of its log:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })?;
        Ok(())
    }

    /// A folder beside the data folder (reachable by the server's user like it), emptied,
    /// owned by that user.
    async fn sibling(&self, name: &str) -> anyhow::Result<PathBuf> {
        let parent = self.data.parent().context("the data folder has a parent")?;
        let dir = parent.join(name);
        if dir.join("postmaster.pid").exists() {
            let data = dir.display().to_string();
            let _ = self
                .run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"])
                .await;
        }
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        let path = dir.display().to_string();
        if self.as_postgres {
            output("chown", &["postgres:", &path]).await?;
        }
        output("chmod", &["700", &path]).await?;
        Ok(dir)
    }

    /// Turns on WAL archiving (a restart) into a folder beside the data folder, which it
    /// returns: every finished WAL segment is copied there, as a backup's archive would be.
    pub async fn archive_wal(&self) -> anyhow::Result<PathBuf> {
        let archive = self.sibling("wal-archive").await?;
        let admin = connect(&self.admin_config()?).await?;
        // One statement per call: ALTER SYSTEM refuses the implicit transaction of several.
        admin
            .batch_execute("ALTER SYSTEM SET archive_mode = on")
            .await?;
        admin
            .batch_execute(&format!(
                "ALTER SYSTEM SET archive_command = 'test ! -f {dir}/%f && cp %p {dir}/%f'",
                dir = archive.display()
            ))
            .await?;
        self.restart_fast().await?;
        Ok(archive)
    }

    /// Ends the current WAL segment and waits until the archive has it: everything committed
    /// so far can be recovered from the archive.
    pub async fn flush_archive(&self) -> anyhow::Result<()> {
        let admin = connect(&self.admin_config()?).await?;
        // The segment is named from what the switch returns (the end of the segment it
        // closed), not from the current position: anything written after the switch (the
        // server under test, a checkpoint) is already in the next segment, which is archived
        // only when it fills.
        let segment: String = admin
            .query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])
            .await?
            .get(0);
        let started = std::time::Instant::now();
        loop {
            let archived: Option<String> = admin
                .query_one("SELECT last_archived_wal FROM pg_stat_archiver", &[])
                .await?
                .get(0);
            if archived.is_some_and(|a| a.as_str() >= segment.as_str()) {
                return Ok(());
            }
            anyhow::ensure!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "segment {segment} not archived within 60 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// A base backup of the running cluster (`pg_basebackup`, with the WAL it needs) in a
    /// folder beside the data folder, which it returns.
    pub async fn base_backup(&self, name: &str) -> anyhow::Result<PathBuf> {
        let backup = self.sibling(name).await?;
        let port = self.port.to_string();
        let dest = backup.display().to_string();
        self.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                &dest,
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
        )
        .await
        .context("pg_basebackup")?;
        Ok(backup)
    }

    /// Point-in-time recovery into a new cluster (folder `name` beside this one's data, a port
    /// of its own): a copy of `backup`, replaying `archive` up to the restore point `target`
    /// (`pg_create_restore_point`), then promoted, which starts a new timeline. Returns once
    /// it takes writes. This cluster is left as it is.
    pub async fn restore(
        &self,
        backup: &Path,
        archive: &Path,
        target: &str,
        name: &str,
    ) -> anyhow::Result<Postgres> {
        let data = self.sibling(name).await?;
        let (from, to) = (
            format!("{}/.", backup.display()),
            data.display().to_string(),
        );
        let argv = self.argv("cp", &[]);
        // `cp` of the system, as the server's user (so the copy is theirs).
        let mut cp: Vec<&str> = argv[..argv.len() - 1].iter().map(String::as_str).collect();
        cp.extend(["cp", "-a", &from, &to]);
        output(cp[0], &cp[1..]).await.context("copy the backup")?;
        std::fs::write(data.join("recovery.signal"), "")?;
        let mut auto = std::fs::read_to_string(data.join("postgresql.auto.conf"))?;
        auto.push_str(&format!(
            "restore_command = 'cp {archive}/%f %p'\n\
             recovery_target_name = '{target}'\n\
             recovery_target_action = 'promote'\n\
             archive_mode = off\n",
            archive = archive.display()
        ));
        std::fs::write(data.join("postgresql.auto.conf"), auto)?;
        let restored = Postgres {
            bin: self.bin.clone(),
            data,
            port: free_port()?,
            as_postgres: self.as_postgres,
        };
        restored.launch(&PostgresOptions::default()).await?;
        let admin = connect(&restored.admin_config()?).await?;
        let started = std::time::Instant::now();
        while admin
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await?
            .get::<_, bool>(0)
        {
            anyhow::ensure!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "the restored cluster did not finish recovery within 60 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Ok(restored)
    }

    /// Where the cluster's data (and its `server.log`) is.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    fn data_str(&self) -> String {
        self.data.display().to_string()
    }

    fn log(&self) -> String {
        format!("{}/server.log", self.data_str())
    }

    /// The command line of one of PostgreSQL's programs, as the user it must run as.
    fn argv(&self, tool: &str, args: &[&str]) -> Vec<String> {
        let mut argv = Vec::new();
        if self.as_postgres {
            argv.extend(["runuser", "-u", "postgres", "--"].map(String::from));
        }
        argv.push(self.bin.join(tool).display().to_string());
        argv.extend(args.iter().map(|a| a.to_string()));
        argv
    }

    async fn run(&self, tool: &str, args: &[&str]) -> anyhow::Result<()> {
        let argv = self.argv(tool, args);
        let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
        output(&argv[0], &args).await.map(drop)
    }

    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The URL of `database` reached through `addr` (a proxy in front of the cluster).
    pub fn url_via(&self, addr: SocketAddr, database: &str) -> String {
        format!("postgres://postgres@{addr}/{database}")
    }

    /// Settings of the `postgres` database, for [`TemplateDatabases`].
    pub fn admin_config(&self) -> anyhow::Result<PgConfig> {
        Ok(self.url("postgres").parse()?)
    }

    /// Fast shutdown (open transactions are rolled back, connections cut), then start again.
    pub async fn restart_fast(&self) -> anyhow::Result<()> {
        // With its log file, or the new postmaster would hold this process's stdout open.
        let (data, log) = (self.data_str(), self.log());
        self.run(
            "pg_ctl",
            &[
                "-D", &data, "-l", &log, "-m", "fast", "-w", "-t", "60", "restart",
            ],
        )
        .await
        .context("pg_ctl restart")
    }

    /// Immediate shutdown; errors are ignored (it may be down already).
    pub async fn stop(&self) {
        let data = self.data_str();
        let _ = self
            .run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"])
            .await;
    }
}

impl Drop for Postgres {
    /// Best effort, for a run that ends early: the server is a daemon, not a child.
    fn drop(&mut self) {
        if self.data.join("postmaster.pid").exists() {
            let data = self.data_str();
            let argv = self.argv("pg_ctl", &["-D", &data, "-m", "immediate", "stop"]);
            let _ = std::process::Command::new(&argv[0])
                .args(&argv[1..])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

#[cfg(test)]
mod tests;
