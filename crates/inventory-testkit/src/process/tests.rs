use super::*;

#[tokio::test]
async fn eventually_waits_for_the_condition() {
    let started = Instant::now();
    eventually(
        "a tenth of a second passes",
        Duration::from_secs(5),
        || async { started.elapsed() >= Duration::from_millis(100) },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn eventually_gives_up_and_says_what_did_not_happen() {
    let error = eventually("the sky fell", Duration::from_millis(120), || async {
        false
    })
    .await
    .unwrap_err();
    assert!(
        error.to_string().starts_with("the sky fell within"),
        "{error}"
    );
}

#[tokio::test]
async fn eventually_ok_returns_the_value_and_reports_the_last_error() {
    let mut calls = 0;
    let value = eventually_ok("third time lucky", Duration::from_secs(5), || {
        calls += 1;
        let calls = calls;
        async move { if calls >= 3 { Ok(calls) } else { Err(calls) } }
    })
    .await
    .unwrap();
    assert_eq!(value, 3);
    let error = eventually_ok::<(), _, _, _>("never", Duration::ZERO, || async { Err("refused") })
        .await
        .unwrap_err();
    assert!(error.to_string().contains("refused"), "{error}");
}

#[tokio::test]
async fn a_process_is_paused_resumed_and_terminated() {
    let child = Command::new("sleep")
        .arg("30")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut process = Process::new(child);
    process.pause().await.unwrap();
    process.resume().await.unwrap();
    assert_eq!(process.try_wait().unwrap(), None);
    let status = process.terminate(Duration::from_secs(5)).await;
    assert!(status.is_some_and(|s| !s.success()), "{status:?}");
    assert!(!process.is_running());
    assert!(process.pause().await.is_err());
}
