//! `ibv_rc_pingpong` over the software device: two processes exchange QPN, PSN and GID over
//! TCP, connect an RC QP by hand and ping-pong SENDs of `-s` bytes `-n` times.
//!
//! ```text
//! server: cargo run -p rdma-soft --example rc_pingpong -- -a 127.0.0.2
//! client: cargo run -p rdma-soft --example rc_pingpong -- -a 127.0.0.1 127.0.0.2
//! ```
//! Options (as `ibv_rc_pingpong` where it has them):
//! - `-a ADDR`: the local address (this device's GID 0); the server also listens on it for
//!   the TCP exchange.
//! - `-p PORT`: TCP port of the exchange (default 18515).
//! - `-s SIZE`: message size (default 4096); `-n ITERS`: iterations (default 1000).
//! - `-d NETDEV`: netdev of the device (default `lo`); `-U PORT`: UDP port of the RoCEv2 wire
//!   (default 4791; both sides must use the same).
//!
//! Output, as `ibv_rc_pingpong` prints it:
//! ```text
//!   local address:  LID 0x0000, QPN 0x000002, PSN 0x4d2a11, GID ::ffff:127.0.0.1
//!   remote address: LID 0x0000, QPN 0x000002, PSN 0x1be7c0, GID ::ffff:127.0.0.2
//! 8192000 bytes in 0.12 seconds = 546.13 Mbit/sec
//! 1000 iters in 0.12 seconds = 120.00 usec/iter
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdma_soft::io::{UdpConfig, UdpWire, WireAddr};
use rdma_soft::verbs::*;

struct Opts {
    local: WireAddr,
    server: Option<IpAddr>,
    tcp_port: u16,
    size: usize,
    iters: u64,
    netdev: String,
    udp_port: u16,
}

const USAGE: &str = "usage: rc_pingpong -a LOCAL_ADDR [-p TCP_PORT] [-s SIZE] [-n ITERS] [-d NETDEV] [-U UDP_PORT] [SERVER_ADDR]";

fn parse_args() -> Result<Opts, String> {
    let mut args = std::env::args().skip(1);
    let mut o = Opts {
        local: WireAddr::from(IpAddr::from([127, 0, 0, 1])),
        server: None,
        tcp_port: 18515,
        size: 4096,
        iters: 1000,
        netdev: "lo".into(),
        udp_port: rdma_soft::io::ROCE_PORT,
    };
    let mut local_given = false;
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "-a" | "-g" | "--addr" => {
                let v = val(&a)?;
                o.local = v.parse().map_err(|e| format!("-a {v}: {e}"))?;
                local_given = true;
            }
            "-p" => o.tcp_port = val("-p")?.parse().map_err(|e| format!("-p: {e}"))?,
            "-s" => o.size = val("-s")?.parse().map_err(|e| format!("-s: {e}"))?,
            "-n" => o.iters = val("-n")?.parse().map_err(|e| format!("-n: {e}"))?,
            "-d" => o.netdev = val("-d")?,
            "-U" => o.udp_port = val("-U")?.parse().map_err(|e| format!("-U: {e}"))?,
            "-h" | "--help" => return Err(USAGE.into()),
            s if !s.starts_with('-') && o.server.is_none() => {
                o.server = Some(s.parse().map_err(|e| format!("{s}: {e}"))?)
            }
            s => return Err(format!("unknown argument {s}\n{USAGE}")),
        }
    }
    if !local_given {
        return Err(format!("-a LOCAL_ADDR is required\n{USAGE}"));
    }
    if o.size == 0 || o.size > 1 << 30 || o.iters == 0 {
        return Err("size must be 1..=1 GiB and iters at least 1".into());
    }
    Ok(o)
}

/// One side's connection data, as `ibv_rc_pingpong` writes it: `LID:QPN:PSN:GID` in hex.
struct Dest {
    qpn: u32,
    psn: u32,
    gid: [u8; 16],
}

impl Dest {
    fn wire(&self) -> String {
        let gid: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        format!("0000:{:06x}:{:06x}:{gid}\n", self.qpn, self.psn)
    }

    fn parse(s: &str) -> Option<Dest> {
        let f: Vec<&str> = s.trim().split(':').collect();
        if f.len() != 4 || f[3].len() != 32 {
            return None;
        }
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = u8::from_str_radix(f[3].get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Dest {
            qpn: u32::from_str_radix(f[1], 16).ok()?,
            psn: u32::from_str_radix(f[2], 16).ok()?,
            gid,
        })
    }

    fn print(&self, what: &str) {
        println!(
            "  {what} LID 0x0000, QPN {:#08x}, PSN {:#08x}, GID {}",
            self.qpn,
            self.psn,
            Ipv6Addr::from(self.gid)
        );
    }
}

/// Exchanges connection data; returns the peer's and the stream (buffered: the peer may
/// have sent more than its line already).
fn exchange(o: &Opts, mine: &Dest) -> Result<(Dest, BufReader<TcpStream>), String> {
    let stream = match o.server {
        Some(ip) => {
            let to = SocketAddr::new(ip, o.tcp_port);
            let end = Instant::now() + Duration::from_secs(10);
            loop {
                match TcpStream::connect(to) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() > end => return Err(format!("connect {to}: {e}")),
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        None => {
            let at = SocketAddr::new(o.local.ip(), o.tcp_port);
            let l = TcpListener::bind(at).map_err(|e| format!("listen {at}: {e}"))?;
            l.accept().map_err(|e| format!("accept: {e}"))?.0
        }
    };
    let mut r = BufReader::new(stream);
    r.get_mut()
        .write_all(mine.wire().as_bytes())
        .map_err(|e| format!("send dest: {e}"))?;
    let mut line = String::new();
    r.read_line(&mut line)
        .map_err(|e| format!("read dest: {e}"))?;
    let peer = Dest::parse(&line).ok_or(format!("bad remote address {line:?}"))?;
    Ok((peer, r))
}

fn wait(cq: &CompletionQueue, wc: &mut Vec<Completion>) -> Result<Completion, String> {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        wc.clear();
        if cq.poll(wc, 1) > 0 {
            let c = wc[0];
            if c.status != WcStatus::Success {
                return Err(format!("completion {} failed: {:?}", c.wr_id, c.status));
            }
            return Ok(c);
        }
        if Instant::now() > end {
            return Err("no completion within 30 s".into());
        }
    }
}

fn run(o: &Opts) -> Result<(), String> {
    let e = |e: rdma_soft::Error| e.to_string();
    let mut cfg = DeviceConfig::for_netdev(&o.netdev).map_err(e)?;
    cfg.gids = vec![o.local];
    let wire = UdpWire::new(UdpConfig {
        port: o.udp_port,
        ..UdpConfig::from_env().map_err(e)?
    })
    .map_err(e)?;
    let dev = Device::open_with_wire(cfg, Box::new(wire)).map_err(e)?;
    let pd = dev.alloc_pd().map_err(e)?;
    let cq = dev.create_cq(16, None).map_err(e)?;
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).map_err(e)?;
    let mr = pd
        .register(vec![0u8; o.size], AccessFlags::LOCAL_WRITE)
        .map_err(e)?;
    // a PSN from the clock and the pid, 24 bits, as ibv_rc_pingpong draws one at random
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let seed = nanos ^ std::process::id().wrapping_mul(2_654_435_761);
    let mine = Dest {
        qpn: qp.qpn(),
        psn: seed & 0xFF_FFFF,
        gid: o.local.gid(),
    };
    let (peer, mut tcp) = exchange(o, &mine)?;
    mine.print("local address: ");
    peer.print("remote address:");
    qp.connect(peer.qpn, peer.psn, mine.psn, peer.gid)
        .map_err(e)?;
    // both sides ready before the first SEND (as the reference does with its sync)
    tcp.get_mut().write_all(b"R").map_err(|e| e.to_string())?;
    let mut b = [0u8; 1];
    std::io::Read::read_exact(&mut tcp, &mut b).map_err(|e| e.to_string())?;

    let len = o.size as u32;
    let sge = mr.sge(0, len).map_err(e)?;
    let client = o.server.is_some();
    let mut wc = Vec::with_capacity(4);
    let start = Instant::now();
    for _ in 0..o.iters {
        qp.post_recv(&RecvWr::new(1).with_sge(sge)).map_err(e)?;
        if client {
            qp.post_send(&SendWr::new(2, SendOp::Send).with_sge(sge).signaled())
                .map_err(e)?;
        }
        let mut need = if client { 2 } else { 1 };
        while need > 0 {
            let c = wait(&cq, &mut wc)?;
            need -= 1;
            if !client && c.wr_id == 1 {
                qp.post_send(&SendWr::new(2, SendOp::Send).with_sge(sge).signaled())
                    .map_err(e)?;
                need += 1;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let usec = secs * 1e6;
    let bytes = o.size as u64 * o.iters * 2;
    println!(
        "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {secs:.2} seconds = {:.2} usec/iter",
        o.iters,
        usec / o.iters as f64
    );
    // let the peer see our last ACKs before the QP goes away
    tcp.get_mut().write_all(b"D").map_err(|e| e.to_string())?;
    let end = Instant::now() + Duration::from_millis(200);
    tcp.get_ref()
        .set_read_timeout(Some(Duration::from_millis(5)))
        .map_err(|e| e.to_string())?;
    while Instant::now() < end {
        let _ = dev.progress();
        if std::io::Read::read(&mut tcp, &mut b).is_ok() {
            break;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let o = match parse_args() {
        Ok(o) => o,
        Err(m) => {
            eprintln!("{m}");
            return ExitCode::from(2);
        }
    };
    match run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(m) => {
            eprintln!("rc_pingpong: {m}");
            ExitCode::FAILURE
        }
    }
}
