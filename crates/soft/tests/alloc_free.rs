//! The fast path allocates nothing: after a warm-up, posting sends and driving two devices
//! (RC SEND, RC WRITE, a multi-packet SEND, UD SEND, a GSI MAD) moves data between them with no
//! heap allocation in the driving thread, measured with a counting global allocator.
//!
//! One test in this binary, and the count is per thread, so the harness's own threads do not
//! disturb it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use rdma_soft::io::{UdpConfig, UdpWire, WireAddr};
use rdma_soft::verbs::*;

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note();
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note();
        System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note();
        System.realloc(p, l, n)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}

#[global_allocator]
static A: Counting = Counting;

fn counted<R>(f: impl FnOnce() -> R) -> (R, u64) {
    ALLOCS.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    (r, ALLOCS.with(|n| n.get()))
}

fn device(ip: &str) -> Device {
    let mut cfg = DeviceConfig::for_netdev("lo").unwrap();
    cfg.gids = vec![ip.parse().unwrap()];
    let wire = UdpWire::new(UdpConfig {
        port: 47971,
        faults: None,
        ..UdpConfig::default()
    })
    .unwrap();
    Device::open_with_wire(cfg, Box::new(wire)).unwrap()
}

/// Polls `cq` (which drives its device) and drives the peer device `other` until `cq` has a
/// completion.
fn wait(cq: &CompletionQueue, other: &Device) -> Completion {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(c) = cq.poll_one() {
            assert_eq!(c.status, WcStatus::Success);
            return c;
        }
        other.progress().unwrap();
        assert!(Instant::now() < end, "no completion");
    }
}

#[test]
fn fast_path_allocates_nothing_after_warm_up() {
    let (ia, ib) = ("127.0.71.1", "127.0.71.2");
    let (da, db) = (device(ia), device(ib));
    let gid = |s: &str| s.parse::<WireAddr>().unwrap().gid();
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let (ca, cb) = (
        da.create_cq(256, None).unwrap(),
        db.create_cq(256, None).unwrap(),
    );
    let (qa, qb) = (
        pa.create_qp(&QpInitAttr::rc(&ca, &ca)).unwrap(),
        pb.create_qp(&QpInitAttr::rc(&cb, &cb)).unwrap(),
    );
    qa.connect(qb.qpn(), 7, 100, gid(ib)).unwrap();
    qb.connect(qa.qpn(), 100, 7, gid(ia)).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let (ma, mb) = (
        pa.register(vec![5u8; 1 << 16], access).unwrap(),
        pb.register(vec![0u8; 1 << 16], access).unwrap(),
    );
    // UD pair and GSI on the same addresses
    let (ua, ub) = (
        pa.create_qp(&QpInitAttr::ud(&ca, &ca)).unwrap(),
        pb.create_qp(&QpInitAttr::ud(&cb, &cb)).unwrap(),
    );
    ua.ud_ready(0x42).unwrap();
    ub.ud_ready(0x42).unwrap();
    let ah = pa
        .create_ah(&PathAttr {
            dgid: gid(ib),
            ..PathAttr::default()
        })
        .unwrap();
    let (la, lb): (WireAddr, WireAddr) = (ia.parse().unwrap(), ib.parse().unwrap());
    da.gsi_open(la).unwrap();
    db.gsi_open(lb).unwrap();
    let mut mad = [7u8; 256];
    // Not a CM MAD (class 7): a sharing wire steers those by comm id, and this made-up one
    // names slot 7.
    mad[1] = 0x01;

    let send_small = SendWr::new(1, SendOp::Send)
        .with_sge(ma.sge(0, 64).unwrap())
        .signaled();
    let send_big = SendWr::new(2, SendOp::Send)
        .with_sge(ma.sge(0, 40_000).unwrap())
        .signaled();
    let write = SendWr::new(
        3,
        SendOp::RdmaWrite {
            remote_addr: mb.sge(0, 1).unwrap().addr + 1024,
            rkey: mb.rkey(),
        },
    )
    .with_sge(ma.sge(0, 8192).unwrap())
    .signaled();
    let ud = SendWr::new(4, SendOp::Send)
        .with_sge(ma.sge(0, 512).unwrap())
        .with_ud(ah.dest(ub.qpn(), 0x42))
        .signaled();
    let recv = RecvWr::new(9).with_sge(mb.sge(0, 1 << 16).unwrap());

    let round = || {
        // RC SEND 64 B and 40 KB (10 packets), RC WRITE 8 KB
        for wr in [&send_small, &send_big, &write] {
            if wr.wr_id != 3 {
                qb.post_recv(&recv).unwrap();
            }
            qa.post_send(wr).unwrap();
            if wr.wr_id != 3 {
                wait(&cb, &da);
            }
            wait(&ca, &db);
        }
        // UD SEND 512 B
        ub.post_recv(&recv).unwrap();
        ua.post_send(&ud).unwrap();
        wait(&ca, &db);
        wait(&cb, &da);
        // GSI MAD
        da.gsi_send(&la, &lb, &mad).unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(m) = db.gsi_recv().unwrap() {
                assert_eq!(m.mad[0], 7);
                break;
            }
            assert!(Instant::now() < end, "no MAD");
        }
    };
    for _ in 0..50 {
        round();
    }
    // the counter sees allocations of this thread
    let ((), n) = counted(|| drop(std::hint::black_box(vec![1u8; 10])));
    assert_eq!(n, 1);
    let ((), allocs) = counted(|| {
        for _ in 0..200 {
            round();
        }
    });
    assert_eq!(allocs, 0, "heap allocations on the fast path");
    assert_eq!(da.runtime_stats().send_errors, 0);
}
