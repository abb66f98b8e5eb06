//! The align policy with the async layer between two namespace hosts (root; SKIPPED
//! otherwise; topology in `ha/mod.rs`): a verifying message stream H → B over h0, H's
//! route to B moved to h1, the connection closes with `CloseReason::PathMoved`, B sees the
//! peer disconnect, and `Connection::reconnect` continues the stream over h1 byte-exact:
//! the messages that did not complete are handed back (and resent by the test, from where
//! B says it stopped), the memory region registered before the first connect is written
//! by B over the new connection with the same rkey (no re-registration).

mod support_ha;
mod support_hosts;

use std::sync::mpsc;
use std::time::Duration;

use rdma_testhosts::require_root;
use rdmacm::cm::{EventType, HaPolicy, ALIGN_PATH_MOVED};
use rdmacm::verbs::AccessFlags;
use rdmacm::{AcceptOptions, CloseReason, ConnectOptions, Connection, Error, Listener, RemoteBuf};
use support_ha::{cma, route_to_h1, rt, topo, tx_bytes, within, B_ADDR, HANG};

const TOKEN: &[u8; 8] = b"session7";
const LEN: usize = 1024;

/// Message `seq`: its number and a pattern derived from it.
fn message(seq: u32) -> Vec<u8> {
    let mut m = vec![0u8; LEN];
    m[..4].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in m[4..].iter_mut().enumerate() {
        *b = (seq as usize * 7 + i) as u8;
    }
    m
}

fn seq_of(m: &[u8]) -> u32 {
    u32::from_le_bytes(m[..4].try_into().unwrap())
}

/// Receives messages in order from `next` on; returns the next expected one when the
/// connection closes (with the close reason) or `end` arrives (`None`).
async fn take_stream(c: &Connection, next: &mut u32) -> Option<CloseReason> {
    loop {
        match within("server recv", c.recv()).await {
            Ok(m) if m == b"end" => return None,
            Ok(m) => {
                assert_eq!(seq_of(&m), *next, "in order, exactly once");
                assert_eq!(m, message(*next), "byte-exact");
                *next += 1;
            }
            Err(Error::Closed(why)) => return Some(why),
            Err(e) => panic!("server recv: {e}"),
        }
    }
}

#[test]
fn align_closes_and_reconnect_continues_over_h1() {
    if !require_root("align_closes_and_reconnect_continues_over_h1") {
        return;
    }
    let t = topo();
    let (h, b) = (t.host("h"), t.host("b"));
    let (ready_tx, ready_rx) = mpsc::channel();
    let (phase_tx, phase_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let server = s.spawn(move || {
            b.run(move || {
                rt().block_on(async move {
                    let addr = format!("{B_ADDR}:7471").parse().unwrap();
                    let l = Listener::builder()
                        .cma(cma(HaPolicy::Notify))
                        .bind(addr)
                        .await
                        .unwrap();
                    ready_tx.send(()).unwrap();
                    let inc = within("request 1", l.incoming()).await.unwrap();
                    assert_eq!(&inc.private_data()[..8], TOKEN);
                    let rb = RemoteBuf::from_bytes(&inc.private_data()[8..24]).unwrap();
                    let c1 = inc.accept(AcceptOptions::default()).await.unwrap();
                    within("write 1", c1.write(&rb, b"over path one"))
                        .await
                        .unwrap();
                    let mut next = 0;
                    let why = take_stream(&c1, &mut next).await;
                    assert_eq!(why, Some(CloseReason::PeerDisconnected));
                    // The new connection is a normal request: matched by its token.
                    let inc = within("request 2", l.incoming()).await.unwrap();
                    assert_eq!(&inc.private_data()[..8], TOKEN);
                    assert_eq!(
                        inc.peer_addr().unwrap().ip().to_string(),
                        "198.51.100.1",
                        "the new path's source"
                    );
                    let opts = AcceptOptions {
                        private_data: next.to_le_bytes().to_vec(),
                        ..Default::default()
                    };
                    let c2 = inc.accept(opts).await.unwrap();
                    // The same rkey, valid on the new connection: nothing re-registered.
                    within("write 2", c2.write(&rb, b"over path two"))
                        .await
                        .unwrap();
                    assert_eq!(take_stream(&c2, &mut next).await, None);
                    next
                })
            })
        });
        ready_rx.recv().unwrap();
        let client = s.spawn(move || {
            h.run(move || {
                rt().block_on(async move {
                    let opts = ConnectOptions::new()
                        .ha(HaPolicy::Align)
                        .cma(cma(HaPolicy::Notify));
                    let addr = format!("{B_ADDR}:7471").parse().unwrap();
                    let mut r = within("resolve", Connection::resolve(addr, opts))
                        .await
                        .unwrap();
                    let pd = r.device().alloc_pd().unwrap();
                    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
                    let mr = pd.register(vec![0u8; 64], access).unwrap();
                    let keys = (mr.lkey(), mr.rkey());
                    let mut pdata = TOKEN.to_vec();
                    pdata.extend_from_slice(&RemoteBuf::of(&mr).to_bytes());
                    r.options_mut().setup.pd = Some(pd);
                    r.options_mut().private_data = pdata;
                    let c = within("connect", r.connect()).await.unwrap();
                    assert_eq!(c.id().unwrap().ha_policy(), HaPolicy::Align);
                    assert_eq!(c.id().unwrap().netdev().unwrap().0, "h0");
                    let old_qpn = c.qp().qpn();
                    let mut seq = 0u32;
                    while seq < 32 {
                        c.send(&message(seq)).await.unwrap();
                        seq += 1;
                    }
                    within("flush", c.flush()).await;
                    // From here H's datagrams over h0 go to a MAC nobody has (B's kernel
                    // drops them): the next messages are posted and never acknowledged, so
                    // that the close must hand them back (without this the stream may be
                    // all acknowledged when the close comes, and nothing handed back).
                    support_hosts::sh(
                        h,
                        &[
                            "neigh",
                            "replace",
                            B_ADDR,
                            "lladdr",
                            "02:00:00:00:00:99",
                            "dev",
                            "h0",
                            "nud",
                            "permanent",
                        ],
                    );
                    let stalled = seq;
                    while seq < stalled + 4 {
                        c.send(&message(seq)).await.unwrap();
                        seq += 1;
                    }
                    phase_tx.send(()).unwrap();
                    // Keep sending while the route moves: some sends are in flight when
                    // the CM ends the connection.
                    loop {
                        match c.send(&message(seq)).await {
                            Ok(()) => seq += 1,
                            Err(Error::NotConnected | Error::Closed(_)) => break,
                            Err(e) => panic!("send: {e}"),
                        }
                        if seq % 8 == 0 {
                            tokio::task::yield_now().await;
                        }
                        if seq > 100_000 {
                            panic!("the connection never closed");
                        }
                    }
                    let why = within("closed", c.closed()).await;
                    assert_eq!(
                        why,
                        CloseReason::PathMoved {
                            status: ALIGN_PATH_MOVED
                        }
                    );
                    let ev = within("event", async {
                        loop {
                            let ev = c.next_event().await.unwrap();
                            if ev.kind() == EventType::Disconnected {
                                return ev;
                            }
                        }
                    })
                    .await;
                    assert_eq!(ev.status(), ALIGN_PATH_MOVED);
                    drop(ev);
                    let tx0 = tx_bytes("h1");
                    let r = within("reconnect", c.reconnect(TOKEN)).await.unwrap();
                    let c2 = r.connection;
                    assert_ne!(c2.qp().qpn(), old_qpn, "a new QP");
                    assert_eq!(c2.id().unwrap().ha_policy(), HaPolicy::Align);
                    assert_eq!((mr.lkey(), mr.rkey()), keys);
                    assert!(r.unread.is_empty());
                    let next = u32::from_le_bytes(c2.peer_private_data()[..4].try_into().unwrap());
                    // Nothing lost: every message B lacks was handed back, in order; and
                    // B lacks the stalled ones at least: the hand-back ran.
                    assert!(
                        next <= stalled,
                        "B got {next} messages, {stalled} before the stall"
                    );
                    let resend: Vec<&Vec<u8>> =
                        r.unfinished.iter().filter(|m| seq_of(m) >= next).collect();
                    let want: Vec<u32> = (next..seq).collect();
                    let got: Vec<u32> = resend.iter().map(|m| seq_of(m)).collect();
                    assert_eq!(
                        got,
                        want,
                        "unfinished {:?}",
                        r.unfinished.iter().map(|m| seq_of(m)).collect::<Vec<_>>()
                    );
                    for m in &resend {
                        assert_eq!(**m, message(seq_of(m)));
                        c2.send(m).await.unwrap();
                    }
                    let end = seq + 64;
                    while seq < end {
                        c2.send(&message(seq)).await.unwrap();
                        seq += 1;
                    }
                    c2.send(b"end").await.unwrap();
                    c2.flush().await;
                    // B's WRITE over the new connection landed in the old region.
                    let mut got = [0u8; 13];
                    within("write 2 lands", async {
                        loop {
                            mr.read(0, &mut got).unwrap();
                            if &got == b"over path two" {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    })
                    .await;
                    let sent_h1 = tx_bytes("h1") - tx0;
                    assert!(
                        sent_h1 >= 64 * LEN as u64,
                        "the new connection's data left over h1 ({sent_h1} bytes)"
                    );
                    c2.disconnect().await.unwrap();
                    (seq, r.unfinished.len())
                })
            })
        });
        phase_rx.recv_timeout(HANG).expect("first phase");
        route_to_h1(h);
        let (sent, unfinished) = client.join().unwrap();
        let received = server.join().unwrap();
        assert_eq!(received, sent, "B received every message once");
        eprintln!("{sent} messages, {unfinished} handed back by reconnect");
    });
}
