//! Command-line parsing in the style of rdma-core's tools (for `rping`, `ucmatose`, `udaddy`,
//! `cmtime`, `rdma-perf`, ...).
//!
//! What every tool shares, so that habits and scripts carry over from rdma-core:
//! * short options parsed as POSIX `getopt` does ([`getopt`]: `-C 5`, `-C5`, grouped flags
//!   `-vV`, `--` ends options), with getopt's own messages for bad options; long options
//!   as `getopt_long` ([`getopt_long`], for `rdma-perf`'s perftest flags). The parsing
//!   itself is the [`getopts`] crate's;
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
///
/// The parsing is the `getopts` crate's (POSIX rules: grouped flags, attached or separate
/// values, `--`); this function only declares the spec's letters to it, words its errors as
/// getopt does and returns the options in command-line order.
pub fn getopt(args: &[String], spec: &str) -> Result<Vec<Opt>, String> {
    let letters = spec_letters(spec);
    let mut opts = getopts::Options::new();
    // The first operand ends the options, as POSIX getopt (without GNU permutation).
    opts.parsing_style(getopts::ParsingStyle::StopAtFirstFree);
    for &(c, value) in &letters {
        let c = c.to_string();
        if value {
            opts.optmulti(&c, "", "", "");
        } else {
            opts.optflagmulti(&c, "", "");
        }
    }
    let m = opts.parse(args).map_err(|f| getopt_message(&f, false))?;
    if let Some(extra) = m.free.first() {
        return Err(format!("unexpected argument '{extra}'"));
    }
    Ok(in_order(args, &letters, &m))
}

/// The letters of a getopt spec and whether each takes a value (`x:`).
fn spec_letters(spec: &str) -> Vec<(char, bool)> {
    let chars: Vec<char> = spec.chars().collect();
    chars
        .iter()
        .enumerate()
        .filter(|(_, &c)| c != ':')
        .map(|(i, &c)| (c, chars.get(i + 1) == Some(&':')))
        .collect()
}

/// A `getopts` failure in getopt's words (`long`: the tool also has `--name` options, and
/// an unknown `--name` is reported as getopt_long does).
fn getopt_message(f: &getopts::Fail, long: bool) -> String {
    use getopts::Fail;
    let one = |n: &str| n.chars().count() == 1;
    match f {
        Fail::UnrecognizedOption(n) if one(n) => format!("invalid option -- '{n}'"),
        Fail::UnrecognizedOption(n) if long => format!("unrecognized option '--{n}'"),
        // getopt without long options reads `--name` as the letter '-' first.
        Fail::UnrecognizedOption(_) => "invalid option -- '-'".to_string(),
        Fail::ArgumentMissing(n) if one(n) => format!("option requires an argument -- '{n}'"),
        Fail::ArgumentMissing(n) => format!("option '--{n}' requires an argument"),
        Fail::UnexpectedArgument(n) => format!("option '--{n}' doesn't allow an argument"),
        other => other.to_string(),
    }
}

/// The options of `m` in command-line order. `getopts` keeps, per letter, the index of the
/// option argument each occurrence came from; a grouped `-vVs` gives three letters the same
/// index, and their order is the order of the letters in that argument.
fn in_order(args: &[String], letters: &[(char, bool)], m: &getopts::Matches) -> Vec<Opt> {
    // The command-line argument behind each option index: getopts counts the arguments it
    // reads as options, not the values it takes from the next argument (a group whose first
    // value-taking letter is its last one takes the next argument as that value).
    let takes = |c: char| letters.iter().any(|&(l, v)| l == c && v);
    let mut option_args = Vec::new();
    let mut i = 0;
    while let Some(a) = args.get(i) {
        if a == "--" || a.len() < 2 || !a.starts_with('-') {
            break;
        }
        option_args.push(a.as_str());
        let body = &a[1..];
        let next_is_value = body
            .char_indices()
            .find(|&(_, c)| takes(c))
            .is_some_and(|(j, c)| j + c.len_utf8() == body.len());
        i += 1 + usize::from(next_is_value);
    }
    // (option index, letter's place in its argument, option)
    let mut all: Vec<(usize, usize, Opt)> = Vec::new();
    for &(c, value) in letters {
        let name = c.to_string();
        let found: Vec<(usize, Option<String>)> = if value {
            m.opt_strs_pos(&name)
                .into_iter()
                .map(|(p, v)| (p, Some(v)))
                .collect()
        } else {
            m.opt_positions(&name)
                .into_iter()
                .map(|p| (p, None))
                .collect()
        };
        let mut prev: Option<usize> = None;
        let mut nth = 0;
        for (pos, v) in found {
            nth = if prev == Some(pos) { nth + 1 } else { 0 };
            prev = Some(pos);
            let place = option_args
                .get(pos)
                .and_then(|a| a[1..].chars().enumerate().filter(|&(_, l)| l == c).nth(nth))
                .map_or(0, |(k, _)| k);
            all.push((pos, place, Opt { name: c, value: v }));
        }
    }
    all.sort_by_key(|&(pos, place, _)| (pos, place));
    all.into_iter().map(|(_, _, o)| o).collect()
}

/// Parses `args` (without the program name) against a getopt spec and long names for some
/// of its letters (`(name, letter)`: `--name` is `-letter`), as `getopt_long` does:
/// operands may come between options and are returned apart, `--` ends the options.
/// Errors carry getopt_long's wording: `unrecognized option '--x'`,
/// `option '--x' requires an argument`, `option '--x' doesn't allow an argument`, and
/// those of [`getopt`] for short options.
///
/// ```
/// use rdma_tools::cli::getopt_long;
/// let args = ["write_bw", "-s4096", "--bind=127.0.0.2", "127.0.0.1"].map(String::from);
/// let (opts, operands) = getopt_long(&args, "s:B:", &[("size", 's'), ("bind", 'B')]).unwrap();
/// assert_eq!(opts.len(), 2);
/// assert_eq!(opts[1].value.as_deref(), Some("127.0.0.2"));
/// assert_eq!(operands, ["write_bw", "127.0.0.1"]);
/// ```
pub fn getopt_long(
    args: &[String],
    spec: &str,
    long: &[(&str, char)],
) -> Result<(Vec<Opt>, Vec<String>), String> {
    let letters = spec_letters(spec);
    let mut opts = getopts::Options::new();
    opts.parsing_style(getopts::ParsingStyle::FloatingFrees);
    for &(c, value) in &letters {
        let short = c.to_string();
        let name = long.iter().find(|&&(_, l)| l == c).map_or("", |&(n, _)| n);
        if value {
            opts.optmulti(&short, name, "", "");
        } else {
            opts.optflagmulti(&short, name, "");
        }
    }
    let m = opts.parse(args).map_err(|f| getopt_message(&f, true))?;
    // Different letters of one group share a position; no caller gives such letters
    // meanings that depend on their order, so a stable sort by position is enough here.
    let mut found: Vec<(usize, Opt)> = Vec::new();
    for &(c, value) in &letters {
        let name = c.to_string();
        if value {
            found.extend(m.opt_strs_pos(&name).into_iter().map(|(p, v)| {
                let o = Opt {
                    name: c,
                    value: Some(v),
                };
                (p, o)
            }));
        } else {
            found.extend(m.opt_positions(&name).into_iter().map(|p| {
                (
                    p,
                    Opt {
                        name: c,
                        value: None,
                    },
                )
            }));
        }
    }
    found.sort_by_key(|&(p, _)| p);
    Ok((found.into_iter().map(|(_, o)| o).collect(), m.free))
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
    fn getopt_order_and_repeats() {
        // The last of -s / -c wins in rping: the order inside a group is kept.
        let names = |a: &[&str]| -> Vec<char> {
            getopt(&v(a), "scvC:")
                .unwrap()
                .iter()
                .map(|o| o.name)
                .collect()
        };
        assert_eq!(names(&["-csc"]), ['c', 's', 'c']);
        assert_eq!(
            names(&["-vs", "-C", "-5", "-cvC3"]),
            ['v', 's', 'C', 'c', 'v', 'C']
        );
        let o = getopt(&v(&["-C", "-5", "-C7"]), "C:").unwrap();
        assert_eq!(o[0].value.as_deref(), Some("-5"));
        assert_eq!(o[1].value.as_deref(), Some("7"));
        assert_eq!(
            getopt(&v(&["--foo"]), "s").unwrap_err(),
            "invalid option -- '-'"
        );
        assert_eq!(
            getopt(&v(&["-s", "foo", "-x"]), "s").unwrap_err(),
            "unexpected argument 'foo'"
        );
        assert_eq!(
            getopt(&v(&["-s", "--", "x"]), "s").unwrap_err(),
            "unexpected argument 'x'"
        );
    }

    #[test]
    fn getopt_long_forms() {
        let long = [("size", 's'), ("all", 'a'), ("bind", 'B')];
        let (o, free) = getopt_long(
            &v(&["t", "--size", "64", "-a", "x", "--bind=::1", "-s8"]),
            "s:aB:",
            &long,
        )
        .unwrap();
        let got: Vec<(char, Option<&str>)> =
            o.iter().map(|o| (o.name, o.value.as_deref())).collect();
        assert_eq!(
            got,
            [
                ('s', Some("64")),
                ('a', None),
                ('B', Some("::1")),
                ('s', Some("8"))
            ]
        );
        assert_eq!(free, ["t", "x"]);
        let err = |a: &[&str]| getopt_long(&v(a), "s:aB:", &long).unwrap_err();
        assert_eq!(err(&["--bogus"]), "unrecognized option '--bogus'");
        assert_eq!(err(&["--size"]), "option '--size' requires an argument");
        assert_eq!(
            err(&["--all=1"]),
            "option '--all' doesn't allow an argument"
        );
        assert_eq!(err(&["-x"]), "invalid option -- 'x'");
        assert_eq!(err(&["-s"]), "option requires an argument -- 's'");
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_num::<u32>("10"), Some(10));
        assert_eq!(parse_num::<u32>("-1"), None);
        assert_eq!(parse_num::<u32>("x"), None);
        assert_eq!(parse_num::<u16>("65536"), None);
    }
}
