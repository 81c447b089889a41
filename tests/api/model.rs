//! The reference model (`crates/inventory-model`) against the real server: seeded sequences of
//! calls, each answer and then the levels of every SKU at every location compared with what
//! the model says; a divergence is shrunk to the fewest calls that still diverge and printed
//! as `grpcurl` commands with the seed.
//!
//! In `make test`: a fixed set of seeds (`MODEL_SEEDS` of them from 1, `MODEL_CALLS` calls
//! each). `make model`: `MODEL_SEED` (a random one unless given, printed first) and as many
//! runs as `MODEL_RUNS`; `MODEL_STRICT=1` (or a list of their names) checks the stricter rules of `Rules`.
//!
//! Time: every hold lasts an hour unless a `Lapse` call ends it: `ExtendReservation` to one
//! second, a wait until PostgreSQL's clock (the machine's) is past the new expiry, and a sweep
//! by hand. So expiry is a transition the sequence takes at a point it chooses, and the
//! answer of every other call is decided before any hold could run out by itself.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use inventory_model::{
    Answer, Call, Code, Model, Namespace, Request, Rules,
    generate::{Generator, Profile},
    grpcurl,
    shrink::Shrinker,
    view,
};
use inventory_server::proto::{self, inventory_service_client::InventoryServiceClient};
use tonic::transport::Channel;

use crate::helpers::{TestApp, spawn_app_without_sweeper};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// A divergence: the call (by index in the sequence) and what differed.
#[derive(Debug)]
struct Divergence {
    index: usize,
    what: String,
}

/// What the server answered, as the model compares it, and the reservation id and expiry
/// it named (if any).
struct Observed {
    answer: Answer,
    reservation_id: Option<String>,
    expires_at: Option<prost_types::Timestamp>,
}

fn refused(status: &tonic::Status) -> Answer {
    use tonic_types::StatusExt as _;
    Answer::Refused {
        code: Code::from_i32(status.code() as i32),
        reason: status
            .get_details_error_info()
            .map(|info| info.reason)
            .unwrap_or_default(),
    }
}

async fn send(
    client: &mut InventoryServiceClient<Channel>,
    ns: &Namespace,
    request: Request,
) -> Observed {
    let reservation = |ns: &Namespace, r: &proto::Reservation| Observed {
        answer: Answer::Reservation(view::from_reservation(ns, r)),
        reservation_id: Some(r.reservation_id.clone()),
        expires_at: r.expires_at,
    };
    let plain = |answer: Answer| Observed {
        answer,
        reservation_id: None,
        expires_at: None,
    };
    let level = |ns: &Namespace, l: &proto::StockLevel| {
        Answer::Level(view::without_promise(view::from_level(ns, l)))
    };
    let result = match request {
        Request::UpsertLocation(r) => client
            .upsert_location(r)
            .await
            .map(|a| plain(Answer::Location(view::from_location(ns, a.get_ref())))),
        Request::AdjustStock(r) => client
            .adjust_stock(r)
            .await
            .map(|a| plain(level(ns, a.get_ref()))),
        Request::SetStock(r) => client
            .set_stock(r)
            .await
            .map(|a| plain(level(ns, a.get_ref()))),
        Request::SetStockPolicy(r) => client
            .set_stock_policy(r)
            .await
            .map(|a| plain(level(ns, a.get_ref()))),
        Request::MoveStockState(r) => client
            .move_stock_state(r)
            .await
            .map(|a| plain(level(ns, a.get_ref()))),
        Request::Reserve(r) => client
            .reserve(r)
            .await
            .map(|a| reservation(ns, a.get_ref())),
        Request::Confirm(r) => client
            .confirm_reservation(r)
            .await
            .map(|a| reservation(ns, a.get_ref())),
        Request::Release(r) => client
            .release_reservation(r)
            .await
            .map(|a| reservation(ns, a.get_ref())),
        Request::Extend(r) => client
            .extend_reservation(r)
            .await
            .map(|a| reservation(ns, a.get_ref())),
        Request::GetReservation(r) => client
            .get_reservation(r)
            .await
            .map(|a| reservation(ns, a.get_ref())),
        Request::CancelOrder(r) => client.cancel_order(r).await.map(|a| {
            plain(Answer::Reservations(
                a.get_ref()
                    .reservations
                    .iter()
                    .map(|r| view::from_reservation(ns, r))
                    .collect(),
            ))
        }),
        Request::ExpectStock(r) => client
            .expect_stock(r)
            .await
            .map(|a| plain(Answer::Receipt(view::from_receipt(ns, a.get_ref())))),
        Request::ReceiveStock(r) => client
            .receive_stock(r)
            .await
            .map(|a| plain(Answer::Receipt(view::from_receipt(ns, a.get_ref())))),
        Request::CancelReceipt(r) => client
            .cancel_receipt(r)
            .await
            .map(|a| plain(Answer::Receipt(view::from_receipt(ns, a.get_ref())))),
    };
    result.unwrap_or_else(|status| plain(refused(&status)))
}

/// Waits until the machine's clock (PostgreSQL's too: same machine) is past `at`.
async fn wait_past(at: &prost_types::Timestamp) {
    let at = UNIX_EPOCH + Duration::new(at.seconds as u64, at.nanos as u32);
    while SystemTime::now() <= at + Duration::from_millis(20) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Runner {
    app: TestApp,
    rules: Rules,
    /// How often each (method, answer) was seen: what the sequences reached.
    seen: std::sync::Mutex<BTreeMap<String, u64>>,
}

impl Runner {
    async fn new(rules: Rules) -> Runner {
        Runner {
            app: spawn_app_without_sweeper().await,
            rules,
            seen: Default::default(),
        }
    }

    /// Runs `calls` in `ns` and compares: `Err` at the first divergence.
    async fn run(&self, calls: &[Call], ns: &Namespace) -> Result<(), Divergence> {
        let mut client = self.app.client.clone();
        let mut model = Model::new(self.rules);
        let mut ids: BTreeMap<String, String> = BTreeMap::new();
        for (index, call) in calls.iter().enumerate() {
            let Some(outcomes) = model.step(call) else {
                continue;
            };
            let id = call
                .reservation()
                .and_then(|key| ids.get(key))
                .cloned()
                .unwrap_or_default();
            let observed = send(&mut client, ns, call.request(ns, &id)).await;
            if let (Call::Reserve { key, .. }, Some(id)) = (call, &observed.reservation_id) {
                ids.insert(key.clone(), id.clone());
            }
            let Some(chosen) = outcomes.into_iter().find(|o| o.answer == observed.answer) else {
                let expected: Vec<String> = model
                    .step(call)
                    .unwrap_or_default()
                    .iter()
                    .map(|o| format!("{:?}", o.answer))
                    .collect();
                return Err(Divergence {
                    index,
                    what: format!(
                        "{call}\nexpected (any of):\n{}\nobserved:\n{:?}",
                        expected.join("\nor\n"),
                        observed.answer
                    ),
                });
            };
            if chosen.lapse {
                let at = observed.expires_at.expect("an extended hold has an expiry");
                wait_past(&at).await;
                while self.app.inventory.expire_due(100).await.expect("a sweep") == 100 {}
            }
            *self
                .seen
                .lock()
                .unwrap()
                .entry(format!(
                    "{} {}",
                    call.method(),
                    outcome_label(&observed.answer)
                ))
                .or_default() += 1;
            model = chosen.next;
            self.compare_levels(&mut client, ns, &model)
                .await
                .map_err(|what| Divergence {
                    index,
                    what: format!("after {call}: levels differ\n{what}"),
                })?;
        }
        Ok(())
    }

    async fn compare_levels(
        &self,
        client: &mut InventoryServiceClient<Channel>,
        ns: &Namespace,
        model: &Model,
    ) -> Result<(), String> {
        let skus = model.skus();
        if skus.is_empty() {
            return Ok(());
        }
        let response = client
            .get_stock(proto::GetStockRequest {
                skus: skus.iter().map(|s| ns.name(s)).collect(),
                by_location: true,
            })
            .await
            .map_err(|status| format!("GetStock: {status:?}"))?
            .into_inner();
        let observed: BTreeMap<_, _> = view::levels_by_key(ns, &response)
            .into_iter()
            .filter(|((_, location), level)| location.is_empty() || !level.is_empty())
            .collect();
        let expected = model.levels();
        if observed == expected {
            return Ok(());
        }
        let mut diff = String::new();
        for key in expected
            .keys()
            .chain(observed.keys())
            .collect::<std::collections::BTreeSet<_>>()
        {
            let (e, o) = (expected.get(key), observed.get(key));
            if e != o {
                diff.push_str(&format!("{key:?}\n  model:  {e:?}\n  server: {o:?}\n"));
            }
        }
        Err(diff)
    }

    /// Runs the sequence of `seed`; on a divergence, shrinks it and answers the report.
    async fn check(&self, seed: u64, profile: Profile, shrink_for: Duration) -> Result<(), String> {
        let calls = Generator::sequence(seed, profile);
        let ns = Namespace::new(&format!("m{seed:x}"));
        let Err(divergence) = self.run(&calls, &ns).await else {
            return Ok(());
        };
        let mut shrinker = Shrinker::new(calls[..=divergence.index].to_vec());
        let mut last = divergence;
        let started = Instant::now();
        while started.elapsed() < shrink_for
            && let Some(candidate) = shrinker.candidate()
        {
            let ns = Namespace::new(&format!("m{seed:x}s{}", shrinker.attempts()));
            match self.run(&candidate, &ns).await {
                Err(divergence) => {
                    shrinker.report(Some(divergence.index));
                    last = divergence;
                }
                Ok(()) => shrinker.report(None),
            }
        }
        // The report's divergence is the shortest sequence's own.
        let best = shrinker.best().to_vec();
        let ns = Namespace::new(&format!("m{seed:x}final"));
        if let Err(divergence) = self.run(&best, &ns).await {
            last = divergence;
        }
        Err(format!(
            "the model and the server diverge (seed {seed}, shrunk to {} of {} calls in {} attempts)\n\
             {}\n\nTo reproduce against `make run`:\n{}",
            best.len(),
            profile.calls,
            shrinker.attempts(),
            last.what,
            grpcurl::script(seed, &best, &Namespace::default()),
        ))
    }
}

/// What an answer was, for the summary of what the sequences reached.
fn outcome_label(answer: &Answer) -> String {
    match answer {
        Answer::Refused { reason, .. } => reason.clone(),
        Answer::Reservation(r) => {
            let waiting = r.lines.iter().any(|l| l.backordered + l.preordered > 0);
            format!("{}{}", r.state, if waiting { " waiting" } else { "" })
        }
        Answer::Receipt(r) => r.state.to_owned(),
        _ => "OK".to_owned(),
    }
}

/// The short profile of `make test` (fixed seeds), or `make model` (`MODEL_SEED`,
/// `MODEL_RUNS`, `MODEL_CALLS`, `MODEL_STRICT`).
#[tokio::test]
async fn the_model_and_the_server_agree_on_seeded_sequences() {
    let rules = Rules::parse(&std::env::var("MODEL_STRICT").unwrap_or_default())
        .expect("MODEL_STRICT names stricter rules of the model");
    let first = env_u64("MODEL_SEED").unwrap_or(1);
    let runs = env_u64("MODEL_RUNS").unwrap_or(64);
    let profile = Profile {
        calls: env_u64("MODEL_CALLS").unwrap_or(50) as usize,
        ..Profile::default()
    };
    println!(
        "model: seeds {first}..{} ({runs} runs of {} calls)",
        first + runs,
        profile.calls
    );
    let runner = Runner::new(rules).await;
    let mut failures = Vec::new();
    for seed in (0..runs).map(|i| first.wrapping_add(i)) {
        if let Err(report) = runner.check(seed, profile, Duration::from_secs(30)).await {
            println!("{report}");
            failures.push(seed);
            if failures.len() >= 3 {
                break;
            }
        }
    }
    let seen = runner.seen.lock().unwrap().clone();
    println!("model: answers the sequences reached (method, answer: count):");
    for (label, count) in &seen {
        println!("  {label}: {count}");
    }
    assert!(
        failures.is_empty(),
        "seeds that diverged: {failures:?} (reports above)"
    );
    // The sequences reach the states they are weighted for: waiting holds, fills, receipts
    // closed both ways, replays of stored answers.
    if failures.is_empty() && runs >= 8 {
        for reached in [
            "Reserve HELD waiting",
            "ReceiveStock RECEIVED",
            "CancelReceipt CANCELLED",
            "IDEMPOTENCY_KEY_REUSED",
            "Reserve INSUFFICIENT_STOCK",
        ] {
            assert!(
                seen.keys().any(|k| k.contains(reached)),
                "no `{reached}` in {seen:#?}"
            );
        }
    }
}
