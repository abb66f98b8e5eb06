//! The device registry: one software device per netdev with an address (`lo` included),
//! GID tables that follow the host's addresses, every 127.0.0.0/8 address usable through
//! lo's device, `RDMACM_DEVICES` / `CmaConfig` selecting and renaming devices, and wildcard
//! listeners on devices that appear after `listen`. Namespace tests need root (SKIPPED
//! otherwise).

mod support_cm;
mod support_hosts;

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rdma_testhosts::{require_root, Host};
use rdmacm::cm::{CmId, Cma, CmaConfig, ConnParam, Event, EventChannel, EventType, PortSpace};
use support_cm::{expect_within, sa};
use support_hosts::*;

const T: Duration = Duration::from_secs(10);

fn expect(ch: &EventChannel, kind: EventType) -> Event {
    expect_within(ch, kind, T)
}

/// Connects `src` → `dst` (a listener on `dst` in the same context);
/// returns (client channel, client id, server id) established.
fn connect_in(
    cma: &Cma,
    src: Option<&str>,
    dst: SocketAddr,
    lch: &EventChannel,
) -> (EventChannel, CmId, CmId) {
    let ch = EventChannel::with_cma(cma).unwrap();
    let c = CmId::new(&ch, PortSpace::Tcp).unwrap();
    c.resolve_addr(src.map(sa), dst, T).unwrap();
    expect(&ch, EventType::AddrResolved);
    c.resolve_route(T).unwrap();
    expect(&ch, EventType::RouteResolved);
    c.create_qp_default().unwrap();
    c.connect(&ConnParam::default()).unwrap();
    let s = expect(lch, EventType::ConnectRequest).take_id().unwrap();
    s.create_qp_default().unwrap();
    s.accept(&ConnParam::default()).unwrap();
    expect(&ch, EventType::Established);
    expect(lch, EventType::Established);
    (ch, c, s)
}

fn gid_ips(cma: &Cma, netdev: &str) -> Vec<IpAddr> {
    cma.device_list()
        .unwrap()
        .into_iter()
        .find(|d| d.netdev() == netdev)
        .map(|d| d.gids().iter().map(|g| g.ip()).collect())
        .unwrap_or_default()
}

/// Runs `f` here when UDP 4791 is free on every address of `addrs`; otherwise (another
/// process holds one: a tool, another run of the suites) in a fresh network namespace the
/// test creates, where they are free. That needs root: without it the test fails rather than
/// pass having tested nothing.
fn where_free<R: Send>(test: &str, addrs: &[&str], f: impl FnOnce() -> R + Send) -> R {
    let held: Vec<&str> = addrs
        .iter()
        .copied()
        .filter(|a| std::net::UdpSocket::bind(sa(a)).is_err())
        .collect();
    if held.is_empty() {
        return f();
    }
    assert!(
        rdma_testhosts::is_root(),
        "{test}: UDP {held:?} held by another process, and without root the test cannot run \
         in a namespace of its own"
    );
    println!("{test}: UDP {held:?} held by another process: testing in a new namespace");
    let t = rdma_testhosts::Topology::builder(test)
        .host("a")
        .build()
        .expect("namespace");
    t.host("a").run(f)
}

#[test]
fn connect_between_127_0_7_1_and_127_0_7_2() {
    where_free(
        "connect_between_127_0_7_1_and_127_0_7_2",
        &["127.0.7.1:4791", "127.0.7.2:4791"],
        connect_between_127_0_7_1_and_127_0_7_2_here,
    );
}

fn connect_between_127_0_7_1_and_127_0_7_2_here() {
    let cma = Cma::new().unwrap();
    let lch = EventChannel::with_cma(&cma).unwrap();
    let l = CmId::new(&lch, PortSpace::Tcp).unwrap();
    l.bind_addr(sa("127.0.7.2:0")).unwrap();
    l.listen(0).unwrap();
    let dst = l.local_addr().unwrap();
    let (ch, c, s) = connect_in(&cma, Some("127.0.7.1:0"), dst, &lch);
    assert_eq!(c.local_addr().unwrap().ip(), ip("127.0.7.1"));
    assert_eq!(s.local_addr().unwrap().ip(), ip("127.0.7.2"));
    assert_eq!(s.peer_addr().unwrap().ip(), ip("127.0.7.1"));
    assert_eq!(c.netdev().unwrap().0, "lo");
    let gids = gid_ips(&cma, "lo");
    assert!(gids.contains(&ip("127.0.7.1")) && gids.contains(&ip("127.0.7.2")));
    // Not the old 127.0.0.0/24 workaround: only lo's addresses and the ones in use.
    assert!(!gids.contains(&ip("127.0.0.200")), "{gids:?}");
    c.disconnect().unwrap();
    expect(&lch, EventType::Disconnected);
    s.disconnect().unwrap();
    expect(&ch, EventType::Disconnected);
}

#[test]
fn device_list_has_one_device_per_netdev_with_an_address_lo_included() {
    let cma = Cma::with_config(CmaConfig::default()).unwrap();
    let devs = cma.device_list().unwrap();
    let names: Vec<&str> = devs.iter().map(|d| d.name()).collect();
    assert!(names.contains(&"lo"), "{names:?}");
    for d in &devs {
        assert_eq!(d.name(), d.netdev(), "named after the netdev");
        assert!(!d.gids().is_empty(), "{} has addresses", d.name());
    }
    let mut sorted = names.clone();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "one device per netdev");
    let lo = devs.iter().find(|d| d.name() == "lo").unwrap();
    let ips: Vec<IpAddr> = lo.gids().iter().map(|g| g.ip()).collect();
    assert!(ips.contains(&ip("127.0.0.1")), "{ips:?}");
}

#[test]
fn devices_setting_restricts_and_renames() {
    let cfg = CmaConfig::parse_devices("lo=soft_lo").unwrap();
    let cma = Cma::with_config(cfg).unwrap();
    let devs = cma.device_list().unwrap();
    let names: Vec<&str> = devs.iter().map(|d| d.name()).collect();
    assert_eq!(names, ["soft_lo"]);
    assert_eq!(devs[0].netdev(), "lo");
    assert_eq!(
        CmaConfig::parse_devices("lo,,eth0").unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(CmaConfig::parse_devices(" ").unwrap(), CmaConfig::default());
}

fn two_hosts(test: &str) -> Option<rdma_testhosts::Topology> {
    if !require_root(test) {
        return None;
    }
    Some(two_hosts_running())
}

#[test]
fn devices_setting_leaves_other_netdevs_without_device_enodev() {
    let Some(t) = two_hosts("devices_setting_leaves_other_netdevs_without_device_enodev") else {
        return;
    };
    t.host("a").run(|| {
        let cma = Cma::with_config(CmaConfig::parse_devices("lo").unwrap()).unwrap();
        let names: Vec<String> = cma
            .device_list()
            .unwrap()
            .iter()
            .map(|d| d.name().to_owned())
            .collect();
        assert_eq!(names, ["lo"]);
        let ch = EventChannel::with_cma(&cma).unwrap();
        let c = CmId::new(&ch, PortSpace::Tcp).unwrap();
        let e = c.resolve_addr(None, sa("192.0.2.2:7000"), T).unwrap_err();
        assert_eq!(e.errno(), libc::ENODEV, "{e}");
        // Default: lo and eth0.
        let cma = Cma::with_config(CmaConfig::default()).unwrap();
        let names: Vec<String> = cma
            .device_list()
            .unwrap()
            .iter()
            .map(|d| d.name().to_owned())
            .collect();
        assert_eq!(names, ["lo", "eth0"]);
    });
}

/// A server in `h` with a wildcard listener; `after_listen` runs (in the test thread) once
/// it listens; the server accepts one connection, checks the GID table of `netdev` holds
/// `gid`, and waits for the client's disconnect.
fn wildcard_server(h: &Host, netdev: &'static str, gid: &'static str, ready: mpsc::Sender<()>) {
    h.run(move || {
        let cma = Cma::new().unwrap();
        let lch = EventChannel::with_cma(&cma).unwrap();
        let l = CmId::new(&lch, PortSpace::Tcp).unwrap();
        l.bind_addr(sa("0.0.0.0:7471")).unwrap();
        l.listen(0).unwrap();
        ready.send(()).unwrap();
        // Serve: the host change arrives while we wait here (progress runs in get_event).
        let mut ev = expect(&lch, EventType::ConnectRequest);
        let s = ev.take_id().unwrap();
        drop(ev);
        s.create_qp_default().unwrap();
        s.accept(&ConnParam::default()).unwrap();
        expect(&lch, EventType::Established);
        assert_eq!(s.local_addr().unwrap().ip(), ip(gid));
        assert_eq!(s.netdev().unwrap().0, netdev);
        assert!(gid_ips(&cma, netdev).contains(&ip(gid)));
        expect(&lch, EventType::Disconnected);
        drop(l);
    });
}

fn client_connects(h: &Host, dst: &str) {
    let dst = sa(dst);
    h.run(move || {
        let cma = Cma::new().unwrap();
        cma.set_cm_timeouts(14, 15).unwrap(); // REQ retried every ~130 ms
        let ch = EventChannel::with_cma(&cma).unwrap();
        let t0 = Instant::now();
        let c = CmId::new(&ch, PortSpace::Tcp).unwrap();
        c.resolve_addr(None, dst, T).unwrap();
        expect(&ch, EventType::AddrResolved);
        c.resolve_route(T).unwrap();
        expect(&ch, EventType::RouteResolved);
        c.create_qp_default().unwrap();
        c.connect(&ConnParam::default()).unwrap();
        let ev = ch.get_event_timeout(T).unwrap().expect("event");
        assert_eq!(ev.kind(), EventType::Established, "status {}", ev.status());
        drop(ev);
        assert!(t0.elapsed() < T);
        c.disconnect().unwrap();
        expect(&ch, EventType::Disconnected);
    });
}

#[test]
fn address_added_after_the_device_opened_is_usable() {
    let Some(t) = two_hosts("address_added_after_the_device_opened_is_usable") else {
        return;
    };
    let (a, b) = (t.host("a"), t.host("b"));
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| wildcard_server(b, "eth0", "192.0.2.20", tx));
        rx.recv().unwrap();
        // The listener opened b's eth0 device with 192.0.2.2; now a new address.
        sh(b, &["addr", "add", "192.0.2.20/24", "dev", "eth0"]);
        client_connects(a, "192.0.2.20:7471");
    });
}

#[test]
fn wildcard_listener_gets_a_netdev_added_after_listen() {
    let Some(t) = two_hosts("wildcard_listener_gets_a_netdev_added_after_listen") else {
        return;
    };
    let (a, b) = (t.host("a"), t.host("b"));
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| wildcard_server(b, "eth1", "198.51.100.2", tx));
        rx.recv().unwrap();
        // A second link between the hosts, made after the listen.
        sh(
            a,
            &[
                "link",
                "add",
                "eth1",
                "type",
                "veth",
                "peer",
                "name",
                "eth1",
                "netns",
                b.netns(),
            ],
        );
        sh(a, &["addr", "add", "198.51.100.1/24", "dev", "eth1"]);
        sh(b, &["addr", "add", "198.51.100.2/24", "dev", "eth1"]);
        sh(a, &["link", "set", "eth1", "up"]);
        sh(b, &["link", "set", "eth1", "up"]);
        with_resolver(a, |r| wait_running(r, "eth1"));
        with_resolver(b, |r| wait_running(r, "eth1"));
        client_connects(a, "198.51.100.2:7471");
    });
}
