//! The errors a user meets: nothing listening, an address in use, a peer that never
//! answers, the whole-connect timeout. None of them hangs.
//!
//! Each test on its own 127.0.61.x address (30-39).

use std::time::Duration;

use rdmacm::cm::Cma;
use rdmacm::{ConnectOptions, Connection, Error, Listener};

mod support_async;
use support_async::*;

fn opts(cma: &Cma, src: &str) -> ConnectOptions {
    ConnectOptions::new()
        .src(src.parse().unwrap())
        .cma(cma.clone())
}

/// Nobody listens on the port: ECONNREFUSED, named (REJ 8, invalid service id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_a_port_nobody_listens_on_is_refused_with_the_reason() {
    let cma = Cma::new().unwrap();
    // A listener on another port: the device is up, the port is not listened on.
    let _l = Listener::builder()
        .cma(cma.clone())
        .bind("127.0.61.30:7000".parse().unwrap())
        .await
        .unwrap();
    let e = within(
        "connect",
        Connection::connect(
            "127.0.61.30:7001".parse().unwrap(),
            opts(&cma, "127.0.61.30:0"),
        ),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, Error::ConnectionRefused(8)), "{e:?}");
    assert_eq!(e.errno(), libc::ECONNREFUSED);
    assert!(e.to_string().contains("invalid service id"), "{e}");
}

/// A second listener on the same address and port: EADDRINUSE; the first still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_on_an_address_in_use_is_eaddrinuse() {
    let cma = Cma::new().unwrap();
    let l = Listener::builder()
        .cma(cma.clone())
        .bind("127.0.61.31:0".parse().unwrap())
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let e = Listener::builder()
        .cma(cma.clone())
        .bind(addr)
        .await
        .unwrap_err();
    assert_eq!(e.errno(), libc::EADDRINUSE, "{e}");
    let server = tokio::spawn(async move { l.accept().await.map(|_| ()) });
    let c = within(
        "connect",
        Connection::connect(addr, opts(&cma, "127.0.61.31:0")),
    )
    .await
    .unwrap();
    within("accept", server).await.unwrap().unwrap();
    drop(c);
}

/// A peer address whose UDP 4791 swallows everything (a plain socket there: no CM ever
/// answers): with short CM timeouts the REQ's retries run out and connect fails with
/// ETIMEDOUT (UNREACHABLE), not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_answers_times_out() {
    let _hole = std::net::UdpSocket::bind("127.0.61.32:4791").unwrap();
    let cma = Cma::new().unwrap();
    cma.set_cm_timeouts(12, 1).unwrap();
    let e = within(
        "connect",
        Connection::connect(
            "127.0.61.32:7471".parse().unwrap(),
            opts(&cma, "127.0.61.33:0"),
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(e.errno(), libc::ETIMEDOUT, "{e:?}");
}

/// The same black hole with the default CM timeouts (about 74 s of REQ retries) and a
/// 300 ms `connect_timeout`: ETIMEDOUT from the bound over the whole connect, well
/// inside the hang guard; the context still connects elsewhere afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_timeout_bounds_the_whole_connect() {
    let _hole = std::net::UdpSocket::bind("127.0.61.34:4791").unwrap();
    let cma = Cma::new().unwrap();
    let o = opts(&cma, "127.0.61.35:0").connect_timeout(Duration::from_millis(300));
    let e = within(
        "connect",
        Connection::connect("127.0.61.34:7471".parse().unwrap(), o),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, Error::TimedOut), "{e:?}");
    // Nothing is left stuck: a connection on the same context works.
    let l = Listener::builder()
        .cma(cma.clone())
        .bind("127.0.61.35:0".parse().unwrap())
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move { l.accept().await.map(|_| ()) });
    let c = within(
        "connect",
        Connection::connect(addr, opts(&cma, "127.0.61.35:0")),
    )
    .await
    .unwrap();
    within("accept", server).await.unwrap().unwrap();
    drop(c);
}
