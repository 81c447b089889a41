//! PgBouncer (session mode) in front of a PostgreSQL, as a deployment puts it between the replicas and the
//! database: Debian's `pgbouncer`, started on a free port with its files in a folder of its
//! own, reaching PostgreSQL over its Unix socket (so that the sessions it opens are told from
//! direct ones: they have no client address).

use std::{fs::File, path::Path, process::Stdio};

use anyhow::Context as _;
use tokio::process::Command;

use crate::{
    ports::free_port,
    process::{Process, eventually, output},
};

/// A running PgBouncer; it stops when dropped.
#[derive(Debug)]
pub struct PgBouncer {
    port: u16,
    _process: Process,
}

impl PgBouncer {
    /// Starts PgBouncer in session mode in `dir`, forwarding every database to the PostgreSQL
    /// whose Unix socket is in `socket_dir` on `pg_port`, trusting user `postgres`.
    pub async fn start(dir: &Path, socket_dir: &str, pg_port: u16) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let port = free_port()?;
        let users = dir.join("users.txt");
        std::fs::write(&users, "\"postgres\" \"\"\n")?;
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host={socket_dir} port={pg_port}\n\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
                 unix_socket_dir =\nauth_type = trust\nauth_file = {}\n\
                 pool_mode = session\nmax_client_conn = 200\ndefault_pool_size = 40\n",
                users.display(),
            ),
        )?;
        let mut command = Command::new("pgbouncer");
        // It will not run as root: it reads its files, then becomes `postgres`.
        if output("id", &["-u"]).await?.trim() == "0" {
            command.args(["-u", "postgres"]);
        }
        let log = File::create(dir.join("pgbouncer.log"))?;
        let child = command
            .arg(&ini)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("cannot run pgbouncer (make test installs Debian's pgbouncer)")?;
        let process = Process::new(child);
        eventually(
            "PgBouncer listening",
            std::time::Duration::from_secs(10),
            || async {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
            },
        )
        .await?;
        Ok(Self {
            port,
            _process: process,
        })
    }

    /// A URL of `database` through PgBouncer.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }
}
