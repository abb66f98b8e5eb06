//! RC over the software device against plain UDP and TCP, on loopback, in one run.
//!
//! Prints one table: latency of a 64-byte ping-pong (SEND and WRITE, as `ib_send_lat` and
//! `ib_write_lat` measure it: half the round trip) and bandwidth of 64 KiB messages (SEND and
//! WRITE, 16 in flight), next to a UDP ping-pong of 64 bytes and a single TCP stream of 64 KiB
//! writes, both on 127.0.0.1. Each side runs in its own thread and busy-polls its CQ (which
//! drives its device); the baselines block in the kernel.
//!
//! ```text
//! cargo run --release -p rdma-soft --example rc_perf [-- ITERATIONS MIB]
//! ```
//! Defaults: 20000 ping-pong iterations, 512 MiB per bandwidth test. RDMA devices use
//! 127.0.0.31 and 127.0.0.32 on UDP 4791.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdma_soft::io::WireAddr;
use rdma_soft::verbs::*;

const MSG: usize = 64;
const BW_MSG: usize = 64 << 10;
const DEPTH: usize = 16;

struct Side {
    gid: [u8; 16],
    qp: QueuePair,
    mr: MemoryRegion,
    cq: CompletionQueue,
    _pd: ProtectionDomain,
    dev: Device,
}

fn side(ip: &str, len: usize) -> rdma_soft::Result<Side> {
    let mut cfg = DeviceConfig::for_netdev("lo")?;
    cfg.gids = vec![ip
        .parse()
        .map_err(|_| rdma_soft::Error::InvalidArgument("ip"))?];
    let dev = Device::open(cfg)?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(1024, None)?;
    let mut init = QpInitAttr::rc(&cq, &cq);
    init.cap.max_recv_wr = 512;
    let qp = pd.create_qp(&init)?;
    let mr = pd.register(
        vec![0u8; len],
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    )?;
    let gid = ip
        .parse::<WireAddr>()
        .map_err(|_| rdma_soft::Error::InvalidArgument("ip"))?
        .gid();
    Ok(Side {
        gid,
        qp,
        mr,
        cq,
        _pd: pd,
        dev,
    })
}

fn next(s: &Side) -> Completion {
    loop {
        if let Some(c) = s.cq.poll_one() {
            assert!(c.status.is_success(), "{c:?}");
            return c;
        }
    }
}

/// SEND ping-pong: returns the one-way latency in microseconds.
fn send_lat(a: &Side, b: &Side, iters: usize) -> f64 {
    let pong = |s: &Side, first: bool| {
        let recv = || {
            s.qp.post_recv(&RecvWr::new(0).with_sge(s.mr.sge(0, MSG as u32).unwrap()))
                .unwrap()
        };
        let send = || {
            let wr = SendWr::new(1, SendOp::Send)
                .with_sge(s.mr.sge(MSG, MSG as u32).unwrap())
                .signaled();
            s.qp.post_send(&wr).unwrap();
        };
        recv();
        if first {
            send();
        }
        let mut got = 0;
        let mut sent = usize::from(first);
        while got < iters {
            let c = next(s);
            if c.opcode == WcOpcode::Recv {
                got += 1;
                if got < iters {
                    recv();
                }
                if sent < iters {
                    send();
                    sent += 1;
                }
            }
        }
    };
    let t = Instant::now();
    std::thread::scope(|sc| {
        sc.spawn(|| pong(b, false));
        pong(a, true);
    });
    t.elapsed().as_secs_f64() * 1e6 / (2 * iters) as f64
}

/// WRITE ping-pong: each side writes a counter into the other's buffer and waits to see the
/// peer's; returns the one-way latency in microseconds.
fn write_lat(a: &Side, b: &Side, iters: usize) -> f64 {
    let run = |me: &Side, peer: &Side, first: bool| {
        let (va, rkey) = (peer.mr.addr(), peer.mr.rkey());
        let mut buf = [0u8; MSG];
        let write = |i: u64| {
            let mut m = [0u8; MSG];
            m[MSG - 8..].copy_from_slice(&i.to_le_bytes());
            me.mr.write(MSG, &m).unwrap();
            let op = SendOp::RdmaWrite {
                remote_addr: va,
                rkey,
            };
            // unsignaled except every 64th, as ib_write_lat does
            let mut wr = SendWr::new(i, op).with_sge(me.mr.sge(MSG, MSG as u32).unwrap());
            if i % 64 == 0 {
                wr = wr.signaled();
            }
            me.qp.post_send(&wr).unwrap();
        };
        let mut i = 1u64;
        if first {
            write(i);
        }
        while i <= iters as u64 {
            // wait for the peer's i (a drives progress through the CQ poll)
            loop {
                let _ = me.cq.poll_one();
                me.mr.read(0, &mut buf).unwrap();
                if u64::from_le_bytes(buf[MSG - 8..].try_into().unwrap()) >= i {
                    break;
                }
            }
            if !first || i < iters as u64 {
                write(if first { i + 1 } else { i });
            }
            i += 1;
        }
    };
    let t = Instant::now();
    std::thread::scope(|sc| {
        sc.spawn(|| run(b, a, false));
        run(a, b, true);
    });
    t.elapsed().as_secs_f64() * 1e6 / (2 * iters) as f64
}

/// Streams `total` bytes in `BW_MSG` messages a -> b by SEND or WRITE; MiB/s.
fn bandwidth(a: &Side, b: &Side, total: usize, write: bool) -> f64 {
    let n = total / BW_MSG;
    let slots = a.mr.len() / BW_MSG;
    let done_flag = AtomicBool::new(false);
    let t = Instant::now();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            if write {
                // the last WRITE carries an immediate
                b.qp.post_recv(&RecvWr::new(0)).unwrap();
                next(b);
            } else {
                let (mut posted, mut got) = (0, 0);
                while got < n {
                    while posted < n && posted - got < 4 * DEPTH {
                        let sge = b.mr.sge((posted % slots) * BW_MSG, BW_MSG as u32).unwrap();
                        b.qp.post_recv(&RecvWr::new(posted as u64).with_sge(sge))
                            .unwrap();
                        posted += 1;
                    }
                    next(b);
                    got += 1;
                }
            }
            done_flag.store(true, Ordering::Release);
        });
        let (mut posted, mut done) = (0, 0);
        while done < n {
            while posted < n && posted - done < DEPTH {
                let off = (posted % slots) * BW_MSG;
                let sge = a.mr.sge(off, BW_MSG as u32).unwrap();
                let op = if !write {
                    SendOp::Send
                } else if posted + 1 == n {
                    SendOp::RdmaWriteWithImm {
                        remote_addr: b.mr.addr() + off as u64,
                        rkey: b.mr.rkey(),
                        imm: 1,
                    }
                } else {
                    SendOp::RdmaWrite {
                        remote_addr: b.mr.addr() + off as u64,
                        rkey: b.mr.rkey(),
                    }
                };
                a.qp.post_send(&SendWr::new(posted as u64, op).with_sge(sge).signaled())
                    .unwrap();
                posted += 1;
            }
            next(a);
            done += 1;
        }
        while !done_flag.load(Ordering::Acquire) {
            let _ = a.cq.poll_one();
        }
    });
    total as f64 / t.elapsed().as_secs_f64() / (1 << 20) as f64
}

/// One-way UDP latency (half the average round trip, as `ib_send_lat` reports), measured by
/// the repository's loopback baseline (`rdma-bench`); `spin`: busy-poll, as the RC sides poll
/// their CQs, else blocking `recv`.
fn udp_lat(iters: usize, spin: bool) -> Result<f64, rdma_bench::Error> {
    let cfg = rdma_bench::udp::Config {
        size: MSG,
        iters,
        warmup: iters / 20,
        mode: if spin {
            rdma_bench::udp::Mode::BusyPoll
        } else {
            rdma_bench::udp::Mode::Blocking
        },
        timeout: Duration::from_secs(5),
    };
    let rtt = rdma_bench::udp::pingpong_in_process("127.0.0.1:0".parse().unwrap(), &cfg)?;
    Ok(rtt.avg / 2.0)
}

/// A single TCP stream in `BW_MSG` writes (the `rdma-bench` baseline), in MiB/s.
fn tcp_bw() -> Result<f64, rdma_bench::Error> {
    let cfg = rdma_bench::tcp_stream::Config {
        duration: Duration::from_secs(2),
        write_size: BW_MSG,
        timeout: Duration::from_secs(10),
    };
    let t = rdma_bench::tcp_stream::stream_in_process("127.0.0.1:0".parse().unwrap(), &cfg)?;
    Ok(t.bytes_per_s() / (1 << 20) as f64)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let iters: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let mib: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(512);
    let total = (mib << 20) / BW_MSG * BW_MSG;
    let a = side("127.0.0.31", 16 << 20)?;
    let b = side("127.0.0.32", 16 << 20)?;
    a.qp.connect(b.qp.qpn(), 0x200, 0x100, b.gid)?;
    b.qp.connect(a.qp.qpn(), 0x100, 0x200, a.gid)?;

    // warm up
    send_lat(&a, &b, 1000);
    let s_lat = send_lat(&a, &b, iters);
    let w_lat = write_lat(&a, &b, iters);
    let s_bw = bandwidth(&a, &b, total, false);
    let w_bw = bandwidth(&a, &b, total, true);
    let u_lat = udp_lat(iters, false)?;
    let u_spin = udp_lat(iters, true)?;
    let t_bw = tcp_bw()?;
    let gbit = |m: f64| m * (1 << 20) as f64 * 8.0 / 1e9;

    println!(
        "loopback, {iters} ping-pongs of {MSG} B, {mib} MiB in {} KiB messages",
        BW_MSG >> 10
    );
    println!("{:<28} {:>14} {:>22}", "", "latency (us)", "bandwidth");
    println!(
        "{:<28} {:>14.2} {:>11.0} MiB/s {:>5.2} Gb/s",
        "RC SEND (rdma-soft)",
        s_lat,
        s_bw,
        gbit(s_bw)
    );
    println!(
        "{:<28} {:>14.2} {:>11.0} MiB/s {:>5.2} Gb/s",
        "RC WRITE (rdma-soft)",
        w_lat,
        w_bw,
        gbit(w_bw)
    );
    println!(
        "{:<28} {:>14.2} {:>22}",
        "UDP ping-pong, blocking", u_lat, "-"
    );
    println!(
        "{:<28} {:>14.2} {:>22}",
        "UDP ping-pong, busy-poll", u_spin, "-"
    );
    println!(
        "{:<28} {:>14} {:>11.0} MiB/s {:>5.2} Gb/s",
        "TCP stream (kernel)",
        "-",
        t_bw,
        gbit(t_bw)
    );
    let (sa, sb) = (a.dev.wire_stats(), b.dev.wire_stats());
    println!(
        "rdma-soft wire: a sent {} in {} sendmmsg, b sent {} in {} sendmmsg; retransmitted a {} b {}",
        sa.sent,
        sa.send_calls,
        sb.sent,
        sb.send_calls,
        a.qp.transport_stats().map_or(0, |s| s.retransmitted),
        b.qp.transport_stats().map_or(0, |s| s.retransmitted),
    );
    Ok(())
}
