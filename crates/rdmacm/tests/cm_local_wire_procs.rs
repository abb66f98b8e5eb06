//! The host-local wire between processes (issue 10, part 2): this test binary re-run as a
//! server child on 127.0.0.1; the parent connects without a bind, checks every byte of
//! messages, a 1 MiB WRITE and READ, that both QPs took the rings and that the data never
//! touched UDP; then a SIGKILLed server: the client gets an error instead of a hang and
//! the next server process takes the same address and port at once. Under the runtime's
//! device driver (`RDMACM_ASYNC_DRIVER=on` in the server child, `CmaConfig::async_driver`
//! here) a tokio task, not the engine, sleeps on the wire fd, so the rings must ring it.
//!
//! Ports 7650-7659 on 127.0.0.1 (nobody else's).

use std::time::Duration;

use rdmacm::{Buf, RemoteBuf};

mod support_async;
mod support_local_child;

use support_async::within;
use support_local_child::{ask, connect, connect_with, pattern, Server, MIB};

#[test]
#[ignore = "run by the tests below as their server process"]
fn child_server() {
    support_local_child::serve();
}

/// The rings lose nothing, so a QP on them resends nothing early: a server stopped for
/// 30 ms (six probe floors) while a message waits for it is answered late, without a
/// probe, an ACK timeout or any resend. (With early retransmission on the rings, the first
/// such wait drew a probe.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_peer_on_the_rings_draws_no_probe() {
    let server = std::sync::Arc::new(Server::start(7653, &[]));
    let c = connect(7653).await;
    assert!(c.qp().host_peer().is_some(), "on the host-local wire");
    // a round trip measured first: microseconds (a probe would come after the floor)
    for i in 0..20u32 {
        assert!(ask(&c, &pattern(i, 64)).await == pattern(i, 64));
    }
    for i in 0..5u32 {
        let m = pattern(i, 64);
        let s = server.clone();
        let stopped = std::sync::mpsc::channel::<()>();
        let pause = std::thread::spawn(move || {
            // SIGSTOP first, then the message goes: it waits in the ring for the server
            let pid = s.pid();
            // SAFETY: a signal to our own child, which is not reaped while `s` lives.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
            stopped.0.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(30));
            // SAFETY: as above.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
        });
        stopped.1.recv().unwrap();
        assert!(ask(&c, &m).await == m, "echo {i} differs");
        pause.join().unwrap();
    }
    let t = c.qp().transport_stats().unwrap();
    assert_eq!(
        (t.tail_probes, t.retransmitted, t.timeouts),
        (0, 0, 0),
        "{t:?}"
    );
    within("disconnect", c.disconnect()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_127_0_0_1_talk_through_shared_memory() {
    let server = Server::start(7650, &[]);
    let c = connect(7650).await;
    assert!(
        c.qp().host_peer().is_some(),
        "client QP on the host-local wire"
    );
    let dev = c.device().unwrap();
    let udp_before = dev.wire_stats().sent;
    for i in 0..300u32 {
        let m = pattern(i, 1 + (i as usize * 1237) % 30_000);
        assert!(ask(&c, &m).await == m, "echo {i} differs");
    }
    let remote = RemoteBuf::from_bytes(&ask(&c, b"rkey?").await).unwrap();
    let data = pattern(99, MIB);
    let (r, _) = within("write", c.write_buf(&remote, Buf::from(data.clone()))).await;
    r.unwrap();
    let (r, back) = within("read", c.read_buf(&remote, Buf::zeroed(MIB))).await;
    r.unwrap();
    assert!(back[..] == data[..], "READ after WRITE differs");
    // from a region the device allocated: the server copies it from this process
    let src = c.register_remote(MIB).unwrap();
    let data2 = pattern(100, MIB);
    src.write(0, &data2).unwrap();
    let (r, _src) = within("write_from", c.write_from(&remote, src, 0, MIB)).await;
    r.unwrap();
    let (r, back) = within("read", c.read_buf(&remote, Buf::zeroed(MIB))).await;
    r.unwrap();
    assert!(back[..] == data2[..], "READ after the pulled WRITE differs");
    // both READs of the server's region were copied here from its memory
    assert_eq!(c.qp().transport_stats().unwrap().pulls_done, 2);
    let stats = String::from_utf8(ask(&c, b"stats?").await).unwrap();
    let w = dev.wire_stats();
    assert_eq!(
        w.sent, udp_before,
        "client datagrams on UDP during the data"
    );
    assert!(w.local.sent > 600, "{:?}", w.local);
    assert_eq!(
        w.local.ring_full + w.local.dead + w.local.malformed,
        0,
        "{:?}",
        w.local
    );
    // the server's side: its QP on the rings too, and only the CM's MADs on UDP
    let field = |k: &str| {
        stats
            .split(' ')
            .find_map(|f| f.strip_prefix(k))
            .unwrap_or_else(|| panic!("{stats}"))
            .to_owned()
    };
    assert_eq!(field("peer="), "true", "{stats}");
    assert!(field("udp=").parse::<u64>().unwrap() < 10, "{stats}");
    assert!(field("local=").parse::<u64>().unwrap() > 600, "{stats}");
    // the 1 MiB WRITE: copied by the server from this process's memory
    assert_eq!(field("pulls="), "1", "{stats}");
    assert_eq!(c.qp().transport_stats().unwrap().pulls_sent, 1);
    within("disconnect", c.disconnect()).await.unwrap();
    server.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_fails_the_client_and_the_next_takes_its_port_at_once() {
    let server = Server::start(7651, &[]);
    let c = connect(7651).await;
    assert!(c.qp().host_peer().is_some());
    assert_eq!(ask(&c, b"hello").await, b"hello");
    server.kill();
    // In flight to a dead process: an error (retries exhausted), not a hang, and never a
    // reply from someone else.
    let r = within("send to a dead server", async {
        loop {
            c.send(&[1u8; 4096]).await?;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        #[allow(unreachable_code)]
        Ok::<(), rdmacm::Error>(())
    })
    .await;
    assert!(r.is_err());
    let next = Server::start(7651, &[]);
    let c2 = connect(7651).await;
    assert!(
        c2.qp().host_peer().is_some(),
        "the new server's wire, not the dead one's"
    );
    let m = pattern(5, 50_000);
    assert!(ask(&c2, &m).await == m);
    next.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_driver_is_woken_by_the_rings_on_both_sides() {
    let server = Server::start(7652, &[("RDMACM_ASYNC_DRIVER", "on")]);
    let cfg = rdmacm::cm::CmaConfig::from_env().unwrap();
    let c = connect_with(7652, cfg.into_builder().async_driver(true).build()).await;
    assert!(c.qp().host_peer().is_some());
    // ping-pong: every message waits for the other side's driver to be woken
    for i in 0..500u32 {
        let m = pattern(i, 1 + (i as usize * 613) % 9000);
        assert!(ask(&c, &m).await == m, "echo {i} differs");
    }
    let remote = RemoteBuf::from_bytes(&ask(&c, b"rkey?").await).unwrap();
    let data = pattern(3, MIB);
    let (r, _) = within("write", c.write_buf(&remote, Buf::from(data.clone()))).await;
    r.unwrap();
    let (r, back) = within("read", c.read_buf(&remote, Buf::zeroed(MIB))).await;
    r.unwrap();
    assert!(back[..] == data[..], "READ after WRITE differs");
    let dev = c.device().unwrap();
    assert!(
        dev.watch_stats().drives > 0,
        "the driver task drove the device"
    );
    assert_eq!(dev.wire_stats().local.ring_full, 0);
    // No wake-up was lost and waited out: no ACK timeout. The rings lose nothing, so a QP
    // on them probes nothing either (a lost wake-up would cost an ACK timeout).
    let t = c.qp().transport_stats().unwrap();
    assert_eq!(t.timeouts, 0, "{t:?}");
    assert_eq!((t.retransmitted, t.tail_probes), (0, 0), "{t:?}");
    within("disconnect", c.disconnect()).await.unwrap();
    server.kill();
}
