//! `udp-pingpong`: round trip of a small UDP datagram on loopback. See `-h`.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use rdma_bench::cli::{Args, Usage};
use rdma_bench::json::{line, Num};
use rdma_bench::stats::{Summary, SummaryJson};
use rdma_bench::udp::{self, Config, Mode};
use rdma_bench::{loopback_addr, run_main, Error, MainError, Progress};

const NAME: &str = "udp-pingpong";
const PORT: u16 = 18515;

const HELP: &str = "\
udp-pingpong: round trip of a UDP datagram on loopback (the limit for RDMA SEND latency)

Usage: udp-pingpong [OPTIONS]
       udp-pingpong --server [ADDR] [--mode MODE]
       udp-pingpong --client ADDR [OPTIONS]

By default the echo server and the client are two threads of this process. Each round trip is
timed; the figures are the round trip (RTT) and half of it (one-way, as ib_send_lat reports).

Options:
  -n, --iters N        measured round trips per mode (default 50000)
  -w, --warmup N       round trips before measuring (default 1000)
  -s, --size BYTES     payload bytes, 1..=65507 (default 64)
  -m, --mode MODE      blocking, busy-poll or both (default both); in-process the server waits
                       the same way as the client; --server takes one mode (default blocking)
  -b, --bind ADDR      address of the in-process server (default 127.0.0.1, any port)
      --server [ADDR]  only the echo server, on ADDR (default 127.0.0.1:18515); it exits when
                       a client is done
      --client ADDR    only the client, against a --server
  -t, --timeout SECS   longest wait for one echo (default 5)
      --json           print one line of JSON on stdout instead of the table
  -q, --quiet          no progress lines on stderr
  -h, --help           this help

Only loopback addresses are accepted (127.0.0.0/8, ::1).";

/// `--json` of `--server`.
#[derive(serde::Serialize)]
struct ServerJson {
    tool: &'static str,
    role: &'static str,
    addr: String,
    echoed: u64,
}

/// `--json` of a client run: one result per mode.
#[derive(serde::Serialize)]
struct ClientJson<'a> {
    tool: &'static str,
    addr: String,
    size: usize,
    iters: usize,
    results: Vec<ModeJson<'a>>,
}

#[derive(serde::Serialize)]
struct ModeJson<'a> {
    mode: &'static str,
    #[serde(flatten)]
    rtt: SummaryJson<'a>,
    one_way_median_us: Num,
    one_way_avg_us: Num,
}

enum Role {
    InProcess(SocketAddr),
    Server(SocketAddr),
    Client(SocketAddr),
}

fn modes(s: &str) -> Result<Vec<Mode>, Usage> {
    match s {
        "blocking" => Ok(vec![Mode::Blocking]),
        "busy-poll" | "busy" | "poll" => Ok(vec![Mode::BusyPoll]),
        "both" => Ok(vec![Mode::Blocking, Mode::BusyPoll]),
        _ => Err(Usage(format!(
            "bad mode {s:?}: expected blocking, busy-poll or both"
        ))),
    }
}

fn main() {
    run_main(NAME, real_main)
}

fn real_main() -> Result<(), MainError> {
    let mut a = Args::from_env();
    let (mut iters, mut warmup, mut size) = (50_000usize, 1000usize, 64usize);
    let mut mode_list: Option<Vec<Mode>> = None;
    let mut timeout = 5.0f64;
    let (mut json, mut quiet) = (false, false);
    let mut role = None;
    let mut bind = None;
    while let Some(f) = a.next_flag()? {
        match f.as_str() {
            "-h" | "--help" => {
                println!("{HELP}");
                return Ok(());
            }
            "-n" | "--iters" => iters = a.parse_in(&f, 1, 100_000_000)?,
            "-w" | "--warmup" => warmup = a.parse_in(&f, 0, 100_000_000)?,
            "-s" | "--size" => size = a.parse_in(&f, 1, udp::MAX_SIZE)?,
            "-m" | "--mode" => mode_list = Some(modes(&a.value(&f)?)?),
            "-t" | "--timeout" => timeout = a.parse_in(&f, 0.001, 3600.0)?,
            "-b" | "--bind" => bind = Some(a.value(&f)?),
            "--server" => {
                let s = a.optional_value().unwrap_or_else(|| "127.0.0.1".into());
                role = Some(Role::Server(loopback_addr(&s, PORT)?));
            }
            "--client" => role = Some(Role::Client(loopback_addr(&a.value(&f)?, PORT)?)),
            "--json" => json = true,
            "-q" | "--quiet" => quiet = true,
            _ => return Err(Usage(format!("unknown option {f:?}")).into()),
        }
    }
    let role = match role {
        Some(r) => {
            if bind.is_some() {
                return Err(Usage("--bind is for the in-process server only".into()).into());
            }
            r
        }
        None => Role::InProcess(loopback_addr(bind.as_deref().unwrap_or("127.0.0.1"), 0)?),
    };
    let p = Progress {
        name: NAME,
        on: !quiet,
    };
    let timeout = Duration::from_secs_f64(timeout);

    if let Role::Server(addr) = role {
        let mode = match mode_list.as_deref() {
            None => Mode::Blocking,
            Some([m]) => *m,
            Some(_) => return Err(Usage("--server takes one --mode".into()).into()),
        };
        let sock = UdpSocket::bind(addr).map_err(|e| Error::io(&format!("bind {addr}"), e))?;
        p.say(format_args!(
            "echo server on {addr} ({}), waiting for a client",
            mode.name()
        ));
        let n = udp::echo(&sock, mode, None)?;
        p.say(format_args!("client done after {n} datagrams"));
        if json {
            let o = ServerJson {
                tool: NAME,
                role: "server",
                addr: addr.to_string(),
                echoed: n,
            };
            println!("{}", line(&o));
        }
        return Ok(());
    }

    let mode_list = mode_list.unwrap_or_else(|| vec![Mode::Blocking, Mode::BusyPoll]);
    let mut results: Vec<(Mode, Summary)> = Vec::new();
    let addr = match role {
        Role::InProcess(a) | Role::Client(a) | Role::Server(a) => a,
    };
    for &mode in &mode_list {
        let cfg = Config {
            size,
            iters,
            warmup,
            mode,
            timeout,
        };
        p.say(format_args!(
            "{}: {iters} round trips of {size} B on {} ({warmup} warm-up)",
            mode.name(),
            addr.ip()
        ));
        let rtt = match role {
            Role::Client(server) => udp::pingpong(server, &cfg)?,
            _ => udp::pingpong_in_process(addr, &cfg)?,
        };
        p.say(format_args!(
            "{}: median round trip {:.2} us",
            mode.name(),
            rtt.median
        ));
        results.push((mode, rtt));
    }
    if let Role::Client(server) = role {
        udp::stop(server)?;
    }

    if json {
        let results = results
            .iter()
            .map(|(m, rtt)| {
                let half = rtt.scaled(2.0);
                ModeJson {
                    mode: m.name(),
                    rtt: rtt.json("rtt"),
                    one_way_median_us: Num(half.median),
                    one_way_avg_us: Num(half.avg),
                }
            })
            .collect();
        let o = ClientJson {
            tool: NAME,
            addr: addr.ip().to_string(),
            size,
            iters,
            results,
        };
        println!("{}", line(&o));
    } else {
        println!(
            "UDP ping-pong, {size} B on {}, {iters} round trips per mode (microseconds)",
            addr.ip()
        );
        println!(
            "{:<10} {:>9} {:>9} {:>9} {:>9} {:>9} | {:>15} {:>12}",
            "mode", "rtt min", "median", "avg", "p99", "p99.9", "one-way median", "one-way avg"
        );
        for (m, r) in &results {
            println!(
                "{:<10} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} | {:>15.2} {:>12.2}",
                m.name(),
                r.min,
                r.median,
                r.avg,
                r.p99,
                r.p999,
                r.median / 2.0,
                r.avg / 2.0
            );
        }
    }
    Ok(())
}
