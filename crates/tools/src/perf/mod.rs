//! `rdma-perf`: perftest's tests (`send_lat`, `send_bw`, `write_lat`, `write_bw`,
//! `read_lat`, `read_bw`) over connections made by our connection manager, with perftest's
//! flags and output table.
//!
//! The server runs when no peer address is given; the client takes the server's address as
//! its last argument. The client's connection request carries its parameters and its
//! buffer (address, rkey, length) in the CM private data, the server's accept carries the
//! server's buffer back (perftest's `-R` exchange over rdma_cm). Each message size is one
//! phase: the server announces it is ready (a SEND with immediate), the client runs the
//! test and ends the phase with a SEND with immediate.
//!
//! With `-R`, both sides speak perftest's own `-R` exchange instead ([`rcm`], message layouts
//! in [`perftest`], `docs/PERFTEST.md`), so that perftest's `ib_*` tools are the peer; a
//! server without `-R` serves both kinds of client.

pub mod args;
pub mod conn;
mod idle;
pub mod perftest;
pub mod proto;
pub mod rcm;
pub mod report;
pub mod run;

use std::net::SocketAddr;
use std::time::Duration;

/// The operation a test measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// SEND / RECV.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
}

/// Latency (ping-pong) or bandwidth (streaming).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Latency.
    Lat,
    /// Bandwidth.
    Bw,
}

/// One of perftest's tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Test {
    /// The operation.
    pub verb: Verb,
    /// Latency or bandwidth.
    pub kind: Kind,
}

/// Every test, in the order of [`Test::code`].
pub const TESTS: [Test; 6] = [
    Test::new(Verb::Send, Kind::Lat),
    Test::new(Verb::Send, Kind::Bw),
    Test::new(Verb::Write, Kind::Lat),
    Test::new(Verb::Write, Kind::Bw),
    Test::new(Verb::Read, Kind::Lat),
    Test::new(Verb::Read, Kind::Bw),
];

impl Test {
    /// A test.
    pub const fn new(verb: Verb, kind: Kind) -> Test {
        Test { verb, kind }
    }

    /// The subcommand name (`send_lat`, ...).
    pub fn name(self) -> &'static str {
        match (self.verb, self.kind) {
            (Verb::Send, Kind::Lat) => "send_lat",
            (Verb::Send, Kind::Bw) => "send_bw",
            (Verb::Write, Kind::Lat) => "write_lat",
            (Verb::Write, Kind::Bw) => "write_bw",
            (Verb::Read, Kind::Lat) => "read_lat",
            (Verb::Read, Kind::Bw) => "read_bw",
        }
    }

    /// perftest's banner title (`Send Latency Test`, `RDMA_Write BW Test`, ...).
    pub fn title(self) -> &'static str {
        match (self.verb, self.kind) {
            (Verb::Send, Kind::Lat) => "Send Latency Test",
            (Verb::Send, Kind::Bw) => "Send BW Test",
            (Verb::Write, Kind::Lat) => "RDMA_Write Latency Test",
            (Verb::Write, Kind::Bw) => "RDMA_Write BW Test",
            (Verb::Read, Kind::Lat) => "RDMA_Read Latency Test",
            (Verb::Read, Kind::Bw) => "RDMA_Read BW Test",
        }
    }

    /// The test named `s`.
    pub fn from_name(s: &str) -> Option<Test> {
        TESTS.into_iter().find(|t| t.name() == s)
    }

    /// Its number in the CM private data.
    pub fn code(self) -> u8 {
        TESTS.iter().position(|t| *t == self).unwrap_or(0) as u8
    }

    /// The test numbered `c`.
    pub fn from_code(c: u8) -> Option<Test> {
        TESTS.get(usize::from(c)).copied()
    }
}

/// Largest message size of `-a` (2^23 bytes, as perftest).
pub const MAX_ALL_SIZE: usize = 1 << 23;

/// Latency tests signal one SEND or WRITE in this many. Not perftest's: 100 is its
/// `--cq-mod` default, but it caps that at the send queue depth, 1 in its latency tests
/// (`perftest_parameters.c`, 4.5), and `run_iter_lat_write` signals every WRITE, so its
/// latency tests signal every message (`-Q 1` here; `bench/compare.sh` passes it).
pub const DEFAULT_CQ_MOD: u32 = 100;

/// perftest's latency loops: the `n`th send (from 1) is signaled every `cq_mod` sends and
/// at the end, so the send queue retires without a completion (or an ACK) per message.
pub(crate) fn signal_some(
    p: &Params,
    mut wr: rdma_soft::verbs::SendWr,
    n: u64,
) -> rdma_soft::verbs::SendWr {
    let last = p.duration.is_none() && n >= p.iters;
    wr.flags.set(
        rdma_soft::verbs::SendFlags::SIGNALED,
        n.is_multiple_of(u64::from(p.cq_mod.max(1))) || last,
    );
    wr
}

/// What to run (the client's parameters are the ones both sides follow).
#[derive(Debug, Clone)]
pub struct Params {
    /// The test.
    pub test: Test,
    /// Message size (`-s`).
    pub size: usize,
    /// All sizes 2..2^23 (`-a`).
    pub all: bool,
    /// Iterations per size (`-n`).
    pub iters: u64,
    /// Run each size for this long instead (`-D`).
    pub duration: Option<Duration>,
    /// Queue pairs (`-q`; bandwidth tests).
    pub qps: u32,
    /// Work requests in flight (`-t`; bandwidth tests).
    pub tx_depth: u32,
    /// Latency tests: one signaled send in this many (`-Q`, perftest's `--cq-mod`); each
    /// side's own choice, not negotiated.
    pub cq_mod: u32,
    /// CM port (`-p`).
    pub port: u16,
    /// Local address (`--bind`).
    pub bind: Option<SocketAddr>,
    /// The server (client mode).
    pub server: Option<SocketAddr>,
}

impl Params {
    /// The message sizes, one phase each.
    pub fn sizes(&self) -> Vec<usize> {
        if self.all {
            (1..=23).map(|i| 1usize << i).collect()
        } else {
            vec![self.size]
        }
    }

    /// Bytes of each side's data region: room for `tx_depth` messages of the largest size,
    /// at most 64 MiB (messages then share slots), at least one message.
    pub fn region_len(&self) -> usize {
        let max = self.sizes().into_iter().max().unwrap_or(1).max(1);
        let slots = (64usize << 20) / max;
        max * slots.clamp(1, self.slots_wanted())
    }

    fn slots_wanted(&self) -> usize {
        match self.test.kind {
            Kind::Lat => 1,
            Kind::Bw => self.tx_depth.max(1) as usize,
        }
    }
}

/// Runs `rdma-perf` with its arguments (without the program name); the error is the
/// one-line reason.
pub fn main_with(args: &[String]) -> Result<(), String> {
    let p = args::parse(args)?;
    rcm::calibrate();
    match p {
        args::Parsed::Help => {
            print!("{}", args::USAGE);
            Ok(())
        }
        args::Parsed::Run(p, e) => match (p.server, e.rdma_cm) {
            (Some(_), false) => run::client(&p, &mut |_| {}),
            (Some(_), true) => rcm::client(&p, &mut |_| {}, true).map(|_| ()),
            (None, false) => run::server_auto(&p, &mut |_| {}, true),
            (None, true) => rcm::server(&p, &mut |_| {}, true, &mut || {}).map(|_| ()),
        },
    }
}
