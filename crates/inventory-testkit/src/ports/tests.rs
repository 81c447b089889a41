use super::*;

#[test]
fn a_free_port_is_below_the_ephemeral_range_and_can_be_bound() {
    let (low, high) = range();
    let port = free_port().unwrap();
    assert!((low..high).contains(&port), "{port} not in {low}..{high}");
    TcpListener::bind(loopback(port)).unwrap();
}
