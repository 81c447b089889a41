//! Per-SKU leases with fencing tokens.
//!
//! Grant is one Lua script: `SET lease <holder> NX PX ttl` and, only if that succeeded,
//! `INCR fence`. Being one script, token order is grant order. Every grant renews the fence
//! counter's long TTL (30 days by default): a counter in use never expires, while counters of
//! SKUs nobody reserves any more (or that never existed) do not pile up in Redis forever.
//! Losing a counter is survivable by design (PostgreSQL keeps the highest accepted token and
//! the core raises the counter past it), so the TTL trades a rare recovery for bounded memory.
//!
//! A release publishes the SKU on `<prefix>:lease-released`, and a replica waiting for that
//! SKU's lease tries again at once instead of sleeping out its backoff: with several replicas
//! sharing a hot SKU, the lease passes between them in a round trip, not in a backoff step.
//! The message is a hint, never a condition: the backoff still runs (a lease that expires
//! publishes nothing, and pub/sub drops messages while a subscriber reconnects), and a Redis
//! user without the channel permission releases as before, unheard.
//!
//! Every call fails fast: a disconnected client answers at once, a slow Redis within the
//! command timeout. fred ignores per-call options on the Lua path (fred #353), so the bound
//! comes from the client's default command timeout, with an outer timeout as a backstop. A
//! timed-out script may still run on Redis later; that is harmless here (the lease expires
//! on its own and the counter only grows), and the caller hears `UNAVAILABLE`, never success.

use std::{
    collections::HashMap,
    future::Future,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use fred::{
    error::{Error as RedisError, ErrorKind},
    interfaces::{EventInterface as _, KeysInterface, PubsubInterface as _},
    types::scripts::Script,
};
use inventory_core::{
    Dependency, Error,
    domain::{FenceToken, Sku},
    ports::{Attempt, Lease, LeaseService, Peer},
};
use opentelemetry::KeyValue;
use tokio::sync::Notify;

use crate::client::Redis;

/// KEYS: lease, fence. ARGV: holder, lease ttl in ms, fence ttl in ms. Returns the new
/// fencing token, or 0 when the lease is held by someone else.
const ACQUIRE: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local token = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return token
end
return 0
"#;

/// As [`ACQUIRE`], but a refusal says who holds the lease: returns `{token, ''}` when
/// granted, `{0, holder}` when not (`''` if the lease expired in between).
const ACQUIRE_OR_HOLDER: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local token = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return {token, ''}
end
return {0, redis.call('GET', KEYS[1]) or ''}
"#;

/// KEYS: lease, fence. ARGV: holder, lease ttl in ms, fence ttl in ms. If this holder still
/// has the lease: extends it and returns the next fencing token (one round trip where a
/// release and a new grant take two); otherwise 0.
const RENEW: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local token = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return token
end
return 0
"#;

/// KEYS: lease. ARGV: holder, release channel, SKU. Deletes the lease only if this holder
/// still has it, and then tells the replicas waiting for it. The message is best effort
/// (`pcall`): a user not allowed on the channel still releases.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.pcall('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
"#;

/// KEYS: fence. ARGV: token. Deletes the counter only if no token was handed out since.
const FORGET_FENCE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// KEYS: fence. ARGV: floor, fence ttl in ms. Raises the counter to the floor, never lowers it.
const RAISE_FENCE: &str = r#"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local floor = tonumber(ARGV[1])
if current < floor then
  redis.call('SET', KEYS[1], floor, 'PX', ARGV[2])
  return floor
end
return current
"#;

/// How leases behave.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// How long a lease lasts if its holder never releases it (crash, cancelled call).
    pub ttl: Duration,
    /// First backoff step while a lease is busy; doubles up to `max_backoff`, with full jitter.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// How long an unused SKU's fence counter stays in Redis.
    pub fence_ttl: Duration,
    /// Most requests of this replica waiting for one SKU's lease; more are refused at once
    /// (`RESOURCE_EXHAUSTED`) instead of piling up.
    pub max_waiters: usize,
    /// The internal address peers forward calls to, written into every lease this replica
    /// holds (`<token>@<address>`), so a replica that finds the lease taken knows where to
    /// send the call. `None`: leases name no address, and this replica forwards nothing.
    pub advertise: Option<String>,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(2),
            min_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(25),
            fence_ttl: Duration::from_secs(30 * 24 * 60 * 60),
            max_waiters: 256,
            advertise: None,
        }
    }
}

#[derive(Debug)]
pub struct RedisLeases {
    redis: Redis,
    settings: LeaseSettings,
    /// Requests per SKU inside `acquire` right now.
    waiters: Arc<Mutex<HashMap<Sku, Waiting>>>,
    /// Grant attempts refused because another holder had the lease.
    refused: AtomicU64,
    /// Set once the subscription to lease releases is in place.
    subscribed: Arc<AtomicBool>,
    /// Where a release is published (`KeyPrefix::released_channel`).
    released_channel: String,
    acquire: Script,
    acquire_or_holder: Script,
    release: Script,
    renew: Script,
    raise_fence: Script,
    forget_fence: Script,
}

impl RedisLeases {
    /// Must be called within a Tokio runtime: it starts listening for released leases.
    pub fn new(redis: Redis, settings: LeaseSettings) -> Self {
        let waiters = Arc::default();
        let subscribed = Arc::default();
        let released_channel = redis.prefix().released_channel();
        listen_for_releases(
            &redis,
            &released_channel,
            Arc::clone(&waiters),
            Arc::clone(&subscribed),
        );
        Self {
            redis,
            settings,
            waiters,
            refused: AtomicU64::new(0),
            subscribed,
            released_channel,
            acquire: Script::from_lua(ACQUIRE),
            acquire_or_holder: Script::from_lua(ACQUIRE_OR_HOLDER),
            release: Script::from_lua(RELEASE),
            renew: Script::from_lua(RENEW),
            raise_fence: Script::from_lua(RAISE_FENCE),
            forget_fence: Script::from_lua(FORGET_FENCE),
        }
    }

    pub fn redis(&self) -> &Redis {
        &self.redis
    }

    /// Whether this replica has subscribed to lease releases (once; the client resubscribes
    /// after a reconnect on its own). Until then its waiters only poll.
    pub fn hears_releases(&self) -> bool {
        self.subscribed.load(Ordering::Relaxed)
    }

    /// How many grant attempts of this replica found the lease held by someone else.
    pub fn refused_attempts(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The release script for `holder`'s lease of `sku`, as a future that owns what it needs
    /// (so it can be spawned): 1 if it deleted the lease.
    fn release_script(
        &self,
        sku: &Sku,
        holder: &str,
    ) -> impl Future<Output = Result<i64, RedisError>> + use<> {
        let keys = vec![self.redis.prefix().lease(sku)];
        let args = vec![
            holder.to_owned(),
            self.released_channel.clone(),
            sku.to_string(),
        ];
        let (redis, script) = (self.redis.clone(), self.release.clone());
        async move { script.evalsha_with_reload(redis.client(), keys, args).await }
    }

    /// A new holder value: a random token, and this replica's peer address when it has one.
    fn new_holder(&self) -> Result<String, Error> {
        let token = new_holder_token()?;
        Ok(match &self.settings.advertise {
            Some(address) => format!("{token}@{address}"),
            None => token,
        })
    }

    /// Who holds a lease whose value is `holder`: this replica, the peer it names, or a holder
    /// that names none (an older release's token).
    fn held_by(&self, holder: &str) -> Attempt {
        match holder.split_once('@') {
            Some((_, address)) if self.settings.advertise.as_deref() == Some(address) => {
                Attempt::HeldHere
            }
            Some((_, address)) if !address.is_empty() => Attempt::Held {
                peer: Some(Peer(address.to_owned())),
            },
            _ => Attempt::Held { peer: None },
        }
    }

    /// One grant attempt: `Some(token)` if granted, `None` if busy.
    pub async fn attempt(&self, sku: &Sku, holder: &str) -> Result<Option<FenceToken>, Error> {
        let token = self
            .lease_script("acquire", &self.acquire, sku, holder)
            .await?;
        Ok((token > 0).then(|| FenceToken::new(token)))
    }

    /// Runs a script that takes the next fencing token for `holder` (grant or renew): KEYS
    /// lease and fence, ARGV holder and the two TTLs. Returns the token, or 0 if refused.
    async fn lease_script<T: fred::types::FromValue>(
        &self,
        command: &'static str,
        script: &Script,
        sku: &Sku,
        holder: &str,
    ) -> Result<T, Error> {
        let prefix = self.redis.prefix();
        let ttl_ms = self.settings.ttl.as_millis().max(1) as i64;
        self.bounded(
            command,
            script.evalsha_with_reload(
                self.redis.client(),
                vec![prefix.lease(sku), prefix.fence(sku)],
                vec![
                    holder.to_owned(),
                    ttl_ms.to_string(),
                    self.fence_ttl_ms().to_string(),
                ],
            ),
        )
        .await
    }

    /// Best effort, off the caller's path: deletes the SKU's lease if `holder` has it.
    fn release_in_background(&self, sku: &Sku, holder: &str) {
        if !self.redis.is_connected() {
            // Nothing was sent; a reconnecting client would only queue the release.
            return;
        }
        let lease = Lease {
            sku: sku.clone(),
            holder: holder.to_owned(),
            fence: FenceToken::new(0),
        };
        let call = self.release_script(&lease.sku, &lease.holder);
        let timeout = self.redis.command_timeout() * 4;
        tokio::spawn(async move {
            match tokio::time::timeout(timeout, call).await {
                Ok(Ok(1)) => {
                    tracing::info!(sku = %lease.sku, "released a lease granted after its grant timed out")
                }
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    tracing::debug!(sku = %lease.sku, %error, "late grant not released")
                }
                Err(_) => tracing::debug!(sku = %lease.sku, "late grant not released: timed out"),
            }
        });
    }

    fn fence_ttl_ms(&self) -> i64 {
        i64::try_from(self.settings.fence_ttl.as_millis().max(1)).unwrap_or(i64::MAX)
    }

    /// Refuses at once while disconnected, and bounds the call by the command timeout. Each
    /// call sent is timed as `command` (`inventory_redis_command_duration_seconds`).
    async fn bounded<T>(
        &self,
        command: &'static str,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, Error> {
        if !self.redis.is_connected() {
            return Err(Error::unavailable(Dependency::Redis, "not connected"));
        }
        let started = Instant::now();
        let (result, outcome) =
            match tokio::time::timeout(self.redis.command_timeout() * 2, call).await {
                Ok(Ok(value)) => (Ok(value), "ok"),
                Ok(Err(error)) => (Err(classify(error)), "error"),
                Err(_) => (
                    Err(Error::unavailable(Dependency::Redis, "command timed out")),
                    "timeout",
                ),
            };
        crate::metrics::leases().command_duration.record(
            started.elapsed().as_secs_f64(),
            &[
                KeyValue::new("command", command),
                KeyValue::new("outcome", outcome),
            ],
        );
        result
    }
}

impl LeaseService for RedisLeases {
    #[tracing::instrument(name = "lease.acquire", skip_all, fields(sku = %sku, attempts, wait_ms))]
    async fn acquire(&self, sku: &Sku, deadline: Instant) -> Result<Lease, Error> {
        let waiting = WaiterGuard::enter(&self.waiters, sku, self.settings.max_waiters)?;
        let holder = self.new_holder()?;
        let metrics = crate::metrics::leases();
        let started = Instant::now();
        let outcome = |name: &'static str| {
            metrics.acquire_duration.record(
                started.elapsed().as_secs_f64(),
                &[KeyValue::new("outcome", name)],
            );
            tracing::Span::current().record("wait_ms", started.elapsed().as_millis() as u64);
        };
        let mut step = self.settings.min_backoff;
        let mut attempts = 0u64;
        loop {
            // Listening before the attempt, so a release between the refusal and the sleep
            // still wakes this waiter.
            let released = waiting.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let granted = match self.attempt(sku, &holder).await {
                Ok(granted) => granted,
                Err(error) => {
                    outcome("unavailable");
                    // The grant may still run on Redis after we stopped waiting for it. Its
                    // holder token is ours alone, so give it back if it did: otherwise the SKU
                    // would be blocked on every replica for a whole lease TTL.
                    self.release_in_background(sku, &holder);
                    return Err(error);
                }
            };
            tracing::Span::current().record("attempts", attempts + 1);
            if let Some(fence) = granted {
                outcome("granted");
                tracing::debug!(%sku, attempts = attempts + 1, waited = ?started.elapsed(), "lease granted");
                return Ok(Lease {
                    sku: sku.clone(),
                    holder,
                    fence,
                });
            }
            self.refused.fetch_add(1, Ordering::Relaxed);
            if attempts == 0 {
                metrics.contended.add(1, &[]);
            }
            attempts += 1;
            let now = Instant::now();
            if now >= deadline {
                outcome("busy");
                return Err(Error::LeaseBusy {
                    sku: sku.clone(),
                    waited: now - started,
                });
            }
            tokio::select! {
                () = tokio::time::sleep(jitter(step).min(deadline - now)) => {}
                () = released => {}
            }
            step = (step * 2).min(self.settings.max_backoff);
            metrics.retries.add(1, &[]);
        }
    }

    async fn try_acquire(&self, sku: &Sku) -> Result<Attempt, Error> {
        let holder = self.new_holder()?;
        let answer: Result<(i64, String), Error> = self
            .lease_script("acquire", &self.acquire_or_holder, sku, &holder)
            .await;
        let (token, current) = match answer {
            Ok(answer) => answer,
            Err(error) => {
                // As in `acquire`: a grant that still runs after the timeout is given back.
                self.release_in_background(sku, &holder);
                return Err(error);
            }
        };
        if token > 0 {
            return Ok(Attempt::Granted(Lease {
                sku: sku.clone(),
                holder,
                fence: FenceToken::new(token),
            }));
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        crate::metrics::leases().contended.add(1, &[]);
        Ok(self.held_by(&current))
    }

    async fn release(&self, lease: &Lease) -> Result<bool, Error> {
        let deleted: i64 = self
            .bounded("release", self.release_script(&lease.sku, &lease.holder))
            .await?;
        Ok(deleted == 1)
    }

    async fn renew(&self, lease: &Lease) -> Result<Option<Lease>, Error> {
        let token = self
            .lease_script("renew", &self.renew, &lease.sku, &lease.holder)
            .await?;
        Ok((token > 0).then(|| Lease {
            sku: lease.sku.clone(),
            holder: lease.holder.clone(),
            fence: FenceToken::new(token),
        }))
    }

    async fn is_held(&self, lease: &Lease) -> Result<bool, Error> {
        let holder: Option<String> = self
            .bounded(
                "read_lease",
                self.redis
                    .client()
                    .get(self.redis.prefix().lease(&lease.sku)),
            )
            .await?;
        let held = holder.as_deref() == Some(lease.holder.as_str());
        if !held {
            crate::metrics::leases().lost.add(1, &[]);
        }
        Ok(held)
    }

    async fn forget_fence(&self, lease: &Lease) -> Result<(), Error> {
        let _: i64 = self
            .bounded(
                "forget_fence",
                self.forget_fence.evalsha_with_reload(
                    self.redis.client(),
                    vec![self.redis.prefix().fence(&lease.sku)],
                    vec![lease.fence.get().to_string()],
                ),
            )
            .await?;
        Ok(())
    }

    async fn raise_fence(&self, sku: &Sku, floor: FenceToken) -> Result<(), Error> {
        crate::metrics::leases().fence_raised.add(1, &[]);
        let _: i64 = self
            .bounded(
                "raise_fence",
                self.raise_fence.evalsha_with_reload(
                    self.redis.client(),
                    vec![self.redis.prefix().fence(sku)],
                    vec![floor.get().to_string(), self.fence_ttl_ms().to_string()],
                ),
            )
            .await?;
        Ok(())
    }
}

/// Subscribes to the release channel (again until it works; the client resubscribes after a
/// reconnect) and wakes one waiter of the released SKU per message: it tries the grant, and
/// if another replica was faster, waits for the next release.
fn listen_for_releases(
    redis: &Redis,
    channel: &str,
    waiters: Arc<Mutex<HashMap<Sku, Waiting>>>,
    subscribed: Arc<AtomicBool>,
) {
    let subscriber = redis.subscriber().clone();
    let channel = channel.to_owned();
    let mine = channel.clone();
    // One subscriber connection serves every tenant's leases: only this one's channel counts.
    subscriber.on_message(move |message| {
        let sku = (&*message.channel == mine.as_str())
            .then(|| message.value.as_str().and_then(|sku| Sku::parse(&sku).ok()))
            .flatten();
        if let Some(sku) = sku
            && let Some(waiting) = waiters.lock().expect("waiters lock").get(&sku)
        {
            waiting.released.notify_one();
        }
        async { Ok(()) }
    });
    tokio::spawn(async move {
        let mut pause = Duration::from_millis(100);
        loop {
            match subscriber.subscribe(channel.as_str()).await {
                Ok(()) => {
                    subscribed.store(true, Ordering::Relaxed);
                    return;
                }
                Err(error) => {
                    tracing::debug!(%error, %channel, "not subscribed to lease releases yet; waiters poll meanwhile");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(30));
                }
            }
        }
    });
}

/// This replica's requests waiting for one SKU's lease.
#[derive(Debug, Default)]
struct Waiting {
    count: usize,
    /// Woken when the SKU's lease is released anywhere.
    released: Arc<Notify>,
}

/// Counts one request waiting for a SKU's lease, for as long as it lives.
struct WaiterGuard<'a> {
    waiters: &'a Mutex<HashMap<Sku, Waiting>>,
    sku: Sku,
    released: Arc<Notify>,
}

impl<'a> WaiterGuard<'a> {
    fn enter(
        waiters: &'a Mutex<HashMap<Sku, Waiting>>,
        sku: &Sku,
        max: usize,
    ) -> Result<Self, Error> {
        let mut all = waiters.lock().expect("waiters lock");
        let waiting = all.entry(sku.clone()).or_default();
        if waiting.count >= max {
            return Err(Error::TooManyWaiters { sku: sku.clone() });
        }
        waiting.count += 1;
        Ok(Self {
            waiters,
            sku: sku.clone(),
            released: Arc::clone(&waiting.released),
        })
    }
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        let mut all = self.waiters.lock().expect("waiters lock");
        if let Some(waiting) = all.get_mut(&self.sku) {
            waiting.count -= 1;
            if waiting.count == 0 {
                all.remove(&self.sku);
            }
        }
    }
}

/// 128 bits from the operating system's CSPRNG, hex-encoded: unguessable, so no other
/// process can release or impersonate this holder's lease.
fn new_holder_token() -> Result<String, Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| Error::internal(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Full jitter: uniform in `[0, step]`, so waiters on one SKU spread out instead of retrying
/// in lockstep.
fn jitter(step: Duration) -> Duration {
    let fraction = f64::from(getrandom::u32().unwrap_or(u32::MAX / 2)) / f64::from(u32::MAX);
    step.mul_f64(fraction)
}

/// Fail closed: anything that is not plainly a bug counts as Redis being unavailable.
fn classify(error: RedisError) -> Error {
    match error.kind() {
        ErrorKind::InvalidCommand
        | ErrorKind::InvalidArgument
        | ErrorKind::Parse
        | ErrorKind::Protocol
        | ErrorKind::Config
        | ErrorKind::Url
        | ErrorKind::NotFound => Error::internal(error),
        _ => Error::unavailable(Dependency::Redis, error),
    }
}
