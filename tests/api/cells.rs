//! Cells: two complete copies of the service, each serving its own tenants, found through the
//! client kit's static map. A tenant's calls reach its cell only, and one cell's outage
//! leaves the other's tenants selling.

use std::path::Path;

use inventory_client::{CellClients, CellMap, ClientConfig};
use inventory_server::{
    auth::digest_hex,
    proto::{ReserveRequest, SetStockRequest},
};
use inventory_testkit::cells::{Cell, CellSpec, cell_map};
use tonic::Code;

use crate::helpers::{reserve, set_stock};

const A_ADMIN: &str = "cell-a-admin-token";
const A_SHOP: &str = "cell-a-shop-token";
const B_ADMIN: &str = "cell-b-admin-token";
const B_SHOP: &str = "cell-b-shop-token";

fn credentials(dir: &Path) -> std::path::PathBuf {
    let line = |name: &str, role: &str, token: &str, tenant: &str| {
        format!(
            "{name} {role} token-sha256:{} tenant={tenant}\n",
            digest_hex(token.as_bytes())
        )
    };
    let path = dir.join("credentials");
    std::fs::write(
        &path,
        [
            line("a-admin", "admin", A_ADMIN, "brand_a"),
            line("a-shop", "reserver", A_SHOP, "brand_a"),
            line("b-admin", "admin", B_ADMIN, "brand_b"),
            line("b-shop", "reserver", B_SHOP, "brand_b"),
        ]
        .concat(),
    )
    .unwrap();
    path
}

/// The clients one caller (`token`) would build from the map.
fn clients(map: &CellMap, token: &str) -> CellClients {
    let mut base = ClientConfig::new("http://unused");
    base.token = Some(token.to_owned().into());
    // A cell that is down stays down in this test: give up after a few attempts.
    base.retry.budget = std::time::Duration::from_secs(3);
    CellClients::new(map.clone(), &base).unwrap()
}

/// The refusal's code and reason.
fn refusal(error: &inventory_client::Error) -> (Code, &str) {
    match error {
        inventory_client::Error::Refused { code, reason, .. } => (*code, reason),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The tenants' schemas a cell's database has.
async fn schemas(cell: &Cell) -> Vec<String> {
    cell.database()
        .await
        .unwrap()
        .query(
            "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'tenant\\_%' ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

async fn reservations_in(cell: &Cell, schema: &str) -> i64 {
    cell.database()
        .await
        .unwrap()
        .query_one(&format!("SELECT count(*) FROM {schema}.reservations"), &[])
        .await
        .unwrap()
        .get(0)
}

fn order(key: &str, units: i64) -> ReserveRequest {
    reserve(key, &[("SAME-1", units)])
}

fn count(units: i64) -> SetStockRequest {
    set_stock("SAME-1", units, None, "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_calls_stay_in_its_cell_and_the_other_cell_sells_through_an_outage() {
    let dir = inventory_testkit::Scratch::new("cells");
    let credentials = credentials(&dir.0);
    let binary = Path::new(env!("CARGO_BIN_EXE_inventory-server"));
    let spec = |name: &str, tenant: &str| CellSpec {
        name: name.into(),
        tenants: vec![tenant.into()],
        replicas: 2,
        credentials: credentials.clone(),
    };
    let (one, two) = tokio::join!(
        Cell::start(binary, spec("c1", "brand_a")),
        Cell::start(binary, spec("c2", "brand_b")),
    );
    let (mut one, two) = (one.unwrap(), two.unwrap());
    let map = CellMap::parse(&cell_map(&[&one, &two])).unwrap();
    assert_eq!(map.cell_of("brand_b").unwrap().name(), "c2");

    // The same SKU in both tenants, each through its own cell, as the map says.
    for (admin, shop, units) in [(A_ADMIN, A_SHOP, 3), (B_ADMIN, B_SHOP, 2)] {
        let tenant = if admin == A_ADMIN {
            "brand_a"
        } else {
            "brand_b"
        };
        clients(&map, admin)
            .for_tenant(tenant)
            .unwrap()
            .set_stock(count(units))
            .await
            .unwrap();
        clients(&map, shop)
            .for_tenant(tenant)
            .unwrap()
            .reserve(order(&format!("{tenant}-1"), 1))
            .await
            .unwrap();
    }
    // Each cell holds its own tenant's rows and nothing of the other's.
    assert_eq!(schemas(&one).await, ["tenant_brand_a"]);
    assert_eq!(schemas(&two).await, ["tenant_brand_b"]);
    assert_eq!(reservations_in(&one, "tenant_brand_a").await, 1);
    assert_eq!(reservations_in(&two, "tenant_brand_b").await, 1);

    // A stale map sending brand_b to c1 reaches nothing there: refused, nothing written.
    let misrouted = clients(&map, B_SHOP)
        .for_cell("c1")
        .unwrap()
        .reserve(order("brand_b-misrouted", 1))
        .await
        .unwrap_err();
    assert_eq!(
        refusal(&misrouted),
        (Code::FailedPrecondition, "TENANT_NOT_SERVED")
    );
    assert_eq!(reservations_in(&one, "tenant_brand_a").await, 1);
    assert!(clients(&map, B_SHOP).for_tenant("brand_z").is_err());

    // c1 goes down whole. brand_b sells on in c2, on either replica; brand_a cannot.
    one.outage().await.unwrap();
    let b_shop = clients(&map, B_SHOP).for_tenant("brand_b").unwrap();
    b_shop.reserve(order("brand_b-2", 1)).await.unwrap();
    let sold_out = b_shop.reserve(order("brand_b-3", 1)).await.unwrap_err();
    assert_eq!(
        refusal(&sold_out),
        (Code::FailedPrecondition, "INSUFFICIENT_STOCK")
    );
    let mut second = ClientConfig::new(two.replicas[1].addr());
    second.token = Some(B_SHOP.to_owned().into());
    let level = inventory_client::InventoryClient::connect(second)
        .await
        .unwrap()
        .get_stock(inventory_server::proto::GetStockRequest {
            skus: vec!["SAME-1".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!((level.levels[0].on_hand, level.levels[0].reserved), (2, 2));
    let down = clients(&map, A_SHOP)
        .for_tenant("brand_a")
        .unwrap()
        .reserve(order("brand_a-2", 1))
        .await
        .unwrap_err();
    assert!(
        matches!(
            down,
            inventory_client::Error::Unavailable { .. }
                | inventory_client::Error::OutcomeUnknown { .. }
        ),
        "{down:?}"
    );
    assert_eq!(reservations_in(&two, "tenant_brand_b").await, 2);
}

/// Moving a tenant between cells (docs/operations.md, "Moving a tenant to another cell"):
/// the source stops serving it, its schema is copied whole, the target serves it, the map
/// changes. A retry with a key used before the move replays its answer; the stock, the
/// holds and the event stream go on where they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_moves_to_another_cell_with_its_keys_stock_and_stream() {
    use inventory_server::proto::{GetStockRequest, WatchEventsRequest};
    use inventory_testkit::cells::copy_tenant;

    let dir = inventory_testkit::Scratch::new("cells-move");
    let credentials = credentials(&dir.0);
    let binary = Path::new(env!("CARGO_BIN_EXE_inventory-server"));
    let spec = |name: &str, tenants: &[&str]| CellSpec {
        name: name.into(),
        tenants: tenants.iter().map(|t| (*t).to_owned()).collect(),
        replicas: 1,
        credentials: credentials.clone(),
    };
    let (one, two) = tokio::join!(
        Cell::start(binary, spec("c1", &["brand_a"])),
        Cell::start(binary, spec("c2", &["brand_b", "brand_c"])),
    );
    let (mut one, mut two) = (one.unwrap(), two.unwrap());
    let before = CellMap::parse(&cell_map(&[&one, &two])).unwrap();
    clients(&before, B_ADMIN)
        .for_tenant("brand_b")
        .unwrap()
        .set_stock(count(5))
        .await
        .unwrap();
    let held = clients(&before, B_SHOP)
        .for_tenant("brand_b")
        .unwrap()
        .reserve(order("before-move", 2))
        .await
        .unwrap();
    // A consumer's cursor: the last event it read before the move.
    let mut stream = clients(&before, B_ADMIN)
        .for_tenant("brand_b")
        .unwrap()
        .watch_events(WatchEventsRequest::default())
        .await
        .unwrap();
    let mut last = None;
    while last
        .as_ref()
        .is_none_or(|e: &inventory_server::proto::Event| e.sequence < 2)
    {
        last = stream.message().await.unwrap();
    }
    let last = last.unwrap();
    drop(stream);

    // The move: c2 stops serving brand_b, its schema goes to c1, c1 serves it, the map moves.
    two.serve(&["brand_c"]).await.unwrap();
    let frozen = clients(&before, B_SHOP)
        .for_tenant("brand_b")
        .unwrap()
        .reserve(order("during-move", 1))
        .await
        .unwrap_err();
    assert_eq!(
        refusal(&frozen),
        (Code::FailedPrecondition, "TENANT_NOT_SERVED")
    );
    copy_tenant(&two, &one, "brand_b").await.unwrap();
    one.serve(&["brand_a", "brand_b"]).await.unwrap();
    let after = CellMap::parse(&cell_map(&[&one, &two])).unwrap();
    assert_eq!(after.cell_of("brand_b").unwrap().name(), "c1");
    let b_shop = clients(&after, B_SHOP).for_tenant("brand_b").unwrap();

    // The key used before the move replays its answer, and moves no stock again.
    let replay = b_shop.reserve(order("before-move", 2)).await.unwrap();
    assert_eq!(replay.reservation_id, held.reservation_id);
    let level = |map: &CellMap| {
        let client = clients(map, B_ADMIN).for_tenant("brand_b").unwrap();
        async move {
            let level = client
                .get_stock(GetStockRequest {
                    skus: vec!["SAME-1".into()],
                    ..Default::default()
                })
                .await
                .unwrap();
            (level.levels[0].on_hand, level.levels[0].reserved)
        }
    };
    assert_eq!(level(&after).await, (5, 2));
    // A new hold: c1's Redis has no fence counter for brand_b's SKU, which is behind the
    // fence the copied row carries; the service raises it and sells.
    b_shop.reserve(order("after-move", 3)).await.unwrap();
    assert_eq!(level(&after).await, (5, 5));
    let sold_out = b_shop.reserve(order("after-move-2", 1)).await.unwrap_err();
    assert_eq!(
        refusal(&sold_out),
        (Code::FailedPrecondition, "INSUFFICIENT_STOCK")
    );
    // The consumer goes on from its cursor in the new cell: the next event is the new hold.
    let mut stream = clients(&after, B_ADMIN)
        .for_tenant("brand_b")
        .unwrap()
        .watch_events(WatchEventsRequest {
            after_sequence: last.sequence,
            epoch: last.epoch.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let next = stream.message().await.unwrap().unwrap();
    assert_eq!(next.sequence, last.sequence + 1, "{next:?}");
    // A client still on the old map reaches nothing of brand_b's in c2.
    let stale = clients(&before, B_SHOP)
        .for_tenant("brand_b")
        .unwrap()
        .reserve(order("stale", 1))
        .await
        .unwrap_err();
    assert_eq!(
        refusal(&stale),
        (Code::FailedPrecondition, "TENANT_NOT_SERVED")
    );
}
