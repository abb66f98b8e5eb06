//! One TCP stream on loopback: the bandwidth that RDMA WRITE and SEND are compared against.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// What a stream run does.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// How long the client writes.
    pub duration: Duration,
    /// Bytes per `write` call.
    pub write_size: usize,
    /// Longest wait for connecting and for the server's final count.
    pub timeout: Duration,
}

/// Result of a stream run.
#[derive(Clone, Copy, Debug)]
pub struct Throughput {
    /// Bytes the server received.
    pub bytes: u64,
    /// Seconds from the first write to the server's acknowledgement of the last byte.
    pub seconds: f64,
}

impl Throughput {
    /// Bytes per second.
    pub fn bytes_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Server side: accepts one connection, reads until the client shuts down its writing half,
/// then answers with the byte count (8 bytes, little endian). Returns the count.
pub fn sink(listener: &TcpListener, timeout: Option<Duration>) -> Result<u64> {
    let (mut s, _) = listener.accept().map_err(|e| Error::io("accept", e))?;
    s.set_read_timeout(timeout)
        .map_err(|e| Error::io("set_read_timeout", e))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("TCP receive", e)),
        }
    }
    s.write_all(&total.to_le_bytes())
        .map_err(|e| Error::io("TCP send", e))?;
    Ok(total)
}

/// Client side: streams to the [`sink`] at `server` for `cfg.duration`.
pub fn stream(server: SocketAddr, cfg: &Config) -> Result<Throughput> {
    if cfg.write_size == 0 {
        return Err(Error("write size must be at least 1 byte".into()));
    }
    let mut s = TcpStream::connect_timeout(&server, cfg.timeout)
        .map_err(|e| Error::io(&format!("connect {server}"), e))?;
    s.set_read_timeout(Some(cfg.timeout))
        .map_err(|e| Error::io("set_read_timeout", e))?;
    let buf = vec![0x5au8; cfg.write_size];
    let mut sent = 0u64;
    let start = Instant::now();
    while start.elapsed() < cfg.duration {
        s.write_all(&buf).map_err(|e| Error::io("TCP send", e))?;
        sent += buf.len() as u64;
    }
    s.shutdown(Shutdown::Write)
        .map_err(|e| Error::io("shutdown", e))?;
    let mut count = [0u8; 8];
    s.read_exact(&mut count)
        .map_err(|e| Error::io("reading the server's byte count", e))?;
    let seconds = start.elapsed().as_secs_f64();
    let bytes = u64::from_le_bytes(count);
    if bytes != sent {
        return Err(Error(format!("server received {bytes} bytes, sent {sent}")));
    }
    Ok(Throughput { bytes, seconds })
}

/// Runs a [`sink`] in a thread of this process (listening on `bind`, port 0 for any) and a
/// [`stream`] to it.
pub fn stream_in_process(bind: SocketAddr, cfg: &Config) -> Result<Throughput> {
    let l = TcpListener::bind(bind).map_err(|e| Error::io(&format!("bind {bind}"), e))?;
    let addr = l.local_addr().map_err(|e| Error::io("local_addr", e))?;
    std::thread::scope(|sc| {
        let server = sc.spawn(|| sink(&l, Some(cfg.timeout + cfg.duration)));
        let r = stream(addr, cfg);
        if r.is_err() {
            // unblock the accept if the client never connected
            let _ = TcpStream::connect_timeout(&addr, Duration::from_secs(1));
        }
        let served = server
            .join()
            .unwrap_or_else(|_| Err(Error("sink thread panicked".into())));
        let t = r?;
        served?;
        Ok(t)
    })
}
