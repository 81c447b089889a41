//! Where the time goes: CPU seconds of each process on the machine over a run (from
//! `/proc`), and the server's own timings of each step (from its `/metrics` page).

use std::{collections::BTreeMap, net::SocketAddr};

use serde::Serialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// CPU seconds (user + system) of every process alive at the moment, with its name and its
/// parent.
#[derive(Clone, Debug, Default)]
pub struct CpuSnapshot(BTreeMap<u32, Process>);

#[derive(Clone, Debug)]
struct Process {
    name: String,
    parent: u32,
    seconds: f64,
}

impl CpuSnapshot {
    /// Empty where `/proc` is not there (not Linux).
    pub fn take() -> Self {
        // USER_HZ is 100 on every Linux architecture this runs on.
        const TICKS: f64 = 100.0;
        let mut processes = BTreeMap::new();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Self(processes);
        };
        for entry in entries.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                continue;
            };
            let name = stat[open + 1..close].to_owned();
            let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
            let ticks = |i: usize| {
                fields
                    .get(i)
                    .and_then(|f| f.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            processes.insert(
                pid,
                Process {
                    name,
                    parent: ticks(1) as u32,
                    seconds: (ticks(11) + ticks(12)) / TICKS,
                },
            );
        }
        Self(processes)
    }

    /// CPU seconds spent since `before`, by component. Processes that ended in between are
    /// not counted, so the load's processes must outlive the window.
    ///
    /// With several server processes, `server` is their sum and `server (busiest)` the one
    /// that used the most: on separate machines, that one is the fleet's limit.
    pub fn since(&self, before: &Self) -> BTreeMap<String, f64> {
        let mut by_component = BTreeMap::new();
        let mut busiest_server: f64 = 0.0;
        for (pid, process) in &self.0 {
            let now = process.seconds;
            let then = before.0.get(pid).map_or(0.0, |p| p.seconds);
            let component = match process.name.as_str() {
                "postgres" => "postgres",
                "redis-server" => "redis",
                n if n.starts_with("inventory-serv") => "server",
                n if n.starts_with("inventory-benc") || n == "pgbench" => "load generator",
                _ => "other",
            };
            if component == "server" {
                busiest_server = busiest_server.max(now - then);
            }
            *by_component.entry(component.to_owned()).or_insert(0.0) += now - then;
        }
        by_component.insert("server (busiest)".to_owned(), busiest_server);
        by_component
    }

    /// CPU seconds spent since `before` by process `root` and every process descending from
    /// it (a PostgreSQL postmaster and its backends), of those alive now.
    pub fn tree_since(&self, before: &Self, root: u32) -> f64 {
        self.0
            .iter()
            .filter(|(pid, _)| self.descends_from(**pid, root))
            .map(|(pid, process)| process.seconds - before.0.get(pid).map_or(0.0, |p| p.seconds))
            .sum()
    }

    /// Whether `pid` is `root` or one of its descendants.
    fn descends_from(&self, mut pid: u32, root: u32) -> bool {
        // A process tree is never this deep; the bound only guards against a loop.
        for _ in 0..64 {
            if pid == root {
                return true;
            }
            match self.0.get(&pid) {
                Some(process) if process.parent != 0 && process.parent != pid => {
                    pid = process.parent;
                }
                _ => return false,
            }
        }
        false
    }
}

/// Means of the server's step timings over a run, in microseconds.
#[derive(Debug, Default, Serialize)]
pub struct Steps {
    pub rpc_us: f64,
    pub lease_acquire_us: f64,
    pub transaction_us: f64,
    pub commit_us: f64,
    pub transactions: f64,
    pub requests_per_transaction: f64,
}

/// Sum and count of a histogram over the series whose labels contain `filter`.
fn histogram(page: &str, name: &str, filter: &str) -> (f64, f64) {
    let value = |suffix: &str| -> f64 {
        page.lines()
            .filter(|line| line.starts_with(&format!("{name}_{suffix}")) && line.contains(filter))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    (value("sum"), value("count"))
}

/// `after - before` of the server's histograms, as means.
pub fn steps(before: &str, after: &str) -> Steps {
    let mean_us = |name: &str, filter: &str| {
        let (s0, c0) = histogram(before, name, filter);
        let (s1, c1) = histogram(after, name, filter);
        let count = c1 - c0;
        (
            if count > 0.0 {
                (s1 - s0) / count * 1e6
            } else {
                0.0
            },
            count,
        )
    };
    // The API's Reserve only, not the peer port's forwarded ones.
    let (rpc_us, _) = mean_us(
        "inventory_rpc_duration_seconds",
        "InventoryService/Reserve\"",
    );
    let (lease_acquire_us, _) = mean_us("inventory_lease_acquire_duration_seconds", "granted");
    // Coalesced transactions only: the batch sizes are theirs (a lone request's write
    // records `path="single"`).
    let coalesced = "path=\"coalesced\"";
    let (transaction_us, transactions) =
        mean_us("inventory_reserve_transaction_duration_seconds", coalesced);
    let (commit_us, _) = mean_us("inventory_reserve_commit_duration_seconds", coalesced);
    let (b0, _) = histogram(before, "inventory_reserve_batch_size", "");
    let (b1, _) = histogram(after, "inventory_reserve_batch_size", "");
    Steps {
        rpc_us,
        lease_acquire_us,
        transaction_us,
        commit_us,
        transactions,
        requests_per_transaction: if transactions > 0.0 {
            (b1 - b0) / transactions
        } else {
            0.0
        },
    }
}

/// The admin port's `/metrics` page (empty if it cannot be read).
pub async fn scrape(admin: SocketAddr) -> String {
    let Ok(mut stream) = tokio::net::TcpStream::connect(admin).await else {
        return String::new();
    };
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut page = String::new();
    let _ = stream.read_to_string(&mut page).await;
    page
}

/// Where one run's time went.
#[derive(Debug, Default, Serialize)]
pub struct Profile {
    /// CPU microseconds per reservation, by component (`postgres`, `server`, `redis`,
    /// `load generator`, `other`).
    pub cpu_us_per_reservation: BTreeMap<String, f64>,
    /// Share of the machine's CPU time that was busy over the run (1.0: every core, always).
    pub cpu_busy: f64,
    pub steps: Steps,
}

impl Profile {
    pub fn new(cpu: BTreeMap<String, f64>, seconds: f64, reservations: f64, steps: Steps) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        // `server (busiest)` is one of the servers, already in `server`.
        let total: f64 = cpu
            .iter()
            .filter(|(k, _)| k.as_str() != "server (busiest)")
            .map(|(_, v)| v)
            .sum();
        Self {
            cpu_us_per_reservation: cpu
                .into_iter()
                .map(|(k, v)| (k, v / reservations.max(1.0) * 1e6))
                .collect(),
            cpu_busy: total / (seconds.max(1e-9) * cores),
            steps,
        }
    }

    pub fn print(&self) {
        let cpu: Vec<String> = self
            .cpu_us_per_reservation
            .iter()
            .map(|(k, v)| format!("{k} {v:.0}"))
            .collect();
        println!(
            "  CPU µs per reservation: {} (machine {:.0}% busy)",
            cpu.join(", "),
            self.cpu_busy * 100.0
        );
        let s = &self.steps;
        if s.rpc_us > 0.0 {
            println!(
                "  server means: Reserve {:.0}µs = lease {:.0}µs + transaction {:.0}µs (commit {:.0}µs) + rest; {:.1} requests per transaction",
                s.rpc_us,
                s.lease_acquire_us,
                s.transaction_us,
                s.commit_us,
                s.requests_per_transaction
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(processes: &[(u32, &str, u32, f64)]) -> CpuSnapshot {
        CpuSnapshot(
            processes
                .iter()
                .map(|&(pid, name, parent, seconds)| {
                    let name = name.to_owned();
                    (
                        pid,
                        Process {
                            name,
                            parent,
                            seconds,
                        },
                    )
                })
                .collect(),
        )
    }

    #[test]
    fn a_tree_counts_its_root_and_every_descendant_only() {
        // Two clusters: postmasters 10 and 20, each with backends (and a grandchild of 10).
        let before = snapshot(&[
            (10, "postgres", 1, 1.0),
            (11, "postgres", 10, 2.0),
            (20, "postgres", 1, 5.0),
            (21, "postgres", 20, 5.0),
        ]);
        let after = snapshot(&[
            (10, "postgres", 1, 1.5),
            (11, "postgres", 10, 3.0),
            // Started during the window: all of its time counts.
            (12, "postgres", 10, 0.25),
            (13, "postgres", 12, 0.25),
            (20, "postgres", 1, 6.0),
            (21, "postgres", 20, 7.0),
        ]);
        assert_eq!(after.tree_since(&before, 10), 2.0);
        assert_eq!(after.tree_since(&before, 20), 3.0);
        assert_eq!(after.tree_since(&before, 21), 2.0);
        assert_eq!(after.tree_since(&before, 99), 0.0);
        assert_eq!(after.since(&before)["postgres"], 5.0);
    }
}
