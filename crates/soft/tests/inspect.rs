//! The inspection socket of this process: served while a provider (a device) exists,
//! answering the snapshot to `query_all`, removed when the last one goes. One test in this
//! binary: it points `RDMA_SOFT_INSPECT_DIR` at its own directory before anything starts.
//!
//! Addresses: 127.0.154.1.

use rdma_soft::inspect;
use rdma_soft::verbs::{Device, DeviceConfig, QpInitAttr};

#[test]
fn a_device_is_served_and_its_socket_goes_with_it() {
    let dir = std::env::temp_dir().join(format!("rdma-soft-inspect-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // the only test of this binary, before any thread of ours reads the environment
    std::env::set_var(inspect::DIR_ENV, &dir);
    assert_eq!(inspect::runtime_dir(), dir);
    assert!(inspect::serving().is_none());

    let mut cfg = DeviceConfig::for_netdev("lo").unwrap();
    cfg.name = "inspect0".into();
    cfg.gids = vec!["127.0.154.1".parse().unwrap()];
    let dev = Device::open(cfg).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let extra = inspect::register(
        "cm_ids",
        Box::new(|| serde_json::json!([{ "cm-idn": 1 }, { "cm-idn": 2 }])),
    );

    let path = inspect::serving().expect("serving with a device open");
    assert_eq!(path, dir.join(format!("{}.sock", std::process::id())));
    let answers = inspect::query_all();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0].pid, std::process::id());
    let snap = answers[0].snapshot.as_ref().unwrap();
    let d = &snap["devices"][0];
    assert_eq!(d["name"], "inspect0");
    assert_eq!(d["ports"][0]["gids"][0]["addr"], "127.0.154.1");
    assert_eq!(d["ports"][0]["gids"][0]["gid"], "::ffff:127.0.154.1");
    assert_eq!(d["qps"][0]["qpn"], qp.qpn());
    assert_eq!(d["qps"][0]["state"], "RESET");
    assert!(d["qps"][0]["peer"].is_null());
    assert_eq!(
        snap["cm_ids"].as_array().unwrap().len(),
        2,
        "an array is spliced in"
    );

    drop(extra);
    assert!(inspect::snapshot().get("cm_ids").is_none());
    assert!(path.exists(), "the device still serves");
    drop(qp);
    // a destroyed QP's counters stay in the device's totals; the QP is no longer listed
    let snap = inspect::snapshot();
    assert_eq!(snap["devices"][0]["qps"].as_array().unwrap().len(), 0);
    drop((cq, pd, dev));
    assert!(!path.exists(), "the last provider removed the socket");
    assert!(inspect::serving().is_none());
    assert!(inspect::query_all().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
