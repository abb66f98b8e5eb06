//! `attach_mcast` / `detach_mcast` refusals on loopback (no root): an RC QP, a GID that is
//! not a multicast address, a detach of a group never attached; and an address handle to a
//! group is accepted. Datagrams to groups: `crates/rdmacm/tests/mcast*.rs` (namespaces).

use rdma_soft::io::{UdpConfig, UdpWire, WireAddr};
use rdma_soft::verbs::*;

fn device() -> Device {
    let mut cfg = DeviceConfig::for_netdev("lo").unwrap();
    cfg.gids = vec!["127.0.61.1".parse().unwrap()];
    let wire = UdpWire::new(UdpConfig {
        port: 47961,
        ..UdpConfig::default()
    })
    .unwrap();
    Device::open_with_wire(cfg, Box::new(wire)).unwrap()
}

fn gid(s: &str) -> [u8; 16] {
    s.parse::<WireAddr>().unwrap().gid()
}

#[test]
fn attach_refuses_rc_qps_unicast_gids_and_unknown_detaches() {
    let d = device();
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(16, None).unwrap();
    let rc = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let e = rc.attach_mcast(gid("239.1.2.3"), 0).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert!(rc.set_block_self_mcast_loopback(true).is_err());
    let ud = pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    ud.ud_ready(0x0123_4567).unwrap();
    let e = ud.attach_mcast(gid("127.0.61.2"), 0).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    let e = ud.detach_mcast(gid("239.1.2.3"), 0).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert!(ud.mcast_groups().is_empty());
    assert_eq!(
        mcast_group(gid("ff0e::1")).unwrap(),
        "ff0e::1".parse::<WireAddr>().unwrap()
    );
    // sending to a group needs only an address handle
    let ah = pd
        .create_ah(&PathAttr {
            dgid: gid("239.1.2.3"),
            ..PathAttr::default()
        })
        .unwrap();
    assert_eq!(ah.remote(), "239.1.2.3".parse::<WireAddr>().unwrap());
}
