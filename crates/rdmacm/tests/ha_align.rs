//! HA policies (issue 11) between two namespace hosts with two links (root; SKIPPED
//! otherwise): H (h0 192.0.2.1, h1 198.51.100.1) — B (b0 192.0.2.2, b1 198.51.100.2); B's
//! address 192.0.2.2 is reached over h0 first (a /32 route), over h1 as the fallback.
//! `notify` gives ADDR_CHANGE only; `align` ends the connection (DISCONNECTED with the
//! documented status, the peer DISCONNECTED too) when the route moves to h1, h0 goes down
//! or the local address goes; unrelated changes give nothing. Many connections align at
//! once (`RDMA_HA_CONNS`, 4 by default). The policy option and its inheritance are checked
//! on loopback (127.0.211.0/24).

mod support_ha;
mod support_hosts;

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rdma_hostview::MacAddr;
use rdma_soft::verbs::{
    AccessFlags, Completion, CompletionChannel, CompletionQueue, MemoryRegion, QpInitAttr, QpState,
    QueuePair, RecvWr, SendOp, SendWr,
};
use rdma_testhosts::{require_root, Host};
use rdmacm::cm::{
    CmId, CmOption, Cma, ConnParam, Event, EventChannel, EventType, HaPolicy, IdState, PortSpace,
    ALIGN_ADDR_GONE, ALIGN_PATH_MOVED,
};
use support_ha::{cma, topo, B_ADDR};
use support_hosts::*;

/// Resolution timeout handed to the CM (a parameter of the calls under test).
const T: Duration = Duration::from_secs(10);
/// Hang guard of every wait (a stop, not a speed target).
const HANG: Duration = Duration::from_secs(120);

fn conns() -> usize {
    std::env::var("RDMA_HA_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

fn expect(ch: &EventChannel, kind: EventType) -> Event {
    loop {
        let ev = ch
            .get_event_timeout(HANG)
            .unwrap()
            .unwrap_or_else(|| panic!("hang guard: waiting for {kind}"));
        // veth carriers and timewait are not what these tests are about
        if ev.kind() == EventType::TimewaitExit && kind != EventType::TimewaitExit {
            continue;
        }
        assert_eq!(ev.kind(), kind, "status {}", ev.status());
        return ev;
    }
}

/// No event within `d` (other than TIMEWAIT_EXIT).
fn quiet(ch: &EventChannel, d: Duration) {
    let t0 = Instant::now();
    while let Some(left) = d.checked_sub(t0.elapsed()) {
        if let Some(ev) = ch.get_event_timeout(left).unwrap() {
            assert_eq!(
                ev.kind(),
                EventType::TimewaitExit,
                "unexpected {}",
                ev.kind()
            );
        }
    }
}

/// One side of a connection: its QP (a send and a receive CQ on one completion channel)
/// and a buffer for messages.
struct Side {
    qp: Arc<QueuePair>,
    mr: MemoryRegion,
    cc: CompletionChannel,
}

impl Side {
    /// A QP for `id` whose CQs have a completion channel, with its receives posted.
    fn new(id: &CmId) -> Side {
        let dev = id.device().unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cc = dev.create_comp_channel().unwrap();
        let scq = dev.create_cq(16, Some(&cc)).unwrap();
        let rcq = dev.create_cq(16, Some(&cc)).unwrap();
        let qp = id.create_qp(&pd, &QpInitAttr::rc(&scq, &rcq)).unwrap();
        let mr = pd
            .register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)
            .unwrap();
        let s = Side { qp, mr, cc };
        for i in 0..4 {
            s.qp.post_recv(&RecvWr::new(i).with_sge(s.mr.sge(32, 32).unwrap()))
                .unwrap();
        }
        s
    }

    /// The next completion of `cq`, sleeping on the completion channel (an event of the
    /// other CQ wakes it too: it polls again); a hang guard of [`HANG`] per wait.
    fn next(&self, cq: &CompletionQueue) -> Completion {
        loop {
            if let Some(c) = cq.poll_one() {
                return c;
            }
            cq.req_notify(false).unwrap();
            if let Some(c) = cq.poll_one() {
                return c;
            }
            let ev = self.cc.wait_event(Some(HANG)).unwrap();
            assert!(ev.is_some(), "hang guard: no completion");
        }
    }

    fn send(&self, msg: &[u8]) {
        self.mr.write(0, msg).unwrap();
        let wr = SendWr::new(9, SendOp::Send)
            .with_sge(self.mr.sge(0, msg.len() as u32).unwrap())
            .signaled();
        self.qp.post_send(&wr).unwrap();
        let c = self.next(self.qp.send_cq());
        assert!(c.status.is_success(), "{:?}", c.status);
    }

    fn recv(&self) -> Vec<u8> {
        let wc = [self.next(self.qp.recv_cq())];
        assert!(wc[0].status.is_success(), "{:?}", wc[0].status);
        let mut got = vec![0u8; wc[0].byte_len as usize];
        self.mr.read(32, &mut got).unwrap();
        self.qp
            .post_recv(&RecvWr::new(wc[0].wr_id).with_sge(self.mr.sge(32, 32).unwrap()))
            .unwrap();
        got
    }
}

/// What the test asks the two sides to do, in order.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Client sends, server receives "ping N".
    Ping(u8),
    /// The next event of every client id (checked by `expect_client`).
    Client(Want),
    /// The next event of every server id.
    Server(Want),
}

#[derive(Clone, Copy, Debug)]
enum Want {
    AddrChange,
    /// DISCONNECTED with one of these statuses.
    Disconnected(i32, i32),
    Nothing,
    /// Not checked (e.g. whether a DREQ could leave at all).
    Skip,
}

fn check(ch: &EventChannel, ids: &[CmId], w: Want) {
    match w {
        Want::Nothing => quiet(ch, Duration::from_millis(800)),
        Want::Skip => {}
        Want::AddrChange => {
            for _ in ids {
                let ev = expect(ch, EventType::AddrChange);
                assert_eq!(ev.status(), 0);
            }
            for id in ids {
                assert_eq!(
                    id.state(),
                    IdState::Connect,
                    "ADDR_CHANGE tears nothing down"
                );
                assert_eq!(id.qp().unwrap().state(), QpState::Rts);
            }
        }
        Want::Disconnected(a, b) => {
            let mut seen = Vec::new();
            for _ in ids {
                let ev = expect(ch, EventType::Disconnected);
                assert!(
                    ev.status() == a || ev.status() == b,
                    "status {}",
                    ev.status()
                );
                seen.push(ev.id_num());
            }
            for id in ids {
                assert!(seen.contains(&id.num()));
                assert_eq!(id.state(), IdState::Disconnect);
                if a != 0 {
                    // the CM ended it itself (align): the QP is in ERR already
                    assert_eq!(id.qp().unwrap().state(), QpState::Err);
                }
            }
        }
    }
}

/// The server: `n` connections on B, then the steps it is sent.
fn server(
    b: &Host,
    n: usize,
    ready: mpsc::Sender<()>,
    steps: mpsc::Receiver<Step>,
    done: mpsc::Sender<()>,
) {
    b.run(move || {
        let cma = cma(HaPolicy::Notify);
        let ch = EventChannel::with_cma(&cma).unwrap();
        let l = CmId::new(&ch, PortSpace::Tcp).unwrap();
        l.bind_addr(format!("{B_ADDR}:7471").parse().unwrap())
            .unwrap();
        l.listen(64).unwrap();
        ready.send(()).unwrap();
        let mut ids = Vec::new();
        let mut sides = Vec::new();
        let mut established = 0;
        while established < n {
            let mut ev = ch.get_event_timeout(HANG).unwrap().expect("requests");
            match ev.kind() {
                EventType::ConnectRequest => {
                    let id = ev.take_id().unwrap();
                    drop(ev);
                    sides.push(Side::new(&id));
                    id.accept(&ConnParam::default()).unwrap();
                    ids.push(id);
                }
                EventType::Established => established += 1,
                k => panic!("server got {k}"),
            }
        }
        done.send(()).unwrap();
        for s in steps {
            match s {
                Step::Ping(k) => {
                    for side in &sides {
                        assert_eq!(side.recv(), format!("ping {k}").as_bytes());
                    }
                }
                Step::Server(w) => check(&ch, &ids, w),
                Step::Client(_) => {}
            }
            done.send(()).unwrap();
        }
    });
}

fn client(
    h: &Host,
    n: usize,
    policy: HaPolicy,
    steps: mpsc::Receiver<Step>,
    done: mpsc::Sender<()>,
) {
    h.run(move || {
        // The context's default is the policy under test for half the ids, the option
        // for the other half: both paths count.
        let cma = cma(if n > 1 { policy } else { HaPolicy::Notify });
        let ch = EventChannel::with_cma(&cma).unwrap();
        let mut ids = Vec::new();
        let mut sides = Vec::new();
        for i in 0..n {
            let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
            if i % 2 == 0 {
                id.set_option(CmOption::HaPolicy(policy)).unwrap();
            }
            assert_eq!(id.ha_policy(), policy);
            id.resolve_addr(None, format!("{B_ADDR}:7471").parse().unwrap(), T)
                .unwrap();
            expect(&ch, EventType::AddrResolved);
            assert_eq!(id.netdev().unwrap().0, "h0");
            id.resolve_route(T).unwrap();
            expect(&ch, EventType::RouteResolved);
            sides.push(Side::new(&id));
            id.connect(&ConnParam::default()).unwrap();
            expect(&ch, EventType::Established);
            ids.push(id);
        }
        done.send(()).unwrap();
        for s in steps {
            match s {
                Step::Ping(k) => {
                    for side in &sides {
                        side.send(format!("ping {k}").as_bytes());
                    }
                }
                Step::Client(w) => check(&ch, &ids, w),
                Step::Server(_) => {}
            }
            done.send(()).unwrap();
        }
    });
}

/// Connects `n` pairs, pings, applies `change` to the hosts, checks what each side
/// wants, pings again when the connections survive.
fn scenario(
    n: usize,
    policy: HaPolicy,
    change: impl FnOnce(&Host, &Host),
    client_wants: Want,
    server_wants: Want,
) {
    scenario_then(n, policy, change, client_wants, server_wants, |_, _| {});
}

/// [`scenario`], with `restore` run before the second ping.
fn scenario_then(
    n: usize,
    policy: HaPolicy,
    change: impl FnOnce(&Host, &Host),
    client_wants: Want,
    server_wants: Want,
    restore: impl FnOnce(&Host, &Host),
) {
    let t = topo();
    let (h, b) = (t.host("h"), t.host("b"));
    let (ready_tx, ready_rx) = mpsc::channel();
    let (ss_tx, ss_rx) = mpsc::channel::<Step>();
    let (sd_tx, sd_rx) = mpsc::channel();
    let (cs_tx, cs_rx) = mpsc::channel::<Step>();
    let (cd_tx, cd_rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| server(b, n, ready_tx, ss_rx, sd_tx));
        ready_rx.recv().unwrap();
        s.spawn(|| client(h, n, policy, cs_rx, cd_tx));
        let wait = |rx: &mpsc::Receiver<()>, what: &str| {
            rx.recv_timeout(HANG).unwrap_or_else(|_| panic!("{what}"))
        };
        wait(&cd_rx, "client connected");
        wait(&sd_rx, "server connected");
        let both = |st: Step| {
            ss_tx.send(st).unwrap();
            cs_tx.send(st).unwrap();
            wait(&cd_rx, "client step");
            wait(&sd_rx, "server step");
        };
        both(Step::Ping(1));
        change(h, b);
        both(Step::Client(client_wants));
        both(Step::Server(server_wants));
        if !matches!(client_wants, Want::Disconnected(..)) {
            restore(h, b);
            both(Step::Ping(2));
        }
        drop(ss_tx);
        drop(cs_tx);
    });
}

fn route_to_h1(h: &Host, _b: &Host) {
    support_ha::route_to_h1(h);
}

#[test]
fn notify_route_replace_gives_addr_change_and_data_flows() {
    if !require_root("notify_route_replace_gives_addr_change_and_data_flows") {
        return;
    }
    scenario(
        1,
        HaPolicy::Notify,
        route_to_h1,
        Want::AddrChange,
        Want::Nothing,
    );
}

#[test]
fn align_route_replace_disconnects_both_sides() {
    if !require_root("align_route_replace_disconnects_both_sides") {
        return;
    }
    let any = Want::Disconnected(ALIGN_PATH_MOVED, ALIGN_PATH_MOVED);
    scenario(
        1,
        HaPolicy::Align,
        route_to_h1,
        any,
        Want::Disconnected(0, 0),
    );
}

#[test]
fn align_link_down_disconnects() {
    if !require_root("align_link_down_disconnects") {
        return;
    }
    let moved = Want::Disconnected(ALIGN_PATH_MOVED, ALIGN_PATH_MOVED);
    scenario(
        1,
        HaPolicy::Align,
        |h, _| sh(h, &["link", "set", "h0", "down"]),
        moved,
        Want::Disconnected(0, 0),
    );
}

#[test]
fn align_local_address_removed_disconnects() {
    if !require_root("align_local_address_removed_disconnects") {
        return;
    }
    // The address and its prefix route go in one change: either status says so.
    let gone = Want::Disconnected(ALIGN_ADDR_GONE, ALIGN_PATH_MOVED);
    scenario(
        1,
        HaPolicy::Align,
        |h, _| sh(h, &["addr", "del", "192.0.2.1/24", "dev", "h0"]),
        gone,
        Want::Skip,
    );
}

#[test]
fn unrelated_address_gives_nothing_under_either_policy() {
    if !require_root("unrelated_address_gives_nothing_under_either_policy") {
        return;
    }
    for policy in [HaPolicy::Notify, HaPolicy::Align] {
        scenario(
            2,
            policy,
            |h, _| sh(h, &["addr", "add", "192.0.2.77/24", "dev", "h0"]),
            Want::Nothing,
            Want::Nothing,
        );
    }
}

#[test]
fn align_neighbour_mac_change_on_same_netdev_is_addr_change_only() {
    if !require_root("align_neighbour_mac_change_on_same_netdev_is_addr_change_only") {
        return;
    }
    let other = MacAddr([0x02, 0, 0, 0, 0, 0x77]).to_string();
    let neigh = |h: &Host, mac: &str| {
        sh(
            h,
            &[
                "neigh",
                "replace",
                B_ADDR,
                "lladdr",
                mac,
                "dev",
                "h0",
                "nud",
                "permanent",
            ],
        );
    };
    scenario_then(
        1,
        HaPolicy::Align,
        |h, _| neigh(h, &other),
        Want::AddrChange,
        Want::Nothing,
        // B's MAC again, so that the second ping reaches it (another ADDR_CHANGE only).
        |h, b| neigh(h, &mac_of(b, "b0").to_string()),
    );
}

#[test]
fn many_connections_align_at_once() {
    if !require_root("many_connections_align_at_once") {
        return;
    }
    let n = conns();
    let moved = Want::Disconnected(ALIGN_PATH_MOVED, ALIGN_PATH_MOVED);
    scenario(
        n,
        HaPolicy::Align,
        route_to_h1,
        moved,
        Want::Disconnected(0, 0),
    );
}

/// The option on loopback: set, read back, inherited by a listener's request ids.
#[test]
fn policy_option_and_inheritance() {
    let cma = cma(HaPolicy::Notify);
    let ch = EventChannel::with_cma(&cma).unwrap();
    let l = CmId::new(&ch, PortSpace::Tcp).unwrap();
    assert_eq!(l.ha_policy(), HaPolicy::Notify);
    l.set_ha_policy(HaPolicy::Align).unwrap();
    assert_eq!(l.ha_policy(), HaPolicy::Align);
    l.bind_addr("127.0.211.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    l.listen(4).unwrap();
    let c = CmId::new(&ch, PortSpace::Tcp).unwrap();
    assert_eq!(c.ha_policy(), HaPolicy::Notify, "the context's default");
    c.bind_addr("127.0.211.2:0".parse().unwrap()).unwrap();
    c.resolve_addr(None, addr, T).unwrap();
    expect(&ch, EventType::AddrResolved);
    c.resolve_route(T).unwrap();
    expect(&ch, EventType::RouteResolved);
    c.create_qp_default().unwrap();
    c.connect(&ConnParam::default()).unwrap();
    let mut ev = expect(&ch, EventType::ConnectRequest);
    let child = ev.take_id().unwrap();
    drop(ev);
    assert_eq!(
        child.ha_policy(),
        HaPolicy::Align,
        "inherited from the listener"
    );
    // A context whose default is align gives it to every new id.
    let acma = cma_align();
    let ach = EventChannel::with_cma(&acma).unwrap();
    assert_eq!(
        CmId::new(&ach, PortSpace::Tcp).unwrap().ha_policy(),
        HaPolicy::Align
    );
}

fn cma_align() -> Cma {
    cma(HaPolicy::Align)
}
