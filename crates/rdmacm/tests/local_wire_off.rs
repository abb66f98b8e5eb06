//! `RDMA_SOFT_LOCAL_WIRE=0`: every connection stays on UDP (what the benchmarks of the
//! RoCEv2 path and the lossy suites rely on). Its own binary: it sets the environment.

use rdmacm::Connection;

mod aio;

use aio::{pair, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_local_wire_off_a_loopback_connection_stays_on_udp() {
    std::env::set_var("RDMA_SOFT_LOCAL_WIRE", "0");
    let (c, s): (Connection, Connection) = pair("127.0.62.2").await;
    let dev = c.device().unwrap();
    assert_eq!(dev.host_local(), None);
    assert_eq!((c.qp().host_peer(), s.qp().host_peer()), (None, None));
    let before = dev.wire_stats().sent;
    for i in 0..50u8 {
        within("send", c.send(&[i; 3000])).await.unwrap();
        assert_eq!(within("recv", s.recv()).await.unwrap(), vec![i; 3000]);
    }
    let after = dev.wire_stats();
    assert!(after.sent - before >= 50, "the data went through UDP");
    assert_eq!(after.local.sent, 0);
    // IPv4: no socket connected to the peer (see rdma-soft's io/peers.rs)
    assert_eq!(
        (after.peer_sockets, after.sent_connected),
        (0, 0),
        "{after:?}"
    );
}
