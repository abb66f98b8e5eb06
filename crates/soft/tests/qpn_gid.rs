//! QP numbers are allocated cyclically (a destroyed QP's number does not come back at the
//! next create), and the GID table of an open device follows add/remove.

use std::collections::HashSet;

use rdma_soft::io::WireAddr;
use rdma_soft::verbs::{Device, DeviceConfig, QpInitAttr};

fn dev() -> Device {
    Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap()
}

#[test]
fn qp_numbers_are_cyclic_not_reused_at_once() {
    let d = dev();
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(16, None).unwrap();
    let mut seen = HashSet::new();
    let mut slots = HashSet::new();
    // Create and destroy one QP at a time: a LIFO free list would give the same slot
    // every time; cyclic allocation walks through fresh slots.
    for _ in 0..300 {
        let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
        let qpn = qp.qpn();
        assert!(qpn & 0xFFFF >= 2, "slots 0 and 1 are reserved: {qpn:#x}");
        assert!(seen.insert(qpn), "QPN {qpn:#x} came back");
        slots.insert(qpn & 0xFFFF);
        drop(qp);
    }
    assert_eq!(slots.len(), 300);
    // Live QPs keep their slots; the next one is after the last handed out.
    let a = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let b = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    assert_eq!((b.qpn() & 0xFFFF), (a.qpn() & 0xFFFF) + 1);
}

#[test]
fn gid_table_of_an_open_device_follows_add_and_remove() {
    let d = dev();
    assert!(d.gids().is_empty());
    let a: WireAddr = "127.0.7.1".parse().unwrap();
    let b: WireAddr = "127.0.7.2".parse().unwrap();
    assert_eq!(d.add_gid(a).unwrap(), 0);
    assert_eq!(d.add_gid(b).unwrap(), 1);
    assert_eq!(d.add_gid(a).unwrap(), 0, "present: same index");
    assert_eq!(d.gids(), vec![a, b]);
    assert_eq!(d.query_port(1).unwrap().gid_tbl_len, 2);
    assert!(d.remove_gid(a.ip()));
    assert!(!d.remove_gid(a.ip()));
    assert_eq!(d.gid_index(b.ip()), Some(0));
    assert_eq!(d.gids(), vec![b]);
    for i in 0..255u8 {
        d.add_gid(WireAddr::new([127, 1, 0, i].into(), 0)).unwrap();
    }
    let e = d.add_gid("127.2.0.1".parse().unwrap()).unwrap_err();
    assert_eq!(e.errno(), libc::ENOMEM, "{e}");
}
