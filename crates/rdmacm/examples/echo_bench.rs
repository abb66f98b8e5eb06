//! 4 KiB ping-pong and 64 KiB one-way stream through `Connection::send`/`recv`, beside the
//! same through a tokio TCP echo, in one process on 127.0.60.30, with the process's CPU
//! time per message.
//!
//! `cargo run --release -p rdmacm --example echo_bench [SECONDS]` (default 2 per figure).

use std::time::Instant;

use rdmacm::{ConnectOptions, Connection, Listener};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ADDR: &str = "127.0.60.30";

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

struct Figure {
    per_sec: f64,
    cpu_us_per_msg: f64,
}

struct Meter {
    t0: Instant,
    c0: f64,
}

impl Meter {
    fn start() -> Meter {
        Meter {
            t0: Instant::now(),
            c0: cpu_seconds(),
        }
    }

    fn running(&self, secs: f64) -> bool {
        self.t0.elapsed().as_secs_f64() < secs
    }

    fn figure(&self, n: usize) -> Figure {
        let (dt, dc) = (self.t0.elapsed().as_secs_f64(), cpu_seconds() - self.c0);
        Figure {
            per_sec: n as f64 / dt,
            cpu_us_per_msg: dc * 1e6 / n as f64,
        }
    }
}

async fn rdma(secs: f64) -> (Figure, Figure) {
    let l = Listener::bind(format!("{ADDR}:0").parse().unwrap())
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let c = l.accept().await.unwrap();
        // Echo 4 KiB messages; swallow 64 KiB ones (the stream), answering each 64th.
        let mut got = 0u64;
        while let Ok(m) = c.recv().await {
            if m.len() == 4096 {
                c.send(&m).await.unwrap();
            } else {
                got += 1;
                if got % 64 == 0 {
                    c.send(b"k").await.unwrap();
                }
            }
        }
    });
    let opts = ConnectOptions {
        src: Some(format!("{ADDR}:0").parse().unwrap()),
        ..Default::default()
    };
    let c = Connection::connect(addr, opts).await.unwrap();
    let msg = vec![7u8; 4096];
    let (m, mut n) = (Meter::start(), 0);
    while m.running(secs) {
        c.send(&msg).await.unwrap();
        assert_eq!(c.recv().await.unwrap().len(), 4096);
        n += 1;
    }
    let pp = m.figure(n);
    let big = vec![9u8; 64 * 1024];
    let (m, mut n) = (Meter::start(), 0);
    while m.running(secs) {
        for _ in 0..64 {
            c.send(&big).await.unwrap();
        }
        assert_eq!(c.recv().await.unwrap(), b"k");
        n += 64;
    }
    let st = m.figure(n);
    c.disconnect().await.unwrap();
    server.await.unwrap();
    (pp, st)
}

async fn tcp(secs: f64) -> (Figure, Figure) {
    let l = tokio::net::TcpListener::bind(format!("{ADDR}:0"))
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        s.set_nodelay(true).unwrap();
        // Framing: 1 byte kind (0: echo 4 KiB, 1: 64 KiB, answer each 64th).
        let mut buf = vec![0u8; 64 * 1024];
        let mut got = 0u64;
        loop {
            let mut kind = [0u8; 1];
            if s.read_exact(&mut kind).await.is_err() {
                return;
            }
            if kind[0] == 0 {
                s.read_exact(&mut buf[..4096]).await.unwrap();
                s.write_all(&buf[..4096]).await.unwrap();
            } else {
                s.read_exact(&mut buf).await.unwrap();
                got += 1;
                if got % 64 == 0 {
                    s.write_all(b"k").await.unwrap();
                }
            }
        }
    });
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.set_nodelay(true).unwrap();
    let mut msg = vec![7u8; 4097];
    msg[0] = 0;
    let mut back = vec![0u8; 4096];
    let (m, mut n) = (Meter::start(), 0);
    while m.running(secs) {
        c.write_all(&msg).await.unwrap();
        c.read_exact(&mut back).await.unwrap();
        n += 1;
    }
    let pp = m.figure(n);
    let mut big = vec![9u8; 64 * 1024 + 1];
    big[0] = 1;
    let (m, mut n) = (Meter::start(), 0);
    while m.running(secs) {
        for _ in 0..64 {
            c.write_all(&big).await.unwrap();
        }
        let mut k = [0u8; 1];
        c.read_exact(&mut k).await.unwrap();
        n += 64;
    }
    let st = m.figure(n);
    drop(c);
    server.await.unwrap();
    (pp, st)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let (tp, ts) = tcp(secs).await;
    let (rp, rs) = rdma(secs).await;
    println!("| one process, {ADDR} | 4 KiB ping-pong msg/s | CPU us/msg | 64 KiB stream MB/s | CPU us/msg |");
    println!("| --- | --- | --- | --- | --- |");
    for (name, p, s) in [
        ("tokio TCP echo", &tp, &ts),
        ("Connection send/recv", &rp, &rs),
    ] {
        println!(
            "| {name} | {:.0} | {:.1} | {:.0} | {:.1} |",
            p.per_sec,
            p.cpu_us_per_msg,
            s.per_sec * 65536.0 / 1e6,
            s.cpu_us_per_msg
        );
    }
}
