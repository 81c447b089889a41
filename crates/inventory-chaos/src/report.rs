//! A run's report: the schedule as applied, counts by outcome and by fault (and holds by
//! tenant), the checker's verdict per tenant, and a timeline chart (SVG) of throughput and
//! errors with the faults marked.

use std::{collections::BTreeMap, fmt::Write as _};

use inventory_testkit::svg;
use serde::Serialize;

use crate::{
    checker::Check,
    history::{History, OpKind, Outcome},
    schedule::{Fault, Planned},
    topology::Topology,
};

/// A fault as it was applied.
#[derive(Clone, Debug, Serialize)]
pub struct Applied {
    pub fault: Fault,
    pub started_ms: f64,
    /// How much later than scheduled it started (an earlier fault took long to heal).
    pub late_ms: f64,
    /// When everything it broke served again (a restarted process answering, a cluster `ok`).
    pub healed_ms: f64,
    /// A failover: when the monitor had promoted the standby.
    pub promoted_ms: Option<f64>,
    /// A failover: the longest stretch, between its start and its healing, in which no
    /// `Reserve` was answered OK: how long the service was unavailable.
    pub unavailable_ms: Option<f64>,
    /// `Reserve` answers to calls made while it lasted, by status code.
    pub reserve_codes: BTreeMap<String, u64>,
    /// A fault on a lease holder: which replica held which SKU, and how long after the fault
    /// began that SKU was first sold again (a `Reserve` of it made since, answered OK).
    pub holder: Option<HolderFault>,
}

#[derive(Clone, Debug, Serialize)]
pub struct HolderFault {
    /// `None`: no replica held a lease when the fault came; it hit replica 0.
    pub replica: Option<usize>,
    /// The tenant whose SKU's lease it held (its keys: `<prefix>:<tenant>:{<sku>}:lease`).
    pub tenant: Option<String>,
    pub sku: Option<String>,
    pub sold_again_ms: Option<f64>,
}

/// How long after `from_ms` a `Reserve` of `tenant`'s `sku` made since was first answered OK.
pub fn sold_again_ms(history: &History, tenant: &str, sku: &str, from_ms: f64) -> Option<f64> {
    history
        .ops
        .iter()
        .filter(|o| {
            o.tenant == tenant
                && o.kind == OpKind::Reserve
                && o.outcome == Outcome::Ok
                && o.invoked_ms >= from_ms
                && o.lines.iter().any(|l| l.sku == sku)
        })
        .map(|o| o.completed_ms - from_ms)
        .min_by(f64::total_cmp)
}

#[derive(Debug, Serialize)]
pub struct RunReport {
    pub topology: Topology,
    pub seed: u64,
    pub duration_s: f64,
    pub clients: usize,
    /// SKU names, each a SKU of every tenant.
    pub skus: usize,
    /// The tenants the replicas served, each with the same SKU names.
    pub tenants: Vec<String>,
    pub schedule: Vec<Planned>,
    pub applied: Vec<Applied>,
    /// Operation kind (partial confirms and releases apart, as "confirm part") → status code
    /// → count, load and resolve phases together.
    pub counts: BTreeMap<String, BTreeMap<String, u64>>,
    /// `Reserve` calls answered OK, by tenant.
    pub holds_by_tenant: BTreeMap<String, u64>,
    /// Keys whose outcome was unknown after their in-run retries.
    pub unknown_after_load: usize,
    pub events: usize,
    pub checks: Vec<Check>,
    pub passed: bool,
    /// The command that runs this schedule again.
    pub replay: String,
}

pub fn counts(history: &History) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut counts: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for op in &history.ops {
        let mut kind = format!("{:?}", op.kind).to_lowercase();
        if op.is_partial() {
            kind.push_str(" part");
        }
        *counts
            .entry(kind)
            .or_default()
            .entry(op.code.clone())
            .or_insert(0) += 1;
    }
    counts
}

/// `Reserve` calls answered OK, by tenant (every tenant served, none left out).
pub fn holds_by_tenant(history: &History, tenants: &[String]) -> BTreeMap<String, u64> {
    let mut holds: BTreeMap<String, u64> = tenants.iter().map(|t| (t.clone(), 0)).collect();
    for op in &history.ops {
        if op.kind == OpKind::Reserve && op.outcome == Outcome::Ok {
            *holds.entry(op.tenant.clone()).or_insert(0) += 1;
        }
    }
    holds
}

/// `Reserve` answers for calls invoked between two moments, by code.
pub fn reserve_codes(history: &History, from_ms: f64, to_ms: f64) -> BTreeMap<String, u64> {
    let mut codes = BTreeMap::new();
    for op in &history.ops {
        if op.kind == OpKind::Reserve && op.invoked_ms >= from_ms && op.invoked_ms <= to_ms {
            *codes.entry(op.code.clone()).or_insert(0) += 1;
        }
    }
    codes
}

/// The longest stretch between `from_ms` and `to_ms` in which no `Reserve` was answered OK:
/// from `from_ms` to the first answer, between answers, and from the last answer to `to_ms`.
pub fn longest_without_reserve(history: &History, from_ms: f64, to_ms: f64) -> f64 {
    let mut answers: Vec<f64> = history
        .ops
        .iter()
        .filter(|o| o.kind == OpKind::Reserve && o.outcome == Outcome::Ok)
        .map(|o| o.completed_ms)
        .filter(|&at| at >= from_ms && at <= to_ms)
        .collect();
    answers.sort_by(f64::total_cmp);
    answers.push(to_ms);
    let mut previous = from_ms;
    let mut longest = 0.0_f64;
    for at in answers {
        longest = longest.max(at - previous);
        previous = at;
    }
    longest
}

fn codes_line(codes: &BTreeMap<String, u64>) -> String {
    if codes.is_empty() {
        return "no calls".into();
    }
    codes
        .iter()
        .map(|(code, n)| format!("{code} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl RunReport {
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "== chaos {}: seed {}, {:.0} s, {} clients, {} SKUs in tenants {}: {}",
            self.topology.name(),
            self.seed,
            self.duration_s,
            self.clients,
            self.skus,
            self.tenants.join(", "),
            if self.passed { "PASSED" } else { "FAILED" }
        );
        let _ = writeln!(out, "faults ({}):", self.applied.len());
        for a in &self.applied {
            let _ = writeln!(
                out,
                "  {:>6.1} s  {:<20} healed after {:>5.1} s{}   reserve: {}",
                a.started_ms / 1000.0,
                a.fault.name(),
                (a.healed_ms - a.started_ms) / 1000.0,
                if a.late_ms > 500.0 {
                    format!(" ({:.1} s late)", a.late_ms / 1000.0)
                } else {
                    String::new()
                },
                codes_line(&a.reserve_codes)
            );
            if let (Some(promoted), Some(unavailable)) = (a.promoted_ms, a.unavailable_ms) {
                let _ = writeln!(
                    out,
                    "            standby promoted after {:.1} s; no Reserve answered OK for {:.1} s",
                    (promoted - a.started_ms) / 1000.0,
                    unavailable / 1000.0
                );
            }
            if let Some(holder) = &a.holder {
                let tenant = holder.tenant.as_deref().unwrap_or_default();
                let line = match (holder.replica, &holder.sku, holder.sold_again_ms) {
                    (Some(replica), Some(sku), Some(ms)) => format!(
                        "replica {replica} held tenant {tenant}'s {sku} lease; sold again after \
                         {:.2} s",
                        ms / 1000.0
                    ),
                    (Some(replica), Some(sku), None) => format!(
                        "replica {replica} held tenant {tenant}'s {sku} lease; never sold again"
                    ),
                    _ => "no replica held a lease at that moment; replica 0 took it".to_owned(),
                };
                let _ = writeln!(out, "            {line}");
            }
        }
        let _ = writeln!(out, "calls:");
        for (kind, codes) in &self.counts {
            let _ = writeln!(out, "  {kind:<12} {}", codes_line(codes));
        }
        let holds: Vec<String> = self
            .holds_by_tenant
            .iter()
            .map(|(tenant, n)| format!("{tenant} {n}"))
            .collect();
        let _ = writeln!(out, "  holds by tenant: {}", holds.join(", "));
        let _ = writeln!(
            out,
            "  {} keys unknown after their retries, resolved afterwards; {} events",
            self.unknown_after_load, self.events
        );
        // Each tenant's checks together, then those of the run as a whole.
        let width = self
            .tenants
            .iter()
            .map(String::len)
            .max()
            .unwrap_or(0)
            .max(3);
        let _ = writeln!(out, "checks (per tenant, then across tenants):");
        for c in &self.checks {
            let _ = writeln!(
                out,
                "  {} {:<width$} {:<34} {:>6} examined  {}",
                if c.passed { "ok  " } else { "FAIL" },
                c.tenant.as_deref().unwrap_or("all"),
                c.name,
                c.examined,
                c.detail
            );
        }
        if !self.passed {
            let _ = writeln!(out, "replay this schedule: {}", self.replay);
        }
        out
    }
}

/// Calls per second (successes, refusals, unknown outcomes) with the faults as bands.
pub fn svg(report: &RunReport, history: &History) -> String {
    const W: f64 = 1000.0;
    const LEFT: f64 = 60.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 50.0;
    const PLOT: f64 = 300.0;
    const LANE: f64 = 16.0;
    const BUCKET_MS: f64 = 500.0;
    let end_ms = history
        .ops
        .iter()
        .map(|o| o.completed_ms)
        .fold(report.duration_s * 1000.0, f64::max);
    let buckets = (end_ms / BUCKET_MS).ceil().max(1.0) as usize;
    let mut series = [
        vec![0u64; buckets],
        vec![0u64; buckets],
        vec![0u64; buckets],
    ];
    for op in history.ops.iter().filter(|o| o.kind == OpKind::Reserve) {
        let i = ((op.completed_ms / BUCKET_MS) as usize).min(buckets - 1);
        let s = match op.outcome {
            Outcome::Ok => 0,
            Outcome::Fail => 1,
            Outcome::Unknown => 2,
        };
        series[s][i] += 1;
    }
    let per_s = 1000.0 / BUCKET_MS;
    let y_max = series
        .iter()
        .flatten()
        .map(|&n| n as f64 * per_s)
        .fold(1.0, f64::max)
        * 1.1;
    let x = |ms: f64| LEFT + (W - LEFT - RIGHT) * ms / end_ms;
    let y = |v: f64| TOP + PLOT - PLOT * v / y_max;
    let lanes_top = TOP + PLOT + 40.0;
    let height = lanes_top + 2.0 * LANE + 40.0;
    let mut out = String::new();
    svg::open(&mut out, W, height, 11);
    let _ = write!(
        out,
        r##"<text x="{LEFT}" y="22" font-size="15">chaos {} — seed {}: {}</text><text x="{LEFT}" y="40">Reserve answers per second; shaded: faults (label above each band)</text>"##,
        report.topology.name(),
        report.seed,
        if report.passed {
            "checker PASSED"
        } else {
            "checker FAILED"
        }
    );
    // Fault bands, labelled in alternating rows so neighbours do not overlap.
    for (i, a) in report.applied.iter().enumerate() {
        let (x0, x1) = (x(a.started_ms), x(a.healed_ms.max(a.started_ms + 50.0)));
        let _ = write!(
            out,
            r##"<rect x="{x0:.1}" y="{TOP}" width="{:.1}" height="{PLOT}" fill="{}" opacity="0.18"/>"##,
            x1 - x0,
            fault_colour(&a.fault)
        );
        let row = (i % 2) as f64;
        let _ = write!(
            out,
            r##"<text x="{x0:.1}" y="{:.1}" font-size="10" fill="#333">{}</text>"##,
            lanes_top + row * LANE,
            a.fault.name()
        );
        let _ = write!(
            out,
            r##"<line x1="{x0:.1}" x2="{x0:.1}" y1="{:.1}" y2="{:.1}" stroke="#999" stroke-width="0.5"/>"##,
            TOP + PLOT,
            lanes_top + row * LANE - 9.0
        );
    }
    // Axes and ticks.
    let _ = write!(
        out,
        r##"<line x1="{LEFT}" y1="{0}" x2="{1}" y2="{0}" stroke="black"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{0}" stroke="black"/>"##,
        TOP + PLOT,
        W - RIGHT
    );
    for t in 0..=4 {
        let v = y_max * t as f64 / 4.0;
        let _ = write!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{v:.0}</text>"##,
            LEFT - 5.0,
            y(v) + 4.0
        );
    }
    let step_s = ((end_ms / 1000.0) / 10.0).ceil().max(1.0);
    let mut t = 0.0;
    while t * 1000.0 <= end_ms {
        let _ = write!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{t:.0}s</text>"##,
            x(t * 1000.0),
            TOP + PLOT + 15.0
        );
        t += step_s;
    }
    let styles = [
        ("OK", "#2ca02c"),
        ("refused (nothing written)", "#ff7f0e"),
        ("unknown outcome", "#d62728"),
    ];
    for (s, (label, colour)) in styles.iter().enumerate() {
        let points = series[s]
            .iter()
            .enumerate()
            .map(|(i, &n)| (x((i as f64 + 0.5) * BUCKET_MS), y(n as f64 * per_s)));
        svg::polyline(&mut out, colour, 1.5, points);
        let lx = LEFT + 10.0 + s as f64 * 220.0;
        let ly = height - 15.0;
        let _ = write!(
            out,
            r##"<rect x="{lx}" y="{:.1}" width="12" height="3" fill="{colour}"/><text x="{:.1}" y="{ly}">{label}</text>"##,
            ly - 4.0,
            lx + 16.0
        );
    }
    svg::close(&mut out);
    out
}

fn fault_colour(fault: &Fault) -> &'static str {
    match fault {
        Fault::PauseReplica { .. }
        | Fault::KillReplica { .. }
        | Fault::PauseHolder { .. }
        | Fault::KillHolder { .. } => "#1f77b4",
        Fault::RedisPause { .. } | Fault::RedisSlow { .. } => "#ff7f0e",
        Fault::PostgresRestart | Fault::PostgresCut { .. } | Fault::PostgresSlow { .. } => {
            "#9467bd"
        }
        _ => "#d62728",
    }
}
