//! libfabric's verbs provider (Debian's libfabric-bin 1.17) over our libraries: its
//! `FI_EP_MSG` (rdma_cm) domains, between two namespace hosts (root). `fi_info` given an
//! address, as a libfabric MSG application gives one, finds the domain `eth0` on both sides
//! (server: its source address; client: the server's, with its own filled in by
//! `rdma_resolve_addr`).
//!
//! What does not work, by libfabric's own logic (docs/CABI.md): `fi_getinfo` with no address
//! at all (`fi_pingpong -e msg`, `-e rdm` over `verbs;ofi_rxm`) picks the domain by binding
//! an rdma_cm id to "localhost", and MSG domains exist only for interfaces that are not
//! `IFF_LOOPBACK` (`vrb_getifaddrs`): our `lo` device has none, so the answer is
//! `-FI_ENODATA` (-61). Over Linux the bind itself fails (`ENODEV`), with the same -61.

mod support;

use support::{bin, lib_dir};

fn fi_info(h: &rdma_testhosts::Host, args: &[&str]) -> String {
    let mut c = h.command(bin("fi_info").to_str().unwrap());
    c.args(["-p", "verbs", "-t", "FI_EP_MSG", "-v"])
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("FI_PROVIDER", "verbs"); // no other provider's start-up
    let o = c.output().unwrap();
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "fi_info {args:?}: {t}");
    t
}

#[test]
fn fi_info_finds_msg_domains_between_namespace_hosts() {
    if !rdma_testhosts::require_root("fi_info_finds_msg_domains_between_namespace_hosts") {
        return;
    }
    let topo = rdma_testhosts::topologies::two_hosts_one_link().expect("topology");
    let (a, b) = (&topo.hosts()[0], &topo.hosts()[1]);
    a.wait_carrier("eth0");
    b.wait_carrier("eth0");
    let server = fi_info(b, &["-s", "192.0.2.2", "-P", "17571"]);
    for want in [
        "type: FI_EP_MSG",
        "name: eth0",
        "src_addr: fi_sockaddr_in://192.0.2.2:17571",
    ] {
        assert!(server.contains(want), "{want:?} missing:\n{server}");
    }
    let client = fi_info(a, &["-n", "192.0.2.2", "-P", "17571"]);
    for want in [
        "type: FI_EP_MSG",
        "name: eth0",
        "src_addr: fi_sockaddr_in://192.0.2.1:0",
        "dest_addr: fi_sockaddr_in://192.0.2.2:17571",
    ] {
        assert!(client.contains(want), "{want:?} missing:\n{client}");
    }
}
