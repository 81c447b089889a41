use super::*;

async fn write(formation: &Formation, value: i32) -> anyhow::Result<()> {
    let client = connect(&formation.admin_config()?).await?;
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS kept (value int)")
        .await?;
    client
        .execute("INSERT INTO kept VALUES ($1)", &[&value])
        .await?;
    Ok(())
}

async fn kept(formation: &Formation) -> anyhow::Result<Vec<i32>> {
    let client = connect(&formation.admin_config()?).await?;
    let rows = client
        .query("SELECT value FROM kept ORDER BY value", &[])
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// The formation fails over when its primary dies or is cut off, the multi-host URL finds the
/// new primary, every acknowledged write survives, and the old primary rejoins as standby.
#[tokio::test]
async fn a_lost_primary_is_replaced_and_rejoins_as_standby() {
    let scratch = crate::Scratch::new("formation");
    let mut formation = Formation::start(&scratch.0).await.unwrap();
    let first = formation.wait_stable().await.unwrap();
    write(&formation, 1).await.unwrap();

    formation.kill(first).await.unwrap();
    let second = formation.wait_promoted(first).await.unwrap();
    assert_ne!(second, first);
    eventually_ok("a write on the new primary", SETTLE, || {
        write(&formation, 2)
    })
    .await
    .unwrap();
    formation.restart(first).await.unwrap();
    assert_eq!(formation.wait_stable().await.unwrap(), second);

    formation.set_cut(second, true);
    assert_eq!(formation.wait_promoted(second).await.unwrap(), first);
    eventually_ok("a write after the partition", SETTLE, || {
        write(&formation, 3)
    })
    .await
    .unwrap();
    formation.set_cut(second, false);
    assert_eq!(formation.wait_stable().await.unwrap(), first);

    formation.switchover().await.unwrap();
    assert_eq!(formation.wait_stable().await.unwrap(), second);
    assert_eq!(kept(&formation).await.unwrap(), [1, 2, 3]);
    formation.stop().await;
}
