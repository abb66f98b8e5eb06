//! Linux rxe sends RoCEv2 over IPv6 with a zero UDP checksum (the ICRC covers the packet).
//! Our sockets used to let the kernel drop those datagrams, so a Linux peer's REQ (Linux
//! `rping -c` → our `rping -s` over 2001:db8::/64) and REP (our `rping -c` → Linux's
//! `rping -s` over fe80::) never reached us: the Linux client timed out, ours reported
//! UNREACHABLE -110. `captures/refvm-ipv6.pcap` is that traffic between our rping and Linux
//! 6.1 rxe in `../shared/refvm` (after the fix: both directions, global and link-local);
//! this test replays Linux's REQs from it as Linux sent them, checksum 0, between two
//! namespace hosts holding the capture's addresses (so the ICRC stays valid), and our
//! listener must answer each with a REP. Needs root.

mod support_v6_replay;

use std::net::{Ipv6Addr, UdpSocket};
use std::os::fd::AsRawFd;

use rdma_testhosts::require_root;
use support_v6_replay::{reqs, Replay, Req};

/// Linux's REQs in the fixture: those from the VM's addresses (2001:db8::2, its fe80::).
fn linux_req(link_local: bool) -> Req {
    let vm: Ipv6Addr = if link_local {
        "fe80::5054:ff:fe00:202".parse().unwrap()
    } else {
        "2001:db8::2".parse().unwrap()
    };
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/captures/refvm-ipv6.pcap");
    reqs(&path)
        .into_iter()
        .find(|r| r.src == vm)
        .unwrap_or_else(|| panic!("a REQ from {vm} in the fixture"))
}

/// Sends like rxe: `UDP_NO_CHECK6_TX`, so the checksum field is 0 on the wire.
fn zero_checksum(s: &UdpSocket) {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt on a valid socket with a c_int of the right size.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_NO_CHECK6_TX,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(
        rc,
        0,
        "UDP_NO_CHECK6_TX: {}",
        std::io::Error::last_os_error()
    );
}

fn replay(link_local: bool) {
    let req = linux_req(link_local);
    assert_eq!(req.csum, 0, "rxe's IPv6 UDP checksum is 0 on the wire");
    let how = Replay {
        name: &format!("v6z{}", if link_local { "ll" } else { "g" }),
        link_local,
        prefix: 64,
        prepare: zero_checksum,
    };
    support_v6_replay::replay(&req, &how);
}

#[test]
fn linux_zero_checksum_req_global() {
    if !require_root("linux_zero_checksum_req_global") {
        return;
    }
    replay(false);
}

#[test]
fn linux_zero_checksum_req_link_local() {
    if !require_root("linux_zero_checksum_req_link_local") {
        return;
    }
    replay(true);
}
