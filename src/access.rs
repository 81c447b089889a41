//! Who did what: the caller attribute of every call's metrics, and one structured access-log
//! line per call.
//!
//! The RPC layer puts a [`CallNote`] in each request's extensions; the handler fills in the
//! caller's metric label once it knows the caller ([`attribute`]), and the subject (the
//! reservation or order the call is about). When the call ends, the layer records its
//! metrics with the label and hands one [`Entry`] to the [`AccessLog`], which formats and
//! writes it on a thread of its own: a call never waits for a log line. When the writer falls
//! behind, entries are dropped and counted (`inventory.access_log.dropped`), never queued
//! without bound. Every write, every refused or failed call and every call of an operator is
//! logged; other successful reads (and health checks) are sampled (`ACCESS_LOG_READ_SAMPLE`).

use std::{
    io::Write as _,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use tonic::Code;

use inventory_core::domain::Tenant;

use crate::auth::{ANONYMOUS, OTHER_CALLERS, Principal};

/// What the handler learned about a call, for its metrics and its access-log line.
#[derive(Clone, Debug, Default)]
pub struct CallNote(Arc<Mutex<Noted>>);

#[derive(Debug, Default)]
struct Noted {
    /// The caller's metric label.
    label: Option<String>,
    /// The caller's name, for the log (`anonymous` without authentication).
    name: Option<String>,
    subject: Option<(&'static str, String)>,
    /// The tenant the call works in, once the caller is known.
    tenant: Option<Tenant>,
    /// The caller is an operator acting in a tenant it chose.
    operator: bool,
}

impl CallNote {
    /// The caller's metric label: a configured caller's name, or `_OTHER`.
    pub fn label(&self) -> String {
        self.lock()
            .label
            .clone()
            .unwrap_or_else(|| OTHER_CALLERS.to_owned())
    }

    /// Who called, as the access log names it: the caller's own name (a signed token's
    /// `jwt:<subject>` too), or `_OTHER` for a call that was not authenticated.
    pub fn name(&self) -> String {
        self.lock()
            .name
            .clone()
            .unwrap_or_else(|| OTHER_CALLERS.to_owned())
    }

    fn subject(&self) -> Option<(&'static str, String)> {
        self.lock().subject.clone()
    }

    /// The tenant the call worked in, if its caller was identified.
    pub fn tenant(&self) -> Option<Tenant> {
        self.lock().tenant.clone()
    }

    fn operator(&self) -> bool {
        self.lock().operator
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Noted> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Notes who `caller` is (its label computed only when the call carries a note) and what the
/// call is about.
pub fn attribute<T: Subject>(
    request: &tonic::Request<T>,
    principal: &Principal,
    label: impl FnOnce() -> String,
) {
    if let Some(note) = request.extensions().get::<CallNote>() {
        let caller = principal.caller();
        let mut noted = note.lock();
        noted.label = Some(label());
        noted.tenant = Some(principal.tenant().clone());
        noted.operator = principal.is_operator();
        noted.name = Some(if caller.as_str().is_empty() {
            ANONYMOUS.to_owned()
        } else {
            caller.as_str().to_owned()
        });
        noted.subject = request
            .get_ref()
            .subject()
            .map(|(kind, id)| (kind, id.to_owned()));
    }
}

/// What a request is about, for the access log: a reservation id or an order id.
pub trait Subject {
    fn subject(&self) -> Option<(&'static str, &str)> {
        None
    }
}

macro_rules! subjects {
    ($($message:ident => $kind:literal . $field:ident),* $(,)?) => {
        $(impl Subject for crate::proto::$message {
            fn subject(&self) -> Option<(&'static str, &str)> {
                Some(($kind, self.$field.as_str())).filter(|(_, id)| !id.is_empty())
            }
        })*
    };
}

subjects! {
    ReserveRequest => "order_id".order_id,
    CancelOrderRequest => "order_id".order_id,
    ConfirmReservationRequest => "reservation_id".reservation_id,
    ReleaseReservationRequest => "reservation_id".reservation_id,
    ExtendReservationRequest => "reservation_id".reservation_id,
    GetReservationRequest => "reservation_id".reservation_id,
}

macro_rules! no_subject {
    ($($message:ident),* $(,)?) => {
        $(impl Subject for crate::proto::$message {})*
    };
}

no_subject!(
    AdjustStockRequest,
    SetStockRequest,
    BatchSetStockRequest,
    TransferStockRequest,
    SetStockPolicyRequest,
    MoveStockStateRequest,
    ExpectStockRequest,
    ReceiveStockRequest,
    CancelReceiptRequest,
    ListReceiptsRequest,
    UpsertLocationRequest,
    GetStockRequest,
    ListReservationsRequest,
    ListStockMovementsRequest,
    ListLocationsRequest,
    WatchEventsRequest,
    CreateSubscriptionRequest,
    AckEventsRequest,
    ListSubscriptionsRequest,
    DeleteSubscriptionRequest,
);

/// How calls are logged (`ACCESS_LOG`, `ACCESS_LOG_READ_SAMPLE`).
#[derive(Clone, Debug)]
pub struct AccessLogSettings {
    pub enabled: bool,
    /// The share of successful reads logged: 1 logs every one, 0 none.
    pub read_sample: f64,
    pub sink: Sink,
}

impl Default for AccessLogSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            read_sample: 0.01,
            sink: Sink::Stdout,
        }
    }
}

/// Where lines go: standard output, or (for tests) a channel.
#[derive(Clone, Debug)]
pub enum Sink {
    Stdout,
    Channel(std::sync::mpsc::Sender<String>),
}

/// How many entries may wait for the writer before new ones are dropped.
const BACKLOG: usize = 8192;

/// The methods that change something: always logged.
const WRITES: &[&str] = &[
    "AdjustStock",
    "SetStock",
    "BatchSetStock",
    "TransferStock",
    "SetStockPolicy",
    "MoveStockState",
    "ExpectStock",
    "ReceiveStock",
    "CancelReceipt",
    "UpsertLocation",
    "Reserve",
    "ConfirmReservation",
    "ReleaseReservation",
    "ExtendReservation",
    "CancelOrder",
];

/// One finished call.
#[derive(Debug)]
pub struct Entry {
    pub at: SystemTime,
    /// Who called (see [`CallNote::name`]).
    pub caller: String,
    /// `inventory.v1.InventoryService/Reserve`, or `_OTHER`.
    pub method: &'static str,
    pub name: &'static str,
    pub code: Code,
    pub took: Duration,
    pub note: CallNote,
    pub trace_id: Option<String>,
}

/// The access log's entrance: cheap to clone, never blocks.
#[derive(Clone, Debug)]
pub struct AccessLog {
    sender: std::sync::mpsc::SyncSender<Entry>,
    reads: Arc<AtomicU64>,
    /// Log one successful read in this many; 0: none.
    every: u64,
    dropped: opentelemetry::metrics::Counter<u64>,
}

impl AccessLog {
    /// Starts the writer thread; `None` when the log is off.
    pub fn start(settings: &AccessLogSettings) -> Option<Self> {
        if !settings.enabled {
            return None;
        }
        let (sender, receiver) = std::sync::mpsc::sync_channel::<Entry>(BACKLOG);
        let sink = settings.sink.clone();
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_all(receiver, sink))
            .ok()?;
        let every = if settings.read_sample <= 0.0 {
            0
        } else {
            (1.0 / settings.read_sample.min(1.0)).round() as u64
        };
        Some(Self {
            sender,
            reads: Arc::default(),
            every,
            dropped: opentelemetry::global::meter("inventory-server")
                .u64_counter("inventory.access_log.dropped")
                .with_description("Access-log lines dropped because the writer fell behind")
                .build(),
        })
    }

    /// Hands a finished call to the writer, if it is to be logged.
    pub fn record(&self, entry: Entry) {
        // An operator's calls cross tenants: every one is logged, its reads too.
        let write = WRITES.contains(&entry.name) || entry.code != Code::Ok || entry.note.operator();
        if !write {
            if self.every == 0 {
                return;
            }
            if !self
                .reads
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(self.every)
            {
                return;
            }
        }
        if self.sender.try_send(entry).is_err() {
            self.dropped.add(1, &[]);
        }
    }
}

fn write_all(receiver: std::sync::mpsc::Receiver<Entry>, sink: Sink) {
    let stdout = std::io::stdout();
    for entry in receiver {
        let line = line(&entry);
        match &sink {
            Sink::Stdout => {
                let mut out = stdout.lock();
                let _ = writeln!(out, "{line}");
            }
            Sink::Channel(channel) => {
                if channel.send(line).is_err() {
                    return;
                }
            }
        }
    }
}

/// One JSON line, shaped like the server's own JSON logs (`timestamp`, `level`, `message`).
fn line(entry: &Entry) -> String {
    let mut fields = serde_json::Map::new();
    let mut put = |key: &str, value: serde_json::Value| {
        fields.insert(key.to_owned(), value);
    };
    put(
        "timestamp",
        humantime::format_rfc3339_micros(entry.at)
            .to_string()
            .into(),
    );
    put("level", "INFO".into());
    put("message", "access".into());
    put("caller", entry.caller.clone().into());
    if let Some(tenant) = entry.note.tenant() {
        put("tenant", tenant.as_str().into());
    }
    if entry.note.operator() {
        // An operator acting in a tenant it chose: every such call is logged as one.
        put("operator", true.into());
    }
    put("rpc.method", entry.method.into());
    put("rpc.grpc.status_code", (entry.code as i32).into());
    put("code", format!("{:?}", entry.code).into());
    put(
        "duration_ms",
        serde_json::Number::from_f64((entry.took.as_secs_f64() * 1e6).round() / 1e3)
            .map_or(serde_json::Value::Null, serde_json::Value::Number),
    );
    if let Some((kind, id)) = entry.note.subject() {
        put(kind, id.into());
    }
    if let Some(trace_id) = &entry.trace_id {
        put("trace_id", trace_id.clone().into());
    }
    serde_json::Value::Object(fields).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &'static str, code: Code) -> Entry {
        Entry {
            at: SystemTime::UNIX_EPOCH,
            caller: "orders".into(),
            method: "inventory.v1.InventoryService/X",
            name,
            code,
            took: Duration::from_micros(1500),
            note: CallNote::default(),
            trace_id: None,
        }
    }

    /// A log writing to a channel, sampling `read_sample` of successful reads.
    fn started(read_sample: f64) -> (AccessLog, std::sync::mpsc::Receiver<String>) {
        let (lines, received) = std::sync::mpsc::channel();
        let log = AccessLog::start(&AccessLogSettings {
            enabled: true,
            read_sample,
            sink: Sink::Channel(lines),
        })
        .unwrap();
        (log, received)
    }

    #[test]
    fn writes_and_failures_are_always_logged_and_reads_are_sampled() {
        let (log, received) = started(0.25);
        for _ in 0..8 {
            log.record(entry("GetStock", Code::Ok));
        }
        log.record(entry("GetStock", Code::NotFound));
        log.record(entry("Reserve", Code::Ok));
        drop(log);
        let lines: Vec<String> = received.iter().collect();
        assert_eq!(lines.len(), 2 + 2, "{lines:#?}");
        let last: serde_json::Value = serde_json::from_str(&lines[3]).unwrap();
        assert_eq!(last["caller"], "orders");
        assert_eq!(last["code"], "Ok");
        assert_eq!(last["duration_ms"], 1.5);
        let refused: serde_json::Value = serde_json::from_str(&lines[2]).unwrap();
        assert_eq!(refused["rpc.grpc.status_code"], 5);
    }

    #[test]
    fn a_read_sample_of_zero_logs_no_successful_read() {
        let (log, received) = started(0.0);
        log.record(entry("GetStock", Code::Ok));
        log.record(entry("ListLocations", Code::Ok));
        drop(log);
        assert_eq!(received.iter().count(), 0);
    }

    /// An operator acts across tenants: each of its calls is logged, however reads are
    /// sampled.
    #[test]
    fn every_call_of_an_operator_is_logged_its_reads_too() {
        let (log, received) = started(0.0);
        let by_operator = || {
            let read = entry("GetStock", Code::Ok);
            read.note.lock().operator = true;
            read
        };
        log.record(by_operator());
        log.record(entry("GetStock", Code::Ok));
        log.record(by_operator());
        drop(log);
        let lines: Vec<serde_json::Value> = received
            .iter()
            .map(|line| serde_json::from_str(&line).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(lines.iter().all(|line| line["operator"] == true));
    }
}
