use super::*;

#[test]
fn readiness_is_the_inventory_service() {
    assert_eq!(READINESS_SERVICE, "inventory.v1.InventoryService");
}

#[tokio::test]
async fn nothing_listening_is_not_ready() {
    let port = free_port().unwrap();
    assert!(!ready(&format!("http://127.0.0.1:{port}")).await);
}

#[tokio::test]
async fn a_binary_that_exits_at_once_fails_the_start_and_says_where_its_log_is() {
    let scratch = crate::Scratch::new("server-test");
    let log = scratch.0.join("server.log");
    let error = ServerProcess::start(Path::new("/bin/false"), Vec::new(), log.clone())
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(message.contains("exited during start-up"), "{message}");
    assert!(message.contains(&log.display().to_string()), "{message}");
}
