//! The migrate policy (issue 11) between two namespace hosts, both grouped (root; SKIPPED
//! otherwise; topology in `ha/mod.rs`: H h0 192.0.2.1, h1 198.51.100.1 — B b0 192.0.2.2,
//! b1 198.51.100.2; B's address is reached over h0, and over h1 through 198.51.100.2 as
//! the fallback route). The connection carries an alternate path over the second link
//! (the REQ's alternate path, accepted in the REP); `ip link set h0 down` under a verifying
//! message stream moves both QPs to port 2 and the stream goes on byte-exact, on the same
//! QPs, PD and MRs; both devices report IBV_EVENT_PATH_MIG, both ids ADDR_CHANGE, and the
//! connection's MADs follow it (the DREQ at the end crosses the second link).

mod support_ha;
mod support_hosts;

use std::sync::mpsc;

use rdma_soft::verbs::{AsyncEvent, MigrationCause};
use rdma_testhosts::{require_root, Host};
use rdmacm::cm::{Cma, HaPolicy};
use rdmacm::{AcceptOptions, ConnectOptions, Connection, Listener};
use support_ha::stream::{
    addr_change, away_and_back, end_stream, message, migrate_under_stream, path_mig,
    receive_until_done, receive_until_end, send_until_closed, stream_until, Causes,
};
use support_ha::{rt, topo, within, B_ADDR};

/// A context with one device over `first` and `second`, ids starting with migrate.
fn group(name: &str, first: &str, second: &str) -> Cma {
    support_ha::group(name, first, second, HaPolicy::Migrate, false)
}

#[test]
fn link_down_moves_the_connection_to_the_second_link() {
    if !require_root("link_down_moves_the_connection_to_the_second_link") {
        return;
    }
    let down = |h: &rdma_testhosts::Host, _: &rdma_testhosts::Host| {
        support_hosts::sh(h, &["link", "set", "h0", "down"])
    };
    // H is told by its link; B usually follows H's first packet on the new path
    let causes = Causes {
        h: Some(MigrationCause::Forced),
        b: None,
    };
    migrate_under_stream(&topo(), 7492, down, causes);
}

#[test]
fn the_restored_link_brings_the_connection_back() {
    restored("the_restored_link_brings_the_connection_back", false, 7493);
}

/// h0 down, then up with its route to B back (an admin down deletes the routes through it,
/// as a network manager would put it back).
fn restored(name: &str, stay: bool, tcp_port: u16) {
    if !require_root(name) {
        return;
    }
    let down = |h: &Host| support_hosts::sh(h, &["link", "set", "h0", "down"]);
    let up = |h: &Host| {
        support_hosts::sh(h, &["link", "set", "h0", "up"]);
        h.wait_carrier("h0");
        support_ha::route_to_h0(h);
    };
    away_and_back(&topo(), stay, tcp_port, down, up);
}

/// The same with `RDMACM_HA_RETURN=stay` (`CmaConfig::ha_stay`): the connection stays on
/// port 2, with the restored path loaded and armed as its alternate for the next failure.
#[test]
fn with_stay_the_connection_keeps_the_second_link() {
    restored("with_stay_the_connection_keeps_the_second_link", true, 7494);
}

/// Against a peer without path migration (a plain device, `notify`: it refuses the REQ's
/// alternate, as a Linux peer does), `migrate` falls back to `align`: h0 down ends the
/// connection with `PathMoved`, and `reconnect` continues over h1 on the same group device
/// (port 2), with the memory registered before the first connect.
#[test]
fn against_a_peer_without_path_migration_migrate_falls_back_to_align() {
    if !require_root("against_a_peer_without_path_migration_migrate_falls_back_to_align") {
        return;
    }
    let t = topo();
    let (h, b) = (t.host("h"), t.host("b"));
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || {
            b.run(move || {
                rt().block_on(async move {
                    let addr = format!("{B_ADDR}:7495").parse().unwrap();
                    let l = Listener::bind(addr).await.unwrap();
                    ready_tx.send(()).unwrap();
                    let inc = within("request 1", l.incoming()).await.unwrap();
                    let c1 = inc.accept(AcceptOptions::default()).await.unwrap();
                    let mut next = 0u32;
                    while let Ok(m) = c1.recv().await {
                        assert_eq!(m, message(next), "message {next}");
                        next += 1;
                    }
                    let inc = within("request 2", l.incoming()).await.unwrap();
                    let c2 = inc
                        .accept(AcceptOptions {
                            private_data: next.to_le_bytes().to_vec(),
                            ..Default::default()
                        })
                        .await
                        .unwrap();
                    receive_until_end(&c2, &mut next).await;
                    within("peer's disconnect", c2.closed()).await;
                })
            })
        });
        ready_rx.recv().unwrap();
        let host = h;
        h.run(move || {
            rt().block_on(async move {
                let opts = ConnectOptions::new().cma(group("ha", "h0", "h1"));
                let addr = format!("{B_ADDR}:7495").parse().unwrap();
                let mut r = within("resolve", Connection::resolve(addr, opts))
                    .await
                    .unwrap();
                let pd = r.device().alloc_pd().unwrap();
                let mr = pd
                    .register(vec![7u8; 64], rdmacm::verbs::AccessFlags::LOCAL_WRITE)
                    .unwrap();
                r.options_mut().setup.pd = Some(pd);
                let c = within("connect", r.connect()).await.unwrap();
                let a = c.qp().query().unwrap();
                assert_eq!(
                    a.alt_port_num, 0,
                    "the peer refused the alternate: none loaded"
                );
                let mut seq = 0u32;
                stream_until(&c, &mut seq, 50, || true).await;
                support_hosts::sh(host, &["link", "set", "h0", "down"]);
                let why = send_until_closed(&c, &mut seq).await;
                assert!(
                    matches!(why, rdmacm::CloseReason::PathMoved { .. }),
                    "{why:?}"
                );
                let r = within("reconnect", c.reconnect(b"")).await.unwrap();
                let c2 = r.connection;
                assert_eq!(c2.device().unwrap().name(), "ha", "the same group device");
                assert_eq!(c2.id().unwrap().port_num(), Some(2), "over h1");
                let mut head = [0u8; 4];
                mr.read(0, &mut head).unwrap();
                assert_eq!(head, [7u8; 4], "the MR lives on");
                let mut next = u32::from_le_bytes(c2.peer_private_data()[..4].try_into().unwrap());
                stream_until(&c2, &mut next, 50, || true).await;
                end_stream(&c2, next).await;
                within("disconnect", c2.disconnect()).await.unwrap();
            })
        });
    });
}

/// Both links down: the migration to h1 fails too (PATH_MIG_ERR), and the connection ends
/// as `align` ends it (`PathMoved`), instead of a bare retry error — what a peer that took
/// the alternate but never moves to it (Linux rxe) also leads to.
#[test]
fn a_failed_migration_ends_the_connection_as_align_does() {
    if !require_root("a_failed_migration_ends_the_connection_as_align_does") {
        return;
    }
    let t = topo();
    let (h, b) = (t.host("h"), t.host("b"));
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            b.run(move || {
                rt().block_on(async move {
                    let addr = format!("{B_ADDR}:7496").parse().unwrap();
                    let l = support_ha::listen_b(addr, false, &ready_tx).await;
                    let inc = within("request", l.incoming()).await.unwrap();
                    let c = inc.accept(AcceptOptions::default()).await.unwrap();
                    // B only receives (its QP never times out): it stops when H is done.
                    receive_until_done(&c, done_rx).await;
                })
            })
        });
        ready_rx.recv().unwrap();
        let host = h;
        h.run(move || {
            rt().block_on(async move {
                let addr = format!("{B_ADDR}:7496").parse().unwrap();
                let c = support_ha::connect_h(addr, false).await;
                assert_eq!(c.qp().query().unwrap().alt_port_num, 2);
                let (dev, qpn) = (c.device().unwrap(), c.qp().qpn());
                let mut seq = 0u32;
                stream_until(&c, &mut seq, 20, || true).await;
                // h1 first: the alternate is dead before the primary goes.
                support_hosts::sh(host, &["link", "set", "h1", "down"]);
                support_hosts::sh(host, &["link", "set", "h0", "down"]);
                let why = send_until_closed(&c, &mut seq).await;
                let _ = done_tx.send(());
                assert_eq!(
                    why,
                    rdmacm::CloseReason::PathMoved {
                        status: rdmacm::cm::ALIGN_PATH_MOVED
                    }
                );
                // the device said why: the QP's migration to port 2 failed
                assert_eq!(
                    path_mig_err(&dev),
                    AsyncEvent::PathMigrationFailed { qpn, port: 2 }
                );
            })
        });
    });
}

/// The first PATH_MIG_ERR of `dev` (other async events, the port errors, skipped).
fn path_mig_err(dev: &rdma_soft::verbs::Device) -> AsyncEvent {
    loop {
        match dev.wait_async_event(Some(support_ha::HANG)).unwrap() {
            Some(e @ AsyncEvent::PathMigrationFailed { .. }) => return e,
            Some(e) => eprintln!("{}: {e:?}", dev.name()),
            None => panic!("hang guard: no PATH_MIG_ERR"),
        }
    }
}

/// Connections in [`many_connections_migrate_at_once`] (`RDMA_HA_CONNS`; 8 by default, the
/// issue's full run is 100).
fn conns() -> usize {
    std::env::var("RDMA_HA_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
        .max(1)
}

/// Many connections on one group device migrate at once when h0 goes down, each stream
/// byte-exact; every QP reports its migration and its id ADDR_CHANGE.
#[test]
fn many_connections_migrate_at_once() {
    if !require_root("many_connections_migrate_at_once") {
        return;
    }
    let t = topo();
    let (h, b) = (t.host("h"), t.host("b"));
    let n = conns();
    const PER: u32 = 200;
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || {
            b.run(move || {
                rt().block_on(async move {
                    let addr = format!("{B_ADDR}:7497").parse().unwrap();
                    let l = support_ha::listen_b(addr, false, &ready_tx).await;
                    let mut tasks = Vec::new();
                    for _ in 0..n {
                        let inc = within("request", l.incoming()).await.unwrap();
                        let c = inc.accept(AcceptOptions::default()).await.unwrap();
                        tasks.push(tokio::spawn(async move {
                            for seq in 0..PER {
                                let m = within("recv", c.recv()).await.unwrap();
                                assert_eq!(m, message(seq), "message {seq}");
                            }
                            within("ack", c.send(b"all received")).await.unwrap();
                            within("peer's disconnect", c.closed()).await;
                        }));
                    }
                    for t in tasks {
                        t.await.unwrap();
                    }
                })
            })
        });
        ready_rx.recv().unwrap();
        let host = h;
        h.run(move || {
            rt().block_on(async move {
                let cma = group("ha", "h0", "h1");
                let addr: std::net::SocketAddr = format!("{B_ADDR}:7497").parse().unwrap();
                let mut cs = Vec::new();
                for _ in 0..n {
                    let opts = ConnectOptions::new().cma(cma.clone());
                    let c = within("connect", Connection::connect(addr, opts))
                        .await
                        .unwrap();
                    assert_eq!(c.qp().query().unwrap().alt_port_num, 2);
                    cs.push(std::sync::Arc::new(c));
                }
                let (half_tx, mut half_rx) = tokio::sync::mpsc::channel::<()>(n);
                let mut tasks = Vec::new();
                for c in &cs {
                    let c = c.clone();
                    let half_tx = half_tx.clone();
                    tasks.push(tokio::spawn(async move {
                        for seq in 0..PER {
                            if seq == PER / 4 {
                                half_tx.send(()).await.unwrap();
                            }
                            within("send", c.send(&message(seq))).await.unwrap();
                        }
                        assert_eq!(within("ack", c.recv()).await.unwrap(), b"all received");
                    }));
                }
                // Down once every connection is under way.
                for _ in 0..n {
                    half_rx.recv().await.unwrap();
                }
                support_hosts::sh(host, &["link", "set", "h0", "down"]);
                for t in tasks {
                    t.await.unwrap();
                }
                let dev = cs[0].device().unwrap();
                let mut moved = std::collections::HashSet::new();
                while moved.len() < n {
                    if let AsyncEvent::PathMigrated {
                        qpn, to_port: 2, ..
                    } = path_mig(&dev)
                    {
                        moved.insert(qpn);
                    }
                }
                for c in &cs {
                    assert!(
                        moved.contains(&c.qp().qpn()),
                        "QP {} migrated",
                        c.qp().qpn()
                    );
                    assert_eq!(c.qp().query().unwrap().port_num, 2);
                    addr_change(c).await;
                    within("disconnect", c.disconnect()).await.unwrap();
                }
                eprintln!("{n} connections migrated");
            })
        });
    });
}
