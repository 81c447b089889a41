//! What a run is made of: how Redis is laid out, and whether PostgreSQL is one instance or a
//! formation that fails over.

use serde::{Deserialize, Serialize};

use inventory_testkit::redis;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    /// One Redis instance and one PostgreSQL instance, each behind a fault proxy.
    Single,
    /// Redis under Sentinel; one PostgreSQL instance.
    Sentinel,
    /// Redis Cluster; one PostgreSQL instance.
    Cluster,
    /// PostgreSQL as a pg_auto_failover formation (a monitor, a primary, a synchronous
    /// standby), its primary killed, frozen, cut off and switched over; one Redis instance.
    PgFailover,
    /// A rolling upgrade under the faults of `single`: three replicas of the previous release,
    /// the current release's `migrate` while they serve, each replaced by the current build
    /// in turn, one rolled back to the previous release and forward again.
    RollingUpgrade,
}

impl Topology {
    /// What `make chaos` runs by default: every topology that needs no second release.
    pub const ALL: [Topology; 4] = [
        Topology::Single,
        Topology::Sentinel,
        Topology::Cluster,
        Topology::PgFailover,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Topology::Single => "single",
            Topology::Sentinel => "sentinel",
            Topology::Cluster => "cluster",
            Topology::PgFailover => "pg-failover",
            Topology::RollingUpgrade => "rolling-upgrade",
        }
    }

    /// Whether the run rolls replicas from the previous release to this one.
    pub fn rolls(self) -> bool {
        self == Topology::RollingUpgrade
    }

    pub fn redis(self) -> redis::Topology {
        match self {
            Topology::Single | Topology::PgFailover | Topology::RollingUpgrade => {
                redis::Topology::Single
            }
            Topology::Sentinel => redis::Topology::Sentinel,
            Topology::Cluster => redis::Topology::Cluster,
        }
    }

    /// Whether PostgreSQL fails over (a formation) rather than being one instance.
    pub fn fails_over(self) -> bool {
        self == Topology::PgFailover
    }
}
