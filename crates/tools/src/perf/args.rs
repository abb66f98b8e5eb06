//! `rdma-perf` command line: `rdma-perf TEST [options] [server]`, perftest's flags.

use std::time::Duration;

use super::{Kind, Params, Test, DEFAULT_CQ_MOD, MAX_ALL_SIZE};
use crate::cli::{getopt_long, parse_addr, parse_num};

/// The usage text.
pub const USAGE: &str = "usage: rdma-perf TEST [options] [server_address]
tests: send_lat send_bw write_lat write_bw read_lat read_bw
server mode when no server_address is given
options:
   -s, --size=SIZE        message size (default 2 for latency, 65536 for bandwidth)
   -a, --all              all sizes from 2 to 2^23
   -n, --iters=N          iterations per size (default 1000 latency, 5000 bandwidth)
   -D, --duration=SEC     run each size for SEC seconds instead
   -q, --qp=N             queue pairs (bandwidth tests, default 1)
   -t, --tx-depth=N       work requests in flight (bandwidth tests, default 128)
   -Q, --cq-mod=N         latency tests: one signaled SEND or WRITE in N (default 100;
                          perftest 4.5's latency tests signal every one: -Q 1)
   -p, --port=PORT        rdma_cm port (default 18515)
   -F, --CPU-freq         accepted for compatibility (no CPU frequency check is made)
   -R, --rdma_cm          perftest's -R exchange (a perftest -R peer; see docs/PERFTEST.md);
                          a server without -R serves both our clients and perftest -R ones
   -d, -i, -x, -m, -I, -u accepted for perftest compatibility (device, port, GID index, MTU,
                          inline size, QP timeout: the connection manager picks them)
   -c, --connection=RC    connection type (RC only)
       --bind=ADDR        local address (also --bind_source_ip, as perftest)
   -h, --help             this help
";

/// Short options and which take a value.
const SPEC: &str = "s:an:D:q:t:Q:p:FRB:hd:i:x:m:I:u:c:";

/// Long options and their short letter.
const LONG: [(&str, char); 19] = [
    ("size", 's'),
    ("all", 'a'),
    ("iters", 'n'),
    ("duration", 'D'),
    ("qp", 'q'),
    ("tx-depth", 't'),
    ("cq-mod", 'Q'),
    ("port", 'p'),
    ("CPU-freq", 'F'),
    ("rdma_cm", 'R'),
    ("bind", 'B'),
    ("help", 'h'),
    ("ib-dev", 'd'),
    ("ib-port", 'i'),
    ("gid-index", 'x'),
    ("mtu", 'm'),
    ("inline_size", 'I'),
    ("qp-timeout", 'u'),
    ("connection", 'c'),
];

/// The outcome of parsing.
#[derive(Debug)]
pub enum Parsed {
    /// `-h`.
    Help,
    /// Run with these parameters.
    Run(Params, Extra),
}

/// Options beyond [`Params`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Extra {
    /// `-R`: perftest's exchange.
    pub rdma_cm: bool,
}

fn num<T: std::str::FromStr + TryFrom<u64>>(c: char, v: &str) -> Result<T, String> {
    parse_num(v).ok_or_else(|| format!("invalid value '{v}' for -{c}"))
}

/// `-s` as perftest reads it: a number, optionally with a `K` or `M` suffix.
fn size_arg(v: &str) -> Result<usize, String> {
    let (n, f) = match v.strip_suffix('K') {
        Some(n) => (n, 1024),
        None => match v.strip_suffix('M') {
            Some(n) => (n, 1 << 20),
            None => (v, 1),
        },
    };
    let n: usize = num('s', n)?;
    n.checked_mul(f)
        .ok_or_else(|| format!("invalid value '{v}' for -s"))
}

/// Parses the arguments (without the program name).
pub fn parse(args: &[String]) -> Result<Parsed, String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        return Ok(Parsed::Help);
    }
    let Some((first, rest)) = args.split_first() else {
        return Err("no test given (try 'rdma-perf -h')".into());
    };
    let test = Test::from_name(first)
        .or_else(|| first.strip_prefix("ib_").and_then(Test::from_name))
        .ok_or_else(|| format!("unknown test '{first}' (try 'rdma-perf -h')"))?;
    // perftest's --bind_source_ip is our --bind (getopt_long takes one long name a letter).
    let rest: Vec<String> = rest
        .iter()
        .map(|a| match a.strip_prefix("--bind_source_ip") {
            Some(t) if t.is_empty() || t.starts_with('=') => format!("--bind{t}"),
            _ => a.clone(),
        })
        .collect();
    let (opts, operands) = getopt_long(&rest, SPEC, &LONG).map_err(|e| {
        // getopt's short-option messages point at -h, getopt_long's long-option ones do not.
        if e.contains("'--") {
            e
        } else {
            format!("{e} (try 'rdma-perf -h')")
        }
    })?;
    let mut p = Params {
        test,
        size: if test.kind == Kind::Lat { 2 } else { 65536 },
        all: false,
        iters: if test.kind == Kind::Lat { 1000 } else { 5000 },
        duration: None,
        qps: 1,
        tx_depth: 128,
        cq_mod: DEFAULT_CQ_MOD,
        port: 18515,
        bind: None,
        server: None,
    };
    let mut bind = None;
    let mut extra = Extra::default();
    for o in opts {
        let v = o.value.as_deref().unwrap_or("");
        match o.name {
            's' => p.size = size_arg(v)?,
            'a' => p.all = true,
            'n' => p.iters = num('n', v)?,
            'D' => p.duration = Some(Duration::from_secs(num('D', v)?)),
            'q' => p.qps = num('q', v)?,
            't' => p.tx_depth = num('t', v)?,
            'Q' => p.cq_mod = num('Q', v)?,
            'p' => p.port = num('p', v)?,
            'B' => bind = Some(v.to_string()),
            'R' => extra.rdma_cm = true,
            'c' if !v.eq_ignore_ascii_case("RC") => {
                return Err(format!("connection type '{v}' is not supported (RC only)"));
            }
            _ => {}
        }
    }
    if p.size == 0 || p.size > MAX_ALL_SIZE {
        return Err(format!(
            "invalid value '{}' for -s (1 to {MAX_ALL_SIZE})",
            p.size
        ));
    }
    if p.iters == 0 || p.iters > u64::from(u32::MAX) * 16 {
        return Err(format!("invalid value '{}' for -n", p.iters));
    }
    if p.duration
        .is_some_and(|d| d.is_zero() || d.as_secs() > 86_400)
    {
        return Err("invalid value for -D (1 to 86400 seconds)".into());
    }
    if p.qps == 0 || p.qps > 64 {
        return Err(format!("invalid value '{}' for -q (1 to 64)", p.qps));
    }
    if p.qps > 1 && test.kind == Kind::Lat {
        return Err("-q is for bandwidth tests".into());
    }
    if p.tx_depth == 0 || p.tx_depth > 256 {
        return Err(format!("invalid value '{}' for -t (1 to 256)", p.tx_depth));
    }
    if p.cq_mod == 0 || p.cq_mod > 1_000_000 {
        return Err(format!(
            "invalid value '{}' for -Q (1 to 1000000)",
            p.cq_mod
        ));
    }
    if let Some(b) = bind {
        p.bind = Some(parse_addr(&b, 0).map_err(|e| format!("--bind {b}: {e}"))?);
    }
    match operands.as_slice() {
        [] => {}
        [s] => p.server = Some(parse_addr(s, p.port).map_err(|e| format!("{s}: {e}"))?),
        [_, x, ..] => return Err(format!("unexpected argument '{x}'")),
    }
    if let (Some(b), None) = (&mut p.bind, &p.server) {
        b.set_port(p.port);
    }
    Ok(Parsed::Run(p, extra))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn client_and_server_forms() {
        let Parsed::Run(p, _) = parse(&v(&[
            "write_bw",
            "-s",
            "4096",
            "--bind",
            "127.0.0.2",
            "-F",
            "127.0.0.1",
        ]))
        .unwrap() else {
            panic!()
        };
        assert_eq!(p.size, 4096);
        assert_eq!(p.server.unwrap().to_string(), "127.0.0.1:18515");
        assert_eq!(p.bind.unwrap().port(), 0);
        let Parsed::Run(p, _) =
            parse(&v(&["send_lat", "-p5000", "--bind=127.0.0.1", "-a"])).unwrap()
        else {
            panic!()
        };
        assert!(p.server.is_none() && p.all);
        assert_eq!(p.bind.unwrap().to_string(), "127.0.0.1:5000");
        let Parsed::Run(p, e) = parse(&v(&[
            "send_lat",
            "-R",
            "-s",
            "4K",
            "-n",
            "200",
            "-x",
            "3",
            "--bind_source_ip",
            "127.0.0.3",
            "127.0.0.1",
        ]))
        .unwrap() else {
            panic!()
        };
        assert!(e.rdma_cm);
        assert_eq!((p.size, p.iters), (4096, 200));
        assert_eq!(p.bind.unwrap().ip().to_string(), "127.0.0.3");
    }

    #[test]
    fn bad_input_is_an_error() {
        for a in [
            &["nope"][..],
            &[],
            &["send_bw", "-s", "0"],
            &["send_bw", "-s"],
            &["send_bw", "-x"],
            &["send_lat", "-q", "2"],
            &["send_bw", "--bogus"],
            &["send_bw", "a", "b"],
            &["send_bw", "-n", "x"],
            &["send_bw", "-c", "UD"],
        ] {
            assert!(parse(&v(a)).is_err(), "{a:?}");
        }
    }
}
