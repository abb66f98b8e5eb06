//! Linux's own IPv6 REQs (rxe + rdma_cm, `../shared/captures/ipv6-global.pcap` and
//! `ipv6-linklocal.pcap`) replayed into our passive side, datagram for datagram: between two
//! namespace hosts holding the capture's addresses (so the captured ICRC stays valid), the
//! "Linux" host sends the captured REQ from its captured UDP port, and our listener must
//! report CONNECT_REQUEST with Linux's addresses and answer with a REP to it. Needs root.

mod support_v6_replay;

use std::path::{Path, PathBuf};

use rdma_testhosts::require_root;
use support_v6_replay::{reqs, Replay};

fn captures_dir() -> PathBuf {
    if let Ok(d) = std::env::var("RDMA_CAPTURES_DIR") {
        return PathBuf::from(d);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/captures")
}

fn replay(case: &str, link_local: bool) {
    let all = reqs(&captures_dir().join(format!("{case}.pcap")));
    assert!(!all.is_empty(), "{case} holds REQs");
    let how = Replay {
        name: &format!("v6req-{}", if link_local { "ll" } else { "g" }),
        link_local,
        prefix: 64,
        prepare: |_| {},
    };
    support_v6_replay::replay(&all[0], &how);
}

#[test]
fn linux_ipv6_global_req_gets_a_rep() {
    if !require_root("linux_ipv6_global_req_gets_a_rep") {
        return;
    }
    replay("ipv6-global", false);
}

#[test]
fn linux_ipv6_link_local_req_gets_a_rep() {
    if !require_root("linux_ipv6_link_local_req_gets_a_rep") {
        return;
    }
    replay("ipv6-linklocal", true);
}
