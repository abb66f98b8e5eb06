//! Event loops that drive a device themselves (`Device::watch_wire`, `wire_fd`,
//! `drive_inline`): a watcher that drives gets the datagrams; one that never drives (a
//! blocked event loop) still gets every message, from the engine. Neither side polls its CQ
//! with `poll` (which would drive the device inline): completions are taken with
//! `poll_queued` after the completion channel fires. Addresses 127.0.156.x.

mod common;

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_soft::verbs::*;

const LIMIT: Duration = Duration::from_secs(60);
const MSG: u32 = 1000;

struct End {
    dev: Device,
    qp: QueuePair,
    cq: CompletionQueue,
    ch: CompletionChannel,
    mr: MemoryRegion,
    gid: [u8; 16],
    _pd: ProtectionDomain,
}

fn end(ip: &str) -> End {
    let dev = common::device(ip, None);
    let pd = dev.alloc_pd().unwrap();
    let ch = dev.create_comp_channel().unwrap();
    let cq = dev.create_cq(1024, Some(&ch)).unwrap();
    let mut init = QpInitAttr::rc(&cq, &cq);
    init.cap.max_recv_wr = 512;
    init.cap.max_send_wr = 512;
    let qp = pd.create_qp(&init).unwrap();
    let mr = pd
        .register(vec![0u8; 1 << 20], AccessFlags::LOCAL_WRITE)
        .unwrap();
    let gid = ip.parse::<rdma_soft::io::WireAddr>().unwrap().gid();
    End {
        dev,
        qp,
        cq,
        ch,
        mr,
        gid,
        _pd: pd,
    }
}

/// Waits on the channel for `n` completions without driving the device.
fn wait(e: &End, n: usize) -> Vec<Completion> {
    let end = Instant::now() + LIMIT;
    let mut got = Vec::new();
    while got.len() < n {
        e.cq.req_notify(false).unwrap();
        let room = n - got.len();
        if e.cq.poll_queued(&mut got, room) > 0 {
            continue;
        }
        let left = end.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "{} of {n} completions within {LIMIT:?}",
            got.len()
        );
        e.ch.wait_event(Some(left)).unwrap();
    }
    got
}

/// `count` SENDs of `MSG` bytes from a to b, each with its own pattern; b checks every byte.
fn stream(a: &End, b: &End, count: u32) {
    a.qp.connect(b.qp.qpn(), 0x20, 0x10, b.gid).unwrap();
    b.qp.connect(a.qp.qpn(), 0x10, 0x20, a.gid).unwrap();
    let mut done = 0;
    while done < count {
        let batch = (count - done).min(256);
        for i in done..done + batch {
            let off = (i % 256) * MSG;
            let sge = b.mr.sge(off as usize, MSG).unwrap();
            b.qp.post_recv(&RecvWr::new(i as u64).with_sge(sge))
                .unwrap();
        }
        for i in done..done + batch {
            let off = (i % 256) * MSG;
            let data: Vec<u8> = (0..MSG).map(|k| (i * 31 + k) as u8).collect();
            a.mr.write(off as usize, &data).unwrap();
            let wr = SendWr::new(i as u64, SendOp::Send)
                .with_sge(a.mr.sge(off as usize, MSG).unwrap())
                .signaled();
            a.qp.post_send(&wr).unwrap();
        }
        let sent = wait(a, batch as usize);
        assert!(
            sent.iter().all(|c| c.status == WcStatus::Success),
            "{sent:?}"
        );
        let got = wait(b, batch as usize);
        for c in &got {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            assert_eq!(c.byte_len, MSG);
            let i = c.wr_id as u32;
            let mut buf = vec![0u8; MSG as usize];
            b.mr.read(((i % 256) * MSG) as usize, &mut buf).unwrap();
            let want: Vec<u8> = (0..MSG).map(|k| (i * 31 + k) as u8).collect();
            assert_eq!(buf, want, "message {i}");
        }
        done += batch;
    }
}

/// A watcher that never drives (its event loop is blocked): the engine still delivers
/// everything, after the grace time.
#[test]
fn a_stalled_watcher_still_gets_every_message() {
    let a = end("127.0.156.1");
    let b = end("127.0.156.2");
    let _watch = b.dev.watch_wire();
    stream(&a, &b, 300);
    let w = b.dev.watch_stats();
    assert_eq!(w.drives, 0);
    assert!(
        w.left > 0,
        "the engine never left datagrams to the watcher: {w:?}"
    );
    assert!(w.taken_back > 0, "{w:?}");
}

/// A watcher that drives when the wire fd is readable receives the datagrams itself.
#[test]
fn a_watcher_that_drives_receives_the_datagrams() {
    let a = end("127.0.156.3");
    let b = end("127.0.156.4");
    let watch = b.dev.watch_wire();
    let stop = Arc::new(AtomicBool::new(false));
    let dev = b.dev.clone();
    let fd = dev.wire_fd().expect("a UDP wire has a wait fd").as_raw_fd();
    let s = stop.clone();
    let t = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd; the fd lives as long as `dev`.
            unsafe { libc::poll(&mut p, 1, 10) };
            if p.revents != 0 {
                dev.drive_inline().unwrap();
            }
        }
    });
    stream(&a, &b, 300);
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    let w = b.dev.watch_stats();
    assert!(w.drives > 0, "the watcher never drove the device: {w:?}");
    assert!(
        w.left > 0,
        "the engine never left datagrams to the watcher: {w:?}"
    );
    drop(watch);
    // Without a watcher the engine drives again: one more message arrives.
    let sge = b.mr.sge(0, MSG).unwrap();
    b.qp.post_recv(&RecvWr::new(7).with_sge(sge)).unwrap();
    let wr = SendWr::new(7, SendOp::Send)
        .with_sge(a.mr.sge(0, MSG).unwrap())
        .signaled();
    let before = b.dev.watch_stats();
    a.qp.post_send(&wr).unwrap();
    assert_eq!(wait(&b, 1)[0].status, WcStatus::Success);
    let after = b.dev.watch_stats();
    assert_eq!((after.drives, after.left), (before.drives, before.left));
}
