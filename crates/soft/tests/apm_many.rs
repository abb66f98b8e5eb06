//! Many RC connections between two two-port devices migrating at once when port 1 goes
//! down (loopback, 127.0.183.0/24): one event per QP on each side, every connection on
//! port 2 afterwards, its data byte for byte through one shared region per side.
//! `RDMA_SOFT_APM_QPS` sets the count (default 100, at most 200 so that the events fit the
//! async queue).

mod apm_common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use apm_common::{addr, pattern, two_port_lo, HANG};
use rdma_soft::verbs::*;

const A: [&str; 2] = ["127.0.183.1", "127.0.183.2"];
const B: [&str; 2] = ["127.0.183.9", "127.0.183.10"];
/// Bytes each connection writes per round.
const SLOT: usize = 8 << 10;

fn qps_from_env() -> usize {
    std::env::var("RDMA_SOFT_APM_QPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100usize)
        .clamp(1, 200)
}

struct Side {
    qps: Vec<QueuePair>,
    mr: MemoryRegion,
    cq: CompletionQueue,
    _pd: ProtectionDomain,
    dev: Device,
}

fn side(ips: [&str; 2], k: usize) -> Side {
    let dev = Device::open(two_port_lo(ips)).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(2 * k + 16, None).unwrap();
    let qps = (0..k)
        .map(|_| pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap())
        .collect();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = pd.register(vec![0u8; k * SLOT], access).unwrap();
    Side {
        qps,
        mr,
        cq,
        _pd: pd,
        dev,
    }
}

/// Every connection WRITEs its slot of `a`'s region to its slot of `b`'s; all complete and
/// land exactly.
fn write_all(a: &Side, b: &Side, salt: u8) {
    let k = a.qps.len();
    let data = pattern(k * SLOT, salt);
    a.mr.write(0, &data).unwrap();
    for (i, qp) in a.qps.iter().enumerate() {
        let op = SendOp::RdmaWrite {
            remote_addr: b.mr.addr() + (i * SLOT) as u64,
            rkey: b.mr.rkey(),
        };
        let sge = a.mr.sge(i * SLOT, SLOT as u32).unwrap();
        qp.post_send(&SendWr::new(i as u64, op).with_sge(sge).signaled())
            .unwrap();
    }
    let end = Instant::now() + HANG;
    let mut wc = Vec::new();
    while wc.len() < k {
        assert!(Instant::now() < end, "HANG: {} of {k} WRITEs", wc.len());
        let room = k - wc.len();
        if a.cq.poll(&mut wc, room) == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let ids: BTreeSet<u64> = wc.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids.len(), k, "each WRITE completes once");
    assert!(wc.iter().all(|c| c.status == WcStatus::Success), "{wc:?}");
    let mut got = vec![0u8; k * SLOT];
    b.mr.read(0, &mut got).unwrap();
    if let Some(i) = got.iter().zip(&data).position(|(x, y)| x != y) {
        panic!("byte {i} (connection {}) arrived changed", i / SLOT);
    }
}

/// The QPs the device reports migrated (`cause`, 1 → 2), waiting for `k` of them.
fn migrated(dev: &Device, k: usize, cause: MigrationCause) -> BTreeSet<u32> {
    let end = Instant::now() + HANG;
    let mut qpns = BTreeSet::new();
    while qpns.len() < k {
        let left = end.saturating_duration_since(Instant::now());
        match dev.wait_async_event(Some(left)).unwrap() {
            Some(AsyncEvent::PathMigrated {
                qpn,
                cause: c,
                from_port: 1,
                to_port: 2,
            }) if c == cause => assert!(qpns.insert(qpn), "QP {qpn:#x} migrated twice"),
            Some(e) => panic!("unexpected event {e:?}"),
            None => panic!("HANG: {} of {k} migrations", qpns.len()),
        }
    }
    qpns
}

#[test]
fn many_connections_migrate_at_once_when_port_1_goes_down() {
    let k = qps_from_env();
    let (a, b) = (side(A, k), side(B, k));
    let gid = |s: &str| addr(s).gid();
    for (qa, qb) in a.qps.iter().zip(&b.qps) {
        qa.connect_with_alt((1, gid(B[0])), (2, gid(B[1])), qb.qpn(), 7, 9)
            .unwrap();
        qb.connect_with_alt((1, gid(A[0])), (2, gid(A[1])), qa.qpn(), 9, 7)
            .unwrap();
    }
    write_all(&a, &b, 1);
    assert_eq!(a.dev.rx_by_port()[2] + b.dev.rx_by_port()[2], 0);
    a.dev.set_port_state(1, false).unwrap();
    assert_eq!(
        a.dev.poll_async_event(),
        Some(AsyncEvent::PortError { port: 1 })
    );
    let want_a: BTreeSet<u32> = a.qps.iter().map(|q| q.qpn()).collect();
    assert_eq!(migrated(&a.dev, k, MigrationCause::Forced), want_a);
    // the peers follow on the first packet each gets on port 2
    write_all(&a, &b, 2);
    let want_b: BTreeSet<u32> = b.qps.iter().map(|q| q.qpn()).collect();
    assert_eq!(migrated(&b.dev, k, MigrationCause::Peer), want_b);
    write_all(&b, &a, 3);
    for s in [&a, &b] {
        for qp in &s.qps {
            let q = qp.query().unwrap();
            assert_eq!((q.port_num, q.path_mig_state), (2, MigState::Migrated));
        }
        assert!(s.dev.rx_by_port()[2] > 0);
        assert_eq!(s.dev.async_events_dropped(), 0);
        assert_eq!(s.dev.poll_async_event(), None);
        assert_eq!(s.dev.mr_count(), 1);
    }
}
