//! Pulled SENDs on the host-local wire (`pull.rs`): a SEND of at least the pull minimum
//! from an allocated region is one packet; the receiver copies it from the sender's region
//! straight into its receive's buffer. Its errors and RNR waits are an ordinary SEND's.

mod common;

use common::{device, host_local_pair, host_local_pair_srq, poll_within, LocalEnd, LIMIT};
use rdma_soft::verbs::*;
use std::time::Instant;

const LEN: usize = 64 << 10;
const ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE;

/// Two connected RC QPs on two devices of this process over the host-local wire; with
/// `pull` the devices' pull minimum (`None`: pulls off).
fn pair(ip_a: &str, ip_b: &str, pull: Option<Option<u32>>) -> (LocalEnd, LocalEnd) {
    let open = |ip: &str| match pull {
        None => device(ip, None),
        Some(min) => {
            let cfg = rdma_soft::SoftConfig::builder()
                .local_pull(min)
                .build()
                .unwrap();
            let mut dc = DeviceConfig::for_netdev("lo").unwrap();
            dc.gids = vec![ip.parse().unwrap()];
            Device::open_with_config(dc, &cfg).unwrap()
        }
    };
    host_local_pair(open, ip_a, ip_b)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29) ^ seed)
        .collect()
}

/// `len` bytes of a fresh allocated region of `a`, filled with a pattern, as a SEND
/// (with `imm`); returns the region and its bytes.
fn post_send(a: &LocalEnd, len: usize, imm: Option<u32>) -> (MemoryRegion, Vec<u8>) {
    let src = a.1.alloc(LEN, ACCESS).unwrap();
    let want = pattern(3, LEN);
    src.write(0, &want).unwrap();
    let op = match imm {
        Some(imm) => SendOp::SendWithImm { imm },
        None => SendOp::Send,
    };
    let wr = SendWr::new(1, op)
        .with_sge(src.sge(0, len as u32).unwrap())
        .signaled();
    a.3.post_send(&wr).unwrap();
    (src, want[..len].to_vec())
}

/// A receive of `first` bytes at 100 and `second` at 40,000 of `dst`.
fn post_recv(b: &LocalEnd, dst: &MemoryRegion, first: u32, second: u32) {
    let wr = RecvWr::new(2)
        .with_sge(dst.sge(100, first).unwrap())
        .with_sge(dst.sge(40_000, second).unwrap());
    b.3.post_recv(&wr).unwrap();
}

/// Checks that `dst` holds `want` in the receive's two pieces (`first` bytes of it in the
/// first) and zeros everywhere else.
fn check_landed(dst: &MemoryRegion, want: &[u8], first: usize) {
    let got = dst.to_vec();
    assert_eq!(&got[100..100 + first], &want[..first]);
    let rest = want.len() - first;
    assert_eq!(&got[40_000..40_000 + rest], &want[first..]);
    assert!(got[..100].iter().all(|b| *b == 0), "before the first piece");
    assert!(got[100 + first..40_000].iter().all(|b| *b == 0), "between");
    assert!(got[40_000 + rest..].iter().all(|b| *b == 0), "after");
}

#[test]
fn a_long_send_from_an_allocated_region_is_pulled_into_the_receive() {
    let (a, b) = pair("127.0.77.1", "127.0.77.2", None);
    let dst = b.1.alloc(LEN * 2, ACCESS).unwrap();
    post_recv(&b, &dst, 10_000, 60_000);
    let len = 50_000;
    let (_src, want) = post_send(&a, len, Some(0xabc));
    let c = poll_within(&a.2, LIMIT, "SEND completion");
    assert_eq!(c.status, WcStatus::Success, "{c:?}");
    let r = poll_within(&b.2, LIMIT, "receive completion");
    assert_eq!((r.status, r.byte_len), (WcStatus::Success, len as u32));
    assert_eq!(r.imm(), Some(0xabc));
    check_landed(&dst, &want, 10_000);
    let (sa, sb) = (
        a.3.transport_stats().unwrap(),
        b.3.transport_stats().unwrap(),
    );
    assert_eq!((sa.pulls_sent, sb.pulls_done), (1, 1), "pulled");
}

#[test]
fn a_pulled_send_lands_in_a_receive_of_the_qps_srq() {
    let (a, b, srq) = host_local_pair_srq(|ip| device(ip, None), "127.0.77.11", "127.0.77.12");
    let dst = b.1.alloc(LEN * 2, ACCESS).unwrap();
    let wr = RecvWr::new(2)
        .with_sge(dst.sge(100, 10_000).unwrap())
        .with_sge(dst.sge(40_000, 60_000).unwrap());
    srq.post_recv(wr).unwrap();
    let len = 50_000;
    let (_src, want) = post_send(&a, len, Some(0x5a));
    let c = poll_within(&a.2, LIMIT, "SEND completion");
    assert_eq!(c.status, WcStatus::Success, "{c:?}");
    let r = poll_within(&b.2, LIMIT, "receive completion");
    assert_eq!(
        (r.status, r.byte_len, r.wr_id),
        (WcStatus::Success, len as u32, 2)
    );
    assert_eq!(r.imm(), Some(0x5a));
    check_landed(&dst, &want, 10_000);
    assert!(srq.is_empty(), "the SRQ's receive was taken");
    let (sa, sb) = (
        a.3.transport_stats().unwrap(),
        b.3.transport_stats().unwrap(),
    );
    assert_eq!((sa.pulls_sent, sb.pulls_done), (1, 1), "pulled");
}

#[test]
fn a_receive_too_short_fails_as_for_an_ordinary_send_and_nothing_outside_changes() {
    for (k, pull) in [None, Some(None)].into_iter().enumerate() {
        let ips = [("127.0.77.3", "127.0.77.4"), ("127.0.77.5", "127.0.77.6")][k];
        let (a, b) = pair(ips.0, ips.1, pull);
        let dst = b.1.alloc(LEN * 2, ACCESS).unwrap();
        post_recv(&b, &dst, 1000, 20_000);
        let _src = post_send(&a, 32 << 10, None);
        let c = poll_within(&a.2, LIMIT, "SEND completion");
        assert_eq!(c.status, WcStatus::RemInvReqErr, "{pull:?} {c:?}");
        let r = poll_within(&b.2, LIMIT, "receive completion");
        assert_eq!(r.status, WcStatus::LocLenErr, "{pull:?} {r:?}");
        if pull.is_none() {
            assert!(dst.to_vec().iter().all(|b| *b == 0), "nothing copied");
            assert_eq!(b.3.transport_stats().unwrap().pulls_done, 0);
        }
    }
}

#[test]
fn without_a_receive_the_pulled_send_waits_and_lands_after_one_is_posted() {
    let (a, b) = pair("127.0.77.7", "127.0.77.8", None);
    let dst = b.1.alloc(LEN * 2, ACCESS).unwrap();
    let len = 20_000;
    let (_src, want) = post_send(&a, len, None);
    let end = Instant::now() + LIMIT;
    while a.3.transport_stats().unwrap().rnr_naks_received == 0 {
        assert!(a.2.poll_one().is_none(), "no completion before a receive");
        assert!(Instant::now() < end, "no RNR NAK");
    }
    post_recv(&b, &dst, 5_000, 15_000);
    let c = poll_within(&a.2, LIMIT, "SEND completion");
    assert_eq!(c.status, WcStatus::Success, "{c:?}");
    let r = poll_within(&b.2, LIMIT, "receive completion");
    assert_eq!((r.status, r.byte_len), (WcStatus::Success, len as u32));
    check_landed(&dst, &want, 5_000);
    assert_eq!(b.3.transport_stats().unwrap().pulls_done, 1, "pulled again");
}

#[test]
fn with_pulls_off_a_long_send_carries_its_data() {
    let (a, b) = pair("127.0.77.9", "127.0.77.10", Some(None));
    let dst = b.1.alloc(LEN * 2, ACCESS).unwrap();
    post_recv(&b, &dst, 10_000, 60_000);
    let (_src, want) = post_send(&a, LEN, None);
    assert_eq!(poll_within(&a.2, LIMIT, "SEND").status, WcStatus::Success);
    let r = poll_within(&b.2, LIMIT, "receive completion");
    assert_eq!((r.status, r.byte_len), (WcStatus::Success, LEN as u32));
    check_landed(&dst, &want, 10_000);
    let (sa, sb) = (
        a.3.transport_stats().unwrap(),
        b.3.transport_stats().unwrap(),
    );
    assert_eq!((sa.pulls_sent, sb.pulls_done), (0, 0));
}
