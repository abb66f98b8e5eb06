//! With `CmaConfig::async_driver` on, the runtime drives a connection's device when its wire
//! is readable (one tokio task per device), and a blocked runtime does not stall the device:
//! the progress engine takes the datagrams back. Off (the default), the engine drives alone.
//! Addresses 127.0.63.x.

mod support_async;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdmacm::cm::{Cma, CmaConfig};
use rdmacm::{ConnectOptions, Connection, Listener, RemoteBuf};
use support_async::{pair_with, within, HANG};

/// A context configuration with the runtime driver `on` (the rest from the environment).
fn driver(on: bool) -> CmaConfig {
    CmaConfig::from_env()
        .unwrap()
        .into_builder()
        .async_driver(on)
        .build()
}

/// An echo through a connected pair: the runtime's task drove the device, and the engine
/// left fresh datagrams to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_drives_the_device_of_its_connections() {
    let (c, s) = pair_with("127.0.63.1", driver(true)).await;
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let written = Arc::new(AtomicBool::new(false));
    rt.block_on(async {
        let l = Listener::builder()
            .cma(Cma::with_config(driver(true)).unwrap())
            .bind("127.0.63.3:0".parse().unwrap())
            .await
            .unwrap();
        let addr = l.local_addr().unwrap();
        let w = written.clone();
        let client = std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async move {
                let opts = ConnectOptions::new()
                    .src(SocketAddr::new("127.0.63.4".parse().unwrap(), 0))
                    .cma(Cma::with_config(driver(true)).unwrap());
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

/// The default: no runtime driver, the engine drives the device alone and wakes the
/// connection through its completion channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_runtime_driver_the_engine_drives_alone() {
    let (c, s) = pair_with("127.0.63.5", driver(false)).await;
    // A ping-pong: every message waits for the engine's completion and the channel's
    // wake-up (a lost wake-up hangs here, caught by the guard). RDMA_ASYNC_PINGS sets the
    // count (default 2,000).
    let n: u32 = std::env::var("RDMA_ASYNC_PINGS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let echo = tokio::spawn(async move {
        for _ in 0..n {
            let m = within("server recv", s.recv()).await.unwrap();
            s.send(&m).await.unwrap();
        }
        s
    });
    for i in 0..n {
        let msg = i.to_le_bytes().repeat(300);
        c.send(&msg).await.unwrap();
        assert_eq!(within("echo", c.recv()).await.unwrap(), msg);
    }
    let _s = within("server", echo).await.unwrap();
    let w = c.device().unwrap().watch_stats();
    assert_eq!((w.drives, w.left), (0, 0), "{w:?}");
}
