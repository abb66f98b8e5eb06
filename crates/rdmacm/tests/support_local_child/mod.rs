//! The server child of the host-local tests between processes (`cm_local_wire_procs.rs`):
//! the test binary re-run as its ignored `child_server` test.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use rdmacm::cm::Cma;
use rdmacm::{ConnectOptions, Connection, Listener, RemoteBuf};

use crate::support_async::within;

pub const CHILD_ENV: &str = "RDMA_LOCAL_WIRE_CHILD";
pub const MIB: usize = 1 << 20;

/// The server child: echoes every message; answers `rkey?` with a 1 MiB region's
/// `RemoteBuf`, `stats?` with `udp=<sent> local=<sent> peer=<host-local peer?>
/// pulls=<WRITEs copied from the client's memory>`. Each test
/// binary has a `child_server` test (ignored) that calls this.
pub fn serve() {
    let Ok(port) = std::env::var(CHILD_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let l = Listener::bind(addr).await.unwrap();
        println!("READY");
        loop {
            let c = l.accept().await.unwrap();
            tokio::spawn(async move {
                let mr = c.register_remote(MIB).unwrap();
                while let Ok(m) = c.recv().await {
                    let reply = match &m[..] {
                        b"rkey?" => RemoteBuf::of(&mr).to_bytes().to_vec(),
                        b"stats?" => {
                            let w = c.device().unwrap().wire_stats();
                            let peer = c.qp().host_peer().is_some();
                            let pulls = c.qp().transport_stats().map_or(0, |s| s.pulls_done);
                            format!(
                                "udp={} local={} peer={peer} pulls={pulls}",
                                w.sent, w.local.sent
                            )
                            .into_bytes()
                        }
                        _ => m,
                    };
                    if c.send(&reply).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
}

/// The server child process (this test binary re-run as `child_server`).
pub struct Server(Child);

impl Server {
    /// Starts it on `port` with `env` set, and waits until it listens.
    pub fn start(port: u16, env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "child_server", "--nocapture"])
            .env(CHILD_ENV, port.to_string())
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let mut lines = BufReader::new(out).lines();
        loop {
            let line = lines
                .next()
                .expect("server child ended before READY")
                .unwrap();
            if line.trim() == "READY" {
                break;
            }
        }
        // keep draining its stdout so it never blocks on a full pipe
        std::thread::spawn(move || for _ in lines {});
        Server(child)
    }

    /// Its process id (to stop and continue it).
    pub fn pid(&self) -> libc::pid_t {
        self.0.id() as libc::pid_t
    }

    /// SIGKILL, and reap it.
    pub fn kill(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A client connection to the child on `port`, in a context of its own.
pub async fn connect(port: u16) -> Connection {
    connect_with(port, rdmacm::cm::CmaConfig::from_env().unwrap()).await
}

/// [`connect`] from a context configured by `cfg`.
pub async fn connect_with(port: u16, cfg: rdmacm::cm::CmaConfig) -> Connection {
    // no bind: the source is chosen as for any 127.0.0.1 destination; a context (and so a
    // device, whose counters the test reads) per test
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let opts = ConnectOptions::new().cma(Cma::with_config(cfg).unwrap());
    within("connect", Connection::connect(addr, opts))
        .await
        .unwrap()
}

/// Sends `q`, returns the reply.
pub async fn ask(c: &Connection, q: &[u8]) -> Vec<u8> {
    within("send", c.send(q)).await.unwrap();
    within("reply", c.recv()).await.unwrap()
}

/// Test bytes.
pub fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2654435761) ^ seed) as u8)
        .collect()
}
