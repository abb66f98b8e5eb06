//! `tcp-connect`: TCP connect / accept / close cycles on loopback. See `-h`.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use rdma_bench::cli::{Args, Usage};
use rdma_bench::json::{line, Num};
use rdma_bench::stats::SummaryJson;
use rdma_bench::tcp_connect::{self, Config, Rate, MAX_CONCURRENCY};
use rdma_bench::{loopback_addr, run_main, Error, MainError, Progress};

const NAME: &str = "tcp-connect";
const PORT: u16 = 18517;

const HELP: &str = "\
tcp-connect: TCP connect/accept/close cycles on loopback (the comparison for cmtime)

Usage: tcp-connect [OPTIONS]
       tcp-connect --server [ADDR] [-c C]
       tcp-connect --client ADDR [OPTIONS]

One cycle: connect, the server accepts and writes one byte, the client reads it and closes,
the server reads the end of stream and closes. Runs N cycles one after the other (sequential)
and N cycles with C clients at a time (concurrent); reports connections/s, wall-clock
microseconds per connection and the time of each cycle. By default the server (C threads) and
the clients are threads of this process. Closed connections stay in TIME_WAIT for 60 s, each
holding an ephemeral port (about 28000 on Linux): keep N below that per minute.

Options:
  -n, --count N        cycles per run (default 1000)
  -c, --concurrency C  clients at a time in the concurrent run, 1..=256 (default 8);
                       with --server: server threads (default 8)
  -m, --mode MODE      sequential, concurrent or both (default both)
  -b, --bind ADDR      address of the in-process server (default 127.0.0.1, any port)
      --server [ADDR]  only the server, on ADDR (default 127.0.0.1:18517), until a client is done
      --client ADDR    only the clients, against a --server
  -t, --timeout SECS   longest wait for one connect or accept (default 5)
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
    served: u64,
}

/// `--json` of a client run: one result per mode.
#[derive(serde::Serialize)]
struct ClientJson<'a> {
    tool: &'static str,
    addr: String,
    results: Vec<RunJson<'a>>,
}

#[derive(serde::Serialize)]
struct RunJson<'a> {
    mode: &'static str,
    concurrency: usize,
    count: usize,
    seconds: Num,
    conn_per_s: Num,
    us_per_conn: Num,
    #[serde(flatten)]
    cycle: SummaryJson<'a>,
}

enum Role {
    InProcess(SocketAddr),
    Server(SocketAddr),
    Client(SocketAddr),
}

fn main() {
    run_main(NAME, real_main)
}

fn real_main() -> Result<(), MainError> {
    let mut a = Args::from_env();
    let (mut count, mut conc, mut timeout) = (1000usize, 8usize, 5.0f64);
    let (mut seq, mut concurrent) = (true, true);
    let (mut json, mut quiet) = (false, false);
    let (mut role, mut bind) = (None, None);
    while let Some(f) = a.next_flag()? {
        match f.as_str() {
            "-h" | "--help" => {
                println!("{HELP}");
                return Ok(());
            }
            "-n" | "--count" => count = a.parse_in(&f, 1, 10_000_000)?,
            "-c" | "--concurrency" => conc = a.parse_in(&f, 1, MAX_CONCURRENCY)?,
            "-m" | "--mode" => {
                let m = a.value(&f)?;
                (seq, concurrent) = match m.as_str() {
                    "sequential" => (true, false),
                    "concurrent" => (false, true),
                    "both" => (true, true),
                    _ => {
                        return Err(Usage(format!(
                            "bad mode {m:?}: expected sequential, concurrent or both"
                        ))
                        .into())
                    }
                }
            }
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
    let role = match (role, &bind) {
        (Some(_), Some(_)) => {
            return Err(Usage("--bind is for the in-process server only".into()).into())
        }
        (Some(r), None) => r,
        (None, b) => Role::InProcess(loopback_addr(b.as_deref().unwrap_or("127.0.0.1"), 0)?),
    };
    let p = Progress {
        name: NAME,
        on: !quiet,
    };
    let timeout = Duration::from_secs_f64(timeout);

    if let Role::Server(addr) = role {
        let l = TcpListener::bind(addr).map_err(|e| Error::io(&format!("bind {addr}"), e))?;
        p.say(format_args!(
            "server on {addr} with {conc} threads, waiting for clients"
        ));
        let n = tcp_connect::serve(&l, conc, timeout)?;
        p.say(format_args!("served {n} connections"));
        if json {
            let o = ServerJson {
                tool: NAME,
                role: "server",
                addr: addr.to_string(),
                served: n,
            };
            println!("{}", line(&o));
        }
        return Ok(());
    }

    let mut runs = Vec::new();
    if seq {
        runs.push(Config {
            count,
            concurrency: 1,
            timeout,
        });
    }
    if concurrent {
        runs.push(Config {
            count,
            concurrency: conc,
            timeout,
        });
    }
    let name = |c: &Config| {
        if c.concurrency == 1 {
            "sequential"
        } else {
            "concurrent"
        }
    };
    for r in &runs {
        p.say(format_args!(
            "{}: {} connections, {} at a time",
            name(r),
            r.count,
            r.concurrency
        ));
    }
    let (addr, rates): (SocketAddr, Vec<Rate>) = match role {
        Role::Client(addr) => {
            let rates: Result<Vec<Rate>, Error> =
                runs.iter().map(|c| tcp_connect::cycles(addr, c)).collect();
            let stopped = tcp_connect::stop(addr, timeout);
            let rates = rates?;
            stopped?;
            (addr, rates)
        }
        Role::InProcess(addr) | Role::Server(addr) => {
            (addr, tcp_connect::cycles_in_process(addr, &runs)?)
        }
    };
    for (c, r) in runs.iter().zip(&rates) {
        p.say(format_args!(
            "{}: {:.0} connections/s",
            name(c),
            r.per_second()
        ));
    }
    if json {
        let results = runs
            .iter()
            .zip(&rates)
            .map(|(c, r)| RunJson {
                mode: name(c),
                concurrency: c.concurrency,
                count: r.count,
                seconds: Num(r.seconds),
                conn_per_s: Num(r.per_second()),
                us_per_conn: Num(r.us_per_conn()),
                cycle: r.per_conn.json("cycle"),
            })
            .collect();
        let o = ClientJson {
            tool: NAME,
            addr: addr.ip().to_string(),
            results,
        };
        println!("{}", line(&o));
    } else {
        println!("TCP connect/accept/close on {}", addr.ip());
        println!(
            "{:<11} {:>5} {:>7} {:>10} {:>8} | {:>13} {:>9} {:>9}",
            "mode", "conc", "count", "conn/s", "us/conn", "cycle median", "p99", "max"
        );
        for (c, r) in runs.iter().zip(&rates) {
            println!(
                "{:<11} {:>5} {:>7} {:>10.0} {:>8.2} | {:>13.2} {:>9.2} {:>9.2}",
                name(c),
                c.concurrency,
                r.count,
                r.per_second(),
                r.us_per_conn(),
                r.per_conn.median,
                r.per_conn.p99,
                r.per_conn.max
            );
        }
    }
    Ok(())
}
