//! The default: no runtime driver, the engine drives the device alone and wakes the
//! connection through its completion channel. Its own test binary (the setting is
//! process-wide). Address 127.0.63.5.

mod aio;

use aio::{pair, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_runtime_driver_the_engine_drives_alone() {
    let (c, s) = pair("127.0.63.5").await;
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
