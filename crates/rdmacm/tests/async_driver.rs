//! With `set_runtime_driver(true)` the runtime drives a connection's device when its wire is
//! readable (one tokio task per device), and a blocked runtime does not stall the device:
//! the progress engine takes the datagrams back. Addresses 127.0.63.x.

mod aio;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aio::{pair, within, HANG};
use rdmacm::{Cma, ConnectOptions, Connection, Listener, RemoteBuf};

/// An echo through a connected pair: the runtime's task drove the device, and the engine
/// left fresh datagrams to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_drives_the_device_of_its_connections() {
    rdmacm::set_runtime_driver(true);
    let (c, s) = pair("127.0.63.1").await;
    for i in 0..200u32 {
        let msg = i.to_le_bytes().repeat(100);
        c.send(&msg).await.unwrap();
        let got = within("recv", s.recv()).await.unwrap();
        assert_eq!(got, msg);
        s.send(&got).await.unwrap();
        assert_eq!(within("echo", c.recv()).await.unwrap(), msg);
    }
    let w = c.device().unwrap().watch_stats();
    assert!(w.drives > 0, "the runtime never drove the device: {w:?}");
    assert!(w.left > 0, "the engine never left datagrams to it: {w:?}");
}

/// The server's runtime (one thread) is blocked in a long computation while the client
/// WRITEs into its memory: the server's device still acknowledges (the engine drives it),
/// so the client's WRITE completes before the server's runtime runs again.
#[test]
fn a_blocked_runtime_does_not_stall_its_device() {
    rdmacm::set_runtime_driver(true);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let written = Arc::new(AtomicBool::new(false));
    rt.block_on(async {
        let l = Listener::bind_with("127.0.63.3:0".parse().unwrap(), Some(Cma::new().unwrap()))
            .await
            .unwrap();
        let addr = l.local_addr().unwrap();
        let w = written.clone();
        let client = std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async move {
                let opts = ConnectOptions {
                    src: Some(SocketAddr::new("127.0.63.4".parse().unwrap(), 0)),
                    cma: Some(Cma::new().unwrap()),
                    ..Default::default()
                };
                let c = within("connect", Connection::connect(addr, opts))
                    .await
                    .unwrap();
                let remote =
                    RemoteBuf::from_bytes(&within("buf", c.recv()).await.unwrap()).unwrap();
                let data: Vec<u8> = (0..remote.len).map(|i| (i * 7) as u8).collect();
                within("write", c.write(&remote, &data)).await.unwrap();
                w.store(true, Ordering::SeqCst);
                c.send(b"done").await.unwrap();
                within("closed", c.closed()).await;
            })
        });
        let s = within("accept", l.accept()).await.unwrap();
        let mr = s.register_remote(256 * 1024).unwrap();
        s.send(&RemoteBuf::of(&mr).to_bytes()).await.unwrap();
        // Blocked: this thread runs the runtime, so nothing of it runs until the WRITE
        // completed (or the hang guard).
        let end = Instant::now() + HANG;
        while !written.load(Ordering::SeqCst) {
            assert!(
                Instant::now() < end,
                "the WRITE did not complete while blocked"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let w = s.device().unwrap().watch_stats();
        assert!(w.taken_back > 0, "{w:?}");
        assert_eq!(within("done", s.recv()).await.unwrap(), b"done");
        let want: Vec<u8> = (0..mr.len()).map(|i| (i * 7) as u8).collect();
        assert!(mr.to_vec() == want, "written bytes differ");
        within("disconnect", s.disconnect()).await.unwrap();
        client.join().unwrap();
    });
}
