//! `RdmaStream`: a byte stream over a connection's messages, through `tokio::io::copy`.
//!
//! Each test on its own 127.0.61.x address (1-9).

use rdmacm::MAX_MESSAGE;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod support_async;
use support_async::*;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 131 + i / 251) as u8).collect()
}

/// `tokio::io::copy` from a byte source into the stream, `shutdown`, and on the other side
/// `tokio::io::copy` from the stream into a Vec until end of file: the bytes arrive exactly,
/// including a tail that is not a multiple of the message size, and `shutdown` returns only
/// once every byte landed (the reader sees all of them before EOF).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_io_copy_through_the_stream_is_byte_exact_then_eof() {
    let (c, s) = pair("127.0.61.1").await;
    let len = 3 * MAX_MESSAGE * 5 + 12_345;
    let data = pattern(len);
    let reader = tokio::spawn(async move {
        let mut s = s.into_stream();
        let mut got = Vec::new();
        let n = tokio::io::copy(&mut s, &mut got).await.unwrap();
        (n, got)
    });
    let mut w = c.into_stream();
    let mut src = &data[..];
    let n = within("copy in", tokio::io::copy(&mut src, &mut w))
        .await
        .unwrap();
    assert_eq!(n as usize, len);
    within("shutdown", w.shutdown()).await.unwrap();
    let (n, got) = within("copy out", reader).await.unwrap();
    assert_eq!(n as usize, len);
    assert!(got == data, "bytes differ");
    // After shutdown the writer refuses more.
    let e = w.write(b"late").await.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotConnected, "{e}");
}

/// Reads smaller than a message take it in pieces, in order; an empty write sends
/// nothing and is not an end of file for the reader; a message written with
/// `Connection::send(&[])` neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_reads_split_messages_and_empty_messages_are_not_eof() {
    let (c, s) = pair("127.0.61.2").await;
    c.send(b"").await.unwrap();
    let mut w = c.into_stream();
    assert_eq!(w.write(b"").await.unwrap(), 0);
    w.write_all(b"hello, ").await.unwrap();
    w.write_all(b"world").await.unwrap();
    w.flush().await.unwrap();
    let mut r = s.into_stream();
    let mut got = Vec::new();
    let mut three = [0u8; 3];
    while got.len() < 12 {
        let n = within("read", r.read(&mut three)).await.unwrap();
        assert!(n > 0, "EOF before the bytes");
        got.extend_from_slice(&three[..n]);
    }
    assert_eq!(got, b"hello, world");
    // The peer disconnects: EOF.
    within("shutdown", w.shutdown()).await.unwrap();
    assert_eq!(within("eof", r.read(&mut three)).await.unwrap(), 0);
}

/// Echo through a split stream on the server (`tokio::io::split` + `copy`), the client
/// writing and reading at once: the echo is byte exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_through_split_halves() {
    let (c, s) = pair("127.0.61.3").await;
    let echo = tokio::spawn(async move {
        let (mut r, mut w) = tokio::io::split(s.into_stream());
        // Ends with an error or EOF when the client disconnects.
        let _ = tokio::io::copy(&mut r, &mut w).await;
    });
    let len = 2 * 1024 * 1024 + 7;
    let data = pattern(len);
    let (mut r, mut w) = tokio::io::split(c.into_stream());
    let d2 = data.clone();
    let writer = tokio::spawn(async move {
        w.write_all(&d2).await.unwrap();
        w.flush().await.unwrap();
        w
    });
    let mut back = vec![0u8; len];
    within("echo", r.read_exact(&mut back)).await.unwrap();
    assert!(back == data, "echo differs");
    let w = within("writer", writer).await.unwrap();
    let mut stream = r.unsplit(w);
    within("shutdown", stream.shutdown()).await.unwrap();
    within("echo ends", echo).await.unwrap();
}

/// The peer drops its connection mid-stream: a pending read ends (EOF: the peer
/// disconnected), it does not hang until a retry timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_drop_ends_a_pending_read() {
    let (c, s) = pair("127.0.61.4").await;
    let mut r = c.into_stream();
    let pending = tokio::spawn(async move {
        let mut b = [0u8; 16];
        r.read(&mut b).await
    });
    drop(s);
    let n = within("pending read", pending).await.unwrap().unwrap();
    assert_eq!(n, 0);
}
