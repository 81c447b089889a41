use super::*;

#[test]
fn topologies_parse_and_serialise_by_their_names() {
    use clap::ValueEnum as _;
    for topology in Topology::ALL {
        assert_eq!(
            Topology::from_str(topology.name(), false).unwrap(),
            topology
        );
    }
}

#[test]
fn the_three_cluster_nodes_split_the_slots() {
    assert_eq!(
        (0..16384u16)
            .map(slot_owner)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        3
    );
    assert_eq!(slot_owner(0), 0);
    assert_eq!(slot_owner(16383), 2);
}

fn slot_owner(slot: u16) -> usize {
    Redis {
        topology: Topology::Cluster,
        nodes: Vec::new(),
        sentinels: Vec::new(),
        proxy: None,
    }
    .cluster_node_of_slot(slot)
}

#[tokio::test]
async fn a_node_restarts_empty_on_the_same_port() {
    let mut node = RedisNode::start_scratch().await.unwrap();
    let port = node.port;
    node.cli(&["set", "k", "v"]).await.unwrap();
    node.pause().await.unwrap();
    node.resume().await.unwrap();
    node.restart().await.unwrap();
    assert_eq!(node.port, port);
    assert_eq!(node.cli(&["get", "k"]).await.unwrap().trim(), "");
    assert_eq!(node.url(), format!("redis://127.0.0.1:{port}"));
}
