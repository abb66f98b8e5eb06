//! `rdmacm-demo`: connection setup, CM events, RDMA WRITE throughput and SEND latency over
//! the software RoCEv2 device on loopback, with no configuration and no root.
//!
//! * `rdmacm-demo`: server and client in one process (127.0.0.1 and 127.0.0.2).
//! * `rdmacm-demo --server 127.0.0.1` and `rdmacm-demo --client 127.0.0.1`: the same over
//!   two terminals (processes share addresses; `--bind` picks the client's if wanted).

use rdma_tools::demo::{run, DemoOpts, Role};

const USAGE: &str = "usage: rdmacm-demo [--server ADDR | --client ADDR [--bind ADDR]] [options]
   (no role)        server on 127.0.0.1 and client from 127.0.0.2 in one process
   --server ADDR    run the server part on ADDR
   --client ADDR    run the client part against the server at ADDR
   --bind ADDR      the client's local address (default: 127.0.0.2 with no role, else
                    the route's; any process may use any address)
   -p, --port PORT  CM port (default 7472)
   --mib N          MiB to RDMA WRITE (default 256)
   --pings N        SEND ping-pong round trips (default 10000)
   -h, --help       this help
";

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("rdmacm-demo: {msg}");
    std::process::exit(1)
}

fn main() {
    rdma_tools::log::init(0);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut role, mut addr, mut bind) = (Role::Both, None, None);
    let (mut port, mut mib, mut pings) = (7472u16, 256usize, 10_000u64);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        if flag == "-h" || flag == "--help" {
            print!("{USAGE}");
            return;
        }
        let mut val = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .unwrap_or_else(|| fail(format_args!("option '{flag}' requires an argument")))
        };
        let num = |v: String| -> u64 {
            rdma_tools::cli::parse_num(&v)
                .unwrap_or_else(|| fail(format_args!("invalid value '{v}' for {flag}")))
        };
        match flag {
            "--server" => (role, addr) = (Role::Server, Some(val())),
            "--client" => (role, addr) = (Role::Client, Some(val())),
            "--bind" => bind = Some(val()),
            "-p" | "--port" => {
                port = u16::try_from(num(val())).unwrap_or_else(|_| fail("invalid port"))
            }
            "--mib" => mib = num(val()).clamp(1, 1 << 16) as usize,
            "--pings" => pings = num(val()).clamp(1, 100_000_000),
            _ => fail(format_args!(
                "unrecognized option '{a}' (try 'rdmacm-demo -h')"
            )),
        }
    }
    let parse = |s: &str, port: u16| {
        rdma_tools::cli::parse_addr(s, port).unwrap_or_else(|e| fail(format_args!("{s}: {e}")))
    };
    let server = parse(addr.as_deref().unwrap_or("127.0.0.1"), port);
    let bind = match (role, bind) {
        (Role::Server, _) => None,
        (_, Some(b)) => Some(parse(&b, 0)),
        (Role::Both, None) => Some(parse("127.0.0.2", 0)),
        (Role::Client, None) => None,
    };
    let o = DemoOpts {
        role,
        server,
        bind,
        write_mib: mib,
        pings,
    };
    if let Err(e) = run(&o) {
        fail(e);
    }
}
