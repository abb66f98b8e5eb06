//! One migrate scenario, shared by the tests that differ only in what takes the path away:
//! H streams verifying messages to B over h0; after a quarter of them a trigger runs (a link
//! down, a route moved, an address removed); every message must arrive byte-exact and in
//! order on the same QPs, both QPs end on port 2 with one PATH_MIG each (with the expected
//! causes), both ids get ADDR_CHANGE and never DISCONNECTED, and the DREQ at the end
//! crosses the second link.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use rdma_proto::verbs::MigState;
use rdma_soft::verbs::{AsyncEvent, MigrationCause};
use rdma_testhosts::{Host, Topology};
use rdmacm::cm::{EventType, HaPolicy};
use rdmacm::{AcceptOptions, CloseReason, Connection};

use super::{connect_h, listen_b, rt, within, B_ADDR, HANG};

pub const LEN: usize = 2048;

/// Messages in the stream (`RDMA_HA_MESSAGES`, 2,000 by default).
pub fn messages() -> u32 {
    std::env::var("RDMA_HA_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
        .max(8)
}

/// Message `seq`: its number, then a pattern that depends on it.
pub fn message(seq: u32) -> Vec<u8> {
    let mut m = vec![0u8; LEN];
    m[..4].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in m[4..].iter_mut().enumerate() {
        *b = (seq as usize * 31 + i * 7) as u8;
    }
    m
}

/// The first PATH_MIG event of `dev` (other async events, e.g. port errors, skipped).
pub fn path_mig(dev: &rdma_soft::verbs::Device) -> AsyncEvent {
    loop {
        match dev.wait_async_event(Some(HANG)).unwrap() {
            Some(e @ AsyncEvent::PathMigrated { .. }) => {
                eprintln!("{}: {e:?}", dev.name());
                return e;
            }
            Some(_) => continue,
            None => panic!("hang guard: no PATH_MIG"),
        }
    }
}

/// Waits for the connection's ADDR_CHANGE (the CM's report of the migration).
pub async fn addr_change(c: &Connection) {
    within("ADDR_CHANGE", async {
        loop {
            let ev = c.next_event().await.unwrap();
            match ev.kind() {
                EventType::AddrChange => return,
                EventType::Disconnected => panic!("disconnected instead of migrated"),
                _ => {}
            }
        }
    })
    .await
}

/// Checks `e` is QP `qpn`'s migration from port 1 to 2, with `cause` if given.
pub fn check_mig(e: AsyncEvent, qpn: u32, cause: Option<MigrationCause>, who: &str) {
    match e {
        AsyncEvent::PathMigrated {
            qpn: q,
            cause: c,
            from_port: 1,
            to_port: 2,
        } => {
            assert_eq!(q, qpn, "{who}: the connection's QP");
            if let Some(want) = cause {
                assert_eq!(c, want, "{who}: why it migrated");
            }
        }
        e => panic!("{who}: {e:?}"),
    }
}

/// What a scenario expects of the two sides' migrations.
#[derive(Debug, Clone, Copy, Default)]
pub struct Causes {
    /// H's cause, if it must be one.
    pub h: Option<MigrationCause>,
    /// B's cause, if it must be one.
    pub b: Option<MigrationCause>,
}

/// What a scenario saw on H.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The longest time between two completed sends.
    pub longest: Duration,
    /// H's device's wire counters at the end (faults injected among them).
    pub h_wire: rdma_soft::io::WireStats,
}

/// Runs the scenario on `t` (from [`super::topo`]) with the listener on `tcp_port`;
/// `trigger(h, b)` runs in its own thread after a quarter of the stream.
pub fn migrate_under_stream(
    t: &Topology,
    tcp_port: u16,
    trigger: impl FnOnce(&Host, &Host) + Send,
    causes: Causes,
) -> Outcome {
    let (h, b) = (t.host("h"), t.host("b"));
    let n = messages();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    // B stays until H's disconnect returned: a DREP lost on a lossy path is answered again
    // only while B's CM is there to see the DREQ's retransmission
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let addr: std::net::SocketAddr = format!("{B_ADDR}:{tcp_port}").parse().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || {
            b.run(move || {
                rt().block_on(async move {
                    let l = listen_b(addr, false, &ready_tx).await;
                    let inc = within("request", l.incoming()).await.unwrap();
                    let c = inc.accept(AcceptOptions::default()).await.unwrap();
                    let qpn = c.qp().qpn();
                    assert_eq!(c.qp().query().unwrap().port_num, 1);
                    receive_until_end(&c, &mut 0).await;
                    assert_eq!(c.qp().qpn(), qpn, "the same QP");
                    assert_eq!(c.qp().query().unwrap().port_num, 2, "B moved to port 2");
                    check_mig(path_mig(&c.device().unwrap()), qpn, causes.b, "B");
                    addr_change(&c).await;
                    within("peer's disconnect", c.closed()).await;
                    done_rx.recv().unwrap_or(()); // Err: H ended first (it panicked)
                })
            })
        });
        ready_rx.recv().unwrap();
        s.spawn(move || {
            go_rx.recv().unwrap();
            trigger(h, b);
        });
        h.run(move || {
            rt().block_on(async move {
                let c = connect_h(addr, false).await;
                let id = c.id().unwrap();
                assert_eq!(id.ha_policy(), HaPolicy::Migrate);
                assert_eq!(id.port_num(), Some(1));
                let qp = c.qp().clone();
                assert_eq!(
                    qp.query().unwrap().alt_port_num,
                    2,
                    "an alternate on port 2"
                );
                let mut longest = Duration::ZERO;
                let mut last = Instant::now();
                // n messages, and on until H has moved: the trigger runs in its own thread
                // (an `ip` command), which a fast stream could outrun (release builds did)
                let mut seq = 0u32;
                while seq < n || qp.query().unwrap().port_num != 2 {
                    if seq == n / 4 {
                        go_tx.send(()).unwrap();
                    }
                    within("send", c.send(&message(seq))).await.unwrap();
                    longest = longest.max(last.elapsed());
                    last = Instant::now();
                    seq += 1;
                    assert!(seq < 1_000_000, "H never moved to port 2");
                }
                end_stream(&c, seq).await;
                eprintln!(
                    "longest time between two completed sends: {:.1} ms",
                    longest.as_secs_f64() * 1e3
                );
                assert_eq!(qp.query().unwrap().port_num, 2, "H moved to port 2");
                let dev = c.device().unwrap();
                check_mig(path_mig(&dev), qp.qpn(), causes.h, "H");
                addr_change(&c).await;
                // The DREQ takes the connection's new path.
                within("disconnect", c.disconnect()).await.unwrap();
                drop(done_tx);
                Outcome {
                    longest,
                    h_wire: dev.wire_stats(),
                }
            })
        })
    })
}

/// Sends messages `*seq..` until `done` holds (checked after each), then `extra` more.
pub async fn stream_until(c: &Connection, seq: &mut u32, extra: u32, done: impl Fn() -> bool) {
    let mut more = None;
    loop {
        within("send", c.send(&message(*seq))).await.unwrap();
        *seq += 1;
        assert!(*seq < 1_000_000, "the condition never held");
        if more.is_none() && done() {
            more = Some(extra);
        }
        match more.as_mut() {
            Some(0) => return,
            Some(k) => *k -= 1,
            None => {}
        }
    }
}

/// B's side of a verifying stream: receives messages `*next..` (each byte-exact, in order)
/// until `end`, then answers with the count.
pub async fn receive_until_end(c: &Connection, next: &mut u32) {
    loop {
        let m = within("recv", c.recv()).await.unwrap();
        if m == b"end" {
            break;
        }
        assert_eq!(m, message(*next), "message {next}: byte-exact, in order");
        *next += 1;
    }
    within("count", c.send(&next.to_le_bytes())).await.unwrap();
}

/// H's end of a verifying stream: `end`, and B's count must be `seq`.
pub async fn end_stream(c: &Connection, seq: u32) {
    within("end", c.send(b"end")).await.unwrap();
    let got = within("count", c.recv()).await.unwrap();
    assert_eq!(got, seq.to_le_bytes(), "B received every message once");
}

/// Sends messages `*seq..` until a send fails; then why the connection closed.
pub async fn send_until_closed(c: &Connection, seq: &mut u32) -> CloseReason {
    within("closed", async {
        loop {
            if c.send(&message(*seq)).await.is_err() {
                return c.closed().await;
            }
            *seq += 1;
        }
    })
    .await
}

/// B's side of a connection H ends by losing it: receives (and drops) messages until the
/// connection fails or H says it is done.
pub async fn receive_until_done(c: &Connection, done: tokio::sync::oneshot::Receiver<()>) {
    let mut done = done;
    loop {
        tokio::select! {
            r = c.recv() => if r.is_err() { break },
            _ = &mut done => break,
        }
    }
}

/// The first path taken away from H under a stream by `away(h)`, then given back by
/// `back(h)`: the connection moves to port 2, the restored path is loaded as its new
/// alternate (LAP / APR), and it returns to port 1 (`stay` false: the default,
/// `RDMACM_HA_RETURN=return`) once both QPs are armed, its datagrams leaving through h0
/// again; or, with `stay`, keeps port 2 with the restored path loaded and armed. Every
/// message arrives once, in order, byte-exact; both devices report the migrations.
pub fn away_and_back(
    t: &Topology,
    stay: bool,
    tcp_port: u16,
    away: impl FnOnce(&Host) + Send,
    back: impl FnOnce(&Host) + Send,
) {
    let (h, b) = (t.host("h"), t.host("b"));
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>(); // as in migrate_under_stream
    let (end_port, moves_want): (u8, &[(u8, u8)]) = if stay {
        (2, &[(1, 2)])
    } else {
        (1, &[(1, 2), (2, 1)])
    };
    let migrations = |dev: &rdma_soft::verbs::Device, k: usize| -> Vec<(u8, u8)> {
        (0..k)
            .map(|_| match path_mig(dev) {
                AsyncEvent::PathMigrated {
                    from_port, to_port, ..
                } => (from_port, to_port),
                e => panic!("{e:?}"),
            })
            .collect()
    };
    let addr: std::net::SocketAddr = format!("{B_ADDR}:{tcp_port}").parse().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || {
            b.run(move || {
                rt().block_on(async move {
                    let l = listen_b(addr, stay, &ready_tx).await;
                    let inc = within("request", l.incoming()).await.unwrap();
                    let c = inc.accept(AcceptOptions::default()).await.unwrap();
                    receive_until_end(&c, &mut 0).await;
                    let a = c.qp().query().unwrap();
                    assert_eq!(a.port_num, end_port, "B's port at the end");
                    let dev = c.device().unwrap();
                    assert_eq!(migrations(&dev, moves_want.len()), moves_want);
                    within("peer's disconnect", c.closed()).await;
                    done_rx.recv().unwrap_or(()); // Err: H ended first (it panicked)
                })
            })
        });
        ready_rx.recv().unwrap();
        let host = h;
        h.run(move || {
            rt().block_on(async move {
                let c = connect_h(addr, stay).await;
                let qp = c.qp().clone();
                let attr = || qp.query().unwrap();
                let mut seq = 0;
                stream_until(&c, &mut seq, 100, || true).await;
                away(host);
                stream_until(&c, &mut seq, 100, || attr().port_num == 2).await;
                back(host);
                if stay {
                    // The LAP loaded the restored path; traffic armed it; nobody moved.
                    stream_until(&c, &mut seq, 100, || {
                        let a = attr();
                        a.alt_port_num == 1 && a.path_mig_state == MigState::Armed
                    })
                    .await;
                } else {
                    stream_until(&c, &mut seq, 0, || attr().port_num == 1).await;
                    // back on the wire too: the stream leaves through h0 again
                    let before = super::tx_bytes("h0");
                    stream_until(&c, &mut seq, 100, || true).await;
                    within("flush", c.flush()).await;
                    let sent = super::tx_bytes("h0") - before;
                    let want = 100 * LEN as u64;
                    assert!(
                        sent >= want,
                        "{sent} bytes through h0 for {want} in messages"
                    );
                }
                end_stream(&c, seq).await;
                assert_eq!(attr().port_num, end_port, "H's port at the end");
                let dev = c.device().unwrap();
                assert_eq!(migrations(&dev, moves_want.len()), moves_want);
                eprintln!("{seq} messages, on port {end_port} at the end");
                within("disconnect", c.disconnect()).await.unwrap();
                drop(done_tx);
            })
        });
    });
}
