//! UDP ping-pong on loopback: the round trip that a small RDMA SEND is compared against.

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use crate::stats::Summary;
use crate::{Error, Result};

/// Largest payload of one UDP datagram over IPv4.
pub const MAX_SIZE: usize = 65507;

/// How a side waits for the next datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Blocking `recv`: the thread sleeps in the kernel until the datagram arrives.
    Blocking,
    /// Non-blocking `recv` in a loop, as an RDMA application polls its completion queue.
    BusyPoll,
}

impl Mode {
    /// The name used on the command line and in JSON (`blocking`, `busy-poll`).
    pub fn name(self) -> &'static str {
        match self {
            Mode::Blocking => "blocking",
            Mode::BusyPoll => "busy-poll",
        }
    }
}

/// Receives one datagram, waiting as `mode` says, for at most `timeout`.
fn recv(
    s: &UdpSocket,
    buf: &mut [u8],
    mode: Mode,
    timeout: Option<Duration>,
) -> Result<(usize, SocketAddr)> {
    match mode {
        Mode::Blocking => s.recv_from(buf).map_err(|e| {
            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
                Error("timed out waiting for a UDP datagram".into())
            } else {
                Error::io("UDP receive", e)
            }
        }),
        Mode::BusyPoll => {
            let start = Instant::now();
            let mut spins = 0u32;
            loop {
                match s.recv_from(buf) {
                    Ok(r) => return Ok(r),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        spins = spins.wrapping_add(1);
                        if spins.is_multiple_of(4096) {
                            if let Some(t) = timeout {
                                if start.elapsed() > t {
                                    return Err(Error(
                                        "timed out waiting for a UDP datagram".into(),
                                    ));
                                }
                            }
                        }
                        std::hint::spin_loop();
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(Error::io("UDP receive", e)),
                }
            }
        }
    }
}

fn set_mode(s: &UdpSocket, mode: Mode, timeout: Option<Duration>) -> Result<()> {
    s.set_nonblocking(mode == Mode::BusyPoll)
        .map_err(|e| Error::io("set_nonblocking", e))?;
    s.set_read_timeout(timeout)
        .map_err(|e| Error::io("set_read_timeout", e))
}

/// Echo server: sends every datagram back to its sender until an empty datagram arrives (the
/// client's "done"). `idle_timeout` bounds the wait for each datagram. Returns how many
/// datagrams were echoed.
pub fn echo(sock: &UdpSocket, mode: Mode, idle_timeout: Option<Duration>) -> Result<u64> {
    set_mode(sock, mode, idle_timeout)?;
    let mut buf = vec![0u8; MAX_SIZE + 1];
    let mut n = 0u64;
    loop {
        let (len, from) = recv(sock, &mut buf, mode, idle_timeout)?;
        if len == 0 {
            return Ok(n);
        }
        sock.send_to(&buf[..len], from)
            .map_err(|e| Error::io("UDP send", e))?;
        n += 1;
    }
}

/// What a ping-pong run does.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Payload bytes of each datagram (1..=[`MAX_SIZE`]).
    pub size: usize,
    /// Measured round trips.
    pub iters: usize,
    /// Round trips before measuring.
    pub warmup: usize,
    /// How the client waits for the echo.
    pub mode: Mode,
    /// Longest wait for one echo.
    pub timeout: Duration,
}

/// Binds a UDP socket on the loopback address of `peer`'s family, connected to `peer`.
fn client_socket(peer: SocketAddr) -> Result<UdpSocket> {
    let local: SocketAddr = if peer.is_ipv4() {
        "127.0.0.1:0".parse().expect("literal")
    } else {
        "[::1]:0".parse().expect("literal")
    };
    let s = UdpSocket::bind(local).map_err(|e| Error::io(&format!("bind {local}"), e))?;
    s.connect(peer)
        .map_err(|e| Error::io(&format!("connect {peer}"), e))?;
    Ok(s)
}

/// Ping-pong against the echo server at `server`: `cfg.iters` round trips of `cfg.size` bytes,
/// each timed on its own. Returns the round-trip times in microseconds (half of them is the
/// one-way latency that `ib_send_lat` reports).
pub fn pingpong(server: SocketAddr, cfg: &Config) -> Result<Summary> {
    if cfg.size == 0 || cfg.size > MAX_SIZE {
        return Err(Error(format!("size must be 1..={MAX_SIZE} bytes")));
    }
    let s = client_socket(server)?;
    set_mode(&s, cfg.mode, Some(cfg.timeout))?;
    let out = vec![0x5au8; cfg.size];
    let mut buf = vec![0u8; MAX_SIZE + 1];
    let mut times = Vec::with_capacity(cfg.iters);
    for i in 0..cfg.warmup + cfg.iters {
        let t = Instant::now();
        s.send(&out).map_err(|e| Error::io("UDP send", e))?;
        let (len, _) = recv(&s, &mut buf, cfg.mode, Some(cfg.timeout))?;
        let dt = t.elapsed();
        if len != cfg.size {
            return Err(Error(format!("echo of {len} bytes, sent {}", cfg.size)));
        }
        if i >= cfg.warmup {
            times.push(dt);
        }
    }
    Summary::of_durations(&times).ok_or_else(|| Error("no iterations".into()))
}

/// Tells the echo server at `server` that the client is done (an empty datagram).
pub fn stop(server: SocketAddr) -> Result<()> {
    let s = client_socket(server)?;
    s.send(&[]).map_err(|e| Error::io("UDP send", e))?;
    Ok(())
}

/// Runs an echo server in a thread of this process (on `bind`, a loopback address with port 0
/// for any) and a ping-pong against it, both waiting as `cfg.mode` says.
pub fn pingpong_in_process(bind: SocketAddr, cfg: &Config) -> Result<Summary> {
    let sock = UdpSocket::bind(bind).map_err(|e| Error::io(&format!("bind {bind}"), e))?;
    let addr = sock.local_addr().map_err(|e| Error::io("local_addr", e))?;
    let idle = cfg.timeout.max(Duration::from_secs(1));
    std::thread::scope(|sc| {
        let server = sc.spawn(|| echo(&sock, cfg.mode, Some(idle)));
        let r = pingpong(addr, cfg);
        let stopped = stop(addr);
        let served = server
            .join()
            .unwrap_or_else(|_| Err(Error("echo thread panicked".into())));
        let summary = r?;
        stopped?;
        served?;
        Ok(summary)
    })
}
