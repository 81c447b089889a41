//! Results: a summary for people, JSON for machines, an SVG chart to look at.

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use hdrhistogram::Histogram;
use inventory_testkit::svg::{self as chart, escape, tick};
use serde::Serialize;

use crate::{
    audit::Audit,
    load::{Observed, Scenario},
    profile::Profile,
};

#[derive(Debug, Serialize)]
pub struct Latency {
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub mean_us: f64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Self {
        Self {
            p50_us: h.value_at_quantile(0.5),
            p90_us: h.value_at_quantile(0.9),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
            mean_us: h.mean(),
        }
    }
}

/// One second of the run.
#[derive(Debug, Serialize)]
pub struct Second {
    pub t: u64,
    pub ok: u64,
    pub errors: u64,
    pub p50_us: u64,
    pub p99_us: u64,
}

#[derive(Debug, Serialize)]
pub struct RunResult {
    pub label: String,
    pub scenario: Scenario,
    pub clients: usize,
    pub elapsed_s: f64,
    pub calls: u64,
    /// Calls answered with a reservation.
    pub reservations: u64,
    pub calls_per_s: f64,
    pub reservations_per_s: f64,
    pub latency: Latency,
    pub statuses: BTreeMap<String, u64>,
    pub timeline: Vec<Second>,
    /// (quantile, latency in µs), for the distribution plot.
    pub distribution: Vec<(f64, u64)>,
    pub audit: Option<Audit>,
    pub profile: Option<Profile>,
    /// Bytes on disk and of WAL per reservation, when the run measured them.
    pub storage: Option<Storage>,
    /// Holds meant to expire: the longest any hold waited past its expiry for a sweep, as
    /// sampled from the database during the run (seconds).
    pub oldest_overdue_s: Option<f64>,
}

/// What one reservation of a run cost on disk: every table and index a reservation writes,
/// and the WAL the run wrote, each divided by the reservations made.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Storage {
    pub reservations: i64,
    pub bytes_per_reservation: i64,
    pub wal_per_reservation: i64,
    /// Rows the run's database wrote (inserted, updated or deleted: each a new tuple or a
    /// dead one) per reservation, every table, the sequencer's and the sweeper's included.
    pub tuples_per_reservation: f64,
}

impl RunResult {
    pub fn new(
        label: &str,
        scenario: Scenario,
        clients: usize,
        observed: &Observed,
        audit: Option<Audit>,
    ) -> Self {
        let histogram = observed.latency_histogram();
        let elapsed = observed.elapsed.as_secs_f64().max(1e-9);
        let reservations = observed.held.len() as u64;
        let calls = observed.calls.len() as u64;
        let mut seconds: BTreeMap<u64, (u64, u64, Histogram<u64>)> = BTreeMap::new();
        for call in &observed.calls {
            let entry = seconds.entry(call.at.as_secs()).or_insert_with(|| {
                (
                    0,
                    0,
                    Histogram::new_with_bounds(1, 120_000_000, 2).expect("bounds"),
                )
            });
            if call.code == tonic::Code::Ok {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
            entry.2.saturating_record(call.latency.as_micros() as u64);
        }
        let timeline = seconds
            .into_iter()
            .map(|(t, (ok, errors, h))| Second {
                t,
                ok,
                errors,
                p50_us: h.value_at_quantile(0.5),
                p99_us: h.value_at_quantile(0.99),
            })
            .collect();
        let distribution = [
            0.0, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999, 1.0,
        ]
        .iter()
        .map(|q| (*q, histogram.value_at_quantile(*q)))
        .collect();
        Self {
            label: label.to_owned(),
            scenario,
            clients,
            elapsed_s: elapsed,
            calls,
            reservations,
            calls_per_s: calls as f64 / elapsed,
            reservations_per_s: reservations as f64 / elapsed,
            latency: Latency::of(&histogram),
            statuses: observed.status_counts(),
            timeline,
            distribution,
            audit,
            profile: None,
            storage: None,
            oldest_overdue_s: None,
        }
    }

    pub fn print(&self) {
        let l = &self.latency;
        println!(
            "{}: {:?}, {} clients, {:.1}s: {} calls ({:.0}/s), {} reservations ({:.0}/s)",
            self.label,
            self.scenario,
            self.clients,
            self.elapsed_s,
            self.calls,
            self.calls_per_s,
            self.reservations,
            self.reservations_per_s
        );
        println!(
            "  latency p50 {} p90 {} p99 {} p99.9 {} max {}",
            us(l.p50_us),
            us(l.p90_us),
            us(l.p99_us),
            us(l.p999_us),
            us(l.max_us)
        );
        let statuses: Vec<String> = self
            .statuses
            .iter()
            .map(|(code, n)| format!("{code} {n}"))
            .collect();
        println!("  statuses: {}", statuses.join(", "));
        if let Some(profile) = &self.profile {
            profile.print();
        }
        if let Some(audit) = &self.audit {
            println!(
                "  audit: {}",
                if audit.passed { "PASSED" } else { "FAILED" }
            );
            for check in &audit.checks {
                println!(
                    "    [{}] {}: {}",
                    if check.passed { "ok" } else { "FAIL" },
                    check.name,
                    check.detail
                );
            }
        }
    }
}

pub fn us(micros: u64) -> String {
    let d = Duration::from_micros(micros);
    if micros >= 1_000_000 {
        format!("{:.2}s", d.as_secs_f64())
    } else if micros >= 1_000 {
        format!("{:.2}ms", micros as f64 / 1_000.0)
    } else {
        format!("{micros}µs")
    }
}

/// Three panels: reservations and errors per second, p50/p99 latency per second, and the
/// latency distribution by percentile.
pub fn svg(result: &RunResult) -> String {
    const W: f64 = 900.0;
    const PANEL: f64 = 230.0;
    const LEFT: f64 = 80.0;
    const TOP: f64 = 40.0;
    let mut out = String::new();
    let height = TOP + 3.0 * (PANEL + 50.0);
    chart::open(&mut out, W, height, 12);
    let _ = write!(
        out,
        r##"<text x="{LEFT}" y="22" font-size="15">{} — {:?}, {} clients: {:.0} reservations/s, p99 {}</text>"##,
        escape(&result.label),
        result.scenario,
        result.clients,
        result.reservations_per_s,
        us(result.latency.p99_us)
    );

    let seconds: Vec<f64> = result.timeline.iter().map(|s| s.t as f64).collect();
    let x_max = seconds.last().copied().unwrap_or(1.0).max(1.0);
    let series = [
        (
            "reservations/s (OK calls)",
            "#1f77b4",
            result
                .timeline
                .iter()
                .map(|s| s.ok as f64)
                .collect::<Vec<_>>(),
        ),
        (
            "errors/s",
            "#d62728",
            result.timeline.iter().map(|s| s.errors as f64).collect(),
        ),
    ];
    panel(
        &mut out,
        TOP,
        "calls per second",
        "s",
        &seconds,
        x_max,
        &series,
        false,
    );
    let series = [
        (
            "p50 ms",
            "#2ca02c",
            result
                .timeline
                .iter()
                .map(|s| s.p50_us as f64 / 1000.0)
                .collect::<Vec<_>>(),
        ),
        (
            "p99 ms",
            "#ff7f0e",
            result
                .timeline
                .iter()
                .map(|s| s.p99_us as f64 / 1000.0)
                .collect(),
        ),
    ];
    panel(
        &mut out,
        TOP + PANEL + 50.0,
        "latency per second (ms)",
        "s",
        &seconds,
        x_max,
        &series,
        false,
    );
    // Percentiles on a log scale of 1/(1-q): 0, 90, 99, 99.9, 99.99 are evenly spaced.
    let nines: Vec<f64> = result
        .distribution
        .iter()
        .map(|(q, _)| (1.0 / (1.0 - q.min(0.99999))).log10())
        .collect();
    let series = [(
        "latency ms",
        "#9467bd",
        result
            .distribution
            .iter()
            .map(|(_, v)| *v as f64 / 1000.0)
            .collect::<Vec<_>>(),
    )];
    panel(
        &mut out,
        TOP + 2.0 * (PANEL + 50.0),
        "latency distribution (ms) by percentile",
        "nines",
        &nines,
        5.0,
        &series,
        true,
    );
    chart::close(&mut out);
    out
}

#[allow(clippy::too_many_arguments)]
fn panel(
    out: &mut String,
    top: f64,
    title: &str,
    x_unit: &str,
    xs: &[f64],
    x_max: f64,
    series: &[(&str, &str, Vec<f64>)],
    percentile_axis: bool,
) {
    const LEFT: f64 = 80.0;
    const W: f64 = 790.0;
    const H: f64 = 200.0;
    let y_max = series
        .iter()
        .flat_map(|(_, _, ys)| ys.iter().copied())
        .fold(0.0_f64, f64::max)
        .max(1e-9)
        * 1.1;
    let x = |v: f64| LEFT + v / x_max * W;
    let y = |v: f64| top + 20.0 + H - v / y_max * H;
    let _ = write!(
        out,
        r##"<text x="{LEFT}" y="{}" font-size="13">{}</text><rect x="{LEFT}" y="{}" width="{W}" height="{H}" fill="none" stroke="#999"/>"##,
        top + 12.0,
        escape(title),
        top + 20.0
    );
    for i in 0..=4 {
        let v = y_max * f64::from(i) / 4.0;
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text><line x1=\"{LEFT}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/>",
            LEFT - 6.0,
            y(v) + 4.0,
            tick(v),
            LEFT + W,
            y(v),
            y(v)
        );
    }
    let x_ticks: Vec<(f64, String)> = if percentile_axis {
        ["p0", "p90", "p99", "p99.9", "p99.99", "p99.999"]
            .iter()
            .enumerate()
            .map(|(i, l)| (i as f64, (*l).to_owned()))
            .collect()
    } else {
        (0..=5)
            .map(|i| {
                let v = x_max * f64::from(i) / 5.0;
                (v, format!("{v:.0}{x_unit}"))
            })
            .collect()
    };
    for (v, label) in x_ticks {
        let _ = write!(
            out,
            r##"<text x="{:.1}" y="{}" text-anchor="middle">{label}</text>"##,
            x(v),
            top + 20.0 + H + 16.0
        );
    }
    for (n, (name, color, ys)) in series.iter().enumerate() {
        chart::polyline(
            out,
            color,
            2.0,
            xs.iter().zip(ys).map(|(a, b)| (x(*a), y(*b))),
        );
        let _ = write!(
            out,
            r##"<text x="{}" y="{}" fill="{color}">{}</text>"##,
            LEFT + W - 200.0,
            top + 36.0 + 16.0 * n as f64,
            escape(name)
        );
    }
}
