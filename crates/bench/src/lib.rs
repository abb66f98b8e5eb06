//! Physical limits of this machine's loopback, the baselines that `rdma-perf` and `cmtime` are
//! compared against.
//!
//! Three measurements, each a library function and a binary of the same name:
//!
//! | binary | function | what it measures |
//! | --- | --- | --- |
//! | `udp-pingpong` | [`udp::pingpong`] | round trip of a small UDP datagram (64 B by default), blocking or busy-polling |
//! | `tcp-stream` | [`tcp_stream::stream`] | one TCP stream, bytes per second |
//! | `tcp-connect` | [`tcp_connect::cycles`] | connect / accept / close cycles, sequential or concurrent |
//!
//! Every function takes the address of a peer that echoes, sinks or accepts ([`udp::echo`],
//! [`tcp_stream::sink`], [`tcp_connect::serve`]); the binaries run both ends as threads of one
//! process by default, or as two processes (`--server ADDR` / `--client ADDR`). Only loopback
//! addresses (127.0.0.0/8, ::1) are accepted: these are baselines of the host itself, not
//! network tests. `bench/compare.sh` at the workspace root runs all of them next to our tools
//! and the alternatives (libfabric tcp, UCX tcp) and writes `docs/BENCHMARKS.md`.

#![deny(missing_docs)]

pub mod cli;
pub mod json;
pub mod stats;
pub mod tcp_connect;
pub mod tcp_stream;
pub mod udp;

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

/// Error of a benchmark: a one-line message for the user.
#[derive(Debug)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl Error {
    /// An error that wraps an I/O error with what was being done.
    pub fn io(what: &str, e: std::io::Error) -> Error {
        Error(format!("{what}: {e}"))
    }
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Parses `s` as `IP:PORT` (or `[IPv6]:PORT`, or a bare IP with port `default_port`) and checks
/// that the IP is a loopback address (127.0.0.0/8 or ::1).
pub fn loopback_addr(s: &str, default_port: u16) -> Result<SocketAddr> {
    let addr = if let Ok(ip) = s.parse::<IpAddr>() {
        SocketAddr::new(ip, default_port)
    } else if let Ok(a) = s.parse::<SocketAddr>() {
        a
    } else if let Some(a) = s
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| it.find(|a| a.ip().is_loopback()))
    {
        // "localhost:PORT"
        a
    } else {
        return Err(Error(format!(
            "bad address {s:?}: expected IP:PORT or IP (127.0.0.0/8 or ::1)"
        )));
    };
    if !addr.ip().is_loopback() {
        return Err(Error(format!(
            "{} is not a loopback address: only 127.0.0.0/8 and ::1 are allowed",
            addr.ip()
        )));
    }
    Ok(addr)
}

/// Runs a binary's `main`: prints an error as one line prefixed with the program name and exits
/// with status 1 (2 for a usage error, see [`cli::Usage`]).
pub fn run_main(name: &str, f: impl FnOnce() -> std::result::Result<(), MainError>) -> ! {
    match f() {
        Ok(()) => std::process::exit(0),
        Err(MainError::Usage(m)) => {
            eprintln!("{name}: {m} (try '{name} -h')");
            std::process::exit(2)
        }
        Err(MainError::Run(e)) => {
            eprintln!("{name}: error: {e}");
            std::process::exit(1)
        }
    }
}

/// Failure of a binary's `main`: bad command line or failed run.
#[derive(Debug)]
pub enum MainError {
    /// Bad command line (exit status 2).
    Usage(String),
    /// The run failed (exit status 1).
    Run(Error),
}

impl From<Error> for MainError {
    fn from(e: Error) -> Self {
        MainError::Run(e)
    }
}

impl From<cli::Usage> for MainError {
    fn from(u: cli::Usage) -> Self {
        MainError::Usage(u.0)
    }
}

/// Progress lines on stderr, silenced by `--quiet`.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Program name printed in front of each line.
    pub name: &'static str,
    /// Whether to print.
    pub on: bool,
}

impl Progress {
    /// Prints one progress line on stderr (when enabled).
    pub fn say(&self, msg: impl fmt::Display) {
        if self.on {
            eprintln!("{}: {msg}", self.name);
        }
    }
}

/// Converts bytes per second to MB/s, with MB = 2^20 bytes (as perftest and UCX count).
pub fn mib_per_s(bytes_per_s: f64) -> f64 {
    bytes_per_s / (1u64 << 20) as f64
}

/// Converts bytes per second to Gb/s, with Gb = 10^9 bits.
pub fn gbit_per_s(bytes_per_s: f64) -> f64 {
    bytes_per_s * 8.0 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_only() {
        assert_eq!(
            loopback_addr("127.0.0.1", 9).unwrap(),
            "127.0.0.1:9".parse().unwrap()
        );
        assert_eq!(
            loopback_addr("127.1.2.3:80", 9).unwrap(),
            "127.1.2.3:80".parse().unwrap()
        );
        assert_eq!(
            loopback_addr("[::1]:5", 9).unwrap(),
            "[::1]:5".parse().unwrap()
        );
        assert!(loopback_addr("10.0.0.1:5", 9).is_err());
        assert!(loopback_addr("::2", 9).is_err());
        assert!(loopback_addr("not an address", 9).is_err());
        assert!(loopback_addr("127.0.0.1:99999", 9).is_err());
    }

    #[test]
    fn units() {
        assert_eq!(mib_per_s((1u64 << 20) as f64), 1.0);
        assert_eq!(gbit_per_s(1e9 / 8.0), 1.0);
    }
}
