//! The migrate policy with loss, duplication and reordering on the surviving path (issue 11;
//! root, SKIPPED otherwise): `RDMA_SOFT_FAULTS` with `local=198.51.100.1` puts faults on
//! every datagram H sends from or receives on its second link's address, so the first link
//! is clean and the path the connection migrates to is not. `ip link set h0 down` under the
//! verifying stream (`ha/stream.rs`): every message byte-exact, once, in order, on the same
//! QPs. Its own binary: the environment is the process's.

mod support_ha;
mod support_hosts;

use rdma_soft::verbs::MigrationCause;
use rdma_testhosts::{require_root, Host};
use support_ha::stream::{migrate_under_stream, Causes};
use support_ha::topo;

/// The faults (`RDMA_HA_LOSS_SPEC` overrides them).
const FAULTS: &str = "loss=0.05,dup=0.02,reorder=0.05,dir=both,seed=11,local=198.51.100.1";

#[test]
fn loss_on_the_surviving_path_loses_nothing() {
    if !require_root("loss_on_the_surviving_path_loses_nothing") {
        return;
    }
    support_hosts::log_from_env();
    let spec = std::env::var("RDMA_HA_LOSS_SPEC").unwrap_or_else(|_| FAULTS.into());
    // set before any device or thread exists (one test in this binary)
    std::env::set_var(rdma_soft::io::FAULTS_ENV, &spec);
    let t = topo();
    let (tx, rx) = std::sync::mpsc::channel();
    let down = move |h: &Host, _: &Host| {
        support_hosts::sh(h, &["link", "set", "h0", "down"]);
        tx.send(()).unwrap();
    };
    let causes = Causes {
        h: Some(MigrationCause::Forced),
        b: None,
    };
    let out = migrate_under_stream(&t, 7497, down, causes);
    rx.recv().unwrap();
    let w = &out.h_wire;
    let (sent, recv) = (&w.faults_send, &w.faults_recv);
    eprintln!("faults on H's second link: sent {sent:?}, received {recv:?}");
    // every fault the spec asks for happened, in each direction it names
    let faults: rdma_soft::io::FaultSpec = spec.parse().unwrap();
    for (way, on, f) in [
        ("sent", faults.on_send(), sent),
        ("received", faults.on_recv(), recv),
    ] {
        for (kind, p, n) in [
            ("lost", faults.loss, f.dropped),
            ("duplicated", faults.dup, f.duplicated),
            ("reordered", faults.reorder, f.reordered),
            ("corrupted", faults.corrupt, f.corrupted),
        ] {
            assert_eq!(
                n > 0,
                on && p > 0.0,
                "datagrams {kind} on the surviving path, {way}: {n}"
            );
        }
    }
}
