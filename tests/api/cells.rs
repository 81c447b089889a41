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
