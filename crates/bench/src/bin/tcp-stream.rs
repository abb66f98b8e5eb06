//! `tcp-stream`: one TCP stream on loopback. See `-h`.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use rdma_bench::cli::{Args, Usage};
use rdma_bench::json::{line, Num};
use rdma_bench::tcp_stream::{self, Config};
use rdma_bench::{gbit_per_s, loopback_addr, mib_per_s, run_main, Error, MainError, Progress};

const NAME: &str = "tcp-stream";
const PORT: u16 = 18516;

const HELP: &str = "\
tcp-stream: one TCP stream on loopback (the limit for RDMA WRITE/SEND bandwidth)

Usage: tcp-stream [OPTIONS]
       tcp-stream --server [ADDR]
       tcp-stream --client ADDR [OPTIONS]

By default the receiver and the sender are two threads of this process. The sender writes for
the given duration, then shuts down its half; the time runs until the receiver has confirmed
the byte count. MB/s counts 2^20 bytes (as perftest), Gb/s 10^9 bits.

Options:
  -d, --duration SECS  how long to send (default 3)
  -s, --size BYTES     bytes per write call (default 65536)
  -b, --bind ADDR      address of the in-process receiver (default 127.0.0.1, any port)
      --server [ADDR]  only the receiver, on ADDR (default 127.0.0.1:18516); serves one stream
      --client ADDR    only the sender, against a --server
  -t, --timeout SECS   longest wait to connect and for the final count (default 10)
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
    bytes: u64,
}

/// `--json` of a sender's run.
#[derive(serde::Serialize)]
struct ClientJson {
    tool: &'static str,
    addr: String,
    write_size: usize,
    bytes: u64,
    seconds: Num,
    mb_per_s: Num,
    gbit_per_s: Num,
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
    let (mut duration, mut size, mut timeout) = (3.0f64, 65536usize, 10.0f64);
    let (mut json, mut quiet) = (false, false);
    let (mut role, mut bind) = (None, None);
    while let Some(f) = a.next_flag()? {
        match f.as_str() {
            "-h" | "--help" => {
                println!("{HELP}");
                return Ok(());
            }
            "-d" | "--duration" => duration = a.parse_in(&f, 0.001, 3600.0)?,
            "-s" | "--size" => size = a.parse_in(&f, 1, 1 << 30)?,
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
        Some(r) if bind.is_some() => {
            let _ = r;
            return Err(Usage("--bind is for the in-process receiver only".into()).into());
        }
        Some(r) => r,
        None => Role::InProcess(loopback_addr(bind.as_deref().unwrap_or("127.0.0.1"), 0)?),
    };
    let p = Progress {
        name: NAME,
        on: !quiet,
    };
    let cfg = Config {
        duration: Duration::from_secs_f64(duration),
        write_size: size,
        timeout: Duration::from_secs_f64(timeout),
    };

    let (addr, t) = match role {
        Role::Server(addr) => {
            let l = TcpListener::bind(addr).map_err(|e| Error::io(&format!("bind {addr}"), e))?;
            p.say(format_args!("receiver on {addr}, waiting for a sender"));
            let n = tcp_stream::sink(&l, None)?;
            p.say(format_args!("received {n} bytes"));
            if json {
                let o = ServerJson {
                    tool: NAME,
                    role: "server",
                    addr: addr.to_string(),
                    bytes: n,
                };
                println!("{}", line(&o));
            }
            return Ok(());
        }
        Role::Client(addr) => {
            p.say(format_args!(
                "sending to {addr} for {duration} s in {size} B writes"
            ));
            (addr, tcp_stream::stream(addr, &cfg)?)
        }
        Role::InProcess(addr) => {
            p.say(format_args!(
                "sending on {} for {duration} s in {size} B writes",
                addr.ip()
            ));
            (addr, tcp_stream::stream_in_process(addr, &cfg)?)
        }
    };
    let bps = t.bytes_per_s();
    p.say(format_args!("{:.0} MB/s", mib_per_s(bps)));
    if json {
        let o = ClientJson {
            tool: NAME,
            addr: addr.ip().to_string(),
            write_size: size,
            bytes: t.bytes,
            seconds: Num(t.seconds),
            mb_per_s: Num(mib_per_s(bps)),
            gbit_per_s: Num(gbit_per_s(bps)),
        };
        println!("{}", line(&o));
    } else {
        println!(
            "TCP stream on {}, {size} B writes: {} bytes in {:.3} s = {:.0} MB/s (2^20 B) = {:.2} Gb/s",
            addr.ip(),
            t.bytes,
            t.seconds,
            mib_per_s(bps),
            gbit_per_s(bps)
        );
    }
    Ok(())
}
