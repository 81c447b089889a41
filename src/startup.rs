//! Assembly: [`Application::build`] connects and binds (port 0 works, for tests), then
//! [`Application::run_until_stopped`] serves until the shutdown future completes.
//!
//! Shutdown order: health turns NOT_SERVING (so load balancers and probes stop sending work),
//! the server stops accepting and lets in-flight calls finish, bounded by the grace period;
//! then the pools close.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context as _;
use inventory_core::{
    domain::Tenant,
    pause::PausePoints,
    service::{Inventory, InventoryConfig},
};
use inventory_postgres::{PgConfig, PgStore, Pool, Schema, events::PgHeadFeed};
use inventory_redis::{Redis, RedisConfig, RedisLeases, RedisSettings};
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Server, server::Router};
use tonic_health::{
    ServingStatus,
    pb::health_server::{Health, HealthServer},
    server::HealthReporter,
};
use tracing::Instrument as _;

use crate::{
    Service,
    auth::Gate,
    config::PeerSettings,
    config::{DatabaseSettings, ReloadSources, ServerSettings, Settings},
    events::{self, EventHub},
    grpc::InventoryApi,
    peer::{PeerApi, PeerForwarder, PeerSecret},
    proto::{self, inventory_service_server::InventoryServiceServer},
    reload::Reloader,
    tenants::{TenantCore, TenantSettings, Tenants},
    tls::ServerTls,
    upkeep::{self, Upkeep},
};

/// How often a replica that is not ready yet looks again.
const READINESS_RECHECK: Duration = Duration::from_secs(1);
/// How often a ready replica reads the schema floor again.
const FLOOR_RECHECK: Duration = Duration::from_secs(5);

/// How long start-up waits for the first Redis connection before serving anyway.
const REDIS_STARTUP_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub struct Application {
    listener: TcpListener,
    local_addr: SocketAddr,
    health_listener: Option<TcpListener>,
    admin_listener: Option<TcpListener>,
    /// The internal port calls forwarded by other replicas arrive on, when forwarding is on.
    peers: Option<Peers>,
    registry: prometheus::Registry,
    tls: Option<ServerTls>,
    redis: Redis,
    /// Every tenant's core, and the store, pool and `LISTEN` configuration beside each.
    tenants: Tenants,
    stores: Vec<TenantStore>,
    pauses: PausePoints,
    stopping: tokio::sync::watch::Sender<bool>,
    auth: Gate,
    reload: ReloadSources,
    max_in_flight: usize,
    max_message_bytes: usize,
    max_connection_age: Duration,
    upkeep: Upkeep,
    shutdown_grace: Duration,
    access_log: crate::access::AccessLogSettings,
}

impl Application {
    /// Connects the pools and binds the listener. Neither PostgreSQL nor Redis has to be up
    /// yet: requests that need them answer `UNAVAILABLE` until they are.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        Self::build_with_registry(settings, prometheus::Registry::new()).await
    }

    /// Like [`Application::build`], with the Prometheus registry `/metrics` serves.
    pub async fn build_with_registry(
        settings: Settings,
        registry: prometheus::Registry,
    ) -> anyhow::Result<Self> {
        let reload = settings.reload_sources();
        let Settings {
            server,
            database,
            redis,
            inventory,
            upkeep,
            auth,
            peer,
            tenants,
        } = settings;
        let listen_config = listen_config(&database);
        probe_postgres(&database, &listen_config).await?;
        let client = connect_redis(redis.config, &redis.client).await?;
        let listeners = Listeners::bind(&server).await?;
        let peers = match peer {
            Some(peer) => Some(Peers::bind(&peer).await?),
            None => None,
        };
        let mut lease_settings = redis.leases;
        lease_settings.advertise = peers.as_ref().map(|p| p.advertise.to_string());
        let tls = server_tls(&server)?;
        if auth.authenticator.is_disabled() {
            tracing::warn!("authentication is DISABLED: every caller may make every call");
        }
        let core = Core::wire(
            &database,
            &listen_config,
            &client,
            &lease_settings,
            &inventory,
            &tenants,
            crate::events::WatchLimits {
                max_watchers: server.max_watchers,
                heartbeat: server.watch_heartbeat_interval,
            },
            peers.as_ref().map(|p| p.secret.clone()),
        )?;
        Ok(Self {
            listener: listeners.grpc,
            local_addr: listeners.local_addr,
            health_listener: listeners.health,
            admin_listener: listeners.admin,
            peers,
            registry,
            tls,
            redis: client,
            tenants: core.tenants,
            stores: core.stores,
            pauses: core.pauses,
            stopping: core.stopping,
            auth: Gate::new(auth.authenticator),
            reload,
            max_in_flight: server.max_in_flight,
            max_message_bytes: server.max_message_bytes,
            max_connection_age: server.max_connection_age,
            upkeep,
            shutdown_grace: server.shutdown_grace,
            access_log: server.access_log.clone(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The admin (`/metrics`) listener's address, if there is one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_listener
            .as_ref()
            .and_then(|listener| listener.local_addr().ok())
    }

    /// The internal peer port's address, when forwarding is on.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peers
            .as_ref()
            .and_then(|peers| peers.listener.local_addr().ok())
    }

    /// The plaintext health listener's address, if there is one.
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health_listener
            .as_ref()
            .and_then(|listener| listener.local_addr().ok())
    }

    /// The wired core of tenant `default` (or of the first tenant when `default` is not
    /// served): tests use it to run a sweep or arm pause points.
    pub fn inventory(&self) -> Arc<Service> {
        Arc::clone(&self.tenants.primary().inventory)
    }

    /// Shared by every tenant's core and store: one test arms them all.
    pub fn pause_points(&self) -> PausePoints {
        self.pauses.clone()
    }

    /// The PostgreSQL store of [`Self::inventory`]'s tenant: tests use it to position or
    /// prune events by hand.
    pub fn store(&self) -> PgStore {
        let primary = &self.tenants.primary().tenant;
        self.stores
            .iter()
            .find(|s| &s.tenant == primary)
            .expect("every tenant has a store")
            .store
            .clone()
    }

    pub fn events(&self) -> EventHub {
        self.tenants.primary().events.clone()
    }

    /// Every tenant this replica serves, with its core.
    pub fn tenants(&self) -> Tenants {
        self.tenants.clone()
    }

    /// Serves until `shutdown` completes, then drains and closes.
    pub async fn run_until_stopped(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let admission = self.register_metrics();
        let api = InventoryServiceServer::new(InventoryApi::new(
            self.tenants.clone(),
            self.auth.clone(),
            &admission,
        ))
        .max_decoding_message_size(self.max_message_bytes);
        let background = self.spawn_background();
        let (health, health_service) = tonic_health::server::health_reporter();
        let readiness = self.start_readiness(&health).await;
        let reflection_v1 = reflection_builder().build_v1()?;
        // grpcurl 1.8 and many other tools speak only the v1alpha protocol.
        let reflection_v1alpha = reflection_builder().build_v1alpha()?;
        let (stop_health, health_server) =
            serve_health_plaintext(self.health_listener, health_service.clone());
        let admin_server = serve_admin(self.admin_listener, &self.registry, &self.stopping);
        let (stop_peers, peers_stopped) = tokio::sync::oneshot::channel::<()>();
        let peer_server = self.peers.map(|peers| {
            serve_peers(
                peers,
                self.tenants.clone(),
                Arc::clone(&admission.permits),
                peers_stopped,
            )
        });
        let (stop_accepting, stopped) = tokio::sync::oneshot::channel::<()>();
        let access = crate::access::AccessLog::start(&self.access_log);
        let router = Server::builder()
            .layer(
                crate::telemetry::RpcLayer::with_access_log(access)
                    .with_tenants(self.tenants.clone()),
            )
            .max_connection_age(self.max_connection_age)
            .max_connection_age_grace(self.shutdown_grace)
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(api);
        let server = serve_grpc(
            router,
            self.listener,
            self.tls.as_ref(),
            &self.reload,
            stopped,
        );
        tokio::pin!(server);
        tracing::info!(addr = %self.local_addr, "serving");

        tokio::select! {
            result = &mut server => result.context("gRPC server failed")?,
            () = shutdown => {
                tracing::info!(grace = ?self.shutdown_grace, "shutting down: draining in-flight calls");
                set_health(&health, ServingStatus::NotServing).await;
                // Ends the background tasks and every WatchEvents stream, so open streams do
                // not hold the drain up.
                let _ = self.stopping.send(true);
                let _ = stop_accepting.send(());
                drain(&mut server, self.shutdown_grace).await?;
            }
        }

        let _ = self.stopping.send(true);
        for task in background.into_iter().chain(Some(readiness)) {
            let _ = task.await;
        }
        if let Some(admin_server) = admin_server {
            let _ = admin_server.await;
        }
        // The peer port outlives the drain: this replica's leases may still name it, and a
        // call forwarded here meanwhile is served, not refused at the door.
        let _ = stop_peers.send(());
        if let Some(peer_server) = peer_server {
            let _ = peer_server.await;
        }
        stop_health_server(stop_health, health_server).await;
        for store in &self.stores {
            store.store.pool().close();
        }
        self.redis.quit().await;
        tracing::info!("stopped");
        Ok(())
    }

    /// The admission semaphore of unary calls, with the gauges of it and of the pool, and the
    /// build and adapter metrics.
    fn register_metrics(&self) -> crate::metrics::Admission {
        let admission = crate::metrics::Admission {
            permits: Arc::new(tokio::sync::Semaphore::new(self.max_in_flight)),
            limit: self.max_in_flight,
        };
        let pools: Vec<_> = self
            .stores
            .iter()
            .map(|s| (s.tenant.clone(), s.store.pool().clone()))
            .collect();
        crate::metrics::register_saturation(&pools, &admission, &self.tenants.primary().events);
        crate::metrics::record_build_info();
        crate::metrics::init_adapters();
        admission
    }

    /// Upkeep, the event sequencer and tailer, and the credentials reloader, each ending when
    /// `stopping` turns true.
    fn spawn_background(&self) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::new();
        for core in self.tenants.iter() {
            let store = self
                .stores
                .iter()
                .find(|s| s.tenant == core.tenant)
                .expect("every tenant has a store");
            let span = tracing::info_span!("tenant", tenant = %core.tenant);
            tasks.push(tokio::spawn(
                upkeep::run(
                    Arc::clone(&core.inventory),
                    self.upkeep,
                    self.stopping.subscribe(),
                )
                .instrument(span.clone()),
            ));
            tasks.push(tokio::spawn(
                events::run_sequencer(Arc::clone(&core.inventory), self.stopping.subscribe())
                    .instrument(span.clone()),
            ));
            tasks.push(tokio::spawn(
                events::run_tailer(
                    core.events.clone(),
                    PgHeadFeed::new(store.listen.clone(), store.store.bound()),
                    self.stopping.subscribe(),
                )
                .instrument(span),
            ));
        }
        tasks.push(tokio::spawn(
            Reloader::new(self.reload.clone(), self.auth.clone(), self.tls.clone())
                .run(self.stopping.subscribe()),
        ));
        tasks
    }

    /// Alive from now on; ready (the service's own status, which readiness probes check)
    /// once PostgreSQL answered with a schema this binary can use: at once if it does now,
    /// else from the task returned, which also keeps watching the schema floor.
    async fn start_readiness(&self, health: &HealthReporter) -> JoinHandle<()> {
        health.set_service_status("", ServingStatus::Serving).await;
        let pools = self.pools();
        let ready = match every_schema_ready(&pools).await {
            Ok(()) => {
                set_health(health, ServingStatus::Serving).await;
                true
            }
            Err(reason) => {
                tracing::warn!(%reason, "not ready yet: readiness stays NOT_SERVING");
                health
                    .set_service_status(SERVICE_NAME, ServingStatus::NotServing)
                    .await;
                false
            }
        };
        tokio::spawn(gate_readiness(
            pools,
            health.clone(),
            self.stopping.subscribe(),
            ready,
        ))
    }
}

impl Application {
    /// Each tenant's pool, with the tenant's name.
    fn pools(&self) -> Vec<(Tenant, Pool)> {
        self.stores
            .iter()
            .map(|s| (s.tenant.clone(), s.store.pool().clone()))
            .collect()
    }
}

/// The configuration of the `LISTEN` connection, which gets the pool's socket protections too.
fn listen_config(database: &DatabaseSettings) -> PgConfig {
    database
        .listen
        .as_ref()
        .unwrap_or(&database.config)
        .hardened(&database.pool)
}

/// A configuration the database will never accept (TLS, pg_hba.conf, password) ends start-up
/// here with the reason; a database that is merely down does not.
async fn probe_postgres(
    database: &DatabaseSettings,
    listen_config: &PgConfig,
) -> anyhow::Result<()> {
    let mut probes = vec![("DATABASE_URL", database.config.hardened(&database.pool))];
    if database.listen.is_some() {
        probes.push(("DATABASE_LISTEN_URL", listen_config.clone()));
    }
    for (name, config) in probes {
        match inventory_postgres::probe(&config, database.pool.acquire_timeout).await {
            Ok(()) => {}
            Err(inventory_postgres::ProbeError::Refused(reason)) => anyhow::bail!(
                "PostgreSQL refused the connection: {reason} (check {name}'s sslmode, \
                 sslrootcert and credentials, and the server's pg_hba.conf)"
            ),
            Err(inventory_postgres::ProbeError::Unreachable(reason)) => tracing::warn!(
                %reason,
                url = name,
                "PostgreSQL is not reachable yet; calls answer UNAVAILABLE until it is"
            ),
        }
    }
    Ok(())
}

/// The Redis client. A Redis that refuses us (credentials, TLS) ends start-up; one that is
/// merely down is waited for briefly, then Reserve fails closed until it is up.
async fn connect_redis(config: RedisConfig, settings: &RedisSettings) -> anyhow::Result<Redis> {
    let reachable = match inventory_redis::probe(&config, settings, REDIS_STARTUP_WAIT).await {
        Ok(()) => true,
        Err(inventory_redis::RedisProbeError::Refused(reason)) => anyhow::bail!(
            "Redis refused the connection: {reason} (check REDIS_URL's user and password, \
             REDIS_TLS_CA_FILE and the server's certificate)"
        ),
        Err(inventory_redis::RedisProbeError::Unreachable(reason)) => {
            tracing::warn!(%reason, "Redis is not reachable yet; Reserve fails closed until it is");
            false
        }
    };
    let client = Redis::connect(config, settings).context("cannot build the Redis client")?;
    if reachable && !client.wait_connected(REDIS_STARTUP_WAIT).await {
        tracing::warn!("Redis is not reachable yet; Reserve fails closed until it is");
    }
    Ok(client)
}

/// The gRPC port and the optional health and admin ports, bound.
struct Listeners {
    grpc: TcpListener,
    local_addr: SocketAddr,
    health: Option<TcpListener>,
    admin: Option<TcpListener>,
}

impl Listeners {
    async fn bind(server: &ServerSettings) -> anyhow::Result<Self> {
        let grpc = TcpListener::bind(server.listen_addr)
            .await
            .with_context(|| format!("cannot listen on {}", server.listen_addr))?;
        let local_addr = grpc.local_addr()?;
        Ok(Self {
            grpc,
            local_addr,
            health: bind_optional(server.health_listen_addr, "health").await?,
            admin: bind_optional(server.admin_listen_addr, "admin").await?,
        })
    }
}

/// The internal peer port, bound, with what this replica's leases name as its address.
#[derive(Debug)]
struct Peers {
    listener: TcpListener,
    advertise: SocketAddr,
    secret: PeerSecret,
}

impl Peers {
    async fn bind(settings: &PeerSettings) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(settings.listen_addr)
            .await
            .with_context(|| format!("cannot listen on {} (peers)", settings.listen_addr))?;
        let advertise = match settings.advertise_addr {
            Some(addr) => addr,
            None => listener.local_addr()?,
        };
        Ok(Self {
            listener,
            advertise,
            secret: PeerSecret::new(secrecy::ExposeSecret::expose_secret(&settings.secret)),
        })
    }
}

async fn bind_optional(
    addr: Option<SocketAddr>,
    what: &str,
) -> anyhow::Result<Option<TcpListener>> {
    match addr {
        Some(addr) => {
            Ok(Some(TcpListener::bind(addr).await.with_context(|| {
                format!("cannot listen on {addr} ({what})")
            })?))
        }
        None => Ok(None),
    }
}

/// TLS on the gRPC port, if configured. Fails here, at start-up, on a certificate or key that
/// does not parse.
fn server_tls(server: &ServerSettings) -> anyhow::Result<Option<ServerTls>> {
    match &server.tls {
        Some(material) => Ok(Some(
            ServerTls::new(material).context("invalid TLS material")?,
        )),
        None => {
            tracing::warn!("TLS is off: the gRPC port speaks plaintext");
            Ok(None)
        }
    }
}

/// One tenant's store, and the `LISTEN` configuration of its event stream.
#[derive(Debug)]
struct TenantStore {
    tenant: Tenant,
    store: PgStore,
    listen: PgConfig,
}

/// Every tenant's core and store, and the signal that stops their background work.
struct Core {
    tenants: Tenants,
    stores: Vec<TenantStore>,
    pauses: PausePoints,
    stopping: tokio::sync::watch::Sender<bool>,
}

impl Core {
    /// One core per tenant: a pool in the tenant's schema, leases under its Redis keys, its
    /// own event stream; the pause points, the stop signal and the count of watchers shared.
    #[allow(clippy::too_many_arguments)]
    fn wire(
        database: &DatabaseSettings,
        listen: &PgConfig,
        redis: &Redis,
        leases: &inventory_redis::LeaseSettings,
        config: &InventoryConfig,
        tenants: &TenantSettings,
        watch_limits: crate::events::WatchLimits,
        peer_secret: Option<PeerSecret>,
    ) -> anyhow::Result<Self> {
        let pauses = PausePoints::default();
        let (stopping, stopping_rx) = tokio::sync::watch::channel(false);
        let mut cores = Vec::new();
        let mut stores = Vec::new();
        let mut first_hub: Option<EventHub> = None;
        for tenant in &tenants.tenants {
            let schema = Schema::of_tenant(tenant);
            let pool = inventory_postgres::connect(
                database.config.clone().in_schema(schema.clone()),
                &database.pool,
            )
            .with_context(|| format!("cannot build the PostgreSQL pool of tenant {tenant}"))?;
            let store = PgStore::new(pool, database.pool.operation_bound())
                .for_tenant(tenant)
                .with_pause_points(pauses.clone())
                .with_wait_horizon(config.wait_horizon)
                .with_max_subscriptions(tenants.limits.max_subscriptions);
            let mut config = config.clone();
            config.tenant_caps = Some((tenant.clone(), tenants.limits.caps));
            let leases = RedisLeases::new(redis.for_tenant(tenant), leases.clone());
            let mut inventory =
                Inventory::new(store.clone(), leases, config).with_pause_points(pauses.clone());
            if let Some(secret) = &peer_secret {
                inventory = inventory.with_forwarder(Arc::new(
                    PeerForwarder::new(secret.clone()).for_tenant(tenant.clone()),
                ));
            }
            let inventory = Arc::new(inventory);
            let events = match &first_hub {
                None => EventHub::new(Arc::clone(&inventory), stopping_rx.clone(), watch_limits),
                Some(hub) => hub.sibling(Arc::clone(&inventory)),
            };
            first_hub.get_or_insert_with(|| events.clone());
            cores.push(TenantCore::new(
                tenant.clone(),
                inventory,
                events,
                &tenants.limits,
            ));
            stores.push(TenantStore {
                tenant: tenant.clone(),
                store,
                listen: listen.clone().in_schema(schema),
            });
        }
        Ok(Self {
            tenants: Tenants::new(cores),
            stores,
            pauses,
            stopping,
        })
    }
}

/// Plaintext connections as accepted, with Nagle's algorithm off (as on the TLS path): many
/// small HTTP/2 frames share a connection, and a reply held back for a delayed ACK costs a
/// call tens of milliseconds.
fn plaintext(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt as _;
    TcpListenerStream::new(listener).map(|accepted| {
        accepted.inspect(|tcp| {
            let _ = tcp.set_nodelay(true);
        })
    })
}

/// The internal peer port: forwarded calls, until `stop` (after the API port drained); then
/// it lets the calls in flight finish (tonic's graceful shutdown).
fn serve_peers(
    peers: Peers,
    tenants: Tenants,
    in_flight: Arc<tokio::sync::Semaphore>,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> JoinHandle<Result<(), tonic::transport::Error>> {
    tracing::info!(addr = ?peers.listener.local_addr().ok(), advertised = %peers.advertise, "serving peers");
    let api = crate::peer::service(PeerApi::new(
        tenants,
        peers.secret,
        peers.advertise,
        in_flight,
    ));
    tokio::spawn(
        Server::builder()
            .layer(crate::telemetry::RpcLayer::default())
            .add_service(api)
            .serve_with_incoming_shutdown(plaintext(peers.listener), async move {
                let _ = stop.await;
            }),
    )
}

/// The plaintext health listener, if any. It outlives the main one, so probes see
/// NOT_SERVING while in-flight calls drain; it stops when the sender returned is used.
fn serve_health_plaintext(
    listener: Option<TcpListener>,
    service: HealthServer<impl Health>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    Option<JoinHandle<Result<(), tonic::transport::Error>>>,
) {
    let (stop_health, health_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = listener.map(|listener| {
        tracing::info!(addr = ?listener.local_addr().ok(), "serving health in plaintext");
        tokio::spawn(
            Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = health_stopped.await;
                }),
        )
    });
    (stop_health, server)
}

/// Stops the plaintext health listener. Probes' open Watch streams never end by themselves:
/// a short bound, then cut.
async fn stop_health_server(
    stop: tokio::sync::oneshot::Sender<()>,
    server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
) {
    let _ = stop.send(());
    if let Some(mut server) = server
        && tokio::time::timeout(Duration::from_secs(1), &mut server)
            .await
            .is_err()
    {
        server.abort();
    }
}

/// The admin (`/metrics`) listener, if any, until `stopping` turns true.
fn serve_admin(
    listener: Option<TcpListener>,
    registry: &prometheus::Registry,
    stopping: &tokio::sync::watch::Sender<bool>,
) -> Option<JoinHandle<std::io::Result<()>>> {
    listener.map(|listener| {
        let mut stopping = stopping.subscribe();
        tokio::spawn(crate::admin::serve(
            listener,
            registry.clone(),
            async move {
                let _ = stopping.changed().await;
            },
        ))
    })
}

type Serving = std::pin::Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>>;

/// The gRPC port, through TLS when it is on, until `stopped` fires.
fn serve_grpc(
    router: Router<
        tower::layer::util::Stack<crate::telemetry::RpcLayer, tower::layer::util::Identity>,
    >,
    listener: TcpListener,
    tls: Option<&ServerTls>,
    reload: &ReloadSources,
    stopped: tokio::sync::oneshot::Receiver<()>,
) -> Serving {
    let stopped = async {
        let _ = stopped.await;
    };
    match tls {
        Some(tls) => {
            tracing::info!(
                mutual = reload
                    .tls
                    .as_ref()
                    .is_some_and(|files| files.client_ca.is_some()),
                "TLS on"
            );
            Box::pin(router.serve_with_incoming_shutdown(tls.incoming(listener), stopped))
        }
        None => Box::pin(router.serve_with_incoming_shutdown(plaintext(listener), stopped)),
    }
}

/// Lets in-flight calls finish within `grace`; open streams never finish on their own and
/// are cut off when it is over.
async fn drain(server: &mut std::pin::Pin<&mut Serving>, grace: Duration) -> anyhow::Result<()> {
    match tokio::time::timeout(grace, server).await {
        Ok(result) => result.context("gRPC server failed while draining")?,
        Err(_) => tracing::warn!("grace period over: closing the calls still open"),
    }
    Ok(())
}

fn reflection_builder() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        // Lets grpcurl decode the rich error details (BadRequest, ErrorInfo, ...).
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
}

const SERVICE_NAME: &str =
    <InventoryServiceServer<InventoryApi> as tonic::server::NamedService>::NAME;

async fn set_health(health: &HealthReporter, status: ServingStatus) {
    health.set_service_status("", status).await;
    health.set_service_status(SERVICE_NAME, status).await;
}

/// Why this replica may not take traffic, if it may not.
#[derive(Debug, PartialEq, Eq)]
pub enum NotReady {
    /// PostgreSQL did not answer, or the schema is not yet what this binary needs: it may
    /// change by itself (a `migrate` runs).
    Waiting(String),
    /// The schema's floor is above this release: a migration its writes would corrupt was
    /// applied, and only a newer release may write.
    BelowFloor { release: i32, floor: i32 },
}

impl NotReady {
    /// The same reason, naming the tenant it is about (unless it is tenant `default`, the
    /// only one of a deployment without tenants).
    fn of(self, tenant: &Tenant) -> Self {
        match self {
            Self::Waiting(reason) if !tenant.is_default() => {
                Self::Waiting(format!("tenant {tenant}: {reason}"))
            }
            other => other,
        }
    }
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Waiting(reason) => f.write_str(reason),
            Self::BelowFloor { release, floor } => write!(
                f,
                "the schema floor is release {floor}, above this release ({release}): it may \
                 not write (SCHEMA_TOO_NEW); roll this replica forward"
            ),
        }
    }
}

/// Whether this replica may take traffic: PostgreSQL answered, its schema is the one this
/// binary needs or newer (an older binary keeps working during a rollout; a newer one must
/// wait for `migrate`), and the schema's floor is not above this release (see
/// `inventory_postgres::migrate`).
pub async fn schema_ready(pool: &Pool) -> Result<(), NotReady> {
    let client = pool
        .get()
        .await
        .map_err(|error| NotReady::Waiting(format!("PostgreSQL: {error}")))?;
    let needed = inventory_postgres::migrate::expected_version();
    match inventory_postgres::migrate::applied_version(&client).await {
        Ok(Some(applied)) if applied >= needed => {}
        Ok(Some(applied)) => {
            return Err(NotReady::Waiting(format!(
                "the schema is at migration {applied}, this binary needs {needed}: run `inventory-server migrate`"
            )));
        }
        Ok(None) => {
            return Err(NotReady::Waiting(format!(
                "the database has no schema, this binary needs migration {needed}: run `inventory-server migrate`"
            )));
        }
        Err(error) => return Err(NotReady::Waiting(format!("PostgreSQL: {error}"))),
    }
    drop(client);
    below_floor(pool).await
}

/// [`schema_ready`] for every tenant's schema; the first that is not names its tenant.
pub async fn every_schema_ready(pools: &[(Tenant, Pool)]) -> Result<(), NotReady> {
    for (tenant, pool) in pools {
        schema_ready(pool)
            .await
            .map_err(|reason| reason.of(tenant))?;
    }
    Ok(())
}

/// [`below_floor`] for every tenant's schema.
async fn every_below_floor(pools: &[(Tenant, Pool)]) -> Result<(), NotReady> {
    for (tenant, pool) in pools {
        below_floor(pool)
            .await
            .map_err(|reason| reason.of(tenant))?;
    }
    Ok(())
}

/// `Err(BelowFloor)` if the schema's floor is above this release; a failed read is no answer.
async fn below_floor(pool: &Pool) -> Result<(), NotReady> {
    let client = pool
        .get()
        .await
        .map_err(|error| NotReady::Waiting(format!("PostgreSQL: {error}")))?;
    let release = inventory_postgres::migrate::release();
    match inventory_postgres::migrate::floor(&client).await {
        Ok(Some(floor)) if floor > release => Err(NotReady::BelowFloor { release, floor }),
        Ok(_) => Ok(()),
        Err(error) => Err(NotReady::Waiting(format!("PostgreSQL: {error}"))),
    }
}

/// Unless `ready` already, turns readiness on once [`schema_ready`] holds, checking every
/// second until shutdown; then keeps reading the floor (every [`FLOOR_RECHECK`]), and turns
/// readiness off for good once the floor is above this release, so the load balancer sends
/// calls only to replicas that may write. Other failures after that keep the replica ready:
/// calls answer `UNAVAILABLE` instead.
async fn gate_readiness(
    pools: Vec<(Tenant, Pool)>,
    health: HealthReporter,
    mut stopping: tokio::sync::watch::Receiver<bool>,
    ready: bool,
) {
    if !ready && !become_ready(&pools, &health, &mut stopping).await {
        return;
    }
    loop {
        tokio::select! {
            () = tokio::time::sleep(FLOOR_RECHECK) => {}
            _ = stopping.changed() => return,
        }
        if let Err(below @ NotReady::BelowFloor { .. }) = every_below_floor(&pools).await {
            health
                .set_service_status(SERVICE_NAME, ServingStatus::NotServing)
                .await;
            tracing::error!(reason = %below, "not ready: readiness is NOT_SERVING");
            return;
        }
    }
}

/// Checks [`schema_ready`] every second and turns readiness on once it holds; `false` if the
/// shutdown came first.
async fn become_ready(
    pools: &[(Tenant, Pool)],
    health: &HealthReporter,
    stopping: &mut tokio::sync::watch::Receiver<bool>,
) -> bool {
    let mut last = String::new();
    loop {
        tokio::select! {
            () = tokio::time::sleep(READINESS_RECHECK) => {}
            _ = stopping.changed() => return false,
        }
        match every_schema_ready(pools).await {
            Ok(()) if !*stopping.borrow() => {
                health
                    .set_service_status(SERVICE_NAME, ServingStatus::Serving)
                    .await;
                tracing::info!("ready: PostgreSQL answered with the schema this binary needs");
                return true;
            }
            Ok(()) => return false,
            Err(reason) => {
                let reason = reason.to_string();
                if reason != last {
                    tracing::warn!(%reason, "not ready yet: readiness stays NOT_SERVING");
                    last = reason;
                }
            }
        }
    }
}

/// Completes on SIGTERM (Kubernetes) or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
