//! Child processes that faults act on, and waiting for a condition to hold.

use std::{
    fmt::Debug,
    process::{ExitStatus, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use tokio::process::{Child, Command};

/// How often [`eventually`] checks again.
const POLL_EVERY: Duration = Duration::from_millis(50);

/// Runs a command to completion and returns its standard output; fails when it exits with
/// an error, quoting what it printed.
pub async fn output(program: &str, args: &[&str]) -> anyhow::Result<String> {
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
pub async fn signal(child: &Child, name: &str) -> anyhow::Result<()> {
    let pid = child.id().context("the process has already exited")?;
    output("kill", &[&format!("-{name}"), &pid.to_string()]).await?;
    Ok(())
}

/// A child process the faults act on: killed (SIGKILL), paused (SIGSTOP), resumed (SIGCONT),
/// stopped (SIGTERM). Whoever spawned it restarts it. Spawn the child with `kill_on_drop`, so
/// dropping this kills it, stopped or not.
#[derive(Debug, Default)]
pub struct Process(Option<Child>);

impl Process {
    pub fn new(child: Child) -> Self {
        Self(Some(child))
    }

    /// Whether there is a child (it may have exited by itself since).
    pub fn is_running(&self) -> bool {
        self.0.is_some()
    }

    /// The process id, while there is a child.
    pub fn id(&self) -> Option<u32> {
        self.0.as_ref().and_then(Child::id)
    }

    fn running(&self) -> anyhow::Result<&Child> {
        self.0.as_ref().context("not running")
    }

    /// SIGKILL, then reap: the process is gone at once, with everything it held.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.0.take() {
            child.kill().await?;
        }
        Ok(())
    }

    /// SIGSTOP: the process keeps its connections but answers nothing until [`Self::resume`].
    pub async fn pause(&self) -> anyhow::Result<()> {
        signal(self.running()?, "STOP").await
    }

    /// SIGCONT: a paused process reads what queued up meanwhile and answers it.
    pub async fn resume(&self) -> anyhow::Result<()> {
        signal(self.running()?, "CONT").await
    }

    /// SIGTERM, as an orchestrator stops a pod (after SIGCONT, in case it is paused), then
    /// waits up to `grace` for it to exit before killing it. The exit status, if it exited.
    pub async fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        let mut child = self.0.take()?;
        let _ = signal(&child, "CONT").await;
        let _ = signal(&child, "TERM").await;
        match tokio::time::timeout(grace, child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                let _ = child.kill().await;
                None
            }
        }
    }

    /// `Some(status)` when the child has exited by itself.
    pub fn try_wait(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        match self.0.as_mut() {
            Some(child) => Ok(child.try_wait()?),
            None => bail!("not running"),
        }
    }
}

/// Checks `check` until it holds, for up to `timeout`; fails with "`what` within `timeout`".
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_ok(what, timeout, || {
        let attempt = check();
        async move { if attempt.await { Ok(()) } else { Err("no") } }
    })
    .await
}

/// Calls `attempt` until it succeeds, for up to `timeout`, and returns what it gave; fails
/// with "`what` within `timeout`" and the last error.
pub async fn eventually_ok<T, E, F, Fut>(
    what: &str,
    timeout: Duration,
    mut attempt: F,
) -> anyhow::Result<T>
where
    E: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    loop {
        let error = match attempt().await {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        if started.elapsed() >= timeout {
            bail!("{what} within {timeout:?} (last: {error:?})");
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

#[cfg(test)]
mod tests;
