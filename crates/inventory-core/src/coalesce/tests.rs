use super::*;
use crate::domain::{FenceToken, IdempotencyKey, Line, OrderId, Quantity};

fn group(sku: &str, keys: &[&str]) -> ReserveGroup {
    let sku = Sku::parse(sku).unwrap();
    let batch = keys
        .iter()
        .map(|key| {
            let command = Reserve::new(
                crate::domain::Caller::anonymous(),
                IdempotencyKey::parse(key).unwrap(),
                OrderId::parse("o").unwrap(),
                vec![Line {
                    sku: sku.clone(),
                    quantity: Quantity::parse(1).unwrap(),
                    location: None,
                }],
                None,
            );
            (command, Ttl::parse(Duration::from_secs(60)).unwrap())
        })
        .collect();
    ReserveGroup {
        sku,
        fence: FenceToken::new(1),
        batch,
    }
}

fn wait(submitted: Submitted) -> oneshot::Receiver<CommitTurn> {
    match submitted {
        Submitted::Wait(turn) => turn,
        Submitted::Lead(_) => panic!("expected to wait"),
    }
}

#[test]
fn a_transaction_takes_no_sku_or_key_twice_and_no_abandoned_batch() {
    let committer = Committer::default();
    let own = match committer.submit(group("A", &["k1"])) {
        Submitted::Lead(group) => group,
        Submitted::Wait(_) => panic!("the first batch leads"),
    };
    let _same_sku = wait(committer.submit(group("A", &["k2"])));
    let _same_key = wait(committer.submit(group("B", &["k1"])));
    drop(wait(committer.submit(group("C", &["k3"]))));
    let _fine = wait(committer.submit(group("D", &["k4"])));
    let taken: Vec<String> = committer
        .take(10, &own)
        .into_iter()
        .map(|p| p.group.sku.as_str().to_owned())
        .collect();
    assert_eq!(taken, ["D"]);
    // The two that clashed wait for the next transaction, in order; C's task is gone.
    assert_eq!(committer.waiting(), 2);
}

/// The turn is handed to B on one thread while B's waiter gives up on another. Whatever
/// the interleaving (sent before B's guard looked, after, or in between), C ends up with
/// the lead: B's guard closes its receiver before reading it, so a lead can neither land
/// in a receiver about to be dropped nor be passed on twice.
#[test]
fn a_lead_handed_over_while_its_waiter_leaves_reaches_the_next() {
    for _ in 0..2_000 {
        let committer = std::sync::Arc::new(Committer::default());
        let Submitted::Lead(_) = committer.submit(group("A", &["k1"])) else {
            panic!("the first batch leads");
        };
        let leaving = wait(committer.submit(group("B", &["k2"])));
        let mut next = wait(committer.submit(group("C", &["k3"])));
        let handing = {
            let committer = std::sync::Arc::clone(&committer);
            std::thread::spawn(move || committer.hand_off())
        };
        drop(CommitWait::new(leaving, &committer));
        handing.join().unwrap();
        assert!(matches!(next.try_recv(), Ok(CommitTurn::Lead(g)) if g.sku.as_str() == "C"));
    }
}

#[test]
fn a_lead_nobody_read_is_passed_on() {
    let committer = Committer::default();
    let Submitted::Lead(_) = committer.submit(group("A", &["k1"])) else {
        panic!("the first batch leads");
    };
    let first = wait(committer.submit(group("B", &["k2"])));
    let mut second = wait(committer.submit(group("C", &["k3"])));
    committer.hand_off();
    // B was handed the turn, but its task ends without reading it.
    drop(CommitWait::new(first, &committer));
    assert!(matches!(second.try_recv(), Ok(CommitTurn::Lead(g)) if g.sku.as_str() == "C"));
}

#[test]
fn up_to_max_in_flight_transactions_are_written_at_once_and_the_rest_wait() {
    let committer = Committer::new(2);
    assert!(matches!(
        committer.submit(group("A", &["k1"])),
        Submitted::Lead(_)
    ));
    assert!(matches!(
        committer.submit(group("B", &["k2"])),
        Submitted::Lead(_)
    ));
    let mut third = wait(committer.submit(group("C", &["k3"])));
    assert!(third.try_recv().is_err(), "both transactions are busy");
    // One ends: the waiting batch writes next; when that one and the other end, none is busy.
    committer.hand_off();
    assert!(matches!(third.try_recv(), Ok(CommitTurn::Lead(g)) if g.sku.as_str() == "C"));
    committer.hand_off();
    committer.hand_off();
    assert!(matches!(
        committer.submit(group("D", &["k4"])),
        Submitted::Lead(_)
    ));
    assert!(matches!(
        committer.submit(group("E", &["k5"])),
        Submitted::Lead(_)
    ));
}

#[test]
fn a_redirect_sends_client_calls_to_the_holder_refuses_forwarded_ones_and_keeps_returned_ones() {
    let queues = Queues::default();
    let sku = Sku::parse("HOT").unwrap();
    let ttl = Ttl::parse(Duration::from_secs(60)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let command = |key: &str| group("HOT", &[key]).batch.remove(0).0;
    let join = |key: &str, origin| match queues
        .join(&sku, &command(key), origin, ttl, deadline, 16)
        .unwrap()
    {
        Joined::Wait { turn, .. } => turn,
        Joined::Lead => panic!("{key} should queue"),
    };
    assert!(matches!(
        queues
            .join(&sku, &command("leader"), Origin::Client, ttl, deadline, 16)
            .unwrap(),
        Joined::Lead
    ));
    let mut client = join("client", Origin::Client);
    let mut forwarded = join("forwarded", Origin::Peer);
    let mut returned = join("returned", Origin::Local);
    let holder = Peer("10.0.0.2:50053".into());

    queues.redirect(&sku, Some(&holder));
    assert!(matches!(client.try_recv(), Ok(Turn::Forward(peer)) if peer == holder));
    assert!(matches!(
        forwarded.try_recv(),
        Ok(Turn::Done(Err(Error::NotHolder { .. })))
    ));
    assert!(returned.try_recv().is_err(), "a returned call waits here");
    assert_eq!(queues.queued(&sku), 1);

    // A holder that takes no forwards (an older release): client calls wait here too.
    let mut client = join("client-2", Origin::Client);
    queues.redirect(&sku, None);
    assert!(client.try_recv().is_err());
    assert_eq!(queues.queued(&sku), 2);
}
