//! DESIGN.md rows "Passive side" and "Routing changes under a connection" through the
//! connection manager, between network-namespace hosts (root; SKIPPED otherwise): a real
//! connect REJECTED with status 28 when the request's arrival netdev is down or not on
//! the reverse route; ADDR_CHANGE for CONNECTED ids (active and passive) when the route
//! or the neighbour towards the peer changes, and the connection still carries data
//! afterwards (nothing is torn down).

mod support_cm;
mod support_hosts;

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_hostview::MacAddr;
use rdma_soft::verbs::{AccessFlags, MemoryRegion, QueuePair, RecvWr, SendOp, SendWr, WcStatus};
use rdma_testhosts::{require_root, topologies, Host, Topology};
use rdmacm::cm::{CmId, Cma, ConnParam, Event, EventChannel, EventType, PortSpace, RejectCause};
use support_cm::{expect_within, sa};
use support_hosts::*;

const T: Duration = Duration::from_secs(10);

fn expect(ch: &EventChannel, kind: EventType) -> Event {
    expect_within(ch, kind, T)
}

fn no_rp_filter(h: &Host) {
    for d in ["all", "default", "eth0", "eth1", "eth2"] {
        let _ = h.set_sysctl(&format!("net/ipv4/conf/{d}/rp_filter"), "0");
    }
}

/// A second link `a:a_if` (a_cidr) — `b:b_if` (b_cidr), up and running.
fn extra_link(a: &Host, a_if: &str, a_cidr: &str, b: &Host, b_if: &str, b_cidr: &str) {
    sh(
        a,
        &[
            "link",
            "add",
            a_if,
            "type",
            "veth",
            "peer",
            "name",
            b_if,
            "netns",
            b.netns(),
        ],
    );
    sh(a, &["addr", "add", a_cidr, "dev", a_if]);
    sh(b, &["addr", "add", b_cidr, "dev", b_if]);
    sh(a, &["link", "set", a_if, "up"]);
    sh(b, &["link", "set", b_if, "up"]);
    let (ai, bi) = (a_if.to_owned(), b_if.to_owned());
    with_resolver(a, move |r| wait_running(r, &ai));
    with_resolver(b, move |r| wait_running(r, &bi));
}

fn wait_all_up(t: &Topology) {
    for h in t.hosts() {
        with_resolver(h, |r| {
            for l in r.block_on(r.resolver().view().links()).unwrap() {
                if l.name != "lo" {
                    wait_running(r, &l.name);
                }
            }
        });
    }
}

/// A listener in `h` on `addr` that must not see a CONNECT_REQUEST: its CM is paused until
/// `go` (requests wait in the GSI queue, as they would for a busy CM), then it waits for
/// events for `dur`. Returns the causes its CM refused requests for (the REJ's reason, 28,
/// is the same for several).
fn refusing_server(
    h: &Host,
    addr: &'static str,
    ready: mpsc::Sender<()>,
    go: mpsc::Receiver<()>,
    dur: Duration,
) -> Vec<(RejectCause, u64)> {
    h.run(move || {
        let cma = Cma::new().unwrap();
        let ch = EventChannel::with_cma(&cma).unwrap();
        let l = CmId::new(&ch, PortSpace::Tcp).unwrap();
        l.bind_addr(sa(addr)).unwrap();
        l.listen(0).unwrap();
        let pause = cma.pause_progress();
        ready.send(()).unwrap();
        go.recv().unwrap();
        drop(pause);
        let t0 = Instant::now();
        while t0.elapsed() < dur {
            if let Some(ev) = ch.get_event_timeout(Duration::from_millis(100)).unwrap() {
                panic!("the listener got {}", ev.kind());
            }
        }
        cma.reject_counts()
    })
}

/// Only `cause` refused the request (once, or again for a retransmission of it).
fn refused_for(counts: &[(RejectCause, u64)], cause: RejectCause) {
    assert!(
        counts.len() == 1 && counts[0].0 == cause && counts[0].1 >= 1,
        "refused for {cause} only: {counts:?}"
    );
}

/// Connects from `src` to `dst` in `h` and returns the status of REJECTED.
fn rejected_connect(
    h: &Host,
    src: Option<&'static str>,
    dst: &'static str,
    sent: mpsc::Sender<()>,
) -> i32 {
    h.run(move || {
        let cma = Cma::new().unwrap();
        let ch = EventChannel::with_cma(&cma).unwrap();
        let c = CmId::new(&ch, PortSpace::Tcp).unwrap();
        c.resolve_addr(src.map(sa), sa(dst), T).unwrap();
        expect(&ch, EventType::AddrResolved);
        c.resolve_route(T).unwrap();
        expect(&ch, EventType::RouteResolved);
        c.create_qp_default().unwrap();
        c.connect(&ConnParam::default()).unwrap();
        sent.send(()).unwrap();
        loop {
            let ev = ch.get_event_timeout(T).unwrap().expect("REJECTED");
            match ev.kind() {
                // Our own link loses its carrier when the peer's end goes down: a hint.
                EventType::AddrChange => continue,
                EventType::Rejected => return ev.status(),
                k => panic!("{k} (status {})", ev.status()),
            }
        }
    })
}

#[test]
fn passive_side_rejects_not_on_reverse_route() {
    if !require_root("passive_side_rejects_not_on_reverse_route") {
        return;
    }
    // a:eth0 — b (192.0.2.0/24), a:eth1 — c (198.51.100.0/24).
    let t = topologies::two_nics_two_subnets().unwrap();
    wait_all_up(&t);
    let (a, c) = (t.host("a"), t.host("c"));
    no_rp_filter(a);
    // c sends from 192.0.2.50 (an address of b's subnet) to a's eth1: the request arrives
    // on eth1, which has no route back to 192.0.2.50 (it is on eth0's subnet).
    sh(c, &["addr", "add", "192.0.2.50/32", "dev", "eth0"]);
    // Only the CM's own datagrams (UDP 4791) to 192.0.2.50 go back through c, so that the
    // REJ reaches it; the reverse-route check (a plain route lookup) does not see the rule.
    sh(
        a,
        &[
            "rule",
            "add",
            "to",
            "192.0.2.50",
            "ipproto",
            "udp",
            "dport",
            "4791",
            "lookup",
            "100",
            "pref",
            "100",
        ],
    );
    sh(
        a,
        &[
            "route",
            "add",
            "192.0.2.50",
            "via",
            "198.51.100.3",
            "dev",
            "eth1",
            "table",
            "100",
        ],
    );
    let (ready_tx, ready_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let (sent_tx, _sent_rx) = mpsc::channel();
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            refusing_server(
                a,
                "198.51.100.1:7471",
                ready_tx,
                go_rx,
                Duration::from_secs(2),
            )
        });
        ready_rx.recv().unwrap();
        go_tx.send(()).unwrap();
        let status = rejected_connect(c, Some("192.0.2.50:0"), "198.51.100.1:7471", sent_tx);
        assert_eq!(status, 28, "REJ reason 28 (consumer defined), as Linux");
        refused_for(&server.join().unwrap(), RejectCause::NotOnReverseRoute);
    });
}

#[test]
fn passive_side_rejects_arrival_netdev_down() {
    if !require_root("passive_side_rejects_arrival_netdev_down") {
        return;
    }
    let t = topologies::two_nics_two_subnets().unwrap();
    wait_all_up(&t);
    let (a, c) = (t.host("a"), t.host("c"));
    // A second link a:eth2 — c:eth1 carries the REJ once a:eth1 is down.
    extra_link(a, "eth2", "10.0.0.1/24", c, "eth1", "10.0.0.3/24");
    no_rp_filter(c);
    sh(
        a,
        &[
            "rule",
            "add",
            "to",
            "198.51.100.3",
            "ipproto",
            "udp",
            "dport",
            "4791",
            "lookup",
            "100",
            "pref",
            "100",
        ],
    );
    sh(
        a,
        &[
            "route",
            "add",
            "198.51.100.3",
            "via",
            "10.0.0.3",
            "dev",
            "eth2",
            "table",
            "100",
        ],
    );
    let (ready_tx, ready_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let (sent_tx, sent_rx) = mpsc::channel();
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            refusing_server(
                a,
                "198.51.100.1:7471",
                ready_tx,
                go_rx,
                Duration::from_secs(2),
            )
        });
        ready_rx.recv().unwrap();
        let client = s.spawn(|| rejected_connect(c, None, "198.51.100.1:7471", sent_tx));
        // The REQ arrives on a:eth1 and waits in the CM's socket; eth1 goes down before
        // the CM looks at it.
        sent_rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        sh(a, &["link", "set", "eth1", "down"]);
        go_tx.send(()).unwrap();
        let status = client.join().unwrap();
        assert_eq!(status, 28, "REJ reason 28 (consumer defined), as Linux");
        refused_for(&server.join().unwrap(), RejectCause::ArrivalNetdevDown);
    });
}

/// Buffers and a QP of one side of a connection, for sending over it.
struct Side {
    qp: Arc<QueuePair>,
    mr: MemoryRegion,
}

impl Side {
    fn new(qp: Arc<QueuePair>) -> Side {
        let mr = qp
            .pd()
            .register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)
            .unwrap();
        Side { qp, mr }
    }

    fn post_recv(&self, wr_id: u64) {
        self.qp
            .post_recv(&RecvWr::new(wr_id).with_sge(self.mr.sge(0, 64).unwrap()))
            .unwrap();
    }

    /// Sends `msg` and waits for its completion.
    fn send(&self, msg: &[u8]) {
        self.mr.write(0, msg).unwrap();
        self.qp
            .post_send(
                &SendWr::new(1, SendOp::Send)
                    .with_sge(self.mr.sge(0, msg.len() as u32).unwrap())
                    .signaled(),
            )
            .unwrap();
        let mut wc = Vec::new();
        let t0 = Instant::now();
        while self.qp.send_cq().poll(&mut wc, 1) == 0 {
            assert!(t0.elapsed() < T, "send did not complete");
        }
        assert_eq!(wc[0].status, WcStatus::Success);
    }

    /// Waits for a message and returns it.
    fn recv(&self) -> Vec<u8> {
        let mut wc = Vec::new();
        let t0 = Instant::now();
        while self.qp.recv_cq().poll(&mut wc, 1) == 0 {
            assert!(t0.elapsed() < T, "nothing received");
        }
        assert_eq!(wc[0].status, WcStatus::Success);
        let mut got = vec![0u8; wc[0].byte_len as usize];
        self.mr.read(0, &mut got).unwrap();
        got
    }
}

/// Steps a side takes when told.
enum Step {
    /// Wait for ADDR_CHANGE on the connected id.
    AddrChange,
    /// Send a message over the QP.
    Send(&'static [u8]),
    /// Receive a message over the QP (and check it).
    Recv(&'static [u8]),
    /// Check that the id is still connected and its QP ready to send: nothing was torn
    /// down, and no event other than ADDR_CHANGE is queued.
    Sticky,
}

/// Runs the server (listener on `addr`) in `h`: accepts one connection, then does the
/// steps it is sent, answering each with `()`.
fn stepping_server(
    h: &Host,
    addr: &'static str,
    ready: mpsc::Sender<()>,
    steps: mpsc::Receiver<Step>,
    done: mpsc::Sender<()>,
) {
    h.run(move || {
        let cma = Cma::new().unwrap();
        let lch = EventChannel::with_cma(&cma).unwrap();
        let l = CmId::new(&lch, PortSpace::Tcp).unwrap();
        l.bind_addr(sa(addr)).unwrap();
        l.listen(0).unwrap();
        ready.send(()).unwrap();
        let mut ev = expect(&lch, EventType::ConnectRequest);
        let s = ev.take_id().unwrap();
        drop(ev);
        let side = Side::new(s.create_qp_default().unwrap());
        side.post_recv(1);
        side.post_recv(2);
        s.accept(&ConnParam::default()).unwrap();
        expect(&lch, EventType::Established);
        done.send(()).unwrap();
        run_steps(&lch, &s, &side, steps, done);
    });
}

fn stepping_client(
    h: &Host,
    dst: &'static str,
    steps: mpsc::Receiver<Step>,
    done: mpsc::Sender<()>,
) {
    h.run(move || {
        let cma = Cma::new().unwrap();
        let ch = EventChannel::with_cma(&cma).unwrap();
        let c = CmId::new(&ch, PortSpace::Tcp).unwrap();
        c.resolve_addr(None, sa(dst), T).unwrap();
        expect(&ch, EventType::AddrResolved);
        c.resolve_route(T).unwrap();
        expect(&ch, EventType::RouteResolved);
        let side = Side::new(c.create_qp_default().unwrap());
        side.post_recv(1);
        side.post_recv(2);
        c.connect(&ConnParam::default()).unwrap();
        expect(&ch, EventType::Established);
        done.send(()).unwrap();
        run_steps(&ch, &c, &side, steps, done);
    });
}

fn run_steps(
    ch: &EventChannel,
    id: &CmId,
    side: &Side,
    steps: mpsc::Receiver<Step>,
    done: mpsc::Sender<()>,
) {
    for step in steps {
        match step {
            Step::AddrChange => {
                let ev = expect(ch, EventType::AddrChange);
                assert_eq!(ev.id_num(), id.num());
                assert_eq!(ev.status(), 0);
            }
            Step::Send(m) => side.send(m),
            Step::Recv(m) => assert_eq!(side.recv(), m),
            Step::Sticky => {
                assert_eq!(id.state(), rdmacm::cm::IdState::Connect);
                assert_eq!(side.qp.state(), rdma_soft::verbs::QpState::Rts);
                if let Ok(Some(ev)) = ch.get_event_timeout(Duration::from_millis(50)) {
                    assert_eq!(ev.kind(), EventType::AddrChange, "only hints, no teardown");
                }
            }
        }
        done.send(()).unwrap();
    }
}

/// A connected pair (client and server threads): the step senders and completion
/// receivers of each side.
struct Pair {
    c: mpsc::Sender<Step>,
    c_done: mpsc::Receiver<()>,
    s: mpsc::Sender<Step>,
    s_done: mpsc::Receiver<()>,
}

impl Pair {
    fn client(&self, step: Step) {
        self.c.send(step).unwrap();
        self.c_done.recv_timeout(T * 2).expect("client step");
    }
    fn server(&self, step: Step) {
        self.s.send(step).unwrap();
        self.s_done.recv_timeout(T * 2).expect("server step");
    }
    /// Data both ways over the connection.
    fn exchange(&self, n: u8) {
        let (ping, pong): (&'static [u8], &'static [u8]) = if n == 1 {
            (b"ping 1", b"pong 1")
        } else {
            (b"ping 2", b"pong 2")
        };
        self.c.send(Step::Send(ping)).unwrap();
        self.server(Step::Recv(ping));
        self.c_done.recv_timeout(T * 2).expect("client send");
        self.s.send(Step::Send(pong)).unwrap();
        self.client(Step::Recv(pong));
        self.s_done.recv_timeout(T * 2).expect("server send");
    }
}

fn with_pair(a: &Host, b: &Host, addr: &'static str, f: impl FnOnce(&Pair)) {
    let (ready_tx, ready_rx) = mpsc::channel();
    let (cs_tx, cs_rx) = mpsc::channel();
    let (cd_tx, cd_rx) = mpsc::channel();
    let (ss_tx, ss_rx) = mpsc::channel();
    let (sd_tx, sd_rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| stepping_server(b, addr, ready_tx, ss_rx, sd_tx));
        ready_rx.recv().unwrap();
        s.spawn(|| stepping_client(a, addr, cs_rx, cd_tx));
        cd_rx.recv_timeout(T).expect("client established");
        sd_rx.recv_timeout(T).expect("server established");
        let p = Pair {
            c: cs_tx,
            c_done: cd_rx,
            s: ss_tx,
            s_done: sd_rx,
        };
        f(&p);
        p.client(Step::Sticky);
        p.server(Step::Sticky);
        drop(p);
    });
}

#[test]
fn addr_change_on_route_replace() {
    if !require_root("addr_change_on_route_replace") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    wait_all_up(&t);
    let (a, b) = (t.host("a"), t.host("b"));
    extra_link(a, "eth1", "198.51.100.1/24", b, "eth1", "198.51.100.2/24");
    no_rp_filter(a);
    no_rp_filter(b);
    with_pair(a, b, "192.0.2.2:7471", |p| {
        p.exchange(1);
        // The client's route to the server moves to the other link.
        sh(
            a,
            &[
                "route",
                "add",
                "192.0.2.2/32",
                "via",
                "198.51.100.2",
                "dev",
                "eth1",
            ],
        );
        p.client(Step::AddrChange);
        // The server's route to its peer too: its (passive) id is watched as well.
        sh(
            b,
            &[
                "route",
                "add",
                "192.0.2.1/32",
                "via",
                "198.51.100.1",
                "dev",
                "eth1",
            ],
        );
        p.server(Step::AddrChange);
        // Sticky: the connection still carries data (now over the other link).
        p.exchange(2);
    });
}

#[test]
fn addr_change_on_neighbour_mac_change() {
    if !require_root("addr_change_on_neighbour_mac_change") {
        return;
    }
    let t = topologies::two_hosts_one_link().unwrap();
    wait_all_up(&t);
    let (a, b) = (t.host("a"), t.host("b"));
    let mac_b = mac_of(b, "eth0");
    let neigh = |mac: MacAddr| {
        sh(
            a,
            &[
                "neigh",
                "replace",
                "192.0.2.2",
                "lladdr",
                &mac.to_string(),
                "dev",
                "eth0",
                "nud",
                "permanent",
            ],
        );
    };
    neigh(mac_b);
    with_pair(a, b, "192.0.2.2:7471", |p| {
        p.exchange(1);
        neigh(MacAddr([0x02, 0, 0, 0, 0, 0x99]));
        p.client(Step::AddrChange);
        // And back (reported again); the connection was never torn down.
        neigh(mac_b);
        p.client(Step::AddrChange);
        p.exchange(2);
    });
}
