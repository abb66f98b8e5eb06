//! Command-line parsing in the style of rdma-core's tools (for `rping`, `ucmatose`, `udaddy`,
//! `cmtime`, `rdma-perf`, ...).
//!
//! What every tool shares, so that habits and scripts carry over from rdma-core:
//! * short options parsed as POSIX `getopt` does ([`getopt`]: `-C 5`, `-C5`, grouped flags
//!   `-vV`, `--` ends options), with getopt's own messages for bad options;
//! * `-h` prints the usage text to stdout and exits 0 ([`Tool::usage`]);
//! * any failure prints ONE line `toolname: reason` to stderr and exits 1 ([`Tool::fail`]);
//! * numbers and addresses parsed with one-line errors ([`Tool::num`], [`Tool::addr`]).
//!
//! ```
//! use rdma_tools::cli::{getopt, Opt};
//! let args = ["-s", "-C5", "-a", "127.0.0.1", "-vV"].map(String::from);
//! let opts = getopt(&args, "sC:a:vV").unwrap();
//! assert_eq!(opts[1], Opt { name: 'C', value: Some("5".into()) });
//! assert_eq!(opts.len(), 5);
//! assert!(getopt(&args, "s").is_err());
//! ```

use std::fmt::Display;
use std::net::{IpAddr, SocketAddr, SocketAddrV6, ToSocketAddrs};
use std::str::FromStr;

/// One parsed option: its letter and, for options declared with `:`, its argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opt {
    /// The option letter.
    pub name: char,
    /// The option's argument (options declared `x:` in the spec).
    pub value: Option<String>,
}

/// Parses `args` (without the program name) against a getopt spec such as `"sca:p:C:vh"`.
/// Every argument must be an option (the tools take no operands). Errors carry getopt's
/// wording: `invalid option -- 'x'`, `option requires an argument -- 'x'`,
/// `unexpected argument 'foo'`.
pub fn getopt(args: &[String], spec: &str) -> Result<Vec<Opt>, String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        if a == "--" {
            if let Some(extra) = args.get(i) {
                return Err(format!("unexpected argument '{extra}'"));
            }
            break;
        }
        let Some(body) = a.strip_prefix('-').filter(|b| !b.is_empty()) else {
            return Err(format!("unexpected argument '{a}'"));
        };
        for (pos, c) in body.char_indices() {
            match takes_arg(spec, c) {
                None => return Err(format!("invalid option -- '{c}'")),
                Some(false) => out.push(Opt {
                    name: c,
                    value: None,
                }),
                Some(true) => {
                    let rest = &body[pos + c.len_utf8()..];
                    let value = if !rest.is_empty() {
                        rest.to_string()
                    } else if let Some(next) = args.get(i) {
                        i += 1;
                        next.clone()
                    } else {
                        return Err(format!("option requires an argument -- '{c}'"));
                    };
                    out.push(Opt {
                        name: c,
                        value: Some(value),
                    });
                    break;
                }
            }
        }
    }
    Ok(out)
}

/// `None`: not in the spec; `Some(true)`: takes an argument.
fn takes_arg(spec: &str, c: char) -> Option<bool> {
    if c == ':' {
        return None;
    }
    let pos = spec.find(c)?;
    Some(spec[pos + c.len_utf8()..].starts_with(':'))
}

/// A tool's name and usage text: the exits every tool shares.
#[derive(Debug, Clone, Copy)]
pub struct Tool {
    /// The program name, the prefix of every error line (`rping`, `ucmatose`, ...).
    pub name: &'static str,
    /// The usage text `-h` prints (several lines, rdma-core's layout).
    pub usage: &'static str,
}

impl Tool {
    /// Prints `name: reason` on stderr and exits with status 1.
    pub fn fail(&self, reason: impl Display) -> ! {
        eprintln!("{}: {}", self.name, reason);
        std::process::exit(1)
    }

    /// Prints the usage text on stdout and exits 0 (`-h`).
    pub fn usage(&self) -> ! {
        print!("{}", self.usage);
        if !self.usage.ends_with('\n') {
            println!();
        }
        std::process::exit(0)
    }

    /// Parses the process arguments against `spec`; `-h` (when in the spec) prints the
    /// usage and exits, a bad option fails with one line pointing at `-h`.
    pub fn parse_args(&self, spec: &str) -> Vec<Opt> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        match getopt(&args, spec) {
            Ok(opts) => {
                if opts.iter().any(|o| o.name == 'h') {
                    self.usage();
                }
                opts
            }
            Err(e) => self.fail(format_args!("{e} (try '{} -h')", self.name)),
        }
    }

    /// Parses a number option (decimal, or hex with `0x`), failing with
    /// `name: invalid value 'v' for -x`.
    pub fn num<T: FromStr + TryFrom<u64>>(&self, opt: char, value: &str) -> T {
        match parse_num(value) {
            Some(v) => v,
            None => self.fail(format_args!("invalid value '{value}' for -{opt}")),
        }
    }

    /// Resolves an address option to an IP address with its scope id (for link-local
    /// IPv6: `fe80::1%eth0` or `%2`) and `port`, failing with one line.
    pub fn addr(&self, opt: char, value: &str, port: u16) -> SocketAddr {
        match parse_addr(value, port) {
            Ok(a) => a,
            Err(e) => self.fail(format_args!("-{opt} {value}: {e}")),
        }
    }
}

/// Parses a non-negative integer, decimal or `0x` hex; `None` when it is not one or does
/// not fit in `T`.
///
/// ```
/// assert_eq!(rdma_tools::cli::parse_num::<u16>("0x1c0e"), Some(7182));
/// assert_eq!(rdma_tools::cli::parse_num::<u8>("300"), None);
/// ```
pub fn parse_num<T: FromStr + TryFrom<u64>>(s: &str) -> Option<T> {
    let s = s.trim();
    let v = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()?
    } else {
        s.parse::<u64>().ok()?
    };
    T::try_from(v).ok()
}

/// Parses an address as rdma-core's tools accept it (numeric IPv4/IPv6, an IPv6 scope
/// `%ifname` or `%index`, or a host name looked up with the system resolver) with `port`.
///
/// ```
/// let a = rdma_tools::cli::parse_addr("127.0.0.2", 7174).unwrap();
/// assert_eq!(a.to_string(), "127.0.0.2:7174");
/// let b = rdma_tools::cli::parse_addr("::1", 1).unwrap();
/// assert_eq!(b.to_string(), "[::1]:1");
/// assert!(rdma_tools::cli::parse_addr("fe80::1%nosuchif0", 1).is_err());
/// ```
pub fn parse_addr(s: &str, port: u16) -> Result<SocketAddr, String> {
    let s = s.trim_start_matches('[').trim_end_matches(']');
    if let Some((ip, scope)) = s.split_once('%') {
        let ip: std::net::Ipv6Addr = ip
            .parse()
            .map_err(|_| "scope id on a non-IPv6 address".to_string())?;
        let idx = match scope.parse::<u32>() {
            Ok(i) => i,
            Err(_) => if_index(scope).ok_or_else(|| format!("no such interface '{scope}'"))?,
        };
        return Ok(SocketAddr::V6(SocketAddrV6::new(ip, port, 0, idx)));
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    match (s, port).to_socket_addrs() {
        Ok(mut it) => it.next().ok_or_else(|| "no address for host".to_string()),
        Err(e) => Err(format!("getaddrinfo: {e}")),
    }
}

/// The index of the interface `name` (`if_nametoindex`).
fn if_index(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: `c` is a valid NUL-terminated string that lives across the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (idx != 0).then_some(idx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn getopt_forms() {
        let o = getopt(&v(&["-sv", "-p7174", "-a", "::1", "--"]), "svp:a:").unwrap();
        let names: Vec<char> = o.iter().map(|o| o.name).collect();
        assert_eq!(names, ['s', 'v', 'p', 'a']);
        assert_eq!(o[2].value.as_deref(), Some("7174"));
        assert_eq!(o[3].value.as_deref(), Some("::1"));
    }

    #[test]
    fn getopt_errors() {
        assert_eq!(
            getopt(&v(&["-x"]), "s").unwrap_err(),
            "invalid option -- 'x'"
        );
        assert_eq!(
            getopt(&v(&["-p"]), "p:").unwrap_err(),
            "option requires an argument -- 'p'"
        );
        assert!(getopt(&v(&["foo"]), "p:").is_err());
        assert!(getopt(&v(&["-"]), "p:").is_err());
        assert!(getopt(&v(&["-:"]), "p:").is_err());
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_num::<u32>("10"), Some(10));
        assert_eq!(parse_num::<u32>("-1"), None);
        assert_eq!(parse_num::<u32>("x"), None);
        assert_eq!(parse_num::<u16>("65536"), None);
    }
}
