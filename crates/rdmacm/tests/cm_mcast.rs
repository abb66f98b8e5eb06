//! Multicast (issue 33) between namespace hosts on one bridged segment (root; SKIPPED
//! otherwise): every member gets every datagram once and byte-exact, in every process that
//! joined and in none that did not; leave, send-only, block-self-loopback, bad input, link
//! down, IPv6 groups. `RDMA_MCAST_COUNT` datagrams per sender (default 32; full: 1000).

mod support_mcast;

use std::io::{Read, Write};
use std::net::IpAddr;
use std::sync::mpsc;
use std::time::Duration;

use rdma_testhosts::{require_root, Host};
use rdmacm::cm::{CmId, Cma, EventChannel, EventType, McJoinFlags, PortSpace};
use support_mcast::*;

const GROUP: &str = "239.1.2.3:0";

/// A member process (this test binary re-run in a host): `MCAST_CHILD` = "bind group
/// recvs join", where join is `full`, `none` (a UD QP on the address that does not join).
#[test]
#[ignore = "run by the tests below as a member process"]
fn child_member() {
    let Ok(spec) = std::env::var("MCAST_CHILD") else {
        return;
    };
    let f: Vec<&str> = spec.split(' ').collect();
    let mut m = Member::new(f[0], f[1], f[2].parse().unwrap(), false);
    if f[3] == "full" {
        m.join(McJoinFlags::FullMember);
    }
    println!("READY {}", m.qp.qpn());
    std::io::stdout().flush().unwrap();
    // the parent closes stdin once the sender is done
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    for g in m.collect(Duration::from_millis(500)) {
        println!("{}", g.line());
    }
    println!("END");
    std::io::stdout().flush().unwrap();
}

/// The source (host a's 192.0.2.1) and group (`GROUP`) of a datagram from host a.
fn from_a() -> (IpAddr, IpAddr) {
    ("192.0.2.1".parse().unwrap(), sa(GROUP).ip())
}

/// Waits (at most `T`) for `r`'s MULTICAST_ERROR, passing over other events; returns it.
fn multicast_error(r: &Member, what: &str) -> rdmacm::cm::Event {
    let deadline = std::time::Instant::now() + T;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ev =
            r.ch.get_event_timeout(left)
                .unwrap()
                .unwrap_or_else(|| panic!("no MULTICAST_ERROR {what}"));
        if ev.kind() == EventType::MulticastError {
            assert_eq!(ev.status(), -libc::ENETRESET);
            return ev;
        }
    }
}

/// Runs `f` on a current-thread runtime (the async tests' members).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// An async full member of `GROUP` from `bind`, in its own context.
async fn join_async(bind: &str) -> rdmacm::Multicast {
    rdmacm::Multicast::join_with(
        sa(bind),
        sa(GROUP),
        McJoinFlags::FullMember,
        false,
        Some(Cma::new().unwrap()),
    )
    .await
    .unwrap()
}

/// The next `n` datagrams of `m` (each within `T`).
async fn recv_n(m: &mut rdmacm::Multicast, n: usize, what: &str) -> Vec<rdmacm::Datagram> {
    let mut got = Vec::new();
    for _ in 0..n {
        let d = tokio::time::timeout(T, m.recv())
            .await
            .unwrap_or_else(|_| panic!("{what}"))
            .unwrap();
        got.push(d);
    }
    got
}

/// A sender in host `h` from `bind`: joins as `flags` and sends `n` datagrams of `tag`;
/// returns its QPN.
fn send_from(h: &Host, bind: &str, group: &str, tag: u32, n: u32) -> u32 {
    h.run(|| {
        let mut s = Member::new(bind, group, 0, false);
        s.join(McJoinFlags::FullMember);
        s.send(tag, 0..n);
        s.qp.qpn()
    })
}

#[test]
fn three_receivers_in_two_processes_and_another_host_get_every_datagram_once() {
    if !require_root("three_receivers_in_two_processes_and_another_host_get_every_datagram_once") {
        return;
    }
    let t = bridged();
    let n = count() as u32;
    let recvs = 2 * n as usize;
    let spec = |bind: &str, join: &str| format!("{bind} {GROUP} {recvs} {join}");
    let b1 = Proc::start(t.host("b"), &spec("192.0.2.2:0", "full"));
    let b2 = Proc::start(t.host("b"), &spec("192.0.2.2:0", "full"));
    let c = Proc::start(t.host("c"), &spec("192.0.2.3:0", "full"));
    // a process on the same address that has a UD QP but did not join
    let b3 = Proc::start(t.host("b"), &spec("192.0.2.2:0", "none"));
    for p in [&b1, &b2, &c, &b3] {
        p.ready();
    }
    let qpn = send_from(t.host("a"), "192.0.2.1:0", GROUP, 7, n);
    let (src, group) = from_a();
    assert_once("b, process 1", &b1.finish(), 7, n, qpn, src, group);
    assert_once("b, process 2", &b2.finish(), 7, n, qpn, src, group);
    assert_once("c", &c.finish(), 7, n, qpn, src, group);
    let stray = b3.finish();
    assert!(
        stray.is_empty(),
        "a process that did not join got {} datagrams",
        stray.len()
    );
}

/// Receivers on `b` in one process: a full member `r` and a send-only member `s`; after
/// `r` leaves, nothing more reaches it.
#[test]
fn send_only_receives_nothing_and_leave_stops_delivery() {
    if !require_root("send_only_receives_nothing_and_leave_stops_delivery") {
        return;
    }
    let t = bridged();
    let n = count() as u32;
    let (ready_tx, ready_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (res_tx, res_rx) = mpsc::channel();
    let b = t.host("b").clone();
    let recv = std::thread::spawn(move || {
        b.run(move || {
            let mut r = Member::new("192.0.2.2:0", GROUP, 4 * n as usize, false);
            let mut s = Member::new("192.0.2.2:0", GROUP, 4 * n as usize, false);
            r.join(McJoinFlags::FullMember);
            s.join(McJoinFlags::SendOnlyFullMember);
            assert!(s.qp.mcast_groups().is_empty(), "a send-only QP is attached");
            ready_tx.send(()).unwrap();
            // phase 1: both members
            go_rx.recv().unwrap();
            let first = r.collect(Duration::from_millis(300));
            let only = s.collect(Duration::from_millis(300));
            r.id.leave_multicast(sa(GROUP)).unwrap();
            assert!(r.qp.mcast_groups().is_empty());
            ready_tx.send(()).unwrap();
            // phase 2: after the leave
            go_rx.recv().unwrap();
            let after = r.collect(Duration::from_millis(500));
            res_tx.send((first, only, after)).unwrap();
        })
    });
    ready_rx.recv_timeout(T).unwrap();
    let a = t.host("a");
    let qpn = a.run(move || {
        let mut snd = Member::new("192.0.2.1:0", GROUP, 0, false);
        snd.join(McJoinFlags::FullMember);
        snd.send(1, 0..n);
        go_tx.send(()).unwrap();
        ready_rx.recv_timeout(T).unwrap();
        snd.send(2, 0..n);
        go_tx.send(()).unwrap();
        snd.qp.qpn()
    });
    let (first, only, after) = res_rx.recv_timeout(T).unwrap();
    recv.join().unwrap();
    let (src, group) = from_a();
    assert_once("full member", &first, 1, n, qpn, src, group);
    assert!(
        only.is_empty(),
        "the send-only member got {} datagrams",
        only.len()
    );
    assert!(
        after.is_empty(),
        "after leave_multicast: {} datagrams",
        after.len()
    );
}

/// Two members in one process on `a`: `l` blocks its own loopback (mckey -l), `o` does
/// not. `l`'s datagrams reach `o` but not `l`; `o`'s reach both.
#[test]
fn block_self_loopback_skips_only_the_qps_own_datagrams() {
    if !require_root("block_self_loopback_skips_only_the_qps_own_datagrams") {
        return;
    }
    let t = bridged();
    let n = count() as u32;
    t.host("a").run(|| {
        let mut l = Member::new("192.0.2.1:0", GROUP, 4 * n as usize, true);
        let mut o = Member::new("192.0.2.1:0", GROUP, 4 * n as usize, false);
        l.join(McJoinFlags::FullMember);
        o.join(McJoinFlags::FullMember);
        // senders: a third and fourth id with no receives, sending as l and o would:
        // the QPN blocked is the receiving QP's own, so l and o send themselves
        let (src, group) = from_a();
        send_then(&l, 3, n);
        let at_o = o.collect(Duration::from_millis(300));
        let at_l = l.collect(Duration::from_millis(300));
        assert_once("the other QP", &at_o, 3, n, l.qp.qpn(), src, group);
        assert!(
            at_l.is_empty(),
            "-l: the sender got {} of its own",
            at_l.len()
        );
        send_then(&o, 4, n);
        let at_o = o.collect(Duration::from_millis(300));
        let at_l = l.collect(Duration::from_millis(300));
        assert_once("own loopback", &at_o, 4, n, o.qp.qpn(), src, group);
        assert_once(
            "the blocking QP, from another",
            &at_l,
            4,
            n,
            o.qp.qpn(),
            src,
            group,
        );
        let dev = l.id.device().unwrap();
        assert_eq!(dev.runtime_stats().mcast_loopback_blocked, u64::from(n));
        // destroying the id leaves its groups, even while the QP lives on
        let qp = o.qp.clone();
        drop(o);
        assert!(
            qp.mcast_groups().is_empty(),
            "destroying the id detaches its QP"
        );
    });
}

#[test]
fn bad_joins_are_einval_and_a_second_join_is_another_join() {
    if !require_root("bad_joins_are_einval_and_a_second_join_is_another_join") {
        return;
    }
    let t = bridged();
    t.host("b").run(|| {
        let cma = Cma::new().unwrap();
        let ch = EventChannel::with_cma(&cma).unwrap();
        // before resolve (no address, no device)
        let idle = CmId::new(&ch, PortSpace::Udp).unwrap();
        let e = idle
            .join_multicast(sa(GROUP), McJoinFlags::FullMember, 0)
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
        assert!(e.to_string().contains("resolve"), "{e}");
        // an RC id
        let rc = CmId::new(&ch, PortSpace::Tcp).unwrap();
        rc.bind_addr(sa("192.0.2.2:0")).unwrap();
        let e = rc
            .join_multicast(sa(GROUP), McJoinFlags::FullMember, 0)
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
        assert!(e.to_string().contains("UD"), "{e}");
        // a unicast address
        let ud = CmId::new(&ch, PortSpace::Udp).unwrap();
        ud.bind_addr(sa("192.0.2.2:0")).unwrap();
        let e = ud
            .join_multicast(sa("192.0.2.3:0"), McJoinFlags::FullMember, 0)
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
        assert!(e.to_string().contains("not a multicast"), "{e}");
        // the other family
        let e = ud
            .join_multicast(sa("[ff0e::1]:0"), McJoinFlags::FullMember, 0)
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
        // leaving a group never joined: EADDRNOTAVAIL, as librdmacm
        let e = ud.leave_multicast(sa(GROUP)).unwrap_err();
        assert_eq!(e.errno(), libc::EADDRNOTAVAIL, "{e}");
        drop(ch);
    });
    // the same group twice on one id (bound, not resolved: Linux allows both): two joins,
    // two events, one copy per datagram; the QP stays attached until the last leave
    let n = 8u32;
    let (tx, rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let b = t.host("b").clone();
    let recv = std::thread::spawn(move || {
        b.run(move || {
            let mut r = Member::new("192.0.2.2:0", GROUP, 8 * n as usize, false);
            r.join(McJoinFlags::FullMember);
            r.join(McJoinFlags::FullMember);
            tx.send(Vec::new()).unwrap();
            go_rx.recv().unwrap();
            let twice = r.collect(Duration::from_millis(300));
            r.id.leave_multicast(sa(GROUP)).unwrap();
            assert_eq!(
                r.qp.mcast_groups().len(),
                1,
                "still attached after one leave"
            );
            tx.send(twice).unwrap();
            go_rx.recv().unwrap();
            let once_left = r.collect(Duration::from_millis(300));
            r.id.leave_multicast(sa(GROUP)).unwrap();
            assert!(r.qp.mcast_groups().is_empty());
            tx.send(once_left).unwrap();
        })
    });
    rx.recv_timeout(T).unwrap();
    let a = t.host("a");
    let qpn = a.run(move || {
        let mut s = Member::new("192.0.2.1:0", GROUP, 0, false);
        s.join(McJoinFlags::FullMember);
        s.send(5, 0..n);
        go_tx.send(()).unwrap();
        let first = rx.recv_timeout(T).unwrap();
        s.send(6, 0..n);
        go_tx.send(()).unwrap();
        (s.qp.qpn(), first, rx)
    });
    let (qpn, twice, rx) = qpn;
    let once_left = rx.recv_timeout(T).unwrap();
    recv.join().unwrap();
    let (src, group) = from_a();
    assert_once("joined twice", &twice, 5, n, qpn, src, group);
    assert_once("one join left", &once_left, 6, n, qpn, src, group);
}

#[test]
fn link_down_or_address_removed_gives_multicast_error() {
    if !require_root("link_down_or_address_removed_gives_multicast_error") {
        return;
    }
    let t = bridged();
    let b = t.host("b");
    b.run(|| {
        let mut r = Member::new("192.0.2.2:0", GROUP, 4, false);
        r.join(McJoinFlags::FullMember);
        // a joined group is quiet while nothing changes (no neighbour to watch for it)
        if let Some(ev) = r.ch.get_event_timeout(Duration::from_millis(500)).unwrap() {
            panic!("{} before any change", ev.kind());
        }
        b.ip(&["link", "set", "eth0", "down"]).unwrap();
        let ev = multicast_error(&r, "after the link went down");
        let m = ev.mcast().expect("the join");
        assert_eq!((m.group, m.context), (sa(GROUP).ip(), 0x5eed));
    });
    // the source address removed on c: the group is lost too
    let c = t.host("c");
    c.run(|| {
        let mut r = Member::new("192.0.2.3:0", GROUP, 4, false);
        r.join(McJoinFlags::FullMember);
        c.ip(&["addr", "del", "192.0.2.3/24", "dev", "eth0"])
            .unwrap();
        multicast_error(&r, "after the address was removed");
    });
}

#[test]
fn ipv6_group_reaches_every_member_once() {
    if !require_root("ipv6_group_reaches_every_member_once") {
        return;
    }
    let t = bridged();
    let n = count() as u32;
    let g6 = "[ff0e::1:3]:0";
    let spec = |bind: &str| format!("{bind} {g6} {} full", 2 * n);
    let b = Proc::start(t.host("b"), &spec("[2001:db8::2]:0"));
    let c = Proc::start(t.host("c"), &spec("[2001:db8::3]:0"));
    b.ready();
    c.ready();
    let qpn = send_from(t.host("a"), "[2001:db8::1]:0", g6, 9, n);
    let (src, group): (IpAddr, IpAddr) =
        ("2001:db8::1".parse().unwrap(), "ff0e::1:3".parse().unwrap());
    assert_once("b", &b.finish(), 9, n, qpn, src, group);
    assert_once("c", &c.finish(), 9, n, qpn, src, group);
}

/// The async layer: a `Multicast` on `b` receives what one on `a` sends, byte for byte,
/// and the sender gets its own back (looped back by the kernel).
#[test]
fn async_multicast_sends_and_yields_datagrams() {
    if !require_root("async_multicast_sends_and_yields_datagrams") {
        return;
    }
    let t = bridged();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (res_tx, res_rx) = mpsc::channel();
    let b = t.host("b").clone();
    let recv = std::thread::spawn(move || {
        b.run(move || {
            block_on(async {
                let mut m = join_async("192.0.2.2:0").await;
                ready_tx.send(()).unwrap();
                res_tx.send(recv_n(&mut m, 3, "no datagram").await).unwrap();
            })
        })
    });
    ready_rx.recv_timeout(T).unwrap();
    let (qpn, own) = t.host("a").run(|| {
        block_on(async {
            let mut m = join_async("192.0.2.1:0").await;
            for i in 0..3u8 {
                m.send(&vec![i; 100 + usize::from(i)]).await.unwrap();
            }
            let own = recv_n(&mut m, 3, "no own copy").await;
            (m.qpn(), own)
        })
    });
    let got = res_rx.recv_timeout(T).unwrap();
    recv.join().unwrap();
    for (i, d) in got.iter().chain(own.iter()).enumerate() {
        let k = (i % 3) as u8;
        assert_eq!(d.data, vec![k; 100 + usize::from(k)], "datagram {i}");
        assert_eq!(
            (d.src, d.src_qp, d.imm),
            (sa("192.0.2.1:0").ip(), qpn, None)
        );
    }
}
