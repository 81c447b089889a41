use super::*;
use crate::domain::Sku;

fn busy() -> Error {
    Error::LeaseBusy {
        sku: Sku::parse("A").unwrap(),
        waited: Duration::from_secs(1),
    }
}

#[test]
fn the_margin_is_a_fifth_of_the_timeout_within_bounds() {
    let now = Instant::now();
    let at = |timeout: Duration| {
        Budget::from_timeout(Some(timeout), now)
            .answer_by()
            .unwrap()
            .duration_since(now)
    };
    assert_eq!(at(Duration::from_millis(200)), Duration::from_millis(160));
    // At least 5 ms, at most 100 ms kept back.
    assert_eq!(at(Duration::from_millis(10)), Duration::from_millis(5));
    assert_eq!(at(Duration::from_secs(10)), Duration::from_millis(9_900));
    // A timeout shorter than the margin leaves nothing, not an underflow.
    assert_eq!(at(Duration::from_millis(3)), Duration::ZERO);
    assert_eq!(Budget::from_timeout(None, now), Budget::unbounded());
}

#[test]
fn the_earlier_limit_bounds_the_lease_wait_and_names_the_error() {
    let now = Instant::now();
    let tight = Budget::from_timeout(Some(Duration::from_millis(500)), now);
    let wait = tight.lease_wait(Duration::from_secs(5), now);
    assert!(wait.caller_binds);
    assert_eq!(wait.until, tight.answer_by().unwrap());
    assert!(matches!(
        wait.judge::<()>(Err(busy())),
        Err(Error::DeadlineExceeded)
    ));

    let loose = Budget::from_timeout(Some(Duration::from_secs(60)), now);
    let wait = loose.lease_wait(Duration::from_secs(5), now);
    assert!(!wait.caller_binds);
    assert_eq!(wait.until, now + Duration::from_secs(5));
    assert!(matches!(
        wait.judge::<()>(Err(busy())),
        Err(Error::LeaseBusy { .. })
    ));

    let none = Budget::unbounded().lease_wait(Duration::from_secs(5), now);
    assert!(!none.caller_binds);
    assert!(matches!(none.judge(Ok(7)), Ok(7)));
}

#[tokio::test]
async fn work_past_the_budget_is_deadline_exceeded() {
    let budget = Budget::from_timeout(Some(Duration::from_millis(100)), Instant::now());
    let slow = budget.run(async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(())
    });
    assert!(matches!(slow.await, Err(Error::DeadlineExceeded)));
    let quick = budget.run(async { Ok(3) });
    assert_eq!(quick.await.unwrap(), 3);
}
