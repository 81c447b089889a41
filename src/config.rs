//! Command line and environment. Every setting is a flag with an environment variable of the
//! same meaning; `--help` lists them. Values are checked before anything binds or connects, so
//! bad configuration ends the process at once with a clear message.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use clap::{Args, Parser, Subcommand, ValueEnum};
use inventory_core::{coalesce::CoalesceConfig, domain::Ttl, service::InventoryConfig};
use inventory_postgres::{PgConfig, PoolSettings, retention::Retention};
use inventory_redis::{KeyPrefix, LeaseSettings, RedisConfig, RedisSettings, RedisTlsFiles};
use secrecy::{ExposeSecret as _, SecretSlice, SecretString};

use crate::{
    access::AccessLogSettings,
    auth::{AuthSources, Authenticator, CallerLimits, JwtSettings},
    tenants::{TenantLimits, TenantSettings},
    upkeep::Upkeep,
};
use inventory_core::quota::HoldCaps;

#[derive(Debug, Parser)]
#[command(
    name = "inventory-server",
    version,
    about = "Inventory reservation gRPC service"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub log: LogArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the gRPC API until SIGTERM or SIGINT.
    Serve(Box<ServeArgs>),
    /// Apply pending database migrations, then exit. Safe to run from several replicas at once.
    Migrate(DatabaseArgs),
    /// Recompute every SKU from its stock ledger and its live holds, print each drift found,
    /// and exit 1 if there is any.
    Verify(DatabaseArgs),
    /// Start a new epoch of the event stream after its head, for a cut the server cannot see
    /// by itself (a data folder copied back without recovery). Consumers whose cursor is past
    /// the head are then refused with CURSOR_NOT_IN_HISTORY and start over from a snapshot.
    NewStreamEpoch {
        #[command(flatten)]
        database: DatabaseArgs,
        /// Why: kept with the epoch.
        #[arg(long, default_value = "reset by hand")]
        reason: String,
    },
    /// Copy each tenant's event stream to NATS JetStream until SIGTERM or SIGINT: one relay
    /// of a RELAY_NAME publishes per tenant, the others stand by.
    Relay(Box<RelayArgs>),
    /// Read a token (or a client certificate in PEM) on stdin and print the credential line
    /// value for AUTH_TOKENS_FILE.
    HashToken {
        /// Hash a PEM client certificate instead of a token.
        #[arg(long)]
        certificate: bool,
    },
}

mod relay;
pub use relay::RelayArgs;

#[derive(Debug, Args)]
pub struct LogArgs {
    /// Log line format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL connection URL, e.g. postgres://user:pass@host:5432/inventory. TLS follows
    /// libpq: sslmode=disable|prefer|require|verify-ca|verify-full, sslrootcert=<CA file or
    /// system>, sslcert/sslkey for a client certificate.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, value_parser = secret)]
    pub database_url: SecretString,

    /// The tenants this deployment (this cell) serves, separated by commas: each has its own
    /// schema (`public` for `default`, `tenant_<name>` otherwise), Redis keys and event
    /// stream. `migrate` and `verify` work on each in turn.
    #[arg(long, env = "TENANTS", default_value = "default")]
    pub tenants: String,
}

impl DatabaseArgs {
    /// [`DatabaseArgs::tenants`], checked.
    pub fn tenant_list(&self) -> Result<Vec<inventory_core::domain::Tenant>, ConfigError> {
        TenantSettings::parse(&self.tenants, TenantLimits::default())
            .map(|settings| settings.tenants)
            .map_err(ConfigError)
    }
}

/// `serve`'s settings, one group per branch of [`Settings`]: each group checks its own values
/// and becomes its branch.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub database: PostgresArgs,
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub inventory: InventoryArgs,
    #[command(flatten)]
    pub upkeep: UpkeepArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub peer: PeerArgs,
    #[command(flatten)]
    pub tenant: TenantArgs,
}

/// [`TenantSettings`]: what each tenant's callers may take together (the tenants
/// themselves are `TENANTS`, with the database's settings).
#[derive(Debug, Args)]
#[command(next_help_heading = "Tenants")]
pub struct TenantArgs {
    /// Calls of one tenant's callers in flight in one replica, together; unset: only
    /// MAX_IN_FLIGHT (and each caller's own limit) bounds them.
    #[arg(long, env = "TENANT_MAX_IN_FLIGHT")]
    pub tenant_max_in_flight: Option<u32>,

    /// Live holds of one tenant's callers together, fleet-wide; unset: unlimited.
    #[arg(long, env = "TENANT_MAX_HOLDS")]
    pub tenant_max_holds: Option<u64>,

    /// Units one tenant's live holds may keep together, fleet-wide; unset: unlimited.
    #[arg(long, env = "TENANT_MAX_HELD_UNITS")]
    pub tenant_max_held_units: Option<u64>,

    /// Event subscriptions of one tenant: rows of its schema, and series of every replica's
    /// metrics, so never unbounded.
    #[arg(long, env = "TENANT_MAX_SUBSCRIPTIONS", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub tenant_max_subscriptions: u32,
}

impl TenantArgs {
    fn settings(
        &self,
        database: &DatabaseArgs,
        problems: &mut Vec<String>,
    ) -> Option<TenantSettings> {
        for (name, zero) in [
            ("TENANT_MAX_IN_FLIGHT", self.tenant_max_in_flight == Some(0)),
            ("TENANT_MAX_HOLDS", self.tenant_max_holds == Some(0)),
            (
                "TENANT_MAX_HELD_UNITS",
                self.tenant_max_held_units == Some(0),
            ),
        ] {
            if zero {
                problems.push(format!("{name} must be at least 1 (unset it for no limit)"));
            }
        }
        let limits = TenantLimits {
            max_in_flight: self.tenant_max_in_flight,
            caps: HoldCaps {
                max_holds: self.tenant_max_holds,
                max_held_units: self.tenant_max_held_units,
            },
            max_subscriptions: Some(self.tenant_max_subscriptions),
        };
        TenantSettings::parse(&database.tenants, limits)
            .map_err(|found| problems.extend(found))
            .ok()
    }
}

/// [`PeerSettings`]: the internal port replicas forward hot-SKU calls on.
#[derive(Debug, Args)]
#[command(next_help_heading = "Peers")]
pub struct PeerArgs {
    /// Internal listener for calls forwarded by other replicas. Set: a single-line Reserve
    /// whose SKU's lease another replica holds is handed to that replica, so the calls for a
    /// hot SKU meet in one batch. Unset: this replica neither forwards nor takes forwards.
    #[arg(long, env = "PEER_LISTEN_ADDR")]
    pub peer_listen_addr: Option<SocketAddr>,

    /// `ip:port` other replicas reach PEER_LISTEN_ADDR at (in Kubernetes, the pod IP from the
    /// downward API). Unset: the address PEER_LISTEN_ADDR bound, which then must not be a
    /// wildcard address.
    #[arg(long, env = "PEER_ADVERTISE_ADDR")]
    pub peer_advertise_addr: Option<SocketAddr>,

    /// Secret shared by every replica (at least 32 bytes): each forwarded call is signed with
    /// it, and a call without a valid signature is refused. Required with PEER_LISTEN_ADDR.
    #[arg(long, env = "PEER_SECRET", hide_env_values = true, value_parser = secret)]
    pub peer_secret: Option<SecretString>,
}

/// Shortest peer secret accepted: an HMAC-SHA256 key should be as long as its output.
const MIN_PEER_SECRET_BYTES: usize = 32;

/// [`ServerSettings`]: the gRPC port and the ports beside it, and what each call may use.
#[derive(Debug, Args)]
#[command(next_help_heading = "Server")]
pub struct ServerArgs {
    /// Address the gRPC server listens on.
    #[arg(long, env = "LISTEN_ADDR", default_value = "127.0.0.1:50051")]
    pub listen_addr: SocketAddr,

    /// A second, plaintext listener that serves only grpc.health.v1, for probes that cannot
    /// speak TLS (Kubernetes gRPC probes). Unset: no such listener.
    #[arg(long, env = "HEALTH_LISTEN_ADDR")]
    pub health_listen_addr: Option<SocketAddr>,

    /// Plaintext HTTP listener for `/metrics` (Prometheus text format). Unset: none.
    #[arg(long, env = "ADMIN_LISTEN_ADDR")]
    pub admin_listen_addr: Option<SocketAddr>,

    /// Most unary calls in flight in this replica; more are shed with RESOURCE_EXHAUSTED.
    #[arg(long, env = "MAX_IN_FLIGHT", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_in_flight: u32,

    /// One JSON line per call on standard output (caller, method, code, duration, reservation
    /// or order id), written off the calls' path.
    #[arg(long, env = "ACCESS_LOG", default_value_t = true, value_parser = clap::builder::BoolishValueParser::new())]
    pub access_log: bool,

    /// The share of successful reads (and health checks) the access log keeps, 0 to 1;
    /// writes and failed calls are always logged.
    #[arg(long, env = "ACCESS_LOG_READ_SAMPLE", default_value_t = 0.01)]
    pub access_log_read_sample: f64,

    /// Most WatchEvents streams open at once in this replica; more get RESOURCE_EXHAUSTED.
    #[arg(long, env = "MAX_WATCHERS", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_watchers: u32,

    /// How often a filtered or subscription WatchEvents stream that scanned past events it
    /// did not send sends a heartbeat with the latest sequence scanned (and how often a
    /// subscription's reader checks that it was not taken over).
    #[arg(long, env = "WATCH_HEARTBEAT_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub watch_heartbeat_interval: Duration,

    /// Largest request message accepted, in bytes; larger ones get RESOURCE_EXHAUSTED.
    #[arg(long, env = "MAX_MESSAGE_BYTES", default_value_t = 262_144,
          value_parser = clap::value_parser!(u32).range(1024..=16_777_216))]
    pub max_message_bytes: u32,

    /// Connections older than this are closed gracefully, so clients reconnect and spread
    /// over new replicas.
    #[arg(long, env = "MAX_CONNECTION_AGE", default_value = "10m", value_parser = humantime::parse_duration)]
    pub max_connection_age: Duration,

    /// After SIGTERM, how long in-flight calls may take to finish before they are cut off.
    #[arg(long, env = "SHUTDOWN_GRACE", default_value = "20s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,

    #[command(flatten)]
    pub tls: TlsArgs,
}

/// TLS on the gRPC port: [`ServerSettings::tls`] and [`ServerSettings::tls_files`].
#[derive(Debug, Args)]
#[command(next_help_heading = "TLS")]
pub struct TlsArgs {
    /// PEM certificate chain the server presents. With TLS_KEY_FILE it turns TLS on; without
    /// both the server speaks plaintext (local use only).
    #[arg(long, env = "TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,

    /// PEM private key of TLS_CERT_FILE.
    #[arg(long, env = "TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,

    /// PEM CA bundle. When set, every client must present a certificate it signed (mutual TLS).
    #[arg(long, env = "TLS_CLIENT_CA_FILE")]
    pub tls_client_ca_file: Option<PathBuf>,
}

/// [`DatabaseSettings`]: PostgreSQL and its pool.
#[derive(Debug, Args)]
#[command(next_help_heading = "PostgreSQL")]
pub struct PostgresArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// PostgreSQL URL of the one `LISTEN` connection (event wake-ups), when DATABASE_URL goes
    /// through a pooler in transaction mode, which cannot keep a `LISTEN`: a direct URL to the
    /// same database. Unset: DATABASE_URL.
    #[arg(long, env = "DATABASE_LISTEN_URL", hide_env_values = true, value_parser = secret)]
    pub database_listen_url: Option<SecretString>,

    /// Most PostgreSQL connections this replica opens.
    #[arg(long, env = "DATABASE_POOL_SIZE", default_value_t = 16,
          value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub database_pool_size: u16,

    /// Longest wait for a PostgreSQL connection before answering UNAVAILABLE.
    #[arg(long, env = "DATABASE_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub database_timeout: Duration,

    /// Longest one SQL statement may run or wait for a lock before the call is UNAVAILABLE.
    #[arg(long, env = "DATABASE_STATEMENT_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub database_statement_timeout: Duration,
}

/// [`RedisConnection`]: Redis, its client and the leases kept in it.
#[derive(Debug, Args)]
#[command(next_help_heading = "Redis")]
pub struct RedisArgs {
    /// Redis URL: redis://, rediss://, redis-sentinel:// or redis-cluster://.
    #[arg(long, env = "REDIS_URL", hide_env_values = true, value_parser = secret)]
    pub redis_url: SecretString,

    /// PEM CA bundle that signed the Redis server's certificate (rediss:// only). Unset: the
    /// system's roots.
    #[arg(long, env = "REDIS_TLS_CA_FILE")]
    pub redis_tls_ca_file: Option<PathBuf>,

    /// PEM client certificate for Redis servers that require one (rediss:// only).
    #[arg(long, env = "REDIS_TLS_CERT_FILE")]
    pub redis_tls_cert_file: Option<PathBuf>,

    /// PEM private key of REDIS_TLS_CERT_FILE.
    #[arg(long, env = "REDIS_TLS_KEY_FILE")]
    pub redis_tls_key_file: Option<PathBuf>,

    /// Namespace of every Redis key: environment, and tenant where Redis is shared.
    #[arg(long, env = "REDIS_KEY_PREFIX", default_value = "inventory:local")]
    pub redis_key_prefix: String,

    /// Upper bound on each Redis command; a slower Redis counts as unavailable.
    #[arg(long, env = "REDIS_COMMAND_TIMEOUT", default_value = "250ms", value_parser = humantime::parse_duration)]
    pub redis_command_timeout: Duration,

    /// Upper bound on opening a Redis connection.
    #[arg(long, env = "REDIS_CONNECT_TIMEOUT", default_value = "1s", value_parser = humantime::parse_duration)]
    pub redis_connect_timeout: Duration,

    #[command(flatten)]
    pub leases: LeaseArgs,
}

/// [`LeaseSettings`], and how long a Reserve waits for a lease ([`InventoryConfig::lease_wait`]).
#[derive(Debug, Args)]
#[command(next_help_heading = "Leases")]
pub struct LeaseArgs {
    /// How long a lease lasts if its holder neither writes nor releases (crash, cancelled call).
    #[arg(long, env = "LEASE_TTL", default_value = "2s", value_parser = humantime::parse_duration)]
    pub lease_ttl: Duration,

    /// Longest a Reserve waits for a busy SKU's lease (the client's deadline may cut it shorter)
    /// before answering ABORTED.
    #[arg(long, env = "LEASE_WAIT", default_value = "1s", value_parser = humantime::parse_duration)]
    pub lease_wait: Duration,

    /// Most requests of this replica waiting for one SKU's lease; more get RESOURCE_EXHAUSTED.
    #[arg(long, env = "LEASE_MAX_WAITERS", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub lease_max_waiters: u32,
}

/// [`InventoryConfig`]: holds, and the coalescing of hot SKUs.
#[derive(Debug, Args)]
#[command(next_help_heading = "Reservations")]
pub struct InventoryArgs {
    /// Hold of a Reserve that sets no ttl (1s to 24h).
    #[arg(long, env = "RESERVATION_DEFAULT_TTL", default_value = "15m", value_parser = humantime::parse_duration)]
    pub reservation_default_ttl: Duration,

    /// Longest a hold may last from when it was made, extensions included (1s to 24h, at
    /// least RESERVATION_DEFAULT_TTL).
    #[arg(long, env = "MAX_HOLD", default_value = "24h", value_parser = humantime::parse_duration)]
    pub max_hold: Duration,

    /// Longest a reservation's waiting units (backordered, pre-ordered) may wait from when it
    /// was made (1h to 3650d): its checkout expiry never cuts them short, and no pre-order is
    /// pegged to a receipt due later.
    #[arg(long, env = "WAIT_HORIZON", default_value = "365d", value_parser = humantime::parse_duration)]
    pub wait_horizon: Duration,

    #[command(flatten)]
    pub coalesce: CoalesceArgs,
}

/// [`CoalesceConfig`]: hot-SKU coalescing and group commit.
#[derive(Debug, Args)]
#[command(next_help_heading = "Coalescing")]
pub struct CoalesceArgs {
    /// Most single-line Reserve calls for one SKU that one transaction writes (hot-SKU
    /// coalescing). 1 turns coalescing off: each call takes the lease and commits alone.
    #[arg(long, env = "COALESCE_MAX_BATCH", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub coalesce_max_batch: u32,

    /// How long a batch leader that finds others already queued waits for more before it
    /// writes. 0 (the default): write at once; a call that finds nobody queued never waits.
    #[arg(long, env = "COALESCE_LINGER", default_value = "0ms", value_parser = humantime::parse_duration)]
    pub coalesce_linger: Duration,

    /// Most group-commit transactions (coalesced batches of several SKUs) this replica
    /// writes at once; a batch that finds them all busy joins the next one to start.
    #[arg(long, env = "COALESCE_MAX_COMMITS", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub coalesce_max_commits: u32,
}

/// [`Upkeep`]: the sweep of expired holds and what it prunes.
#[derive(Debug, Args)]
#[command(next_help_heading = "Upkeep")]
pub struct UpkeepArgs {
    /// How often this replica looks for expired holds to return their stock.
    #[arg(long, env = "SWEEP_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub sweep_interval: Duration,

    /// Most holds one sweep transaction expires.
    #[arg(long, env = "SWEEP_BATCH", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub sweep_batch: u32,

    #[command(flatten)]
    pub retention: RetentionArgs,
}

/// [`Retention`]: how long each kind of row is kept.
#[derive(Debug, Args)]
#[command(next_help_heading = "Retention")]
pub struct RetentionArgs {
    /// How long events stay in the outbox (and so in WatchEvents); older ones are pruned.
    #[arg(long, env = "EVENT_RETENTION", default_value = "7days", value_parser = humantime::parse_duration)]
    pub event_retention: Duration,

    /// How long a subscription (CreateSubscription) may go without an acknowledgement and
    /// still hold events back from retention; past it, retention goes on and the
    /// subscription is marked lost once events it had not acknowledged are pruned.
    #[arg(long, env = "SUBSCRIPTION_IDLE_LIMIT", default_value = "7days", value_parser = humantime::parse_duration)]
    pub subscription_idle_limit: Duration,

    /// How long a confirmed, released or expired reservation (and its lines) is kept after its
    /// last change (at least 24h); its events and stored outcome have their own retention.
    #[arg(long, env = "RESERVATION_RETENTION", default_value = "30days", value_parser = humantime::parse_duration)]
    pub reservation_retention: Duration,

    /// How long stock movements are kept (a SKU's latest always is); unset keeps the ledger
    /// forever.
    #[arg(long, env = "LEDGER_RETENTION", value_parser = humantime::parse_duration)]
    pub ledger_retention: Option<Duration>,

    /// How long an idempotency key and its stored outcome are kept (at least 24h).
    #[arg(long, env = "IDEMPOTENCY_RETENTION", default_value = "48h", value_parser = humantime::parse_duration)]
    pub idempotency_retention: Duration,
}

/// [`AuthSettings`]: who may call.
#[derive(Debug, Args)]
#[command(next_help_heading = "Authentication")]
pub struct AuthArgs {
    /// Credentials file: one `<name> <role> token-sha256:<hex>|cert-sha256:<hex>` per line
    /// (see `inventory-server hash-token`). Required unless AUTH_DISABLED is set.
    #[arg(long, env = "AUTH_TOKENS_FILE")]
    pub auth_tokens_file: Option<PathBuf>,

    /// Accept bearer tokens on a plaintext, non-loopback gRPC port: only behind a mesh whose
    /// sidecar terminates TLS. Without it such a server refuses to start.
    #[arg(long, env = "ALLOW_PLAINTEXT_TOKENS", default_value_t = false, value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_plaintext_tokens: bool,

    /// Serve every call without credentials. Only for local use; never the default.
    #[arg(long, env = "AUTH_DISABLED", default_value_t = false, value_parser = clap::builder::BoolishValueParser::new())]
    pub auth_disabled: bool,

    /// JWKS file whose keys sign the JWT bearer tokens accepted (re-read when it changes).
    /// Needs JWT_ISSUER and JWT_AUDIENCE.
    #[arg(long, env = "JWT_JWKS_FILE")]
    pub jwt_jwks_file: Option<PathBuf>,

    /// The `iss` every JWT must carry.
    #[arg(long, env = "JWT_ISSUER")]
    pub jwt_issuer: Option<String>,

    /// An `aud` every JWT must carry.
    #[arg(long, env = "JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,

    /// The JWT claim that names the caller.
    #[arg(long, env = "JWT_CALLER_CLAIM", default_value = "sub")]
    pub jwt_caller_claim: String,

    /// The JWT claim that carries the caller's role.
    #[arg(long, env = "JWT_ROLE_CLAIM", default_value = "inventory_role")]
    pub jwt_role_claim: String,

    /// The JWT claim that names the caller's tenant; a token without it is tenant `default`'s
    /// while one tenant is served, and refused while several are.
    #[arg(long, env = "JWT_TENANT_CLAIM", default_value = "inventory_tenant")]
    pub jwt_tenant_claim: String,

    /// Clock skew allowed on a JWT's `exp` and `nbf`.
    #[arg(long, env = "JWT_LEEWAY", default_value = "30s", value_parser = humantime::parse_duration)]
    pub jwt_leeway: Duration,

    /// Calls one caller may have in flight in one replica, unless its credentials line says
    /// otherwise (`max_in_flight=`); unset: only MAX_IN_FLIGHT bounds it.
    #[arg(long, env = "CALLER_MAX_IN_FLIGHT")]
    pub caller_max_in_flight: Option<u32>,

    /// Live holds one caller may have, fleet-wide, unless its line says otherwise
    /// (`max_holds=`); unset: unlimited.
    #[arg(long, env = "CALLER_MAX_HOLDS")]
    pub caller_max_holds: Option<u64>,

    /// Units one caller's live holds may keep, fleet-wide, unless its line says otherwise
    /// (`max_held_units=`); unset: unlimited.
    #[arg(long, env = "CALLER_MAX_HELD_UNITS")]
    pub caller_max_held_units: Option<u64>,
}

/// A linger is a latency every queued call pays; more than this is a misconfiguration.
const MAX_COALESCE_LINGER: Duration = Duration::from_millis(100);

/// Retries of the same request within a day must always replay.
const MIN_IDEMPOTENCY_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// Everything `serve` needs, parsed and checked: one branch per part of the server that
/// uses it, so each part is handed its own branch and nothing else.
#[derive(Debug)]
pub struct Settings {
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    pub redis: RedisConnection,
    /// The core's own settings: default hold, coalescing, how long to wait for leases.
    pub inventory: InventoryConfig,
    pub upkeep: Upkeep,
    pub auth: AuthSettings,
    /// Set: forwarding to the replica holding a SKU's lease is on.
    pub peer: Option<PeerSettings>,
    pub tenants: TenantSettings,
}

/// The internal port replicas forward calls on, and what they sign them with.
#[derive(Clone)]
pub struct PeerSettings {
    pub listen_addr: SocketAddr,
    /// What this replica's leases name as its address; `None`: the bound listen address.
    pub advertise_addr: Option<SocketAddr>,
    pub secret: SecretSlice<u8>,
}

impl std::fmt::Debug for PeerSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerSettings")
            .field("listen_addr", &self.listen_addr)
            .field("advertise_addr", &self.advertise_addr)
            .finish_non_exhaustive()
    }
}

/// The gRPC port and the ports beside it, and what each call may use.
#[derive(Debug)]
pub struct ServerSettings {
    pub listen_addr: SocketAddr,
    pub health_listen_addr: Option<SocketAddr>,
    pub admin_listen_addr: Option<SocketAddr>,
    /// TLS on the gRPC port, as read at start-up...
    pub tls: Option<TlsSettings>,
    /// ...and the files it is re-read from on SIGHUP and whenever they change.
    pub tls_files: Option<TlsFiles>,
    pub max_in_flight: usize,
    pub max_watchers: usize,
    pub watch_heartbeat_interval: Duration,
    pub max_message_bytes: usize,
    pub max_connection_age: Duration,
    pub shutdown_grace: Duration,
    pub access_log: AccessLogSettings,
}

#[derive(Debug)]
pub struct DatabaseSettings {
    pub config: PgConfig,
    /// The `LISTEN` connection's, when not `config`.
    pub listen: Option<PgConfig>,
    pub pool: PoolSettings,
}

#[derive(Debug)]
pub struct RedisConnection {
    pub config: RedisConfig,
    pub client: RedisSettings,
    pub leases: LeaseSettings,
}

#[derive(Debug)]
pub struct AuthSettings {
    pub authenticator: Authenticator,
    /// What it was built from, re-read on SIGHUP and whenever a file changes; `None`
    /// without authentication.
    pub sources: Option<AuthSources>,
}

impl Settings {
    /// The files the running server re-reads, so credentials rotate without a restart.
    pub fn reload_sources(&self) -> ReloadSources {
        ReloadSources {
            auth: self.auth.sources.clone(),
            tls: self.server.tls_files.clone(),
        }
    }
}

/// Files the running server re-reads, so credentials rotate without a restart.
#[derive(Clone, Debug, Default)]
pub struct ReloadSources {
    pub auth: Option<AuthSources>,
    pub tls: Option<TlsFiles>,
}

/// Where the gRPC port's TLS material lives.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// Reads all three files; each problem names its setting.
    pub fn read(&self) -> Result<TlsSettings, Vec<String>> {
        let mut problems = Vec::new();
        let mut read = |name: &str, path: &Path| {
            std::fs::read(path)
                .map_err(|error| problems.push(format!("{name} {}: {error}", path.display())))
                .ok()
        };
        let cert_pem = read("TLS_CERT_FILE", &self.cert);
        let key_pem = read("TLS_KEY_FILE", &self.key);
        let client_ca_pem = self
            .client_ca
            .as_ref()
            .map(|ca| read("TLS_CLIENT_CA_FILE", ca));
        match (cert_pem, key_pem, client_ca_pem) {
            (Some(cert_pem), Some(key_pem), None) => Ok(TlsSettings {
                cert_pem,
                key_pem: key_pem.into(),
                client_ca_pem: None,
            }),
            (Some(cert_pem), Some(key_pem), Some(Some(ca))) => Ok(TlsSettings {
                cert_pem,
                key_pem: key_pem.into(),
                client_ca_pem: Some(ca),
            }),
            _ => Err(problems),
        }
    }
}

/// The server's TLS material, read at start-up.
#[derive(Clone)]
pub struct TlsSettings {
    pub cert_pem: Vec<u8>,
    /// The private key: a type that never prints.
    pub key_pem: SecretSlice<u8>,
    /// Set: clients must present a certificate this CA signed.
    pub client_ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for TlsSettings {
    /// Whether clients must present a certificate; the PEM files are left out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("mutual", &self.client_ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// Checks every value and reports all problems at once.
    pub fn from_args(args: &ServeArgs) -> Result<Self, ConfigError> {
        let mut problems = Vec::new();
        let database = args.database.settings(&mut problems);
        let redis = args.redis.settings(&mut problems);
        let server = args.server.settings(&mut problems);
        let tenants = args.tenant.settings(&args.database.database, &mut problems);
        let several = tenants.as_ref().is_some_and(|t| t.tenants.len() > 1);
        let auth = args.auth.settings(&args.server, several, &mut problems);
        let inventory = args.inventory.settings(&args.redis.leases, &mut problems);
        let upkeep = args.upkeep.settings(&mut problems);
        let peer = args.peer.settings(&mut problems);
        if let Some(tenants) = &tenants
            && args.auth.auth_disabled
            && tenants.tenants != [inventory_core::domain::Tenant::default_tenant()]
        {
            problems.push(
                "AUTH_DISABLED makes every call tenant default's: TENANTS must be default alone \
                 (other tenants need credentials that name them)"
                    .into(),
            );
        }
        match (server, database, redis, inventory, upkeep, auth, tenants) {
            (
                Some(server),
                Some(database),
                Some(redis),
                Some(inventory),
                Some(upkeep),
                Some(auth),
                Some(tenants),
            ) if problems.is_empty() => Ok(Self {
                server,
                database,
                redis,
                inventory,
                upkeep,
                auth,
                peer,
                tenants,
            }),
            _ => Err(ConfigError(problems)),
        }
    }
}

/// Each `(name, value)` that is zero is a problem.
fn nonzero<const N: usize>(durations: [(&str, Duration); N], problems: &mut Vec<String>) {
    for (name, value) in durations {
        if value.is_zero() {
            problems.push(format!("{name} must be greater than zero"));
        }
    }
}

impl PostgresArgs {
    fn settings(&self, problems: &mut Vec<String>) -> Option<DatabaseSettings> {
        let config = parse_database_url(&self.database.database_url)
            .map_err(|problem| problems.push(problem))
            .ok();
        let listen = match &self.database_listen_url {
            None => Some(None),
            Some(url) => inventory_postgres::parse_url(url.expose_secret())
                .map(Some)
                .map_err(|error| problems.push(format!("DATABASE_LISTEN_URL: {error}")))
                .ok(),
        };
        nonzero(
            [
                ("DATABASE_TIMEOUT", self.database_timeout),
                (
                    "DATABASE_STATEMENT_TIMEOUT",
                    self.database_statement_timeout,
                ),
            ],
            problems,
        );
        let pool = PoolSettings {
            max_size: usize::from(self.database_pool_size),
            acquire_timeout: self.database_timeout,
            statement_timeout: self.database_statement_timeout,
        };
        Some(DatabaseSettings {
            config: config?,
            listen: listen?,
            pool,
        })
    }
}

impl RedisArgs {
    fn settings(&self, problems: &mut Vec<String>) -> Option<RedisConnection> {
        let tls = RedisTlsFiles {
            ca: self.redis_tls_ca_file.clone(),
            cert: self.redis_tls_cert_file.clone(),
            key: self.redis_tls_key_file.clone(),
        };
        let config = inventory_redis::parse_url_with_tls(self.redis_url.expose_secret(), &tls)
            .map_err(|error| problems.push(format!("REDIS_URL: {}", error.details())))
            .ok();
        let key_prefix = KeyPrefix::parse(&self.redis_key_prefix)
            .map_err(|problem| problems.push(format!("REDIS_KEY_PREFIX {problem}")))
            .ok();
        nonzero(
            [
                ("REDIS_COMMAND_TIMEOUT", self.redis_command_timeout),
                ("REDIS_CONNECT_TIMEOUT", self.redis_connect_timeout),
            ],
            problems,
        );
        let leases = self.leases.settings(problems);
        Some(RedisConnection {
            config: config?,
            client: RedisSettings {
                key_prefix: key_prefix?,
                command_timeout: self.redis_command_timeout,
                connect_timeout: self.redis_connect_timeout,
            },
            leases,
        })
    }
}

impl PeerArgs {
    fn settings(&self, problems: &mut Vec<String>) -> Option<PeerSettings> {
        let Some(listen_addr) = self.peer_listen_addr else {
            if self.peer_advertise_addr.is_some() || self.peer_secret.is_some() {
                problems.push("PEER_ADVERTISE_ADDR and PEER_SECRET need PEER_LISTEN_ADDR".into());
            }
            return None;
        };
        let advertise_addr = match self.peer_advertise_addr {
            Some(addr) if addr.ip().is_unspecified() || addr.port() == 0 => {
                problems.push("PEER_ADVERTISE_ADDR must be an address peers can reach".into());
                None
            }
            Some(addr) => Some(Some(addr)),
            None if listen_addr.ip().is_unspecified() => {
                problems.push(
                    "PEER_ADVERTISE_ADDR is required when PEER_LISTEN_ADDR is a wildcard address"
                        .into(),
                );
                None
            }
            None => Some(None),
        };
        let secret = match &self.peer_secret {
            Some(secret) if secret.expose_secret().len() >= MIN_PEER_SECRET_BYTES => Some(
                SecretSlice::from(secret.expose_secret().as_bytes().to_vec()),
            ),
            Some(_) => {
                problems.push(format!(
                    "PEER_SECRET must be at least {MIN_PEER_SECRET_BYTES} bytes"
                ));
                None
            }
            None => {
                problems.push("PEER_SECRET is required with PEER_LISTEN_ADDR".into());
                None
            }
        };
        Some(PeerSettings {
            listen_addr,
            advertise_addr: advertise_addr?,
            secret: secret?,
        })
    }
}

impl LeaseArgs {
    fn settings(&self, problems: &mut Vec<String>) -> LeaseSettings {
        nonzero(
            [
                ("LEASE_TTL", self.lease_ttl),
                ("LEASE_WAIT", self.lease_wait),
            ],
            problems,
        );
        LeaseSettings {
            ttl: self.lease_ttl,
            max_waiters: self.lease_max_waiters as usize,
            ..LeaseSettings::default()
        }
    }
}

impl ServerArgs {
    fn settings(&self, problems: &mut Vec<String>) -> Option<ServerSettings> {
        let tls_files = self.tls.files(problems);
        let tls = tls_files
            .as_ref()
            .and_then(|files| files.read().map_err(|found| problems.extend(found)).ok());
        nonzero([("MAX_CONNECTION_AGE", self.max_connection_age)], problems);
        if !(0.0..=1.0).contains(&self.access_log_read_sample) {
            problems.push("ACCESS_LOG_READ_SAMPLE must be between 0 and 1".into());
        }
        Some(ServerSettings {
            listen_addr: self.listen_addr,
            health_listen_addr: self.health_listen_addr,
            admin_listen_addr: self.admin_listen_addr,
            tls,
            tls_files,
            max_in_flight: self.max_in_flight as usize,
            max_watchers: self.max_watchers as usize,
            watch_heartbeat_interval: self.watch_heartbeat_interval,
            max_message_bytes: self.max_message_bytes as usize,
            max_connection_age: self.max_connection_age,
            shutdown_grace: self.shutdown_grace,
            access_log: AccessLogSettings {
                enabled: self.access_log,
                read_sample: self.access_log_read_sample,
                sink: crate::access::Sink::Stdout,
            },
        })
    }
}

impl TlsArgs {
    /// Where the material lives: both files or neither.
    fn files(&self, problems: &mut Vec<String>) -> Option<TlsFiles> {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (None, None) => {
                if self.tls_client_ca_file.is_some() {
                    problems.push("TLS_CLIENT_CA_FILE needs TLS_CERT_FILE and TLS_KEY_FILE".into());
                }
                None
            }
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca_file.clone(),
            }),
            _ => {
                problems.push("TLS_CERT_FILE and TLS_KEY_FILE must be set together".into());
                None
            }
        }
    }

    /// Whether TLS is on: both files set.
    fn is_on(&self) -> bool {
        self.tls_cert_file.is_some() && self.tls_key_file.is_some()
    }
}

impl AuthArgs {
    /// The JWT settings, if a JWKS file is set; each missing companion is a problem.
    fn jwt(&self, problems: &mut Vec<String>) -> Option<JwtSettings> {
        let Some(jwks_file) = &self.jwt_jwks_file else {
            if self.jwt_issuer.is_some() || self.jwt_audience.is_some() {
                problems.push("JWT_ISSUER and JWT_AUDIENCE need JWT_JWKS_FILE".into());
            }
            return None;
        };
        let required = |value: &Option<String>, name: &str, problems: &mut Vec<String>| {
            let value = value.clone().filter(|v| !v.trim().is_empty());
            if value.is_none() {
                problems.push(format!("JWT_JWKS_FILE needs {name}"));
            }
            value
        };
        let issuer = required(&self.jwt_issuer, "JWT_ISSUER", problems);
        let audience = required(&self.jwt_audience, "JWT_AUDIENCE", problems);
        for (name, claim) in [
            ("JWT_CALLER_CLAIM", &self.jwt_caller_claim),
            ("JWT_ROLE_CLAIM", &self.jwt_role_claim),
            ("JWT_TENANT_CLAIM", &self.jwt_tenant_claim),
        ] {
            if claim.trim().is_empty() {
                problems.push(format!("{name} must name a claim"));
            }
        }
        Some(JwtSettings {
            jwks_file: jwks_file.clone(),
            issuer: issuer?,
            audience: audience?,
            caller_claim: self.jwt_caller_claim.clone(),
            role_claim: self.jwt_role_claim.clone(),
            tenant_claim: self.jwt_tenant_claim.clone(),
            leeway: self.jwt_leeway,
        })
    }

    fn defaults(&self, problems: &mut Vec<String>) -> CallerLimits {
        for (name, zero) in [
            ("CALLER_MAX_IN_FLIGHT", self.caller_max_in_flight == Some(0)),
            ("CALLER_MAX_HOLDS", self.caller_max_holds == Some(0)),
            (
                "CALLER_MAX_HELD_UNITS",
                self.caller_max_held_units == Some(0),
            ),
        ] {
            if zero {
                problems.push(format!("{name} must be at least 1 (unset it for no limit)"));
            }
        }
        CallerLimits {
            max_in_flight: self.caller_max_in_flight,
            caps: HoldCaps {
                max_holds: self.caller_max_holds,
                max_held_units: self.caller_max_held_units,
            },
        }
    }

    /// `server`: where bearer tokens would arrive, to refuse taking them in the clear.
    /// `tenant_required`: more than one tenant is served, so every caller names its own.
    fn settings(
        &self,
        server: &ServerArgs,
        tenant_required: bool,
        problems: &mut Vec<String>,
    ) -> Option<AuthSettings> {
        let jwt = self.jwt(problems);
        let credentials = self.auth_tokens_file.is_some() || self.jwt_jwks_file.is_some();
        let defaults = self.defaults(problems);
        let sources = AuthSources {
            tokens_file: self.auth_tokens_file.clone(),
            jwt,
            defaults,
            tenant_required,
        };
        let authenticator = match (credentials, self.auth_disabled) {
            (true, true) => {
                problems.push(
                    "AUTH_TOKENS_FILE (or JWT_JWKS_FILE) and AUTH_DISABLED exclude each other"
                        .into(),
                );
                None
            }
            (true, false) => sources.load().map_err(|found| problems.extend(found)).ok(),
            (false, true) => Some(Authenticator::disabled_with(defaults)),
            (false, false) => {
                problems.push(
                    "authentication is required: set AUTH_TOKENS_FILE or JWT_JWKS_FILE, or AUTH_DISABLED=true for local use"
                        .into(),
                );
                None
            }
        };
        if credentials
            && !server.tls.is_on()
            && !server.listen_addr.ip().is_loopback()
            && !self.allow_plaintext_tokens
        {
            problems.push(format!(
                "credentials without TLS would take bearer tokens in the clear on {}: set \
                 TLS_CERT_FILE and TLS_KEY_FILE, listen on loopback, or set \
                 ALLOW_PLAINTEXT_TOKENS=true if a sidecar terminates TLS in front of this port",
                server.listen_addr
            ));
        }
        Some(AuthSettings {
            authenticator: authenticator?,
            sources: credentials.then_some(sources),
        })
    }
}

impl InventoryArgs {
    /// `leases`: how long a Reserve waits for one, and how many may queue for one SKU.
    fn settings(&self, leases: &LeaseArgs, problems: &mut Vec<String>) -> Option<InventoryConfig> {
        let default_ttl = Ttl::parse(self.reservation_default_ttl)
            .map_err(|problem| problems.push(format!("RESERVATION_DEFAULT_TTL {problem}")))
            .ok();
        if let Err(problem) = Ttl::parse(self.max_hold) {
            problems.push(format!("MAX_HOLD {problem}"));
        } else if self.max_hold < self.reservation_default_ttl {
            problems.push("MAX_HOLD must be at least RESERVATION_DEFAULT_TTL".into());
        }
        if !(Duration::from_secs(3_600)..=inventory_core::domain::MAX_WAIT_HORIZON)
            .contains(&self.wait_horizon)
        {
            problems.push("WAIT_HORIZON must be between 1h and 3650d".into());
        }
        Some(InventoryConfig {
            default_ttl: default_ttl?,
            coalesce: self.coalesce.settings(leases, problems),
            lease_wait: leases.lease_wait,
            max_hold: self.max_hold,
            wait_horizon: self.wait_horizon,
            tenant_caps: None,
        })
    }
}

impl CoalesceArgs {
    fn settings(&self, leases: &LeaseArgs, problems: &mut Vec<String>) -> CoalesceConfig {
        if self.coalesce_linger > MAX_COALESCE_LINGER {
            problems.push("COALESCE_LINGER must be at most 100ms".into());
        }
        CoalesceConfig {
            max_batch: self.coalesce_max_batch as usize,
            linger: self.coalesce_linger,
            max_queued: leases.lease_max_waiters as usize,
            max_commits: self.coalesce_max_commits as usize,
        }
    }
}

impl UpkeepArgs {
    fn settings(&self, problems: &mut Vec<String>) -> Option<Upkeep> {
        nonzero([("SWEEP_INTERVAL", self.sweep_interval)], problems);
        Some(Upkeep {
            interval: self.sweep_interval,
            batch: self.sweep_batch as usize,
            retention: self.retention.settings(problems),
        })
    }
}

impl RetentionArgs {
    fn settings(&self, problems: &mut Vec<String>) -> Retention {
        if self.idempotency_retention < MIN_IDEMPOTENCY_RETENTION {
            problems.push("IDEMPOTENCY_RETENTION must be at least 24h".into());
        }
        if self.reservation_retention < self.idempotency_retention.max(MIN_IDEMPOTENCY_RETENTION) {
            // A retry replays its stored answer; the reservation it names must still exist.
            problems.push(
                "RESERVATION_RETENTION must be at least 24h and at least IDEMPOTENCY_RETENTION"
                    .into(),
            );
        }
        if self.event_retention.is_zero() {
            problems.push("EVENT_RETENTION must be greater than zero".into());
        }
        if self.subscription_idle_limit.is_zero() {
            problems.push("SUBSCRIPTION_IDLE_LIMIT must be greater than zero".into());
        }
        Retention {
            events: self.event_retention,
            subscription_idle: self.subscription_idle_limit,
            idempotency_keys: self.idempotency_retention,
            reservations: self.reservation_retention,
            ledger: self.ledger_retention,
        }
    }
}

/// Parses `DATABASE_URL` (and reads the TLS files it names) without echoing it: it may hold a
/// password.
pub fn parse_database_url(url: &SecretString) -> Result<PgConfig, String> {
    inventory_postgres::parse_url(url.expose_secret())
        .map_err(|error| format!("DATABASE_URL: {error}"))
}

/// A flag's value that may hold a password: kept where `Debug` cannot show it.
fn secret(value: &str) -> Result<SecretString, std::convert::Infallible> {
    Ok(value.into())
}

/// Every problem found in the configuration.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n  {}", .0.join("\n  "))]
pub struct ConfigError(pub Vec<String>);

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::{Cli, Command};

    #[test]
    fn the_urls_never_print() {
        let cli = Cli::try_parse_from([
            "inventory-server",
            "serve",
            "--database-url",
            "postgres://user:pg-s3cret@host/db",
            "--database-listen-url",
            "postgres://user:listen-s3cret@host/db",
            "--redis-url",
            "redis://user:redis-s3cret@host",
        ])
        .unwrap();
        let printed = format!("{cli:?}");
        assert!(!printed.contains("s3cret"), "{printed}");
        let Command::Serve(serve) = cli.command else {
            panic!("serve")
        };
        assert!(!format!("{serve:?}").contains("s3cret"));
    }
}
