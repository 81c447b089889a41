//! The failure lab (`examples/failure_lab.rs`, `make lab`) shows what it promises: the naive
//! worker sells the last unit twice, and the service never does, in each of its scenarios.

use inventory_testkit::redis::RedisNode;

#[allow(dead_code)]
#[path = "../../examples/failure_lab.rs"]
mod failure_lab;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_naive_worker_oversells_and_the_service_never_does() {
    // The lab's scenario 4 starts a Redis of its own; this one is for the others.
    let redis = RedisNode::start_scratch().await.unwrap();
    let database_url = std::env::var("DATABASE_URL").expect("DATABASE_URL (make test sets it)");
    let lab = failure_lab::Lab::new(&database_url, &redis.url()).unwrap();
    let outcomes = lab.run().await.unwrap();
    let text = failure_lab::text(&outcomes);

    let [naive, conditional, fenced, forgets] = &outcomes[..] else {
        panic!("four scenarios:\n{text}")
    };
    assert!(naive.oversold(), "{text}");
    assert_eq!((naive.units, naive.sold), (1, 2), "{text}");
    assert_eq!((conditional.units, conditional.sold), (1, 1), "{text}");
    assert_eq!((fenced.units, fenced.sold), (2, 1), "only B sells:\n{text}");
    assert!(
        fenced
            .steps
            .iter()
            .any(|s| s.actor == "A" && s.what.contains("LEASE_LOST")),
        "A is fenced off:\n{text}"
    );
    // A resumed with stock to spare: only the token stopped it.
    let resumed = fenced
        .steps
        .iter()
        .find(|s| s.actor == "A" && s.what.starts_with("resumes"))
        .unwrap();
    assert!(resumed.stock >= 1, "{text}");
    assert_eq!((forgets.units, forgets.sold), (2, 2), "{text}");
    // Redis's counter was empty after the restart, and B's token is above A's.
    let tokens: Vec<Option<i64>> = forgets.steps.iter().map(|s| s.token).collect();
    assert_eq!(
        tokens[2], None,
        "the counter is gone after the restart:\n{text}"
    );
    let (a, b) = (tokens[1].unwrap(), tokens[3].unwrap());
    assert!(b > a, "B wrote with a token above A's ({b} > {a}):\n{text}");

    let page = failure_lab::html(&outcomes);
    assert_eq!(page.matches("<svg").count(), 4);
    assert!(page.contains("Oversold."), "the naive scenario is marked");
}
