//! Owned buffers: `send_buf`, `write_buf`, `read_buf` move a `Buf` into the operation and
//! hand the same allocation back (no copy), pools recycle, a cancelled operation keeps its
//! buffer until the device is done with it.
//!
//! Each test on its own 127.0.61.x address (20-29).

use std::sync::Arc;

use rdmacm::{Buf, BufPool, RemoteBuf, MAX_MESSAGE};

mod support_async;
use support_async::*;

/// Messages from a pool arrive byte exact; each `send_buf` hands back the very
/// allocation it was given (the device read the application's bytes in place), and the
/// pool recycles them instead of allocating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_buf_returns_the_same_allocation_and_the_pool_recycles() {
    let (c, s) = pair("127.0.61.20").await;
    let pool = BufPool::new(MAX_MESSAGE, 4);
    for i in 0..200u32 {
        let mut b = pool.get();
        let len = [1usize, 100, 4096, MAX_MESSAGE][i as usize % 4];
        b.set_len(len).unwrap();
        for (j, x) in b.iter_mut().enumerate() {
            *x = (j as u32 ^ i) as u8;
        }
        let expect = b.to_vec();
        let before = b.as_ptr();
        let (r, b) = within("send_buf", c.send_buf(b)).await;
        r.unwrap();
        assert_eq!(b.as_ptr(), before, "a different buffer came back: a copy");
        assert!(b[..] == expect[..], "the buffer changed");
        drop(b);
        assert!(
            within("recv", s.recv()).await.unwrap() == expect,
            "message {i}"
        );
    }
    assert_eq!(pool.idle(), 1, "one buffer, recycled 200 times");
    // Over the message size: refused, the buffer comes back untouched.
    let big = Buf::zeroed(MAX_MESSAGE + 1);
    let (r, big) = c.send_buf(big).await;
    assert_eq!(r.unwrap_err().errno(), libc::EINVAL);
    assert_eq!(big.len(), MAX_MESSAGE + 1);
}

/// 1 MiB WRITE from and READ into owned buffers: the server's region holds the bytes, the
/// READ brings back what the server changed, each in the caller's own allocation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_buf_and_read_buf_one_mib_in_place() {
    let (c, s) = pair("127.0.61.21").await;
    const MIB: usize = 1 << 20;
    let mr = s.register_remote(MIB).unwrap();
    s.send(&RemoteBuf::of(&mr).to_bytes()).await.unwrap();
    let remote = RemoteBuf::from_bytes(&within("rkey", c.recv()).await.unwrap()).unwrap();
    let data: Vec<u8> = (0..MIB).map(|i| (i * 31 + i / 4096) as u8).collect();
    let b = Buf::from(data.clone());
    let p = b.as_ptr();
    let (r, b) = within("write_buf", c.write_buf(&remote, b)).await;
    r.unwrap();
    assert_eq!(b.as_ptr(), p);
    assert!(mr.to_vec() == data, "server memory differs");
    mr.write(10, b"server side").unwrap();
    let (r, back) = within("read_buf", c.read_buf(&remote, Buf::zeroed(MIB))).await;
    r.unwrap();
    let mut expect = data;
    expect[10..21].copy_from_slice(b"server side");
    assert!(back[..] == expect[..], "read differs");
    // Longer than the remote region: EINVAL, nothing posted, the buffer back.
    let (r, _) = c.write_buf(&remote, Buf::zeroed(MIB + 1)).await;
    assert_eq!(r.unwrap_err().errno(), libc::EINVAL);
}

/// Futures of owned operations dropped while the operations are out: the connection
/// stays usable (the device never met a vanished buffer: that would be a local
/// protection error closing the connection), and a later send and WRITE succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_owned_operations_leave_the_connection_working() {
    let (c, s) = pair("127.0.61.22").await;
    let c = Arc::new(c);
    const LEN: usize = 4 << 20;
    let mr = s.register_remote(LEN).unwrap();
    let remote = RemoteBuf::of(&mr);
    let mut cancelled_in_flight = 0;
    for i in 0..20u8 {
        let w = c.write_buf(&remote, Buf::from(vec![i; LEN]));
        tokio::pin!(w);
        // Polled once: the WRITE is posted (on loopback it may even complete in that
        // poll); then the future goes.
        match futures::poll!(w.as_mut()) {
            std::task::Poll::Pending => cancelled_in_flight += 1,
            std::task::Poll::Ready((r, _)) => r.unwrap(),
        }
    }
    assert!(
        cancelled_in_flight > 0,
        "no WRITE of 4 MiB was still out after one poll"
    );
    let mut sb = Box::pin(c.send_buf(Buf::from(vec![9u8; 60_000])));
    if let std::task::Poll::Ready((r, _)) = futures::poll!(sb.as_mut()) {
        r.unwrap();
    }
    drop(sb);
    // The cancelled message was posted, so it arrives; then a new one.
    assert_eq!(within("recv", s.recv()).await.unwrap(), vec![9u8; 60_000]);
    let (r, _) = within("send after", c.send_buf(Buf::from(b"after".to_vec()))).await;
    r.unwrap();
    assert_eq!(within("recv", s.recv()).await.unwrap(), b"after");
    let (r, _) = within(
        "write after",
        c.write_buf(&remote, Buf::from(vec![0x77; 4096])),
    )
    .await;
    r.unwrap();
    assert!(mr.to_vec()[..4096].iter().all(|&b| b == 0x77));
    assert!(c.close_reason().is_none(), "{:?}", c.close_reason());
    within("flush", c.flush()).await;
}
