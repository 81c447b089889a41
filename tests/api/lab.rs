//! The failure lab (`examples/failure_lab.rs`, `make lab`) shows what it promises: the naive
//! worker sells the last unit twice, and the service never does, each time for the reason the
//! lab gives (`failure_lab::check`).

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
    failure_lab::check(&outcomes).unwrap_or_else(|e| panic!("{e:#}\n{text}"));
    assert!(outcomes[0].oversold(), "{text}");
    assert!(outcomes[1..].iter().all(|o| !o.oversold()), "{text}");
    // Scenario 4 started from a counter of 100: A wrote 101, B's first grant was 1.
    assert_eq!(outcomes[3].fact("token_a"), Some(101), "{text}");
    assert_eq!(outcomes[3].fact("first_grant_b"), Some(1), "{text}");

    let page = failure_lab::html(&outcomes);
    assert_eq!(page.matches("<svg").count(), 4);
    assert!(page.contains("Oversold."), "the naive scenario is marked");
}
