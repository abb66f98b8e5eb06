//! The async data path of `Connection`: messages, credits, teardown, error text.
//!
//! Client and server share one process and one context per test, each test on its own
//! 127.0.60.x address.

use std::sync::Arc;
use std::time::Duration;

use rdmacm::cm::{Cma, EventType};
use rdmacm::verbs::{QpState, WcStatus};
use rdmacm::{CloseReason, ConnectOptions, Connection, Error, RemoteBuf, MAX_MESSAGE, WINDOW};

mod support_async;

use support_async::{pair, within};

fn pattern(seq: u32, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len)
        .map(|i| (i as u32 ^ seq.wrapping_mul(31)) as u8)
        .collect();
    if len >= 4 {
        v[..4].copy_from_slice(&seq.to_le_bytes());
    }
    v
}

fn rnr_naks(c: &Connection) -> u64 {
    c.qp().transport_stats().unwrap().rnr_naks_received
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_every_size_byte_exact() {
    let (c, s) = pair("127.0.60.1").await;
    let s = Arc::new(s);
    let s2 = s.clone();
    let echo = tokio::spawn(async move {
        let mut n = 0u32;
        while let Ok(m) = s2.recv().await {
            s2.send(&m).await.unwrap();
            n += 1;
        }
        n
    });
    let sizes = [0usize, 1, 63, 64, 65, 4096, 4097, 60_000, MAX_MESSAGE];
    for round in 0..3u32 {
        for (i, &len) in sizes.iter().enumerate() {
            let msg = pattern(round * 100 + i as u32, len);
            within("send", c.send(&msg)).await.unwrap();
            let got = within("echo", c.recv()).await.unwrap();
            assert_eq!(got.len(), len);
            assert!(got == msg, "round {round} size {len}: echo differs");
        }
    }
    within("disconnect", c.disconnect()).await.unwrap();
    let n = within("server loop ends", echo).await.unwrap();
    assert_eq!(n as usize, 3 * sizes.len());
    assert_eq!(rnr_naks(&c) + rnr_naks(&s), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_long_message_is_refused_and_nothing_is_sent() {
    let (c, s) = pair("127.0.60.2").await;
    let e = c.send(&vec![7u8; MAX_MESSAGE + 1]).await.unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert!(e.to_string().contains(&MAX_MESSAGE.to_string()), "{e}");
    // The connection still works, and the refused message never arrived.
    c.send(b"after").await.unwrap();
    assert_eq!(within("recv", s.recv()).await.unwrap(), b"after");
}

/// The receiver takes nothing: exactly WINDOW sends complete, the next waits for a credit,
/// which the first `recv` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sender_stops_at_the_window_until_the_receiver_takes_a_message() {
    let (c, s) = pair("127.0.60.3").await;
    for i in 0..WINDOW {
        within("send within the window", c.send(&pattern(i, 100)))
            .await
            .unwrap();
    }
    let extra = pattern(WINDOW, 100);
    let blocked = c.send(&extra);
    tokio::pin!(blocked);
    // Pending: no credit left (whatever the time given, it cannot complete while the
    // receiver takes nothing).
    assert!(
        tokio::time::timeout(Duration::from_millis(200), blocked.as_mut())
            .await
            .is_err(),
        "a send beyond the window completed without a credit"
    );
    let first = within("recv", s.recv()).await.unwrap();
    assert_eq!(first, pattern(0, 100));
    within("send after a credit came back", blocked)
        .await
        .unwrap();
    for i in 1..=WINDOW {
        assert_eq!(within("recv", s.recv()).await.unwrap(), pattern(i, 100));
    }
    assert_eq!(rnr_naks(&c), 0, "a SEND found no receive posted");
}

/// A one-way stream: the receiver never sends data, so its credits go back in control
/// messages; every message arrives once, in order, byte exact, with no RNR NAK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_way_stream_returns_credits_in_control_messages() {
    let (c, s) = pair("127.0.60.4").await;
    const N: u32 = 2000;
    let rx = tokio::spawn(async move {
        for i in 0..N {
            let m = s.recv().await.unwrap();
            assert!(m == pattern(i, 4096), "message {i} differs");
        }
        s
    });
    for i in 0..N {
        within("send", c.send(&pattern(i, 4096))).await.unwrap();
    }
    let s = within("receiver", rx).await.unwrap();
    assert_eq!(rnr_naks(&c) + rnr_naks(&s), 0);
}

/// Both sides stream at once (credits ride on data both ways).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_directions_at_once() {
    let (c, s) = pair("127.0.60.5").await;
    const N: u32 = 1000;
    let (c, s) = (Arc::new(c), Arc::new(s));
    let mut tasks = Vec::new();
    for (a, b, salt) in [
        (c.clone(), s.clone(), 0u32),
        (s.clone(), c.clone(), 1 << 20),
    ] {
        tasks.push(tokio::spawn(async move {
            for i in 0..N {
                a.send(&pattern(salt + i, 1000 + (i as usize % 7) * 500))
                    .await
                    .unwrap();
            }
        }));
        tasks.push(tokio::spawn(async move {
            for i in 0..N {
                let m = b.recv().await.unwrap();
                assert!(m == pattern(salt + i, 1000 + (i as usize % 7) * 500));
            }
        }));
    }
    for t in tasks {
        within("streams", t).await.unwrap();
    }
    assert_eq!(rnr_naks(&c) + rnr_naks(&s), 0);
}

/// The peer disconnects: the pending recv fails at once with the reason, `closed()` says
/// why, later sends are NotConnected, both QPs are in Err, and `disconnect()` on the
/// initiating side returned only after DISCONNECTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_disconnect_fails_pending_recv_and_later_sends() {
    let (c, s) = pair("127.0.60.6").await;
    let s = Arc::new(s);
    let s2 = s.clone();
    let pending = tokio::spawn(async move { s2.recv().await });
    let s3 = s.clone();
    let closed = tokio::spawn(async move { s3.closed().await });
    within("disconnect", c.disconnect()).await.unwrap();
    // DISCONNECTED came (disconnect waited for it) and is still reported as an event.
    let ev = within("client event", c.next_event()).await.unwrap();
    assert_eq!(ev.kind(), EventType::Disconnected);
    drop(ev);
    match within("pending recv", pending).await.unwrap() {
        Err(Error::Closed(CloseReason::PeerDisconnected)) => {}
        other => panic!("pending recv: {other:?}"),
    }
    assert_eq!(
        within("closed", closed).await.unwrap(),
        CloseReason::PeerDisconnected
    );
    assert!(matches!(s.send(b"x").await, Err(Error::NotConnected)));
    assert!(matches!(c.send(b"x").await, Err(Error::NotConnected)));
    assert!(matches!(
        c.recv().await,
        Err(Error::Closed(CloseReason::LocalDisconnect))
    ));
    assert_eq!(c.close_reason(), Some(CloseReason::LocalDisconnect));
    assert_eq!(s.qp().state(), QpState::Err);
    assert_eq!(c.qp().state(), QpState::Err);
    // A second disconnect returns at once, on both sides.
    within("again", c.disconnect()).await.unwrap();
    within("server side", s.disconnect()).await.unwrap();
}

/// Messages that arrived before the peer's DREQ are still delivered, then the close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_before_the_disconnect_are_delivered_first() {
    let (c, s) = pair("127.0.60.7").await;
    for i in 0..3 {
        c.send(&pattern(i, 2000)).await.unwrap();
    }
    within("disconnect", c.disconnect()).await.unwrap();
    within("closed", s.closed()).await;
    for i in 0..3 {
        assert_eq!(within("recv", s.recv()).await.unwrap(), pattern(i, 2000));
    }
    assert!(matches!(
        s.recv().await,
        Err(Error::Closed(CloseReason::PeerDisconnected))
    ));
}

/// The server drops its Connection while the client is blocked on credits: the client's
/// send fails with the peer's disconnect (not a retry timeout), its QP goes to Err.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_peer_fails_a_send_blocked_on_credits() {
    let (c, s) = pair("127.0.60.8").await;
    for i in 0..WINDOW {
        c.send(&pattern(i, 512)).await.unwrap();
    }
    let blocked = c.send(b"one too many");
    tokio::pin!(blocked);
    // Polled once: waiting for a credit (the window is spent), before the peer goes.
    assert!(futures::poll!(blocked.as_mut()).is_pending());
    drop(s);
    match within("blocked send", blocked).await {
        Err(Error::Closed(CloseReason::PeerDisconnected)) => {}
        other => panic!("blocked send: {other:?}"),
    }
    assert_eq!(c.qp().state(), QpState::Err);
    let e = c.send(b"later").await.unwrap_err();
    assert_eq!(e.errno(), libc::ENOTCONN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connection_names_the_reason() {
    let cma = Cma::new().unwrap();
    let opts = ConnectOptions::new()
        .src("127.0.60.9:0".parse().unwrap())
        .cma(cma);
    // Nobody listens on this port: REJ 8.
    let e = within(
        "connect",
        Connection::connect("127.0.60.9:7999".parse().unwrap(), opts),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, Error::ConnectionRefused(8)), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("invalid service id"), "{text}");
    assert!(text.contains("nobody listens"), "{text}");
    assert_eq!(e.errno(), libc::ECONNREFUSED);
}

#[test]
fn completion_statuses_say_what_happened() {
    let t = WcStatus::RnrRetryExcErr.to_string();
    assert!(t.contains("(13)") && t.contains("post receives"), "{t}");
    let t = WcStatus::RemAccessErr.to_string();
    assert!(t.contains("rkey"), "{t}");
    assert_eq!(WcStatus::Success.to_string(), "success (0)");
    let why = CloseReason::Failed(WcStatus::RetryExcErr).to_string();
    assert!(why.contains("gone or unreachable"), "{why}");
}

/// 1 MiB WRITE then READ into a region the server registered and announced in a message;
/// the server sees exactly the bytes written, canaries around the target stay untouched,
/// and the READ brings back what the server wrote locally afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_mib_write_and_read_through_a_remote_buf() {
    let (c, s) = pair("127.0.60.10").await;
    const MIB: usize = 1 << 20;
    let mr = s.register_remote(MIB + 2 * 4096).unwrap();
    mr.fill(0, mr.len(), 0xee).unwrap();
    let whole = RemoteBuf::of(&mr);
    // The server announces the middle MiB only.
    let target = whole.slice(4096, MIB as u32).unwrap();
    s.send(&target.to_bytes()).await.unwrap();
    let got = within("remote buf", c.recv()).await.unwrap();
    let remote = RemoteBuf::from_bytes(&got).unwrap();
    assert_eq!(remote, target);

    let data: Vec<u8> = (0..MIB).map(|i| (i * 13 + i / 4096) as u8).collect();
    within("write", c.write(&remote, &data)).await.unwrap();
    let seen = mr.to_vec();
    assert!(seen[4096..4096 + MIB] == data[..], "written bytes differ");
    assert!(seen[..4096].iter().all(|&b| b == 0xee), "canary before");
    assert!(
        seen[4096 + MIB..].iter().all(|&b| b == 0xee),
        "canary after"
    );

    // The server changes its memory; the client's READ sees the change.
    mr.write(4096 + 100, b"changed by the server").unwrap();
    let mut back = vec![0u8; MIB];
    within("read", c.read(&remote, &mut back)).await.unwrap();
    let mut expect = data.clone();
    expect[100..121].copy_from_slice(b"changed by the server");
    assert!(back == expect, "read bytes differ");

    // Too long for the remote buffer: refused before anything is posted.
    let e = c.write(&remote, &vec![0u8; MIB + 1]).await.unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    // Messages still flow after the one-sided traffic.
    c.send(b"done").await.unwrap();
    assert_eq!(within("recv", s.recv()).await.unwrap(), b"done");
}

/// A WRITE with a wrong rkey fails with the remote access error, which closes the
/// connection on both sides (the QP goes to Err); the target is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_with_a_bad_rkey_fails_with_remote_access_error() {
    let (c, s) = pair("127.0.60.11").await;
    let mr = s.register_remote(4096).unwrap();
    let mut bad = RemoteBuf::of(&mr);
    bad.rkey ^= 0x5a5a_0000;
    let e = within("write", c.write(&bad, b"not allowed"))
        .await
        .unwrap_err();
    match &e {
        Error::Closed(CloseReason::Failed(WcStatus::RemAccessErr)) => {}
        other => panic!("bad rkey write: {other:?}"),
    }
    assert!(e.to_string().contains("rkey"), "{e}");
    assert!(mr.to_vec().iter().all(|&b| b == 0), "target changed");
    assert_eq!(c.qp().state(), QpState::Err);
    assert!(matches!(
        c.write(&RemoteBuf::of(&mr), b"x").await,
        Err(Error::NotConnected)
    ));
    // The server's responder moved its own QP to Err too (its receives flush) or the
    // client's DREQ came first: either way the server is closed, not waiting.
    let why = within("server closed", s.closed()).await;
    assert!(
        matches!(
            why,
            CloseReason::PeerDisconnected | CloseReason::Failed(WcStatus::WrFlushErr)
        ),
        "{why:?}"
    );
    assert_eq!(s.qp().state(), QpState::Err);
}

/// `disconnect` right after a window of sends that were only posted: it lets them land
/// before the DREQ (the QP would otherwise go to Err and flush them), so the peer reads
/// every message, then the close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_lets_the_sends_in_flight_land() {
    let (c, s) = pair("127.0.60.12").await;
    for i in 0..WINDOW {
        c.send(&pattern(i, MAX_MESSAGE)).await.unwrap();
    }
    within("disconnect", c.disconnect()).await.unwrap();
    for i in 0..WINDOW {
        let m = within("recv", s.recv()).await.unwrap();
        assert!(m == pattern(i, MAX_MESSAGE), "message {i}");
    }
    assert!(matches!(
        s.recv().await,
        Err(Error::Closed(CloseReason::PeerDisconnected))
    ));
}

fn acks_sent(c: &Connection) -> u64 {
    c.qp().transport_stats().unwrap().responses_sent
}

/// Sends of a ping-pong ask for an ACK only every `WINDOW / 2` messages (the rest are
/// retired by those ACKs), so the peer's responder sends a fraction of one ACK per
/// message; every message still arrives byte-exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_pong_asks_for_few_acks() {
    let (c, s) = pair("127.0.60.13").await;
    let s = Arc::new(s);
    let s2 = s.clone();
    let echo = tokio::spawn(async move {
        while let Ok(m) = s2.recv().await {
            if s2.send(&m).await.is_err() {
                break;
            }
        }
    });
    const N: u32 = 400;
    for i in 0..N {
        let msg = pattern(i, 100 + i as usize);
        within("send", c.send(&msg)).await.unwrap();
        let got = within("echo", c.recv()).await.unwrap();
        assert!(got == msg, "message {i}: echo differs");
    }
    within("flush", c.flush()).await;
    let (to_client, to_server) = (acks_sent(&s), acks_sent(&c));
    // One ACK per signaled send (every WINDOW / 2), plus the transport's own asks (the
    // first message in an eighth of the ACK timeout) and the flush's fence.
    let most = (N / (WINDOW / 2)) as u64 * 2 + 16;
    assert!(
        to_client <= most && to_server <= most,
        "ACKs for {N} messages each way: {to_client} to the client, {to_server} to the \
         server (at most {most})"
    );
    within("disconnect", c.disconnect()).await.unwrap();
    within("server loop ends", echo).await.unwrap();
}

/// A flush after sends that asked for no completion of their own returns: it posts a
/// fence (a zero-length WRITE) whose completion reports them done. Without it, nothing
/// would ever report them and the flush would wait forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_after_unsignaled_sends_returns() {
    let (c, s) = pair("127.0.60.14").await;
    for round in 0..5u32 {
        // fewer than WINDOW / 2: none of them asks for a completion
        for i in 0..3 {
            c.send(&pattern(round * 10 + i, 4096)).await.unwrap();
        }
        within("flush", c.flush()).await;
        for i in 0..3 {
            let m = within("recv", s.recv()).await.unwrap();
            assert!(
                m == pattern(round * 10 + i, 4096),
                "round {round} message {i}"
            );
        }
    }
    // the peer's QP took the fences without an error
    assert!(c.close_reason().is_none() && s.close_reason().is_none());
    assert_eq!(c.qp().state(), QpState::Rts);
    within("disconnect", c.disconnect()).await.unwrap();
}

/// Both ends with other windows and message sizes: each connection uses the smaller of
/// the two (carried in the REQ's and REP's private data), messages flow both ways past the
/// window, byte-exact, the application's private data is still there, and a message over
/// the agreed size fails with `EINVAL` on either side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ends_with_different_windows_and_sizes_agree_on_the_smaller() {
    // (listener, client) settings (window, largest message); `None`: the defaults
    type Sizes = (u32, usize);
    let cases: [(Option<Sizes>, Option<Sizes>, Sizes); 3] = [
        (Some((4, 1024)), None, (4, 1024)),
        (None, Some((3, 2000)), (3, 2000)),
        (Some((8, 700)), Some((5, 4096)), (5, 700)),
    ];
    for (i, (server, client, agreed)) in cases.into_iter().enumerate() {
        let ip = format!("127.0.60.{}", 40 + i);
        let cma = Cma::new().unwrap();
        let mut b = rdmacm::Listener::builder().cma(cma.clone());
        if let Some((w, m)) = server {
            b = b.window(w).max_message(m);
        }
        let l = b.bind(format!("{ip}:0").parse().unwrap()).await.unwrap();
        let addr = l.local_addr().unwrap();
        let server_task = tokio::spawn(async move {
            let req = l.incoming().await?;
            let hello = req.private_data()[..5].to_vec();
            let conn = req
                .accept(rdmacm::AcceptOptions {
                    private_data: b"world".to_vec(),
                    ..Default::default()
                })
                .await?;
            Ok::<_, Error>((hello, conn))
        });
        let mut opts = ConnectOptions::new()
            .src(format!("{ip}:0").parse().unwrap())
            .cma(cma)
            .private_data(b"hello".to_vec());
        if let Some((w, m)) = client {
            opts = opts.window(w).max_message(m);
        }
        let c = within("connect", Connection::connect(addr, opts))
            .await
            .unwrap();
        let (hello, s) = within("accept", server_task).await.unwrap().unwrap();
        assert_eq!(hello, b"hello");
        assert_eq!(&c.peer_private_data()[..5], b"world");
        for (who, conn) in [("client", &c), ("server", &s)] {
            assert_eq!(
                (conn.window(), conn.max_message()),
                agreed,
                "{who}, case {i}"
            );
            let e = conn.send(&vec![0; agreed.1 + 1]).await.unwrap_err();
            assert_eq!(e.errno(), libc::EINVAL, "{who}: {e}");
        }
        // three windows' worth each way, full-size messages, before the other side reads
        let n = agreed.0 * 3;
        let (c, s) = (Arc::new(c), Arc::new(s));
        let mut senders = Vec::new();
        for conn in [c.clone(), s.clone()] {
            senders.push(tokio::spawn(async move {
                for seq in 0..n {
                    conn.send(&pattern(seq, agreed.1)).await.unwrap();
                }
            }));
        }
        for conn in [&s, &c] {
            for seq in 0..n {
                let m = within("recv", conn.recv()).await.unwrap();
                assert_eq!(m, pattern(seq, agreed.1), "message {seq}, case {i}");
            }
        }
        for t in senders {
            within("senders", t).await.unwrap();
        }
        assert_eq!(rnr_naks(&c) + rnr_naks(&s), 0, "no receive queue ran dry");
    }
}
