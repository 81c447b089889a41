//! Rotation without a restart: the credentials file and the gRPC port's certificate, key and
//! client CA are re-read on SIGHUP and whenever they change on disk.
//!
//! The folders holding the files are watched, not the files: a Kubernetes Secret update swaps
//! a symlink (`..data`) in the mounted folder and never writes the old file, and editors and
//! `mv` replace files rather than write them. A new version is applied only if it parses
//! completely; a broken one is logged and the old one stays in force. Calls in flight keep
//! the credentials and TLS session they started with.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::Duration,
};

use notify::{RecursiveMode, Watcher as _};
use secrecy::ExposeSecret as _;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};

use crate::{
    auth::{AuthSources, Gate},
    config::ReloadSources,
    tls::ServerTls,
};

/// Changes arrive as bursts (a write, a rename, a symlink swap): one reload after the burst.
const SETTLE: Duration = Duration::from_millis(100);

/// What is reloaded, and where it is applied.
#[derive(Debug)]
pub struct Reloader {
    sources: ReloadSources,
    gate: Gate,
    tls: Option<ServerTls>,
    /// Digests of what is in force, so an unrelated change in a watched folder does nothing.
    auth_digest: Option<[u8; 32]>,
    tls_digest: Option<[u8; 32]>,
}

/// The SHA-256 of `parts`, each preceded by its length, so no two splits of the same bytes
/// collide: what tells a changed set of files from the one in force.
fn digest<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> [u8; 32] {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    hash.finalize().into()
}

impl Reloader {
    /// Nothing is marked as in force yet: the first [`Self::run`] pass applies the files as
    /// they are then, so a change between start-up's read and the watch is never missed.
    pub fn new(sources: ReloadSources, gate: Gate, tls: Option<ServerTls>) -> Self {
        Self {
            sources,
            gate,
            tls,
            auth_digest: None,
            tls_digest: None,
        }
    }

    /// Every file whose change matters.
    fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self
            .sources
            .auth
            .as_ref()
            .map(AuthSources::files)
            .unwrap_or_default();
        if let Some(tls) = &self.sources.tls {
            files.push(tls.cert.clone());
            files.push(tls.key.clone());
            files.extend(tls.client_ca.iter().cloned());
        }
        files
    }

    /// The credential files' bytes and their digest.
    fn read_auth(&self, sources: &AuthSources) -> Result<([u8; 32], Vec<Vec<u8>>), String> {
        let contents = sources.read()?;
        Ok((digest(contents.iter().map(Vec::as_slice)), contents))
    }

    fn read_tls(&self) -> Option<([u8; 32], crate::config::TlsSettings)> {
        let material = self.sources.tls.as_ref()?.read().ok()?;
        let digest = digest([
            material.cert_pem.as_slice(),
            material.key_pem.expose_secret(),
            material.client_ca_pem.as_deref().unwrap_or_default(),
        ]);
        Some((digest, material))
    }

    /// Re-reads every source and applies what changed and parses.
    pub fn reload(&mut self) {
        self.apply(true);
    }

    fn apply(&mut self, announce: bool) {
        if let Some(sources) = self.sources.auth.clone() {
            match self.read_auth(&sources) {
                Err(problem) => tracing::warn!(
                    problem,
                    "cannot read a credentials file; the credentials in force stay"
                ),
                Ok((digest, _)) if Some(digest) == self.auth_digest => {}
                Ok((digest, contents)) => match sources.parse(&contents) {
                    Ok(authenticator) => {
                        self.gate.replace(authenticator);
                        self.auth_digest = Some(digest);
                        if announce {
                            tracing::info!(files = ?sources.files(), "credentials reloaded");
                        }
                    }
                    Err(problems) => tracing::warn!(
                        files = ?sources.files(),
                        ?problems,
                        "the new credentials are invalid; the credentials in force stay"
                    ),
                },
            }
        }
        if let (Some(files), Some(server_tls)) = (&self.sources.tls, &self.tls) {
            match self.read_tls() {
                None => tracing::warn!(
                    cert = %files.cert.display(),
                    "cannot read the TLS files; the certificate in force stays"
                ),
                Some((digest, _)) if Some(digest) == self.tls_digest => {}
                Some((digest, material)) => match server_tls.replace(&material) {
                    Ok(()) => {
                        self.tls_digest = Some(digest);
                        if announce {
                            tracing::info!(cert = %files.cert.display(), "TLS certificate reloaded");
                        }
                    }
                    Err(error) => tracing::warn!(
                        error = format!("{error:#}"),
                        "the new TLS material is invalid; the certificate in force stays"
                    ),
                },
            }
        }
    }

    /// Reloads on SIGHUP and on changes in the watched folders until `stopping` turns true.
    pub async fn run(mut self, mut stopping: watch::Receiver<bool>) {
        let files = self.files();
        if files.is_empty() {
            return;
        }
        let (changed, mut changes) = mpsc::unbounded_channel::<()>();
        // Kept alive for as long as this task runs; dropping it stops the watching.
        let _watcher = watch_folders(&files, changed);
        let mut hangup = hangup();
        // What is on disk now is what serves from here on (quietly: usually what start-up
        // already loaded).
        self.apply(false);
        loop {
            tokio::select! {
                Some(()) = changes.recv() => {
                    // Let the burst finish, then take everything it queued.
                    tokio::time::sleep(SETTLE).await;
                    while changes.try_recv().is_ok() {}
                }
                Some(()) = next_hangup(&mut hangup) => {
                    tracing::info!("SIGHUP: reloading credentials and TLS material");
                }
                _ = stopping.changed() => return,
            }
            self.reload();
        }
    }
}

fn watch_folders(
    files: &[PathBuf],
    changed: mpsc::UnboundedSender<()>,
) -> Option<notify::RecommendedWatcher> {
    let folders: BTreeSet<PathBuf> = files
        .iter()
        .map(|file| {
            file.parent()
                .filter(|parent| !parent.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf()
        })
        .collect();
    let mut watcher = match notify::recommended_watcher(move |event: notify::Result<_>| {
        let _: notify::Event = match event {
            Ok(event) => event,
            Err(_) => return,
        };
        let _ = changed.send(());
    }) {
        Ok(watcher) => watcher,
        Err(error) => {
            tracing::warn!(%error, "cannot watch credential files; reload with SIGHUP");
            return None;
        }
    };
    for folder in &folders {
        if let Err(error) = watcher.watch(folder, RecursiveMode::NonRecursive) {
            tracing::warn!(%error, folder = %folder.display(), "cannot watch; reload with SIGHUP");
        }
    }
    Some(watcher)
}

#[cfg(unix)]
type Hangup = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangup = Option<()>;

#[cfg(unix)]
fn hangup() -> Hangup {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(signal) => Some(signal),
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGHUP");
            None
        }
    }
}

#[cfg(not(unix))]
fn hangup() -> Hangup {
    None
}

async fn next_hangup(hangup: &mut Hangup) -> Option<()> {
    #[cfg(unix)]
    if let Some(signal) = hangup {
        return signal.recv().await;
    }
    let _ = hangup;
    std::future::pending().await
}

#[cfg(test)]
mod tests;
