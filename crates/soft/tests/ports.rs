//! Devices with several ports (device groups): the port API and its errors, QPs and AHs
//! on their port's GID table, one memory key space for QPs on every port. On loopback
//! (127.0.171.0/24, 127.0.172.0/24), and, as root, between two namespace hosts joined by two
//! veth pairs on two subnets, with a capture showing each QP's traffic on its port's link.

use std::time::{Duration, Instant};

use rdma_soft::io::WireAddr;
use rdma_soft::verbs::*;
use rdma_testhosts::capture::{Capture, Roce};
use rdma_testhosts::{require_root, topologies, Host};

/// Bytes each QP moves each way.
const LEN: usize = 96 << 10;
/// Hang guard of every wait.
const GUARD: Duration = Duration::from_secs(120);

fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
}

fn addr(s: &str) -> WireAddr {
    s.parse().unwrap()
}

/// A config on `lo` with port 1 holding `p1` and port 2 (also on `lo`, MTU 1500) `p2`.
fn two_port_lo(p1: &[&str], p2: &[&str]) -> DeviceConfig {
    let mut cfg = DeviceConfig::for_netdev("lo").unwrap();
    cfg.name = "grp".into();
    cfg.gids = p1.iter().map(|s| addr(s)).collect();
    cfg.more_ports = vec![PortConfig {
        netdev: "lo".into(),
        netdev_mtu: 1500,
        up: true,
        gids: p2.iter().map(|s| addr(s)).collect(),
    }];
    cfg
}

fn pattern(len: usize, salt: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8 ^ salt as u8)
        .collect()
}

#[test]
fn port_api_and_errors() {
    let dev = Device::open(two_port_lo(&["127.0.171.1"], &["127.0.171.2"])).unwrap();
    assert_eq!(dev.port_count(), 2);
    assert_eq!(dev.query_device().phys_port_cnt, 2);
    let (p1, p2) = (dev.query_port(1).unwrap(), dev.query_port(2).unwrap());
    assert_eq!((p1.active_mtu, p2.active_mtu), (Mtu::Mtu4096, Mtu::Mtu1024));
    assert_eq!((p1.netdev_mtu, p2.netdev_mtu), (65536, 1500));
    for bad in [0, 3, 255] {
        assert_eq!(dev.query_port(bad).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(dev.gids_on(bad).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(
            dev.add_gid_on(bad, addr("127.0.171.9"))
                .unwrap_err()
                .errno(),
            libc::EINVAL
        );
        assert_eq!(
            dev.set_port_state(bad, false).unwrap_err().errno(),
            libc::EINVAL
        );
        assert!(!dev.remove_gid_on(bad, addr("127.0.171.1").ip()));
        assert_eq!(dev.gid_index_on(bad, addr("127.0.171.1").ip()), None);
    }
    // per-port tables; the single-port methods mean port 1
    assert_eq!(dev.gids(), vec![addr("127.0.171.1")]);
    assert_eq!(dev.gids_on(2).unwrap(), vec![addr("127.0.171.2")]);
    assert_eq!(dev.add_gid_on(2, addr("127.0.171.3")).unwrap(), 1);
    assert_eq!(dev.add_gid_on(2, addr("127.0.171.3")).unwrap(), 1);
    assert_eq!(dev.query_port(2).unwrap().gid_tbl_len, 2);
    assert_eq!(dev.query_port(1).unwrap().gid_tbl_len, 1);
    assert_eq!(dev.gid_index(addr("127.0.171.3").ip()), None);
    assert_eq!(dev.gid_index_on(2, addr("127.0.171.3").ip()), Some(1));
    assert_eq!(dev.port_of(addr("127.0.171.1").ip()), Some((1, 0)));
    assert_eq!(dev.port_of(addr("127.0.171.3").ip()), Some((2, 1)));
    assert_eq!(dev.port_of(addr("127.0.171.4").ip()), None);
    assert!(dev.remove_gid_on(2, addr("127.0.171.2").ip()));
    assert_eq!(dev.port_of(addr("127.0.171.3").ip()), Some((2, 0)));
    assert!(!dev.remove_gid_on(1, addr("127.0.171.3").ip()));
    assert_eq!(dev.port_netdev(2).unwrap(), "lo");
    // port state: only the port asked for changes
    dev.set_port_state(2, false).unwrap();
    assert_eq!(dev.query_port(2).unwrap().state, PortState::Down);
    assert_eq!(dev.query_port(1).unwrap().state, PortState::Active);
    dev.set_port_state(2, true).unwrap();
    assert_eq!(dev.query_port(2).unwrap().state, PortState::Active);
}

#[test]
fn configs_the_device_refuses() {
    let e = |r: rdma_soft::Result<DeviceConfig>| r.unwrap_err().errno();
    assert_eq!(e(DeviceConfig::group("g", &[])), libc::EINVAL);
    assert_eq!(e(DeviceConfig::group("g", &["lo", "lo"])), libc::EINVAL);
    assert_eq!(e(DeviceConfig::group("g", &["lo"; 9])), libc::EINVAL);
    assert_ne!(e(DeviceConfig::group("g", &["lo", "no-such-if0"])), 0);
    let g = DeviceConfig::group("g", &["lo"]).unwrap();
    assert_eq!((g.name.as_str(), g.port_count()), ("g", 1));
    // too many ports, a port MTU too small, a GID table too long
    let mut cfg = two_port_lo(&[], &[]);
    cfg.more_ports = vec![cfg.more_ports[0].clone(); MAX_PORTS];
    assert_eq!(Device::open(cfg).unwrap_err().errno(), libc::EINVAL);
    let mut cfg = two_port_lo(&[], &[]);
    cfg.more_ports[0].netdev_mtu = 300;
    assert_eq!(Device::open(cfg).unwrap_err().errno(), libc::EINVAL);
    let mut cfg = two_port_lo(&[], &[]);
    cfg.more_ports[0].gids = (0..=MAX_GIDS as u32)
        .map(|i| WireAddr::new(std::net::Ipv4Addr::from(0x7f00_0000 + i).into(), 0))
        .collect();
    assert_eq!(Device::open(cfg).unwrap_err().errno(), libc::ENOMEM);
    let mut cfg = two_port_lo(&[], &[]);
    cfg.more_ports.push(PortConfig {
        up: false,
        ..cfg.more_ports[0].clone()
    });
    let dev = Device::open(cfg).unwrap();
    assert_eq!(dev.port_count(), 3);
    assert_eq!(dev.query_port(3).unwrap().state, PortState::Down);
}

#[test]
fn qps_and_ahs_check_their_port() {
    use QpAttrMask as M;
    let dev = Device::open(two_port_lo(&["127.0.171.11"], &["127.0.171.12"])).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let (mut a, m) = QpAttr::init(QpAttr::RC_ACCESS);
    a.port_num = 3;
    assert_eq!(qp.modify(&a, m).unwrap_err().errno(), libc::EINVAL);
    a.port_num = 2;
    qp.modify(&a, m).unwrap();
    assert_eq!(qp.query().unwrap().port_num, 2);
    // RTR on port 2: its table has one entry and its MTU is 1024
    let mut r = a;
    r.qp_state = QpState::Rtr;
    r.path.dgid = addr("127.0.171.19").gid();
    r.path.sgid_index = 1;
    r.path_mtu = Mtu::Mtu1024;
    r.dest_qp_num = 0x99;
    let rtr = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    let rtr = rtr | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    assert_eq!(qp.modify(&r, rtr).unwrap_err().errno(), libc::EINVAL);
    r.path.sgid_index = 0;
    r.path_mtu = Mtu::Mtu2048;
    assert_eq!(qp.modify(&r, rtr).unwrap_err().errno(), libc::EINVAL);
    r.path_mtu = Mtu::Mtu1024;
    qp.modify(&r, rtr).unwrap();
    assert_eq!(qp.query().unwrap().qp_state, QpState::Rtr);
    // connect_on checks the port too
    let qp2 = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let dgid = addr("127.0.171.19").gid();
    assert_eq!(
        qp2.connect_on(3, 5, 0, 0, dgid).unwrap_err().errno(),
        libc::EINVAL
    );
    // AHs: from the port's table
    let path = PathAttr {
        dgid,
        ..PathAttr::default()
    };
    assert_eq!(pd.create_ah(&path).unwrap().local(), addr("127.0.171.11"));
    assert_eq!(
        pd.create_ah_on(2, &path).unwrap().local(),
        addr("127.0.171.12")
    );
    assert_eq!(pd.create_ah_on(3, &path).unwrap_err().errno(), libc::EINVAL);
    let far = PathAttr {
        sgid_index: 1,
        ..path
    };
    assert_eq!(pd.create_ah_on(2, &far).unwrap_err().errno(), libc::EINVAL);
    // UD: the port set at Init is the one it reports and receives on
    let ud = pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    assert_eq!(ud.ud_ready_port(3, 7).unwrap_err().errno(), libc::EINVAL);
    ud.ud_ready_port(2, 7).unwrap();
    let q = ud.query().unwrap();
    assert_eq!((q.port_num, q.path_mtu), (2, Mtu::Mtu1024));
}

/// Waits for `n` successful completions of `cq`.
fn completions(cq: &CompletionQueue, n: usize) {
    let end = Instant::now() + GUARD;
    let mut got = Vec::new();
    while got.len() < n {
        assert!(Instant::now() < end, "{} of {n} completions", got.len());
        let room = n - got.len();
        if cq.poll(&mut got, room) == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    for c in &got {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
    }
}

/// One end: a device, a PD, a CQ, one region of `4 * LEN` bytes shared by its QPs.
struct End {
    qps: Vec<QueuePair>,
    mr: MemoryRegion,
    cq: CompletionQueue,
    _pd: ProtectionDomain,
    dev: Device,
}

fn end(dev: Device, qps: usize) -> End {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256, None).unwrap();
    let qps = (0..qps)
        .map(|_| pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap())
        .collect();
    let mr = pd.register(vec![0u8; 4 * LEN], all_access()).unwrap();
    End {
        qps,
        mr,
        cq,
        _pd: pd,
        dev,
    }
}

/// Over `h.qps[k]` / `b.qps[k]`: `h` WRITEs `LEN` bytes from its shared region to `b`;
/// `b` WRITEs into and READs back from `h`'s shared region at the QP's own slot. Every byte
/// lands exactly.
fn exchange(h: &End, b: &End, k: usize) {
    let slot = |k: usize| 2 * k * LEN;
    let (ph, pb) = (pattern(LEN, 2 * k as u32), pattern(LEN, 2 * k as u32 + 1));
    h.mr.write(slot(k), &ph).unwrap();
    b.mr.write(slot(k), &pb).unwrap();
    let w = |src: &End, dst: &End, id| {
        SendWr::new(
            id,
            SendOp::RdmaWrite {
                remote_addr: dst.mr.addr() + (slot(k) + LEN) as u64,
                rkey: dst.mr.rkey(),
            },
        )
        .with_sge(src.mr.sge(slot(k), LEN as u32).unwrap())
        .signaled()
    };
    h.qps[k].post_send(&w(h, b, 1)).unwrap();
    b.qps[k].post_send(&w(b, h, 2)).unwrap();
    completions(&h.cq, 1);
    completions(&b.cq, 1);
    // b reads back what it wrote into h's region, into its own spare slot
    let read = SendWr::new(
        3,
        SendOp::RdmaRead {
            remote_addr: h.mr.addr() + (slot(k) + LEN) as u64,
            rkey: h.mr.rkey(),
        },
    )
    .with_sge(b.mr.sge(slot(k) + LEN, LEN as u32).unwrap())
    .signaled();
    let mut got = vec![0u8; LEN];
    h.mr.read(slot(k) + LEN, &mut got).unwrap();
    assert!(
        got == pb,
        "QP {k}: the WRITE into the shared region arrived changed"
    );
    b.mr.read(slot(k) + LEN, &mut got).unwrap();
    assert!(got == ph, "QP {k}: h's WRITE arrived changed");
    b.qps[k].post_send(&read).unwrap();
    completions(&b.cq, 1);
    b.mr.read(slot(k) + LEN, &mut got).unwrap();
    assert!(
        got == pb,
        "QP {k}: the READ of the shared region came back changed"
    );
}

#[test]
fn one_region_serves_qps_on_both_ports() {
    let h = end(
        Device::open(two_port_lo(&["127.0.172.1"], &["127.0.172.2"])).unwrap(),
        2,
    );
    // b: two ports as well, so that each pair's ends agree on the path MTU
    let b = end(
        Device::open(two_port_lo(&["127.0.172.9"], &["127.0.172.10"])).unwrap(),
        2,
    );
    let pairs = [
        (1, "127.0.172.1", "127.0.172.9"),
        (2, "127.0.172.2", "127.0.172.10"),
    ];
    for (k, (port, hip, bip)) in pairs.into_iter().enumerate() {
        let (hq, bq) = (h.qps[k].qpn(), b.qps[k].qpn());
        h.qps[k]
            .connect_on(port, bq, 0x20, 0x10, addr(bip).gid())
            .unwrap();
        b.qps[k]
            .connect_on(port, hq, 0x10, 0x20, addr(hip).gid())
            .unwrap();
        assert_eq!(h.qps[k].query().unwrap().port_num, port);
        assert_eq!(h.qps[k].last_rx_port(), None);
    }
    exchange(&h, &b, 0);
    exchange(&h, &b, 1);
    // b accepts packets only from the address it connected to: port 2's QP sent from
    // port 2's address, port 1's from port 1's
    assert_eq!(b.dev.runtime_stats().wrong_path, 0);
    assert_eq!(h.dev.runtime_stats().wrong_path, 0);
    for e in [&h, &b] {
        // each QP's packets arrived on its own port
        for (k, qp) in e.qps.iter().enumerate() {
            assert_eq!(qp.last_rx_port(), Some(k as u8 + 1));
        }
        let rx = e.dev.rx_by_port();
        assert_eq!(rx[0], 0, "{rx:?}");
        assert!(rx[1] > 0 && rx[2] > 0, "{rx:?}");
        assert_eq!(e.dev.mr_count(), 1);
    }
}

/// A two-port device on `h` (its `if0`, `if1` with `ip0`, `ip1`), `qps` RC QPs.
fn group_end(h: &Host, ifs: [&str; 2], ips: [&str; 2], qps: usize) -> End {
    let dev = h.run(|| {
        let mut cfg = DeviceConfig::group("ha0", &ifs).unwrap();
        cfg.gids = vec![addr(ips[0])];
        cfg.more_ports[0].gids = vec![addr(ips[1])];
        Device::open(cfg).unwrap()
    });
    end(dev, qps)
}

#[test]
fn group_qps_send_on_their_own_port() {
    if !require_root("group_qps_send_on_their_own_port") {
        return;
    }
    const H: [&str; 2] = ["192.0.2.1", "198.51.100.1"];
    const B: [&str; 2] = ["192.0.2.2", "198.51.100.2"];
    let topo = topologies::two_hosts_two_links().unwrap();
    let (hh, hb) = (topo.host("h").clone(), topo.host("b").clone());
    for (host, d) in [(&hh, "h0"), (&hh, "h1"), (&hb, "b0"), (&hb, "b1")] {
        host.wait_carrier(d);
    }
    let h = group_end(&hh, ["h0", "h1"], H, 2);
    let b = group_end(&hb, ["b0", "b1"], B, 2);
    assert_eq!(h.dev.port_netdev(2).unwrap(), "h1");
    let rec = hh.run(|| Capture::open("h1")).unwrap().record();
    for k in 0..2 {
        let port = k as u8 + 1;
        let (hq, bq) = (h.qps[k].qpn(), b.qps[k].qpn());
        hh.run(|| h.qps[k].connect_on(port, bq, 0x20, 0x10, addr(B[k]).gid()))
            .unwrap();
        hb.run(|| b.qps[k].connect_on(port, hq, 0x10, 0x20, addr(H[k]).gid()))
            .unwrap();
    }
    exchange(&h, &b, 0);
    exchange(&h, &b, 1);
    let pkts: Vec<Roce> = rec.stop().iter().filter_map(|p| Roce::parse(p)).collect();
    let (h1, b1) = (h.qps[0].qpn(), b.qps[0].qpn());
    let (h2, b2) = (h.qps[1].qpn(), b.qps[1].qpn());
    let seen = |src: &str, qp: u32| {
        let src: std::net::IpAddr = src.parse().unwrap();
        pkts.iter()
            .filter(|r| r.src == src && r.dest_qp == qp)
            .count()
    };
    assert!(seen(H[1], b2) > 0, "no port 2 traffic of h on h1");
    assert!(seen(B[1], h2) > 0, "no port 2 traffic of b on h1");
    let port1_on_h1 = pkts
        .iter()
        .filter(|r| r.dest_qp == h1 || r.dest_qp == b1)
        .count();
    assert_eq!(port1_on_h1, 0, "port 1's QPs seen on h1");
    for e in [&h, &b] {
        let rx = e.dev.rx_by_port();
        assert!(rx[1] > 0 && rx[2] > 0 && rx[0] == 0, "{rx:?}");
        let ports: Vec<_> = e.qps.iter().map(|q| q.last_rx_port()).collect();
        assert_eq!(ports, [Some(1), Some(2)]);
        assert_eq!(e.dev.runtime_stats().wrong_path, 0);
        assert_eq!(e.dev.mr_count(), 1);
    }
    // a link event on port 2: query_port says so, port 1 stays
    h.dev.set_port_state(2, false).unwrap();
    assert_eq!(h.dev.query_port(2).unwrap().state, PortState::Down);
    assert_eq!(h.dev.query_port(1).unwrap().state, PortState::Active);
}

#[test]
fn a_ud_qp_on_port_2_sends_and_receives_on_port_2s_address() {
    let a = Device::open(two_port_lo(&["127.0.171.41"], &["127.0.171.42"])).unwrap();
    let mut cfg = DeviceConfig::for_netdev("lo").unwrap();
    cfg.gids = vec![addr("127.0.171.49")];
    let b = Device::open(cfg).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cqa, cqb) = (
        a.create_cq(16, None).unwrap(),
        b.create_cq(16, None).unwrap(),
    );
    let qa = pa.create_qp(&QpInitAttr::ud(&cqa, &cqa)).unwrap();
    let qb = pb.create_qp(&QpInitAttr::ud(&cqb, &cqb)).unwrap();
    qa.ud_ready_port(2, 0x77).unwrap();
    qb.ud_ready(0x77).unwrap();
    let (ma, mb) = (
        pa.register(vec![0u8; 1024], AccessFlags::LOCAL_WRITE)
            .unwrap(),
        pb.register(vec![0u8; 1024], AccessFlags::LOCAL_WRITE)
            .unwrap(),
    );
    let to_b = pa
        .create_ah_on(
            2,
            &PathAttr {
                dgid: addr("127.0.171.49").gid(),
                ..PathAttr::default()
            },
        )
        .unwrap();
    ma.write(0, b"from port 2").unwrap();
    qb.post_recv(&RecvWr::new(1).with_sge(mb.sge(0, 1024).unwrap()))
        .unwrap();
    let wr = SendWr::new(2, SendOp::Send)
        .with_sge(ma.sge(0, 11).unwrap())
        .with_ud(to_b.dest(qb.qpn(), 0x77));
    qa.post_send(&wr).unwrap();
    completions(&cqb, 1);
    let mut got = [0u8; 51];
    mb.read(0, &mut got).unwrap();
    assert_eq!(
        &got[32..36],
        &[127, 0, 171, 42],
        "GRH source: port 2's address"
    );
    assert_eq!(&got[40..], b"from port 2");
    // and back: b's datagram to port 2's address reaches the QP on port 2
    let to_a = pb
        .create_ah(&PathAttr {
            dgid: addr("127.0.171.42").gid(),
            ..PathAttr::default()
        })
        .unwrap();
    qa.post_recv(&RecvWr::new(3).with_sge(ma.sge(0, 1024).unwrap()))
        .unwrap();
    mb.write(0, b"to port 2").unwrap();
    let wr = SendWr::new(4, SendOp::Send)
        .with_sge(mb.sge(0, 9).unwrap())
        .with_ud(to_a.dest(qa.qpn(), 0x77));
    qb.post_send(&wr).unwrap();
    // a's CQ holds the receive (sends are unsignaled)
    completions(&cqa, 1);
    let mut back = [0u8; 49];
    ma.read(0, &mut back).unwrap();
    assert_eq!(&back[40..], b"to port 2");
    assert_eq!(a.rx_by_port()[2], 1, "{:?}", a.rx_by_port());
}
