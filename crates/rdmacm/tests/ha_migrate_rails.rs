//! The migrate policy on two rails with no cross routes (issue 30, part 3; root, SKIPPED
//! otherwise): H h0 192.0.2.1/24, h1 198.51.100.1/24 — B b0 192.0.2.2/24, b1
//! 198.51.100.2/24, each link its own subnet and no other route, both hosts grouped
//! (`ha` = h0+h1, `hb` = b0+b1). H has no route to B's 192.0.2.2 through h1, so it offers
//! its h1 address in the REQ and B answers with its b1 address in the REP (`rdmacm`'s
//! `rails` module, docs/HA.md): `ip link set h0 down` under a verifying stream moves the
//! connection to the second rail with nothing lost or duplicated. Against a peer that
//! answers as Linux does (failover accepted, nothing more), the connection has no alternate
//! and ends as `align` ends it.

mod support_ha;
mod support_hosts;

use std::net::IpAddr;
use std::sync::mpsc;

use rdma_soft::verbs::MigrationCause;
use rdma_testhosts::{require_root, topologies, Topology};
use rdmacm::cm::HaPolicy;
use rdmacm::{AcceptOptions, CloseReason, Listener};
use support_ha::stream::{
    addr_change, away_and_back, check_mig, end_stream, path_mig, receive_until_done,
    receive_until_end, send_until_closed, stream_until, LEN,
};
use support_ha::{cma, connect_h, listen_b, rt, tx_bytes, within, B_ADDR};

/// The two rails, as the topology builds them: one subnet per link, no cross routes.
fn rails() -> Topology {
    let t = topologies::two_hosts_two_links().unwrap();
    for (h, ifs) in [(t.host("h"), ["h0", "h1"]), (t.host("b"), ["b0", "b1"])] {
        support_hosts::with_resolver(h, |r| {
            ifs.iter().for_each(|i| support_hosts::wait_running(r, i))
        });
    }
    t
}

/// The GID of `ip` (IPv4-mapped), as a QP's alternate path names it.
fn gid(ip: &str) -> [u8; 16] {
    match ip.parse::<IpAddr>().unwrap() {
        IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        IpAddr::V6(v) => v.octets(),
    }
}

/// The REP's private data B sends (H must see it, and only it).
const TOKEN: &[u8] = b"rails";

/// Messages in the stream (`RDMA_HA_MESSAGES`, 2,000 by default; a quarter before the link
/// goes down).
fn messages() -> u32 {
    support_ha::stream::messages()
}

#[test]
fn link_down_migrates_to_the_second_rail_without_cross_routes() {
    if !require_root("link_down_migrates_to_the_second_rail_without_cross_routes") {
        return;
    }
    let t = rails();
    let (h, b) = (t.host("h"), t.host("b"));
    let n = messages();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let addr: std::net::SocketAddr = format!("{B_ADDR}:7520").parse().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || {
            b.run(move || {
                rt().block_on(async move {
                    let wildcard = format!("0.0.0.0:{}", addr.port()).parse().unwrap();
                    let l = listen_b(wildcard, false, &ready_tx).await;
                    let inc = within("request", l.incoming()).await.unwrap();
                    let opts = AcceptOptions {
                        private_data: TOKEN.to_vec(),
                        ..Default::default()
                    };
                    let c = inc.accept(opts).await.unwrap();
                    let qpn = c.qp().qpn();
                    let a = c.qp().query().unwrap();
                    assert_eq!((a.port_num, a.alt_port_num), (1, 2), "B: alternate on b1");
                    assert_eq!(a.alt_path.dgid, gid("198.51.100.1"), "B: to H's offer");
                    receive_until_end(&c, &mut 0).await;
                    assert_eq!(c.qp().qpn(), qpn, "the same QP");
                    assert_eq!(c.qp().query().unwrap().port_num, 2, "B on b1");
                    check_mig(path_mig(&c.device().unwrap()), qpn, None, "B");
                    addr_change(&c).await;
                    within("peer's disconnect", c.closed()).await;
                    done_rx.recv().unwrap_or(()); // Err: H ended first (it panicked)
                })
            })
        });
        ready_rx.recv().unwrap();
        let host = h;
        h.run(move || {
            rt().block_on(async move {
                let c = connect_h(addr, false).await;
                assert_eq!(c.id().unwrap().port_num(), Some(1));
                let qp = c.qp().clone();
                let a = qp.query().unwrap();
                assert_eq!(a.alt_port_num, 2, "H: an alternate on h1");
                assert_eq!(a.alt_path.dgid, gid("198.51.100.2"), "H: B's answer");
                let pd = c.peer_private_data();
                assert_eq!(&pd[..TOKEN.len()], TOKEN, "B's private data");
                assert!(
                    pd[TOKEN.len()..].iter().all(|&b| b == 0),
                    "the answer is hidden from the application"
                );
                let mut seq = 0u32;
                stream_until(&c, &mut seq, n / 4, || true).await;
                support_hosts::sh(host, &["link", "set", "h0", "down"]);
                stream_until(&c, &mut seq, n / 2, || qp.query().unwrap().port_num == 2).await;
                // the connection keeps running on the second rail, on the wire
                let before = tx_bytes("h1");
                stream_until(&c, &mut seq, n / 4, || true).await;
                within("flush", c.flush()).await;
                let sent = tx_bytes("h1") - before;
                let want = u64::from(n / 4) * LEN as u64;
                assert!(
                    sent >= want,
                    "{sent} bytes through h1 for {want} in messages"
                );
                end_stream(&c, seq).await;
                let dev = c.device().unwrap();
                // H is told by its link
                check_mig(path_mig(&dev), qp.qpn(), Some(MigrationCause::Forced), "H");
                addr_change(&c).await;
                eprintln!("{seq} messages; H's transport: {:?}", qp.transport_stats());
                within("disconnect", c.disconnect()).await.unwrap();
                drop(done_tx);
            })
        });
    });
}

/// h0 down, then up (its subnet's route comes back with it; still no cross route): the
/// connection moves to h1, the restored rail is loaded as its new alternate by LAP / APR
/// (a path to B's address through h0 again) and it returns to port 1, its datagrams
/// leaving through h0; every message once, in order, byte-exact (`support_ha::stream`).
#[test]
fn the_restored_rail_brings_the_connection_back() {
    if !require_root("the_restored_rail_brings_the_connection_back") {
        return;
    }
    let down = |h: &rdma_testhosts::Host| support_hosts::sh(h, &["link", "set", "h0", "down"]);
    let up = |h: &rdma_testhosts::Host| {
        support_hosts::sh(h, &["link", "set", "h0", "up"]);
        h.wait_carrier("h0");
    };
    away_and_back(&rails(), false, 7522, down, up);
}

/// B answers as a Linux peer does (a plain device, no `migrate`: `failover_accepted` 0 and
/// its private data only): H has no alternate, and h0 down ends the connection as `align`
/// (`PathMoved`), with B's private data intact.
#[test]
fn a_peer_that_does_not_answer_the_offer_gets_align() {
    if !require_root("a_peer_that_does_not_answer_the_offer_gets_align") {
        return;
    }
    let t = rails();
    let (h, b) = (t.host("h"), t.host("b"));
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let addr: std::net::SocketAddr = format!("{B_ADDR}:7521").parse().unwrap();
    let full: Vec<u8> = (0..rdma_wire::ip_cm::REP_USER_PRIVATE_DATA_MAX)
        .map(|i| (i * 13 + 1) as u8)
        .collect();
    let sent = full.clone();
    std::thread::scope(|s| {
        s.spawn(move || {
            b.run(move || {
                rt().block_on(async move {
                    let l = Listener::builder()
                        .cma(cma(HaPolicy::Notify))
                        .bind(addr)
                        .await
                        .unwrap();
                    ready_tx.send(()).unwrap();
                    let inc = within("request", l.incoming()).await.unwrap();
                    let opts = AcceptOptions {
                        private_data: sent,
                        ..Default::default()
                    };
                    let c = inc.accept(opts).await.unwrap();
                    assert_eq!(c.qp().query().unwrap().alt_port_num, 0);
                    receive_until_done(&c, done_rx).await;
                })
            })
        });
        ready_rx.recv().unwrap();
        let host = h;
        h.run(move || {
            rt().block_on(async move {
                let c = connect_h(addr, false).await;
                assert_eq!(c.qp().query().unwrap().alt_port_num, 0, "no alternate");
                assert_eq!(c.peer_private_data(), &full[..], "B's private data, whole");
                let mut seq = 0u32;
                stream_until(&c, &mut seq, 20, || true).await;
                support_hosts::sh(host, &["link", "set", "h0", "down"]);
                let why = send_until_closed(&c, &mut seq).await;
                let _ = done_tx.send(());
                assert_eq!(
                    why,
                    CloseReason::PathMoved {
                        status: rdmacm::cm::ALIGN_PATH_MOVED
                    }
                );
            })
        });
    });
}
