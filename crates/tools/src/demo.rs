//! `rdmacm-demo`: a server and a client through the connection manager and the software
//! RoCEv2 device, with the CM events as they happen, the connection setup time, a stream
//! of RDMA WRITEs and a SEND ping-pong. In one process by default (two threads, each with
//! its own context: server on 127.0.0.1, client from 127.0.0.2, both on `lo`), or split
//! over two terminals with [`Role::Server`] and [`Role::Client`].

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdmacm::cm::Event;

use crate::perf::report::Outcome;
use crate::perf::run::{client_with, server_with};
use crate::perf::{Kind, Params, Test, Verb, DEFAULT_CQ_MOD};

/// Which part to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Both, in one process.
    Both,
    /// The server only.
    Server,
    /// The client only.
    Client,
}

/// Settings of a run.
#[derive(Debug, Clone)]
pub struct DemoOpts {
    /// What to run.
    pub role: Role,
    /// The server's address and port.
    pub server: SocketAddr,
    /// The client's local address.
    pub bind: Option<SocketAddr>,
    /// MiB written by RDMA WRITE.
    pub write_mib: usize,
    /// Round trips of the SEND ping-pong.
    pub pings: u64,
}

/// Message size of the WRITE stream.
pub const WRITE_MSG: usize = 64 << 10;
/// Message size of the ping-pong.
pub const PING_MSG: usize = 64;

/// Prints lines with a timestamp since the start.
struct Clock(Instant, Mutex<()>);

impl Clock {
    fn say(&self, who: &str, what: &str) {
        let _g = self.1.lock();
        println!(
            "[{:>9.3} ms] {who:<6} {what}",
            self.0.elapsed().as_secs_f64() * 1e3
        );
    }

    fn event(&self, who: &str, ev: &Event) {
        let st = ev.status();
        let s = if st == 0 {
            ev.kind().name().to_string()
        } else {
            format!("{} (status {st})", ev.kind().name())
        };
        self.say(who, &s);
    }
}

fn params(o: &DemoOpts, test: Test, size: usize, iters: u64) -> Params {
    Params {
        test,
        size,
        all: false,
        iters,
        duration: None,
        qps: 1,
        tx_depth: 16,
        cq_mod: DEFAULT_CQ_MOD,
        port: o.server.port(),
        bind: match o.role {
            Role::Client => o.bind,
            _ => Some(o.server),
        },
        server: Some(o.server),
    }
}

fn tests(o: &DemoOpts) -> [Params; 2] {
    let n = ((o.write_mib << 20) / WRITE_MSG).max(1) as u64;
    [
        params(o, Test::new(Verb::Write, Kind::Bw), WRITE_MSG, n),
        params(
            o,
            Test::new(Verb::Send, Kind::Lat),
            PING_MSG,
            o.pings.max(1),
        ),
    ]
}

fn serve(o: &DemoOpts, clock: &Clock, ready: &mpsc::Sender<()>) -> Result<(), String> {
    for mut p in tests(o) {
        p.server = None;
        let mut hook = |ev: &Event| clock.event("server", ev);
        let mut on_listen = || {
            clock.say("server", &format!("listening on {}", o.server));
            let _ = ready.send(());
        };
        server_with(&p, &mut hook, false, &mut on_listen)?;
    }
    Ok(())
}

fn connect(o: &DemoOpts, clock: &Clock, ready: &mpsc::Receiver<()>) -> Result<(), String> {
    let [w, s] = tests(o);
    for (i, p) in [w, s].into_iter().enumerate() {
        if ready.recv_timeout(Duration::from_secs(10)).is_err() {
            return Err("the server did not start".into());
        }
        let mut hook = |ev: &Event| clock.event("client", ev);
        let what = if i == 0 {
            "RDMA WRITE stream"
        } else {
            "SEND ping-pong"
        };
        clock.say(
            "client",
            &format!("connecting to {} for the {what}", o.server),
        );
        // In two processes the server may still be setting up its listener (between the
        // two connections it tears one down): REJ 8 (nobody listens) is retried briefly.
        let t0 = Instant::now();
        let (out, setup) = loop {
            match client_with(&p, &mut hook, false) {
                Err(e)
                    if e.contains("REJECTED, error 8") && t0.elapsed() < Duration::from_secs(5) =>
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                r => break r?,
            }
        };
        clock.say(
            "client",
            &format!(
                "connection set up in {:.3} ms (resolve address, resolve route, REQ/REP/RTU)",
                setup.as_secs_f64() * 1e3
            ),
        );
        for o in out {
            match o {
                Outcome::Bw(b) => clock.say(
                    "client",
                    &format!(
                        "RDMA WRITE: {} MiB in {} KiB messages: {:.0} MiB/s ({:.2} Gb/s), {:.3} Mmsg/s",
                        (b.iters as usize * b.bytes) >> 20,
                        b.bytes >> 10,
                        b.avg,
                        b.avg * (1u64 << 20) as f64 * 8.0 / 1e9,
                        b.mpps
                    ),
                ),
                Outcome::Lat(l) => clock.say(
                    "client",
                    &format!(
                        "SEND ping-pong, {} B x {}: one-way latency median {:.2} us, avg {:.2} us, min {:.2} us, 99% {:.2} us",
                        l.bytes, l.iters, l.typical, l.avg, l.min, l.p99
                    ),
                ),
            }
        }
        clock.say("client", "disconnected");
    }
    Ok(())
}

/// Runs the demo.
pub fn run(o: &DemoOpts) -> Result<(), String> {
    let clock = Clock(Instant::now(), Mutex::new(()));
    let (tx, rx) = mpsc::channel();
    match o.role {
        Role::Server => serve(o, &clock, &tx),
        Role::Client => {
            for _ in 0..2 {
                let _ = tx.send(());
            }
            connect(o, &clock, &rx)
        }
        Role::Both => {
            println!(
                "rdmacm-demo: server on {}, client from {} — software RoCEv2 device on lo, one process, two threads",
                o.server,
                o.bind.map_or_else(|| "auto".into(), |b| b.ip().to_string())
            );
            let mut co = o.clone();
            co.role = Role::Client;
            let so = DemoOpts {
                role: Role::Server,
                ..o.clone()
            };
            let clock = std::sync::Arc::new(clock);
            let sclock = std::sync::Arc::clone(&clock);
            let server = std::thread::spawn(move || serve(&so, &sclock, &tx));
            // A failed client ends the demo at once (the process exits with the server
            // thread still waiting for a connection that will not come).
            if let Err(e) = connect(&co, &clock, &rx) {
                // Report the server's own failure (e.g. its address is held) when it has one.
                if server.is_finished() {
                    if let Ok(Err(se)) = server.join() {
                        return Err(se);
                    }
                }
                return Err(e);
            }
            server
                .join()
                .unwrap_or_else(|_| Err("server thread failed".into()))
        }
    }
}
