//! TCP connect / accept / close cycles on loopback: the connection rate that `cmtime` is
//! compared against.
//!
//! One cycle: the client connects, the server accepts and writes one byte, the client reads it
//! (so the accept is part of the cycle, as both sides reaching ESTABLISHED is for the RDMA CM)
//! and closes; the server reads the end of the stream and closes too. A connection whose first
//! byte from the client is `Q` stops the server.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::stats::Summary;
use crate::{Error, Result};

/// Largest number of concurrent clients (and server threads).
pub const MAX_CONCURRENCY: usize = 256;

const ACCEPTED: u8 = b'A';
const QUIT: u8 = b'Q';

/// Server: `workers` threads accept on `listener` and serve cycles until a client sends `Q`
/// (see [`stop`]). `timeout` bounds the wait on each accepted connection. Returns the number of
/// cycles served.
pub fn serve(listener: &TcpListener, workers: usize, timeout: Duration) -> Result<u64> {
    let workers = workers.clamp(1, MAX_CONCURRENCY);
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("local_addr", e))?;
    let stopping = AtomicBool::new(false);
    let served = AtomicU64::new(0);
    std::thread::scope(|sc| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                sc.spawn(|| -> Result<()> {
                    loop {
                        let (mut s, _) = match listener.accept() {
                            Ok(c) => c,
                            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                            Err(e) => {
                                // let the other workers go too
                                stopping.store(true, Ordering::SeqCst);
                                for _ in 1..workers {
                                    let _ = TcpStream::connect_timeout(&addr, timeout);
                                }
                                return Err(Error::io("accept", e));
                            }
                        };
                        if stopping.load(Ordering::SeqCst) {
                            return Ok(());
                        }
                        // A client that went away mid-cycle costs its cycle, not the server.
                        let _ = s.set_nodelay(true);
                        let _ = s.set_read_timeout(Some(timeout));
                        if s.write_all(&[ACCEPTED]).is_err() {
                            continue;
                        }
                        let mut b = [0u8; 1];
                        match s.read(&mut b) {
                            Ok(1) if b[0] == QUIT => {
                                stopping.store(true, Ordering::SeqCst);
                                drop(s);
                                // wake the workers blocked in accept: each takes one and exits
                                for _ in 1..workers {
                                    let _ = TcpStream::connect_timeout(&addr, timeout);
                                }
                                return Ok(());
                            }
                            Ok(_) => {
                                served.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => {}
                        }
                    }
                })
            })
            .collect();
        let mut first_err = None;
        for h in handles {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(Error("server thread panicked".into())));
            if let (Err(e), None) = (r, &first_err) {
                first_err = Some(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(served.load(Ordering::Relaxed)),
        }
    })
}

/// What a connect run does.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Connections in all.
    pub count: usize,
    /// Clients connecting at the same time (1 = sequential).
    pub concurrency: usize,
    /// Longest wait for one connect or for the server's byte.
    pub timeout: Duration,
}

/// Result of a connect run.
#[derive(Clone, Copy, Debug)]
pub struct Rate {
    /// Completed cycles.
    pub count: usize,
    /// Wall-clock seconds for all of them.
    pub seconds: f64,
    /// Time of each cycle, microseconds.
    pub per_conn: Summary,
}

impl Rate {
    /// Connections per second.
    pub fn per_second(&self) -> f64 {
        self.count as f64 / self.seconds
    }

    /// Wall-clock microseconds per connection (the inverse of the rate).
    pub fn us_per_conn(&self) -> f64 {
        self.seconds * 1e6 / self.count as f64
    }
}

fn hint(e: std::io::Error) -> Error {
    if e.kind() == ErrorKind::AddrNotAvailable {
        Error(format!(
            "connect: {e} (out of ephemeral ports? closed connections stay in TIME_WAIT for 60 s: wait or lower -n)"
        ))
    } else {
        Error::io("connect", e)
    }
}

/// One cycle as the client: connect, read the server's byte, close.
fn cycle(server: SocketAddr, timeout: Duration) -> Result<Duration> {
    let t = Instant::now();
    let mut s = TcpStream::connect_timeout(&server, timeout).map_err(hint)?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| Error::io("set_read_timeout", e))?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b)
        .map_err(|e| Error::io("waiting for the server's accept", e))?;
    if b[0] != ACCEPTED {
        return Err(Error(format!(
            "unexpected byte {:#x} from the server",
            b[0]
        )));
    }
    drop(s);
    Ok(t.elapsed())
}

/// Client side: `cfg.count` cycles against the [`serve`]r at `server`, `cfg.concurrency` at a
/// time.
pub fn cycles(server: SocketAddr, cfg: &Config) -> Result<Rate> {
    if cfg.count == 0 || cfg.concurrency == 0 || cfg.concurrency > MAX_CONCURRENCY {
        return Err(Error(format!(
            "need at least one connection and 1..={MAX_CONCURRENCY} concurrent clients"
        )));
    }
    let c = cfg.concurrency.min(cfg.count);
    let start = Instant::now();
    let per_thread: Vec<Result<Vec<Duration>>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..c)
            .map(|i| {
                let n = cfg.count / c + usize::from(i < cfg.count % c);
                sc.spawn(move || (0..n).map(|_| cycle(server, cfg.timeout)).collect())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error("client thread panicked".into())))
            })
            .collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let mut times = Vec::with_capacity(cfg.count);
    for r in per_thread {
        times.extend(r?);
    }
    let per_conn = Summary::of_durations(&times).ok_or_else(|| Error("no connections".into()))?;
    Ok(Rate {
        count: times.len(),
        seconds,
        per_conn,
    })
}

/// Stops the [`serve`]r at `server`.
pub fn stop(server: SocketAddr, timeout: Duration) -> Result<()> {
    let mut s = TcpStream::connect_timeout(&server, timeout).map_err(hint)?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| Error::io("set_read_timeout", e))?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b)
        .map_err(|e| Error::io("waiting for the server's accept", e))?;
    s.write_all(&[QUIT]).map_err(|e| Error::io("TCP send", e))
}

/// Runs a server in this process (on `bind`, port 0 for any) and then each of `runs` against
/// it; the server has as many threads as the largest concurrency.
pub fn cycles_in_process(bind: SocketAddr, runs: &[Config]) -> Result<Vec<Rate>> {
    let l = TcpListener::bind(bind).map_err(|e| Error::io(&format!("bind {bind}"), e))?;
    let addr = l.local_addr().map_err(|e| Error::io("local_addr", e))?;
    let workers = runs.iter().map(|r| r.concurrency).max().unwrap_or(1);
    let timeout = runs
        .iter()
        .map(|r| r.timeout)
        .max()
        .unwrap_or(Duration::from_secs(5));
    std::thread::scope(|sc| {
        let server = sc.spawn(|| serve(&l, workers, timeout));
        let rates: Result<Vec<Rate>> = runs.iter().map(|cfg| cycles(addr, cfg)).collect();
        let stopped = stop(addr, timeout);
        let served = server
            .join()
            .unwrap_or_else(|_| Err(Error("server thread panicked".into())));
        let rates = rates?;
        stopped?;
        served?;
        Ok(rates)
    })
}
