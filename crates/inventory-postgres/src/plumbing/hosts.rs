//! Multi-host connection strings (`host=a,b` with `target_session_attrs=read-write`), tried
//! one host at a time with the whole handshake bounded.
//!
//! The driver bounds only the TCP connect to each host by `connect_timeout`. A primary that is
//! frozen (SIGSTOP, a hung kernel, a full disk) still completes TCP connects from its listen
//! backlog and then never answers the startup packet, so the driver would wait on it forever
//! and never reach the standby that has been promoted in its place. Here every host but the
//! last gets `connect_timeout` for the connect, TLS, authentication and the
//! `target_session_attrs` check together; the last one is bounded by the caller (the pool's
//! create timeout, the `LISTEN` start-up bound).
//!
//! The host that last answered is tried first next time, so after a failover only the first
//! connection pays the timeout of the host that froze, not every connection the pool opens.

use std::{
    cmp,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio_postgres::config::{Config, Host, LoadBalanceHosts};

/// Where the next connection starts: shared by every clone of a configuration, so the pool
/// and the `LISTEN` connection learn from each other.
#[derive(Clone, Debug, Default)]
pub(crate) struct HostOrder(Arc<AtomicUsize>);

impl HostOrder {
    /// The host to try first, among `count`. With `load_balance_hosts=random` the start
    /// rotates on every connection instead, spreading them over the hosts.
    fn first(&self, count: usize, balance: LoadBalanceHosts) -> usize {
        match balance {
            LoadBalanceHosts::Random => self.0.fetch_add(1, Ordering::Relaxed) % count,
            _ => self.0.load(Ordering::Relaxed) % count,
        }
    }

    /// `index` answered: it is tried first next time (unless connections rotate).
    pub fn answered(&self, index: usize, balance: LoadBalanceHosts) {
        if !matches!(balance, LoadBalanceHosts::Random) {
            self.0.store(index, Ordering::Relaxed);
        }
    }
}

/// One attempt per host, in the order to try them.
pub(crate) struct Attempts {
    /// The configuration of each host alone, first to try first.
    pub hosts: Vec<(usize, Config)>,
    /// How long each host but the last may take, from the first TCP connect to a usable
    /// session.
    pub bound: Option<Duration>,
}

impl Attempts {
    /// `None` when there is one host (or a host list the driver will reject with its own
    /// error): the driver then connects as it always does.
    pub fn plan(config: &Config, order: &HostOrder) -> Option<Self> {
        let count = host_count(config)?;
        let balance = config.get_load_balance_hosts();
        let first = order.first(count, balance);
        let hosts = (0..count)
            .map(|step| (first + step) % count)
            .map(|index| (index, only_host(config, index)))
            .collect();
        Some(Self {
            hosts,
            bound: config.get_connect_timeout().copied(),
        })
    }
}

/// How many hosts `config` lists, when more than one and consistently.
pub(crate) fn host_count(config: &Config) -> Option<usize> {
    let hosts = config.get_hosts().len();
    let addrs = config.get_hostaddrs().len();
    let count = cmp::max(hosts, addrs);
    let consistent = (hosts == 0 || addrs == 0 || hosts == addrs)
        && (config.get_ports().len() <= 1 || config.get_ports().len() == count);
    (count > 1 && consistent).then_some(count)
}

/// `config` with only its `index`-th host (and that host's address and port). Every other
/// setting is copied, so the driver treats the host exactly as it would inside the list.
pub(crate) fn only_host(config: &Config, index: usize) -> Config {
    let mut one = Config::new();
    if let Some(user) = config.get_user() {
        one.user(user);
    }
    if let Some(password) = config.get_password() {
        one.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        one.options(options);
    }
    if let Some(name) = config.get_application_name() {
        one.application_name(name);
    }
    one.ssl_mode(config.get_ssl_mode())
        .ssl_negotiation(config.get_ssl_negotiation());
    match config.get_hosts().get(index) {
        Some(Host::Tcp(host)) => {
            one.host(host);
        }
        Some(Host::Unix(path)) => {
            one.host_path(path);
        }
        None => {}
    }
    if let Some(addr) = config.get_hostaddrs().get(index) {
        one.hostaddr(*addr);
    }
    let ports = config.get_ports();
    if let Some(port) = ports.get(index).or(ports.first()) {
        one.port(*port);
    }
    if let Some(timeout) = config.get_connect_timeout() {
        one.connect_timeout(*timeout);
    }
    if let Some(timeout) = config.get_tcp_user_timeout() {
        one.tcp_user_timeout(*timeout);
    }
    one.keepalives(config.get_keepalives())
        .keepalives_idle(config.get_keepalives_idle());
    if let Some(interval) = config.get_keepalives_interval() {
        one.keepalives_interval(interval);
    }
    if let Some(retries) = config.get_keepalives_retries() {
        one.keepalives_retries(retries);
    }
    one.target_session_attrs(config.get_target_session_attrs())
        .channel_binding(config.get_channel_binding())
        .load_balance_hosts(config.get_load_balance_hosts());
    one
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Config {
        url.parse().unwrap()
    }

    #[test]
    fn one_host_alone_is_the_same_configuration() {
        // Every setting the driver has, so a setting the copy forgets fails here.
        let full = parse(
            "postgres://app:pw@db.internal:6432/inv?options=-c%20x%3D1&application_name=a\
             &sslmode=require&sslnegotiation=direct&connect_timeout=3&tcp_user_timeout=4000\
             &keepalives=0&keepalives_idle=9&target_session_attrs=read-write\
             &channel_binding=require&load_balance_hosts=random",
        );
        let mut full = full;
        full.keepalives_interval(Duration::from_secs(2))
            .keepalives_retries(5);
        assert_eq!(only_host(&full, 0), full);

        let socket = parse("host=/run/postgresql port=5433 user=u dbname=d");
        assert_eq!(only_host(&socket, 0), socket);
        let by_addr = parse("hostaddr=10.0.0.5 port=5433 user=u");
        assert_eq!(only_host(&by_addr, 0), by_addr);
    }

    #[test]
    fn each_host_gets_its_own_port_and_address() {
        let config = parse(
            "host=a,b hostaddr=10.0.0.1,10.0.0.2 port=1,2 user=u target_session_attrs=read-write",
        );
        let second = only_host(&config, 1);
        assert_eq!(second.get_hosts(), &[Host::Tcp("b".into())]);
        assert_eq!(
            second.get_hostaddrs(),
            &["10.0.0.2".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(second.get_ports(), &[2]);
        assert_eq!(second.get_user(), Some("u"));

        // One port for every host.
        let shared = only_host(&parse("host=a,b port=7 user=u"), 1);
        assert_eq!(shared.get_ports(), &[7]);
        // No port: the driver's default applies to each host alone as it did to the list.
        assert!(
            only_host(&parse("host=a,b user=u"), 0)
                .get_ports()
                .is_empty()
        );
    }

    #[test]
    fn the_host_that_answered_is_tried_first() {
        let config = parse("host=a,b,c user=u connect_timeout=1");
        let order = HostOrder::default();
        let names = |attempts: Attempts| -> Vec<usize> {
            attempts.hosts.into_iter().map(|(index, _)| index).collect()
        };
        assert_eq!(names(Attempts::plan(&config, &order).unwrap()), [0, 1, 2]);
        order.answered(2, config.get_load_balance_hosts());
        assert_eq!(names(Attempts::plan(&config, &order).unwrap()), [2, 0, 1]);
        assert_eq!(
            Attempts::plan(&config, &order).unwrap().bound,
            Some(Duration::from_secs(1))
        );

        // One host, or a list the driver rejects itself: no plan, the driver connects.
        assert!(Attempts::plan(&parse("host=a user=u"), &order).is_none());
        assert!(Attempts::plan(&parse("host=a,b port=1,2,3 user=u"), &order).is_none());
    }

    #[test]
    fn random_balancing_rotates_the_first_host() {
        let config = parse("host=a,b user=u load_balance_hosts=random");
        let order = HostOrder::default();
        let first: Vec<usize> = (0..4)
            .map(|_| Attempts::plan(&config, &order).unwrap().hosts[0].0)
            .collect();
        assert_eq!(first, [0, 1, 0, 1]);
        order.answered(1, config.get_load_balance_hosts());
        assert_eq!(Attempts::plan(&config, &order).unwrap().hosts[0].0, 0);
    }
}
