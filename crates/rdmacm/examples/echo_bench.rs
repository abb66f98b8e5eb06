//! 4 KiB ping-pong and 64 KiB one-way stream through `Connection` (`send` /
//! `recv_into`, and `send_buf` with owned buffers), beside the same through a tokio TCP
//! echo, in the same run, with the CPU time per message of client and server together.
//!
//! ```text
//! cargo run --release -p rdmacm --example echo_bench [SECONDS]            # one process
//! cargo run --release -p rdmacm --example echo_bench --two-process [SECONDS]
//! cargo run --release -p rdmacm --example echo_bench --two-process --rdma-only [SECONDS]
//! ```
//!
//! `--rdma-only` skips the TCP figures (to profile or trace the RDMA half alone).
//!
//! With `--two-process` the bench spawns itself as the server (`serve rdma|tcp ADDR`)
//! on 127.0.62.1 and connects from 127.0.62.2; the server's CPU time is read from
//! `/proc/PID/stat`. Default 2 seconds per figure. Figures from a busy machine are not
//! figures: run it on a quiet one.

use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use rdmacm::{BufPool, ConnectOptions, Connection, Listener, MAX_MESSAGE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ONE: &str = "127.0.60.30";
const SERVER: &str = "127.0.62.1";
const CLIENT: &str = "127.0.62.2";

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// User + system time of another process, from `/proc/PID/stat`.
fn cpu_seconds_of(pid: u32) -> f64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start after ") ".
    let rest = s.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) / hz
}

struct Figure {
    per_sec: f64,
    cpu_us_per_msg: f64,
}

impl Figure {
    /// Not measured (printed as NaN).
    const NONE: Figure = Figure {
        per_sec: f64::NAN,
        cpu_us_per_msg: f64::NAN,
    };
}

struct Meter {
    t0: Instant,
    c0: f64,
    peer: Option<u32>,
}

impl Meter {
    fn start(peer: Option<u32>) -> Meter {
        Meter {
            t0: Instant::now(),
            c0: cpu_seconds() + peer.map_or(0.0, cpu_seconds_of),
            peer,
        }
    }

    fn running(&self, secs: f64) -> bool {
        self.t0.elapsed().as_secs_f64() < secs
    }

    fn figure(&self, n: usize) -> Figure {
        let c1 = cpu_seconds() + self.peer.map_or(0.0, cpu_seconds_of);
        let (dt, dc) = (self.t0.elapsed().as_secs_f64(), c1 - self.c0);
        Figure {
            per_sec: n as f64 / dt,
            cpu_us_per_msg: dc * 1e6 / n as f64,
        }
    }
}

/// Echoes 4 KiB messages, swallows 64 KiB ones answering each 64th, until the peer goes.
async fn rdma_server(c: Connection) {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut got = 0u64;
    while let Ok(n) = c.recv_into(&mut buf).await {
        if n == 4096 {
            if c.send(&buf[..n]).await.is_err() {
                return;
            }
        } else {
            got += 1;
            if got % 64 == 0 && c.send(b"k").await.is_err() {
                return;
            }
        }
    }
}

async fn rdma_client(c: &Connection, secs: f64, peer: Option<u32>) -> [Figure; 3] {
    let msg = vec![7u8; 4096];
    let mut back = vec![0u8; MAX_MESSAGE];
    let (m, mut n) = (Meter::start(peer), 0);
    while m.running(secs) {
        c.send(&msg).await.unwrap();
        assert_eq!(c.recv_into(&mut back).await.unwrap(), 4096);
        n += 1;
    }
    let pp = m.figure(n);
    let big = vec![9u8; 64 * 1024];
    let (m, mut n) = (Meter::start(peer), 0);
    while m.running(secs) {
        for _ in 0..64 {
            c.send(&big).await.unwrap();
        }
        assert_eq!(c.recv_into(&mut back).await.unwrap(), 1);
        n += 64;
    }
    let st = m.figure(n);
    // The same stream with owned buffers: the device reads them in place, no copy.
    // send_buf returns after the completion, so up to 8 are kept in flight.
    let pool = BufPool::new(64 * 1024, 16);
    let (m, mut n) = (Meter::start(peer), 0);
    while m.running(secs) {
        let mut out = Vec::with_capacity(8);
        for _ in 0..8 {
            out.push(c.send_buf(pool.get()));
        }
        for (r, _buf) in futures::future::join_all(out).await {
            r.unwrap();
        }
        n += 8;
        if n % 64 == 0 {
            assert_eq!(c.recv_into(&mut back).await.unwrap(), 1);
        }
    }
    let owned = m.figure(n);
    [pp, st, owned]
}

async fn tcp_server(mut s: tokio::net::TcpStream) {
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
}

async fn tcp_client(mut c: tokio::net::TcpStream, secs: f64, peer: Option<u32>) -> [Figure; 2] {
    c.set_nodelay(true).unwrap();
    let mut msg = vec![7u8; 4097];
    msg[0] = 0;
    let mut back = vec![0u8; 4096];
    let (m, mut n) = (Meter::start(peer), 0);
    while m.running(secs) {
        c.write_all(&msg).await.unwrap();
        c.read_exact(&mut back).await.unwrap();
        n += 1;
    }
    let pp = m.figure(n);
    let mut big = vec![9u8; 64 * 1024 + 1];
    big[0] = 1;
    let (m, mut n) = (Meter::start(peer), 0);
    while m.running(secs) {
        for _ in 0..64 {
            c.write_all(&big).await.unwrap();
        }
        let mut k = [0u8; 1];
        c.read_exact(&mut k).await.unwrap();
        n += 64;
    }
    [pp, m.figure(n)]
}

/// The server half, in its own process: prints `READY PORT`, serves one connection.
async fn serve(kind: &str, addr: SocketAddr) {
    if kind == "tcp" {
        let l = tokio::net::TcpListener::bind(addr).await.unwrap();
        println!("READY {}", l.local_addr().unwrap().port());
        let (s, _) = l.accept().await.unwrap();
        tcp_server(s).await;
    } else {
        let l = Listener::bind(addr).await.unwrap();
        println!("READY {}", l.local_addr().unwrap().port());
        let c = l.accept().await.unwrap();
        rdma_server(c).await;
    }
}

/// Starts `serve KIND` as a child process; returns it and the port it listens on.
fn spawn_server(kind: &str) -> (Child, u16) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["serve", kind, &format!("{SERVER}:0")])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the server");
    let mut line = String::new();
    let out = child.stdout.take().unwrap();
    std::io::BufReader::new(out).read_line(&mut line).unwrap();
    let port = line
        .trim()
        .strip_prefix("READY ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("server said {line:?}"));
    (child, port)
}

async fn two_process(secs: f64, tcp: bool) -> ([Figure; 2], [Figure; 3]) {
    let tcp = if tcp {
        let (mut child, port) = spawn_server("tcp");
        let c = tokio::net::TcpSocket::new_v4().unwrap();
        c.bind(format!("{CLIENT}:0").parse().unwrap()).unwrap();
        let c = c
            .connect(format!("{SERVER}:{port}").parse().unwrap())
            .await
            .unwrap();
        let tcp = tcp_client(c, secs, Some(child.id())).await;
        child.wait().unwrap();
        tcp
    } else {
        [Figure::NONE, Figure::NONE]
    };

    let (mut child, port) = spawn_server("rdma");
    let opts = ConnectOptions::new().src(format!("{CLIENT}:0").parse().unwrap());
    let addr = format!("{SERVER}:{port}").parse().unwrap();
    let c = Connection::connect(addr, opts).await.unwrap();
    let rdma = rdma_client(&c, secs, Some(child.id())).await;
    c.disconnect().await.unwrap();
    drop(c);
    child.wait().unwrap();
    (tcp, rdma)
}

async fn one_process(secs: f64) -> ([Figure; 2], [Figure; 3]) {
    let l = tokio::net::TcpListener::bind(format!("{ONE}:0"))
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move { tcp_server(l.accept().await.unwrap().0).await });
    let c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tcp = tcp_client(c, secs, None).await;
    server.await.unwrap();

    let l = Listener::bind(format!("{ONE}:0").parse().unwrap())
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move { rdma_server(l.accept().await.unwrap()).await });
    let opts = ConnectOptions::new().src(format!("{ONE}:0").parse().unwrap());
    let c = Connection::connect(addr, opts).await.unwrap();
    let rdma = rdma_client(&c, secs, None).await;
    c.disconnect().await.unwrap();
    server.await.unwrap();
    (tcp, rdma)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("serve") {
        let addr = args[2].parse().expect("serve KIND ADDR");
        return serve(&args[1], addr).await;
    }
    let two = args.iter().any(|a| a == "--two-process");
    let tcp = !args.iter().any(|a| a == "--rdma-only");
    let secs: f64 = args.iter().find_map(|s| s.parse().ok()).unwrap_or(2.0);
    let (where_, (t, r)) = if two {
        (
            format!("two processes, {CLIENT} -> {SERVER}"),
            two_process(secs, tcp).await,
        )
    } else {
        (format!("one process, {ONE}"), one_process(secs).await)
    };
    println!("| {where_} | 4 KiB ping-pong msg/s | CPU us/msg | 64 KiB stream MB/s | CPU us/msg |");
    println!("| --- | --- | --- | --- | --- |");
    let mb = |f: &Figure| f.per_sec * 65536.0 / 1e6;
    let row = |name: &str, p: &Figure, s: &Figure| {
        println!(
            "| {name} | {:.0} | {:.1} | {:.0} | {:.1} |",
            p.per_sec,
            p.cpu_us_per_msg,
            mb(s),
            s.cpu_us_per_msg
        )
    };
    row("tokio TCP echo", &t[0], &t[1]);
    row("Connection send / recv_into", &r[0], &r[1]);
    println!(
        "| Connection send_buf (owned, 8 in flight) | - | - | {:.0} | {:.1} |",
        mb(&r[2]),
        r[2].cpu_us_per_msg
    );
}
