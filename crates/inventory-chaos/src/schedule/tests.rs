use super::*;

const TTL: Duration = Duration::from_secs(1);

#[test]
fn a_seed_always_gives_the_same_schedule() {
    let a = plan(7, Topology::Single, Duration::from_secs(120), TTL);
    let b = plan(7, Topology::Single, Duration::from_secs(120), TTL);
    let c = plan(8, Topology::Single, Duration::from_secs(120), TTL);
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn faults_fit_the_run_and_never_overlap() {
    let duration = Duration::from_secs(90);
    for topology in Topology::ALL {
        let planned = plan(3, topology, duration, TTL);
        assert!(!planned.is_empty());
        for pair in planned.windows(2) {
            assert!(pair[0].at_ms + nominal_length(&pair[0].fault) < pair[1].at_ms);
        }
        let last = planned.last().unwrap();
        assert!(last.at_ms + nominal_length(&last.fault) <= 86_000);
    }
}

#[test]
fn a_round_covers_every_kind_the_topology_has() {
    for topology in Topology::ALL {
        let planned = plan(11, topology, Duration::from_secs(600), TTL);
        let round = kinds(topology).len();
        let mut names: Vec<_> = planned[..round].iter().map(|p| p.fault.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), round, "{topology:?}: {names:?}");
        assert!(
            planned
                .iter()
                .all(|p| !matches!(p.fault, Fault::RedisCut { .. })
                    || topology.redis() == inventory_testkit::redis::Topology::Single)
        );
        // Failovers only where PostgreSQL can fail over; one-instance faults only where not.
        for p in &planned {
            let one_instance = matches!(
                p.fault,
                Fault::PostgresRestart | Fault::PostgresCut { .. } | Fault::PostgresSlow { .. }
            );
            assert!(!p.fault.fails_over() || topology.fails_over(), "{p:?}");
            assert!(!one_instance || !topology.fails_over(), "{p:?}");
        }
    }
}

#[test]
fn a_pause_outlasts_the_lease() {
    let planned = plan(5, Topology::Cluster, Duration::from_secs(600), TTL);
    let pauses: Vec<u64> = planned
        .iter()
        .filter_map(|p| match p.fault {
            Fault::PauseReplica { for_ms, .. } | Fault::PauseHolder { for_ms } => Some(for_ms),
            _ => None,
        })
        .collect();
    assert!(!pauses.is_empty());
    assert!(
        planned
            .iter()
            .any(|p| matches!(p.fault, Fault::PauseHolder { .. }))
    );
    assert!(pauses.iter().all(|&ms| ms > 1_000));
}

#[test]
fn where_postgres_fails_over_a_failover_comes_first_and_every_other() {
    for seed in 0..20 {
        let planned = plan(seed, Topology::PgFailover, Duration::from_secs(600), TTL);
        let kinds = kinds(Topology::PgFailover).len();
        assert!(planned[0].fault.fails_over(), "{:?}", planned[0]);
        // Within a round (4 failovers, 8 others), the two take turns while both last.
        for pair in planned[..8].windows(2) {
            assert_ne!(pair[0].fault.fails_over(), pair[1].fault.fails_over());
        }
        assert_eq!(kinds, 12);
    }
}

#[test]
fn a_rolling_upgrade_takes_every_step_in_order_between_faults() {
    let planned = plan(9, Topology::RollingUpgrade, Duration::from_secs(90), TTL);
    let steps: Vec<&Fault> = planned
        .iter()
        .map(|p| &p.fault)
        .filter(|f| matches!(f, Fault::MigrateSchema | Fault::ReplaceReplica { .. }))
        .collect();
    assert_eq!(steps, ROLLOUT.iter().collect::<Vec<_>>());
    assert!(matches!(planned[0].fault, Fault::MigrateSchema));
    // A fault between two steps, each one of `single`'s.
    for pair in planned.windows(2) {
        let step = |f: &Fault| matches!(f, Fault::MigrateSchema | Fault::ReplaceReplica { .. });
        assert!(!(step(&pair[0].fault) && step(&pair[1].fault)), "{pair:?}");
    }
    assert!(planned.iter().all(|p| !p.fault.fails_over()));
    // Only a rolling upgrade rolls.
    assert!(
        plan(9, Topology::Single, Duration::from_secs(90), TTL)
            .iter()
            .all(|p| !ROLLOUT.contains(&p.fault))
    );
}
