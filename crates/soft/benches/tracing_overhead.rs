//! What the logs cost on the data path: one RC QP pair on loopback streams small SENDs
//! (one thread posts and polls both sides), once per logging setup, each in its own
//! process (a global subscriber is set once per process):
//!
//! | mode | what |
//! | --- | --- |
//! | `none` | no subscriber at all (a library user who installs none: `RUST_LOG` unset, no tool) |
//! | `warn` | a fmt subscriber with `EnvFilter` `warn` (the tools' default): every event compiled, all disabled |
//! | `debug` | `debug`: decisions logged (few under no loss), per-packet events still disabled |
//! | `trace` | `trace` into a sink: every packet formatted (the cost of `-dd`) |
//!
//! ```text
//! cargo bench -p rdma-soft --bench tracing_overhead            # all modes
//! TRACING_BENCH_MSGS=1000000 cargo bench -p rdma-soft --bench tracing_overhead -- none
//! ```
//!
//! Run it on a quiet machine; `none` vs `warn` is the "compiled but disabled" cost, which
//! should be within noise. Addresses: 127.0.152.1 and 127.0.152.2.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::Instant;

use rdma_soft::verbs::{RecvWr, SendOp, SendWr};

const MODES: [&str; 4] = ["none", "warn", "debug", "trace"];
const DEPTH: u64 = 32;
const SIZE: u32 = 64;

fn run(mode: &str, msgs: u64) {
    if mode != "none" {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(mode))
            .with_writer(std::io::sink)
            .try_init();
    }
    let a = common::Side::new("127.0.152.1", 1 << 16, Some(""));
    let b = common::Side::new("127.0.152.2", 1 << 16, Some(""));
    common::connect(&a, &b);
    let recv = |i: u64| {
        let sge = b.mr.sge(0, SIZE).unwrap();
        b.qp.post_recv(&RecvWr::new(i).with_sge(sge)).unwrap();
    };
    let send = |i: u64| {
        let wr = SendWr::new(i, SendOp::Send)
            .with_sge(a.mr.sge(0, SIZE).unwrap())
            .signaled();
        a.qp.post_send(&wr).unwrap();
    };
    for i in 0..DEPTH * 4 {
        recv(i);
    }
    let t = Instant::now();
    let (mut posted, mut sent, mut got) = (0u64, 0u64, 0u64);
    while got < msgs {
        while posted < msgs && posted - sent < DEPTH {
            send(posted);
            posted += 1;
        }
        if a.cq.poll_one().is_some() {
            sent += 1;
        }
        if b.cq.poll_one().is_some() {
            got += 1;
            recv(got + DEPTH * 4);
        }
    }
    let dt = t.elapsed();
    println!(
        "{mode:>6}: {msgs} SENDs of {SIZE} B in {:.3} s: {:.0} msg/s, {:.0} ns/msg",
        dt.as_secs_f64(),
        msgs as f64 / dt.as_secs_f64(),
        dt.as_nanos() as f64 / msgs as f64
    );
}

fn main() {
    let msgs: u64 = std::env::var("TRACING_BENCH_MSGS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if let Some(mode) = args.iter().find(|a| MODES.contains(&a.as_str())) {
        run(mode, msgs);
        return;
    }
    for mode in MODES {
        let st = Command::new(std::env::current_exe().unwrap())
            .arg(mode)
            .status()
            .unwrap();
        assert!(st.success(), "{mode}: {st}");
    }
}
