//! Shared by the HA tests: the two-link topology and contexts with a given policy.

#![allow(dead_code)]

pub mod stream;

use rdma_testhosts::{topologies, Host, Topology};
use rdmacm::cm::{Cma, CmaConfig, DeviceSpec, HaPolicy};
use rdmacm::{ConnectOptions, Connection, Listener};

use crate::support_hosts::{wait_running, with_resolver};

/// B's address, reached over h0 first.
pub const B_ADDR: &str = "192.0.2.2";

/// Hang guard of every wait (a stop, not a speed target).
pub const HANG: std::time::Duration = std::time::Duration::from_secs(120);

/// `f`, or a panic naming `what` after [`HANG`].
pub async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(HANG, f)
        .await
        .unwrap_or_else(|_| panic!("hang guard: {what}"))
}

/// The runtime each host thread of an async HA test runs on.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A context with one device `name` over `first` (port 1) and `second` (port 2), ids
/// starting with `ha` (and `stay` as `CmaConfig::ha_stay`).
pub fn group(name: &str, first: &str, second: &str, ha: HaPolicy, stay: bool) -> Cma {
    let spec = DeviceSpec {
        netdev: first.into(),
        name: Some(name.into()),
        more: vec![second.into()],
    };
    Cma::with_config(
        CmaConfig::builder()
            .device_specs(Some(vec![spec]))
            .ha(ha)
            .ha_stay(stay)
            .soft(soft())
            .build(),
    )
    .unwrap()
}

/// The devices' settings: the environment's (`RDMA_SOFT_FAULTS` in `ha_migrate_loss`).
fn soft() -> rdma_soft::SoftConfig {
    rdma_soft::SoftConfig::from_env().unwrap()
}

/// B's listener on `addr`, its device group hb (b0 + b1) under migrate (`stay` as
/// `CmaConfig::ha_stay`); `ready` is told once it listens.
pub async fn listen_b(
    addr: std::net::SocketAddr,
    stay: bool,
    ready: &std::sync::mpsc::Sender<()>,
) -> Listener {
    let cma = group("hb", "b0", "b1", HaPolicy::Migrate, stay);
    let l = Listener::builder().cma(cma).bind(addr).await.unwrap();
    ready.send(()).unwrap();
    l
}

/// H's connection to `addr` over its device group ha (h0 + h1) under migrate (`stay` as
/// `CmaConfig::ha_stay`).
pub async fn connect_h(addr: std::net::SocketAddr, stay: bool) -> Connection {
    let opts = ConnectOptions::new().cma(group("ha", "h0", "h1", HaPolicy::Migrate, stay));
    within("connect", Connection::connect(addr, opts))
        .await
        .unwrap()
}

/// A context whose ids start with `ha`.
pub fn cma(ha: HaPolicy) -> Cma {
    Cma::with_config(CmaConfig::builder().ha(ha).soft(soft()).build()).unwrap()
}

/// H and B with two links, B's address over h0 (metric 10) and h1 (metric 100), reverse
/// path filtering off (replies may come back on the other link).
pub fn topo() -> Topology {
    let t = topologies::two_hosts_two_links_builder()
        .route("h", "192.0.2.2/32 dev h0 metric 10")
        .route("h", "192.0.2.2/32 via 198.51.100.2 dev h1 metric 100")
        .build()
        .unwrap();
    for (h, ifs) in [(t.host("h"), ["h0", "h1"]), (t.host("b"), ["b0", "b1"])] {
        with_resolver(h, |r| ifs.iter().for_each(|i| wait_running(r, i)));
        for d in ["all", "default", ifs[0], ifs[1]] {
            let _ = h.set_sysctl(&format!("net/ipv4/conf/{d}/rp_filter"), "0");
        }
    }
    t
}

/// Moves H's route to B from h0 to h1 (no link change).
pub fn route_to_h1(h: &Host) {
    crate::support_hosts::sh(
        h,
        &[
            "route",
            "replace",
            "192.0.2.2/32",
            "via",
            "198.51.100.2",
            "dev",
            "h1",
            "metric",
            "10",
        ],
    );
}

/// Puts H's route to B back through h0 (as the topology has it).
pub fn route_to_h0(h: &Host) {
    crate::support_hosts::sh(
        h,
        &[
            "route",
            "replace",
            "192.0.2.2/32",
            "dev",
            "h0",
            "metric",
            "10",
        ],
    );
}

/// Bytes `dev` sent, read in the calling thread's namespace. Bytes, not packets: with
/// UDP GSO one batch of datagrams crosses a veth as one packet.
pub fn tx_bytes(dev: &str) -> u64 {
    let t = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
    let line = t
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{dev}:")))
        .unwrap_or_else(|| panic!("{dev} not in /proc/net/dev"));
    let f: Vec<&str> = line.split(':').nth(1).unwrap().split_whitespace().collect();
    f[8].parse().unwrap()
}
