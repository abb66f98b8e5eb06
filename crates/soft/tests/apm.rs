//! Automatic path migration on the soft device, on loopback (127.0.181.0/24 and
//! 127.0.182.0/24): RC pairs between two-port devices with the alternate path on port 2
//! armed move a verified stream to port 2 when port 1 goes down (forced) or silently stops
//! carrying packets (retries exhausted), without re-registering memory; the alternate path
//! in modify and query and its errors; the async event queue and its fd.

mod apm_common;

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use apm_common::*;
use rdma_soft::fd::wait_readable;
use rdma_soft::verbs::*;

const A: [&str; 2] = ["127.0.181.1", "127.0.181.2"];
const B: [&str; 2] = ["127.0.181.9", "127.0.181.10"];
const C: [&str; 2] = ["127.0.181.21", "127.0.181.22"];
const D: [&str; 2] = ["127.0.181.29", "127.0.181.30"];
const E: [&str; 2] = ["127.0.181.41", "127.0.181.42"];
const F: [&str; 2] = ["127.0.181.49", "127.0.181.50"];

fn stream() -> Stream {
    Stream {
        n: msgs_from_env(),
        size: 16 << 10,
        depth: 8,
    }
}

fn pair(a_cfg: DeviceConfig, a_wire: Option<Blackhole>, b: [&str; 2], a: [&str; 2]) -> (End, End) {
    let s = stream();
    let recvs = s.n as u32 + 2;
    let da = match a_wire {
        Some(w) => Device::open_with_wire(a_cfg, Box::new(w)).unwrap(),
        None => Device::open(a_cfg).unwrap(),
    };
    let ea = end(da, s.region(), recvs);
    let eb = end(Device::open(two_port_lo(b)).unwrap(), s.region(), recvs);
    connect_armed(&ea, &eb, b, 0x100, 0x200);
    connect_armed(&eb, &ea, a, 0x200, 0x100);
    (ea, eb)
}

#[test]
fn port_down_moves_a_stream_to_the_alternate_port() {
    // port 1 of `a` dies halfway (its datagrams lost both ways), and the device is told
    // once datagrams went into the hole: what they carried must be resent on port 2
    let (wire, hole) = Blackhole::new(&[addr(A[0])]);
    let (a, b) = pair(two_port_lo(A), Some(wire), B, A);
    let (mut holed, mut at_switch) = (false, None);
    let n = stream().n;
    run_stream(&a, &b, stream(), |sent, _| match holed {
        false if sent >= n / 2 => {
            // armed QPs send on their primary only
            assert_eq!(a.dev.rx_by_port()[2], 0);
            assert_eq!(b.dev.rx_by_port()[2], 0);
            hole.on.store(true, Relaxed);
            holed = true;
        }
        true if hole.dropped.load(Relaxed) > 0 && at_switch.is_none() => {
            at_switch = Some((a.dev.rx_by_port(), b.dev.rx_by_port()));
            a.dev.set_port_state(1, false).unwrap();
        }
        _ => {}
    });
    assert!(hole.dropped.load(Relaxed) > 0);
    let st = a.qp.transport_stats().unwrap();
    assert!(st.retransmitted > 0, "nothing resent on port 2: {st:?}");
    assert_eq!(
        a.dev.poll_async_event(),
        Some(AsyncEvent::PortError { port: 1 })
    );
    assert_migrated(&a, &b, MigrationCause::Forced);
    let (ra, rb) = at_switch.unwrap();
    assert!(a.dev.rx_by_port()[2] > ra[2], "{:?}", a.dev.rx_by_port());
    assert!(b.dev.rx_by_port()[2] > rb[2], "{:?}", b.dev.rx_by_port());
    for e in [&a, &b] {
        assert_eq!(e.dev.runtime_stats().wrong_path, 0);
        assert_eq!(e.dev.rx_by_port()[0], 0);
    }
    // from now on nothing travels on port 1, either way, though it would carry it again
    hole.on.store(false, Relaxed);
    let (ra, rb) = (a.dev.rx_by_port(), b.dev.rx_by_port());
    write_once(&a, &b, 256 << 10);
    write_once(&b, &a, 256 << 10);
    let (na, nb) = (a.dev.rx_by_port(), b.dev.rx_by_port());
    assert_eq!(
        (na[1], nb[1]),
        (ra[1], rb[1]),
        "port 1 traffic after the migration"
    );
    assert!(na[2] > ra[2] && nb[2] > rb[2]);
    // the port coming back changes nothing by itself: the QPs stay on port 2
    a.dev.set_port_state(1, true).unwrap();
    assert_eq!(
        a.dev.poll_async_event(),
        Some(AsyncEvent::PortActive { port: 1 })
    );
    assert_eq!(a.qp.query().unwrap().port_num, 2);
    // the return (what the CM does after LAP/APR): port 1 loaded as the alternate in Rearm
    // on both sides, traffic arms them, a forced migration moves both back
    rearm(&a, 1, addr(B[0]).gid());
    rearm(&b, 1, addr(A[0]).gid());
    write_once(&a, &b, 64 << 10);
    write_once(&b, &a, 64 << 10);
    for e in [&a, &b] {
        assert_eq!(e.qp.query().unwrap().path_mig_state, MigState::Armed);
    }
    a.qp.migrate().unwrap();
    write_once(&a, &b, 64 << 10);
    let back = |qpn, cause| AsyncEvent::PathMigrated {
        qpn,
        cause,
        from_port: 2,
        to_port: 1,
    };
    assert_eq!(
        next_qp_event(&a.dev),
        back(a.qp.qpn(), MigrationCause::Forced)
    );
    assert_eq!(
        next_qp_event(&b.dev),
        back(b.qp.qpn(), MigrationCause::Peer)
    );
    let (ra, rb) = (a.dev.rx_by_port(), b.dev.rx_by_port());
    write_once(&a, &b, 256 << 10);
    write_once(&b, &a, 256 << 10);
    let (na, nb) = (a.dev.rx_by_port(), b.dev.rx_by_port());
    assert_eq!(
        (na[2], nb[2]),
        (ra[2], rb[2]),
        "port 2 traffic after the return"
    );
    assert!(na[1] > ra[1] && nb[1] > rb[1]);
    for e in [&a, &b] {
        let q = e.qp.query().unwrap();
        assert_eq!((q.port_num, q.path_mig_state), (1, MigState::Migrated));
        assert_eq!(e.dev.mr_count(), 1);
    }
}

#[test]
fn both_paths_failing_reports_path_mig_err_and_fails_the_qp() {
    let (wire, hole) = Blackhole::new(&[addr(E[0]), addr(E[1])]);
    let (a, b) = pair(two_port_lo(E), Some(wire), F, E);
    write_once(&a, &b, 64 << 10);
    hole.on.store(true, Relaxed);
    let wr = SendWr::new(
        5,
        SendOp::RdmaWrite {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
    )
    .with_sge(a.mr.sge(0, 4096).unwrap())
    .signaled();
    a.qp.post_send(&wr).unwrap();
    // retries run out on port 1: migration; then on port 2 with nothing acknowledged there
    let e1 = next_qp_event(&a.dev);
    assert_eq!(
        e1,
        AsyncEvent::PathMigrated {
            qpn: a.qp.qpn(),
            cause: MigrationCause::RetryExhausted,
            from_port: 1,
            to_port: 2
        }
    );
    let e2 = next_qp_event(&a.dev);
    assert_eq!(
        e2,
        AsyncEvent::PathMigrationFailed {
            qpn: a.qp.qpn(),
            port: 2
        }
    );
    assert_eq!(e2.event_type(), 7);
    let end = Instant::now() + HANG;
    let mut wc = Vec::new();
    while a.scq.poll(&mut wc, 1) == 0 {
        assert!(
            Instant::now() < end,
            "HANG: no completion of the failed WRITE"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!((wc[0].wr_id, wc[0].status), (5, WcStatus::RetryExcErr));
    assert_eq!(a.qp.state(), QpState::Err);
    // the peer heard nothing of it: still armed on port 1
    let q = b.qp.query().unwrap();
    assert_eq!((q.port_num, q.path_mig_state), (1, MigState::Armed));
    assert_eq!(b.dev.poll_async_event(), None);
}

#[test]
fn a_silent_path_failure_migrates_when_retries_run_out() {
    let (wire, hole) = Blackhole::new(&[addr(C[0])]);
    let (a, b) = pair(two_port_lo(C), Some(wire), D, C);
    let n = stream().n;
    run_stream(&a, &b, stream(), |sent, _| {
        if sent >= n / 2 && !hole.on.load(Relaxed) {
            assert_eq!(a.dev.rx_by_port()[2], 0);
            hole.on.store(true, Relaxed);
        }
    });
    assert!(hole.dropped.load(Relaxed) > 0);
    // nobody told the device: no port event, the migration came from the ACK timer
    assert_migrated(&a, &b, MigrationCause::RetryExhausted);
    assert_eq!(a.dev.query_port(1).unwrap().state, PortState::Active);
    assert!(a.qp.transport_stats().unwrap().timeouts > 0);
    assert!(a.dev.rx_by_port()[2] > 0 && b.dev.rx_by_port()[2] > 0);
}

/// A QP of a two-port device moved to Init on port 1, and an RTR call with an alternate
/// path on port 2 (index 0 of its table).
fn init_qp(cq: &CompletionQueue, pd: &ProtectionDomain) -> (QueuePair, QpAttr) {
    let qp = pd.create_qp(&QpInitAttr::rc(cq, cq)).unwrap();
    let (mut a, m) = QpAttr::init(QpAttr::RC_ACCESS);
    a.port_num = 1;
    qp.modify(&a, m).unwrap();
    let path = |ip: &str| PathAttr {
        dgid: addr(ip).gid(),
        hop_limit: 64,
        ..PathAttr::default()
    };
    let (mut r, _) = a.rtr(&rdma_proto::verbs::RtrParams {
        path: path("127.0.182.9"),
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: 0x77,
        rq_psn: 1,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 12,
    });
    r.alt_path = path("127.0.182.10");
    r.alt_port_num = 2;
    r.alt_timeout = 12;
    (qp, r)
}

fn rtr_mask() -> QpAttrMask {
    use QpAttrMask as M;
    M::STATE
        | M::AV
        | M::PATH_MTU
        | M::DEST_QPN
        | M::RQ_PSN
        | M::MAX_DEST_RD_ATOMIC
        | M::MIN_RNR_TIMER
}

#[test]
fn alternate_path_modify_query_and_errors() {
    use QpAttrMask as M;
    let dev = Device::open(two_port_lo(["127.0.182.1", "127.0.182.2"])).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16, None).unwrap();
    let (qp, rtr) = init_qp(&cq, &pd);
    let rtr_m = rtr_mask();
    let before = qp.query().unwrap();
    let einval = |a: &QpAttr, m| qp.modify(a, m).unwrap_err().errno();
    // the alternate on the primary's port, on a port the device lacks, beyond port 2's
    // GID table, a path MTU port 2 cannot carry: EINVAL, nothing changed
    let mut bad = vec![];
    for f in [
        (|a: &mut QpAttr| a.alt_port_num = 1) as fn(&mut QpAttr),
        |a| a.alt_port_num = 3,
        |a| a.alt_port_num = 0,
        |a| a.alt_path.sgid_index = 1,
        |a| a.path_mtu = Mtu::Mtu2048,
        |a| a.alt_timeout = 32,
    ] {
        let mut a = rtr;
        f(&mut a);
        bad.push(a);
    }
    for a in &bad {
        assert_eq!(einval(a, rtr_m | M::ALT_PATH), libc::EINVAL, "{a:?}");
        assert_eq!(qp.query().unwrap(), before, "changed by a refused modify");
    }
    // PATH_MIG_STATE is not an attribute of Init -> RTR
    let mut a = rtr;
    a.path_mig_state = MigState::Armed;
    assert_eq!(
        einval(&a, rtr_m | M::ALT_PATH | M::PATH_MIG_STATE),
        libc::EINVAL
    );
    assert_eq!(qp.query().unwrap(), before);
    qp.modify(&rtr, rtr_m | M::ALT_PATH).unwrap();
    let q = qp.query().unwrap();
    assert_eq!(
        (q.qp_state, q.port_num, q.alt_port_num),
        (QpState::Rtr, 1, 2)
    );
    assert_eq!((q.alt_path, q.alt_timeout), (rtr.alt_path, 12));
    assert_eq!(q.path_mig_state, MigState::Migrated);
    // RTS in Rearm: migrating from anything but Armed is refused
    let (mut rts, m) = rtr.rts(&rdma_proto::verbs::RtsParams {
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn: 5,
        max_rd_atomic: 4,
    });
    rts.path_mig_state = MigState::Rearm;
    qp.modify(&rts, m | M::PATH_MIG_STATE).unwrap();
    let rearm = qp.query().unwrap();
    assert_eq!(rearm.path_mig_state, MigState::Rearm);
    assert_eq!(qp.migrate().unwrap_err().errno(), libc::EINVAL);
    assert_eq!(qp.query().unwrap(), rearm);
    // Armed by hand in RTS is refused too (only at setup, or by the peer's packets)
    let armed = QpAttr {
        path_mig_state: MigState::Armed,
        ..QpAttr::default()
    };
    assert_eq!(einval(&armed, M::PATH_MIG_STATE), libc::EINVAL);
    assert_eq!(dev.poll_async_event(), None);
    // a port going down moves only Armed QPs: this one is in Rearm
    dev.set_port_state(1, false).unwrap();
    assert_eq!(
        dev.poll_async_event(),
        Some(AsyncEvent::PortError { port: 1 })
    );
    assert_eq!(qp.query().unwrap(), rearm);
    dev.set_port_state(1, true).unwrap();
    assert_eq!(
        dev.poll_async_event(),
        Some(AsyncEvent::PortActive { port: 1 })
    );
    // a UD QP has no path to migrate
    let ud = pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    assert_eq!(ud.migrate().unwrap_err().errno(), libc::EINVAL);
}

#[test]
fn a_forced_migration_switches_the_path_and_queues_an_event() {
    let dev = Device::open(two_port_lo(["127.0.182.11", "127.0.182.12"])).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let other = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let gid = |s: &str| addr(s).gid();
    for q in [&qp, &other] {
        q.connect_with_alt(
            (1, gid("127.0.182.19")),
            (2, gid("127.0.182.20")),
            0x55,
            0,
            0,
        )
        .unwrap();
    }
    let fresh = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let one_port = fresh.connect_with_alt(
        (1, gid("127.0.182.19")),
        (1, gid("127.0.182.20")),
        0x55,
        0,
        0,
    );
    assert_eq!(
        one_port.unwrap_err().errno(),
        libc::EINVAL,
        "both paths on one port"
    );
    assert_eq!(
        fresh.query().unwrap().qp_state,
        QpState::Init,
        "refused at Init -> RTR"
    );
    assert_eq!(fresh.query().unwrap().alt_port_num, 0);
    let fd = dev.async_event_fd().as_raw_fd();
    assert!(!wait_readable(&[fd], Some(Instant::now())).unwrap());
    qp.migrate().unwrap();
    assert!(wait_readable(&[fd], Some(Instant::now())).unwrap());
    let ev = dev.poll_async_event().unwrap();
    assert_eq!(
        ev,
        AsyncEvent::PathMigrated {
            qpn: qp.qpn(),
            cause: MigrationCause::Forced,
            from_port: 1,
            to_port: 2
        }
    );
    assert_eq!(
        (ev.event_type(), ev.qpn(), ev.port()),
        (6, Some(qp.qpn()), Some(2))
    );
    assert!(!wait_readable(&[fd], Some(Instant::now())).unwrap());
    let q = qp.query().unwrap();
    assert_eq!((q.port_num, q.path_mig_state), (2, MigState::Migrated));
    assert_eq!(q.path.dgid, gid("127.0.182.20"));
    assert_eq!(
        qp.migrate().unwrap_err().errno(),
        libc::EINVAL,
        "already migrated"
    );
    // a port going down migrates the armed QPs in force on it, and only those
    dev.set_port_state(2, false).unwrap();
    assert_eq!(
        dev.poll_async_event(),
        Some(AsyncEvent::PortError { port: 2 })
    );
    assert_eq!(
        dev.poll_async_event(),
        None,
        "no QP in force on port 2 is armed"
    );
    dev.set_port_state(1, false).unwrap();
    assert_eq!(
        dev.poll_async_event(),
        Some(AsyncEvent::PortError { port: 1 })
    );
    let want = AsyncEvent::PathMigrated {
        qpn: other.qpn(),
        cause: MigrationCause::Forced,
        from_port: 1,
        to_port: 2,
    };
    assert_eq!(dev.poll_async_event(), Some(want));
    assert_eq!(other.query().unwrap().port_num, 2);
    assert_eq!(dev.async_events_dropped(), 0);
}

/// A device as a source of async events for tokio.
struct Events(Device);

impl AsRawFd for Events {
    fn as_raw_fd(&self) -> RawFd {
        self.0.async_event_fd().as_raw_fd()
    }
}

#[test]
fn the_async_event_fd_wakes_a_tokio_task() {
    use tokio::io::unix::AsyncFd;
    let dev = Device::open(two_port_lo(["127.0.182.31", "127.0.182.32"])).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let got = rt.block_on(async {
        // SAFETY: the registration holds a clone of the device, which owns the fd
        let fd = unsafe { AsyncFd::register(Events(dev.clone())) }.unwrap();
        let wait = async {
            loop {
                let mut g = fd.readable().await.unwrap();
                if let Some(e) = dev.poll_async_event() {
                    return e;
                }
                g.clear_ready();
            }
        };
        let trigger = async {
            tokio::task::yield_now().await;
            dev.set_port_state(2, false).unwrap();
        };
        let (e, ()) = tokio::join!(tokio::time::timeout(HANG, wait), trigger);
        e.expect("HANG: the event fd never woke the task")
    });
    assert_eq!(got, AsyncEvent::PortError { port: 2 });
}
