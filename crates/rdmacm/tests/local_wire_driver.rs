//! The host-local wire between processes under the runtime's device driver
//! (`RDMACM_ASYNC_DRIVER=1` in the server child, `set_runtime_driver(true)` here): a tokio
//! task, not the engine, sleeps on the wire fd, so the rings must ring it. This binary has
//! its own process for that global setting. Port 7652 on 127.0.0.1.

use rdmacm::{Buf, RemoteBuf};

mod aio;
mod local_child;

use aio::within;
use local_child::{ask, connect, pattern, Server, MIB};

#[test]
#[ignore = "run by the test below as its server process"]
fn child_server() {
    local_child::serve();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_driver_is_woken_by_the_rings_on_both_sides() {
    rdmacm::set_runtime_driver(true);
    let server = Server::start(7652, &[("RDMACM_ASYNC_DRIVER", "1")]);
    let c = connect(7652).await;
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
