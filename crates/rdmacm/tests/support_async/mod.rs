//! Shared by the async tests: the hang guard and a connected pair.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use rdmacm::cm::{Cma, CmaConfig};
use rdmacm::{ConnectOptions, Connection, Listener};

/// Hang guard: a stop, not a speed target.
pub const HANG: Duration = Duration::from_secs(120);

/// `f`, or a panic naming `what` after [`HANG`].
pub async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(HANG, f)
        .await
        .unwrap_or_else(|_| panic!("hang guard: {what}"))
}

/// A connected (client, server) pair on `ip`, one context for both.
pub async fn pair(ip: &str) -> (Connection, Connection) {
    pair_with(ip, CmaConfig::from_env().unwrap()).await
}

/// [`pair`] in a context configured by `cfg`.
pub async fn pair_with(ip: &str, cfg: CmaConfig) -> (Connection, Connection) {
    let cma = Cma::with_config(cfg).unwrap();
    let l = Listener::builder()
        .cma(cma.clone())
        .bind(format!("{ip}:0").parse().unwrap())
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move { l.accept().await });
    let opts = ConnectOptions::new()
        .src(SocketAddr::new(addr.ip(), 0))
        .cma(cma);
    let c = within("connect", Connection::connect(addr, opts))
        .await
        .unwrap();
    let s = within("accept", server).await.unwrap().unwrap();
    (c, s)
}
