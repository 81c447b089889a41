//! The seeded fault schedule: which fault, when, and for how long. The same seed, topology and
//! duration always give the same schedule; [`plan`] is a pure function.
//!
//! Faults come one at a time. Every fault kind the topology supports comes once per round, in
//! an order shuffled by the seed, so even a short run covers each kind it has time for.

use std::time::Duration;

use rand::{Rng as _, SeedableRng as _, rngs::StdRng, seq::SliceRandom as _};
use serde::{Deserialize, Serialize};

use crate::topology::Topology;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// SIGSTOP a server replica for longer than the lease TTL, then SIGCONT: the stale holder.
    PauseReplica { replica: usize, for_ms: u64 },
    /// SIGKILL a server replica; start it again after `down_ms`.
    KillReplica { replica: usize, down_ms: u64 },
    /// SIGSTOP the replica holding a SKU's lease (found in Redis at that moment) while the
    /// others forward that SKU's calls to it, past the lease TTL; then SIGCONT.
    PauseHolder { for_ms: u64 },
    /// SIGKILL the replica holding a SKU's lease while the others forward to it; start it
    /// again after `down_ms`.
    KillHolder { down_ms: u64 },
    /// SIGSTOP a Redis data node (the single one, Sentinel's primary, or cluster node `node`),
    /// then SIGCONT: commands time out, then run late. Long enough, it sets off a failover.
    RedisPause { node: usize, for_ms: u64 },
    /// SIGKILL Redis and start it again, empty: every lease and fence counter is gone.
    RedisRestartEmpty { down_ms: u64 },
    /// Sever every connection to Redis and refuse new ones.
    RedisCut { for_ms: u64 },
    /// Delay every packet to and from Redis.
    RedisSlow { latency_ms: u64, for_ms: u64 },
    /// SIGKILL the Redis primary; Sentinel promotes the replica (which may lack the last
    /// counter increments). The old primary comes back empty after `down_ms`.
    SentinelFailover { down_ms: u64 },
    /// SIGKILL one Redis Cluster primary and start it again, empty, after `down_ms`.
    ClusterNodeKill { node: usize, down_ms: u64 },
    /// `pg_ctl restart -m fast`: connections cut, open transactions rolled back.
    PostgresRestart,
    /// Sever every connection to PostgreSQL and refuse new ones.
    PostgresCut { for_ms: u64 },
    /// Delay every packet to and from PostgreSQL.
    PostgresSlow { latency_ms: u64, for_ms: u64 },
    /// SIGKILL the PostgreSQL primary's whole node (keeper, server, backends): the standby is
    /// promoted. The old primary starts again after `down_ms` and rejoins as the standby.
    PgPrimaryKill { down_ms: u64 },
    /// SIGSTOP the PostgreSQL primary's whole node until the standby has been promoted, and
    /// `after_ms` more; then SIGCONT: the old primary must not take a write the service acts
    /// on (it finds itself demoted and rejoins as the standby).
    PgPrimaryPause { after_ms: u64 },
    /// Cut the PostgreSQL primary off from everyone (clients, standby, monitor) until the
    /// standby has been promoted, and `after_ms` more; then join it again.
    PgPrimaryCut { after_ms: u64 },
    /// A planned switchover: the standby becomes the primary, the primary its standby.
    PgSwitchover,
    /// A rollout's first step: the current release's `migrate` while the previous release
    /// serves.
    MigrateSchema,
    /// A rollout's step: the replica stopped as a pod is (SIGTERM, the drain) and started
    /// again as `release`.
    ReplaceReplica { replica: usize, release: Release },
}

/// Which build a replica runs in a rolling upgrade.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Release {
    /// The build under test.
    Current,
    /// The release before it.
    Previous,
}

/// The steps of a rolling upgrade, in order: migrate, replace every replica, roll one back,
/// and forward again.
pub const ROLLOUT: [Fault; 6] = [
    Fault::MigrateSchema,
    Fault::ReplaceReplica {
        replica: 0,
        release: Release::Current,
    },
    Fault::ReplaceReplica {
        replica: 1,
        release: Release::Current,
    },
    Fault::ReplaceReplica {
        replica: 2,
        release: Release::Current,
    },
    Fault::ReplaceReplica {
        replica: 1,
        release: Release::Previous,
    },
    Fault::ReplaceReplica {
        replica: 1,
        release: Release::Current,
    },
];

impl Fault {
    pub fn name(&self) -> &'static str {
        match self {
            Fault::PauseReplica { .. } => "pause_replica",
            Fault::KillReplica { .. } => "kill_replica",
            Fault::PauseHolder { .. } => "pause_holder",
            Fault::KillHolder { .. } => "kill_holder",
            Fault::RedisPause { .. } => "redis_pause",
            Fault::RedisRestartEmpty { .. } => "redis_restart_empty",
            Fault::RedisCut { .. } => "redis_cut",
            Fault::RedisSlow { .. } => "redis_slow",
            Fault::SentinelFailover { .. } => "sentinel_failover",
            Fault::ClusterNodeKill { .. } => "cluster_node_kill",
            Fault::PostgresRestart => "postgres_restart",
            Fault::PostgresCut { .. } => "postgres_cut",
            Fault::PostgresSlow { .. } => "postgres_slow",
            Fault::PgPrimaryKill { .. } => "pg_primary_kill",
            Fault::PgPrimaryPause { .. } => "pg_primary_pause",
            Fault::PgPrimaryCut { .. } => "pg_primary_cut",
            Fault::PgSwitchover => "pg_switchover",
            Fault::MigrateSchema => "migrate_schema",
            Fault::ReplaceReplica {
                release: Release::Current,
                ..
            } => "upgrade_replica",
            Fault::ReplaceReplica {
                release: Release::Previous,
                ..
            } => "rollback_replica",
        }
    }

    /// Whether it moves the PostgreSQL primary to another node.
    pub fn fails_over(&self) -> bool {
        matches!(
            self,
            Fault::PgPrimaryKill { .. }
                | Fault::PgPrimaryPause { .. }
                | Fault::PgPrimaryCut { .. }
                | Fault::PgSwitchover
        )
    }
}

/// A fault and when it is due, from the start of the load.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Planned {
    pub at_ms: u64,
    pub fault: Fault,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Pause,
    Kill,
    PauseHolder,
    KillHolder,
    RedisPause,
    RedisRestart,
    RedisCut,
    RedisSlow,
    Failover,
    NodeKill,
    PgRestart,
    PgCut,
    PgSlow,
    PgKill,
    PgPause,
    PgPartition,
    PgSwitchover,
}

impl Kind {
    fn fails_over(self) -> bool {
        matches!(
            self,
            Kind::PgKill | Kind::PgPause | Kind::PgPartition | Kind::PgSwitchover
        )
    }
}

fn kinds(topology: Topology) -> Vec<Kind> {
    let mut kinds = vec![
        Kind::Pause,
        Kind::Kill,
        Kind::PauseHolder,
        Kind::KillHolder,
        Kind::RedisPause,
    ];
    if topology.fails_over() {
        kinds.extend([
            Kind::PgKill,
            Kind::PgPause,
            Kind::PgPartition,
            Kind::PgSwitchover,
        ]);
    } else {
        kinds.extend([Kind::PgRestart, Kind::PgCut, Kind::PgSlow]);
    }
    match topology {
        // Only a single instance sits behind the proxy: Sentinel and Cluster hand out the
        // nodes' own addresses.
        Topology::Single | Topology::PgFailover | Topology::RollingUpgrade => {
            kinds.extend([Kind::RedisRestart, Kind::RedisCut, Kind::RedisSlow])
        }
        Topology::Sentinel => kinds.push(Kind::Failover),
        Topology::Cluster => kinds.push(Kind::NodeKill),
    }
    kinds
}

/// One round of `kinds` in the seed's order. Where PostgreSQL fails over, failovers and the
/// other faults take turns, a failover first: even a short run has one.
fn shuffled_round(topology: Topology, rng: &mut StdRng) -> Vec<Kind> {
    let (mut failovers, mut others): (Vec<Kind>, Vec<Kind>) =
        kinds(topology).into_iter().partition(|k| k.fails_over());
    failovers.shuffle(rng);
    others.shuffle(rng);
    let mut round = Vec::new();
    while !failovers.is_empty() || !others.is_empty() {
        round.extend(failovers.pop());
        round.extend(others.pop());
    }
    // Taken from the back.
    round.reverse();
    round
}

/// The schedule for a run of `duration`: faults start after a short warm-up and stop early
/// enough that the last one heals while load still runs.
pub fn plan(
    seed: u64,
    topology: Topology,
    duration: Duration,
    lease_ttl: Duration,
) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let ttl = lease_ttl.as_millis() as u64;
    let end = (duration.as_millis() as u64).saturating_sub(4_000);
    let mut at = 2_000;
    let mut round = Vec::new();
    let mut planned = Vec::new();
    // A rolling upgrade's steps take turns with the faults, a step first.
    let mut rollout: Vec<Fault> = if topology.rolls() {
        ROLLOUT.iter().rev().cloned().collect()
    } else {
        Vec::new()
    };
    let mut step_next = true;
    loop {
        if round.is_empty() {
            round = shuffled_round(topology, &mut rng);
        }
        let step = if step_next { rollout.pop() } else { None };
        step_next = !step_next;
        let fault = match step {
            Some(step) => step,
            None => random_fault(round.pop().expect("a round is never empty"), ttl, &mut rng),
        };
        let length = nominal_length(&fault);
        if at + length > end {
            break;
        }
        planned.push(Planned { at_ms: at, fault });
        at += length + rng.random_range(1_000..=2_500);
    }
    planned
}

/// A fault of `kind`, its parameters drawn from `rng`.
fn random_fault(kind: Kind, ttl: u64, rng: &mut StdRng) -> Fault {
    match kind {
        // Past the lease TTL, so another replica's holder takes over meanwhile.
        Kind::Pause => Fault::PauseReplica {
            replica: rng.random_range(0..3),
            for_ms: rng.random_range(ttl + ttl / 2..=ttl * 3),
        },
        Kind::Kill => Fault::KillReplica {
            replica: rng.random_range(0..3),
            down_ms: rng.random_range(200..=1_500),
        },
        Kind::PauseHolder => Fault::PauseHolder {
            for_ms: rng.random_range(ttl + ttl / 2..=ttl * 3),
        },
        Kind::KillHolder => Fault::KillHolder {
            down_ms: rng.random_range(200..=1_500),
        },
        Kind::RedisPause => Fault::RedisPause {
            node: rng.random_range(0..3),
            for_ms: rng.random_range(500..=2_500),
        },
        Kind::RedisRestart => Fault::RedisRestartEmpty {
            down_ms: rng.random_range(500..=2_000),
        },
        Kind::RedisCut => Fault::RedisCut {
            for_ms: rng.random_range(500..=2_000),
        },
        Kind::RedisSlow => Fault::RedisSlow {
            latency_ms: rng.random_range(20..=200),
            for_ms: rng.random_range(1_000..=2_500),
        },
        Kind::Failover => Fault::SentinelFailover {
            down_ms: rng.random_range(1_000..=3_000),
        },
        Kind::NodeKill => Fault::ClusterNodeKill {
            node: rng.random_range(0..3),
            down_ms: rng.random_range(500..=2_000),
        },
        Kind::PgRestart => Fault::PostgresRestart,
        Kind::PgSlow => Fault::PostgresSlow {
            latency_ms: rng.random_range(20..=200),
            for_ms: rng.random_range(1_000..=2_500),
        },
        Kind::PgKill => Fault::PgPrimaryKill {
            down_ms: rng.random_range(500..=3_000),
        },
        // Long enough past the promotion that the service must not wait for the old
        // primary to come back.
        Kind::PgPause => Fault::PgPrimaryPause {
            after_ms: rng.random_range(1_000..=6_000),
        },
        Kind::PgPartition => Fault::PgPrimaryCut {
            after_ms: rng.random_range(0..=2_000),
        },
        Kind::PgSwitchover => Fault::PgSwitchover,
        Kind::PgCut => Fault::PostgresCut {
            for_ms: rng.random_range(500..=2_000),
        },
    }
}

/// How long a PostgreSQL failover takes, from the fault to a formation with its standby back.
const FAILOVER_MS: u64 = 15_000;

/// How long a fault lasts by its own parameters, before recovery time.
fn nominal_length(fault: &Fault) -> u64 {
    match *fault {
        Fault::PauseReplica { for_ms, .. }
        | Fault::PauseHolder { for_ms }
        | Fault::RedisPause { for_ms, .. }
        | Fault::RedisCut { for_ms }
        | Fault::RedisSlow { for_ms, .. }
        | Fault::PostgresCut { for_ms }
        | Fault::PostgresSlow { for_ms, .. } => for_ms,
        Fault::KillReplica { down_ms, .. }
        | Fault::KillHolder { down_ms }
        | Fault::RedisRestartEmpty { down_ms }
        | Fault::ClusterNodeKill { down_ms, .. } => down_ms,
        // Promotion takes about a second after down-after-milliseconds (1 s).
        Fault::SentinelFailover { down_ms } => down_ms + 3_000,
        Fault::PostgresRestart => 1_000,
        // Detection and promotion take about 8 s, the old primary rejoining and the formation
        // settling 5-10 s more under load.
        Fault::PgPrimaryKill { down_ms } => down_ms + FAILOVER_MS,
        Fault::PgPrimaryPause { after_ms } | Fault::PgPrimaryCut { after_ms } => {
            after_ms + FAILOVER_MS
        }
        Fault::PgSwitchover => 4_000,
        // A drain of up to SHUTDOWN_GRACE and a start.
        Fault::MigrateSchema | Fault::ReplaceReplica { .. } => 3_000,
    }
}

#[cfg(test)]
mod tests;
