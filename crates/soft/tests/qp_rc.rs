//! RC queue pairs between two devices over real UDP sockets on loopback: SEND, WRITE, READ and
//! atomics, byte-exact; in one process (two threads) and between two processes, with and
//! without injected faults. `RDMA_SOFT_BYTES` sets the size (default 64 MiB).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use common::*;
use rdma_soft::verbs::*;

fn rate(what: &str, bytes: usize, t: Instant) {
    let s = t.elapsed().as_secs_f64();
    eprintln!(
        "{what}: {} MiB in {s:.2} s = {:.0} MiB/s ({:.2} Gbit/s)",
        bytes >> 20,
        bytes as f64 / s / (1 << 20) as f64,
        bytes as f64 * 8.0 / s / 1e9
    );
}

/// SEND, WRITE and READ of `RDMA_SOFT_BYTES` between 127.0.0.1 and 127.0.0.2, one thread per
/// side; every byte checked by CRC-32 against the source.
fn bulk(ip_a: &str, ip_b: &str, faults: Option<&str>, default_bytes: usize) {
    let n = bytes_from_env(default_bytes);
    let a = Side::new(ip_a, n, faults);
    let b = Side::new(ip_b, n, faults);
    connect(&a, &b);
    // No progress thread: a receiver that has all its data stops polling, and if its last
    // ACK was lost only the process's progress engine re-ACKs the sender's retries.
    fill(&a.mr, 0, n, 0x1234_5678);
    let want = crc(&a.mr, 0, n);

    // SEND a -> b
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| recv_stream(&b, 0, n));
        send_stream(&a, 0, n);
    });
    rate("SEND", n, t);
    assert_eq!(crc(&b.mr, 0, n), want, "SEND data differs");

    // WRITE a -> b (last one with immediate)
    b.mr.fill(0, n, 0).unwrap();
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            let sge = b.mr.sge(0, 0).unwrap();
            b.qp.post_recv(&RecvWr::new(99).with_sge(sge)).unwrap();
            let c = b.next_ok();
            assert_eq!(
                (c.opcode, c.imm()),
                (WcOpcode::RecvRdmaWithImm, Some(0xC0FFEE))
            );
        });
        write_stream(&a, 0, n, b.mr.addr(), b.mr.rkey(), 0xC0FFEE);
    });
    rate("WRITE", n, t);
    assert_eq!(crc(&b.mr, 0, n), want, "WRITE data differs");

    // READ b <- a
    b.mr.fill(0, n, 0).unwrap();
    let stop = AtomicBool::new(false);
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| serve(&a, &stop));
        read_stream(&b, 0, n, a.mr.addr(), a.mr.rkey());
        stop.store(true, Ordering::Release);
    });
    rate("READ", n, t);
    if faults.is_some() {
        // the faults really happened, and were recovered from
        let (wa, wb) = (a.dev.wire_stats(), b.dev.wire_stats());
        let dropped = wa.faults_send.dropped + wb.faults_send.dropped;
        let dup = wa.faults_send.duplicated + wb.faults_send.duplicated;
        let reordered = wa.faults_send.reordered + wb.faults_send.reordered;
        eprintln!("faults: dropped {dropped}, duplicated {dup}, reordered {reordered}");
        assert!(dropped > 0 && dup > 0 && reordered > 0, "{wa:?} {wb:?}");
        let retrans = a.qp.transport_stats().unwrap().retransmitted
            + b.qp.transport_stats().unwrap().retransmitted;
        assert!(retrans > 0, "losses were recovered by retransmission");
    }
    assert_eq!(crc(&b.mr, 0, n), want, "READ data differs");

    let (sa, sb) = (a.dev.wire_stats(), b.dev.wire_stats());
    eprintln!("wire a: {sa:?}\nwire b: {sb:?}");
    eprintln!(
        "rt a: {:?}\nrt b: {:?}",
        a.dev.runtime_stats(),
        b.dev.runtime_stats()
    );
    eprintln!(
        "rc a: {:?}\nrc b: {:?}",
        a.qp.transport_stats(),
        b.qp.transport_stats()
    );
}

#[test]
fn send_write_read_between_two_devices() {
    bulk("127.0.0.1", "127.0.0.2", None, 64 << 20);
}

#[test]
fn send_write_read_with_faults() {
    // a smaller default (go-back-N over 5 % loss is slow by design), passed as an argument:
    // setting RDMA_SOFT_BYTES here would change the size of tests running beside it
    bulk(
        "127.0.0.3",
        "127.0.0.4",
        Some("loss=0.05,dup=0.02,reorder=0.05,seed=7"),
        16 << 20,
    );
}

/// Fetch-and-add and compare-and-swap across the wire, from two threads on two QPs of one
/// device against one word: every increment lands exactly once.
#[test]
fn atomics_across_the_wire() {
    let a = Side::new("127.0.0.9", 4096, None);
    let b = Side::new("127.0.0.10", 4096, None);
    connect(&a, &b);
    let off = ((8 - (a.mr.addr() % 8)) % 8) as usize;
    let word = a.mr.addr() + off as u64;
    a.mr.write(off, &100u64.to_ne_bytes()).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| serve(&a, &stop));
        let mut seen = Vec::new();
        for i in 0..500u64 {
            let op = SendOp::AtomicFetchAndAdd {
                remote_addr: word,
                rkey: a.mr.rkey(),
                add: 3,
            };
            let sge = b.mr.sge(0, 8).unwrap();
            b.qp.post_send(&SendWr::new(i, op).with_sge(sge).signaled())
                .unwrap();
            let c = b.next_ok();
            assert_eq!(c.opcode, WcOpcode::FetchAdd);
            let mut v = [0u8; 8];
            b.mr.read(0, &mut v).unwrap();
            seen.push(u64::from_ne_bytes(v));
        }
        assert_eq!(seen, (0..500).map(|i| 100 + 3 * i).collect::<Vec<_>>());
        // compare-and-swap: one that matches, one that does not
        for (i, (cmp, swap, orig)) in [(1600, 7, 1600), (1600, 9, 7)].into_iter().enumerate() {
            let op = SendOp::AtomicCmpAndSwp {
                remote_addr: word,
                rkey: a.mr.rkey(),
                compare: cmp,
                swap,
            };
            let sge = b.mr.sge(8, 8).unwrap();
            b.qp.post_send(&SendWr::new(i as u64, op).with_sge(sge).signaled())
                .unwrap();
            let c = b.next_ok();
            assert_eq!(c.opcode, WcOpcode::CompSwap);
            let mut v = [0u8; 8];
            b.mr.read(8, &mut v).unwrap();
            assert_eq!(u64::from_ne_bytes(v), orig);
        }
        stop.store(true, Ordering::Release);
    });
    let mut v = [0u8; 8];
    a.mr.read(off, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 7);
}

/// Errors and edge cases: inline sends, bad rkey, wrong state, QPN allocation, no panics.
#[test]
fn verbs_rules_and_errors() {
    let a = Side::new("127.0.0.11", 4096, None);
    let b = Side::new("127.0.0.12", 4096, None);
    assert!(a.qp.qpn() > 1 && a.qp.qpn() <= 0xFF_FFFF);
    assert_eq!(a.qp.state(), QpState::Reset);
    // posting before RTS is EINVAL
    let wr = SendWr::new(1, SendOp::Send);
    assert_eq!(a.qp.post_send(&wr).unwrap_err().errno(), libc::EINVAL);
    // illegal transition
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    assert_eq!(
        a.qp.modify(&rts, QpAttrMask::STATE).unwrap_err().errno(),
        libc::EINVAL
    );
    connect(&a, &b);
    assert_eq!(a.qp.state(), QpState::Rts);
    // nobody polls b's CQ before its completions are due: the progress engine answers
    let q = a.qp.query().unwrap();
    assert_eq!((q.dest_qp_num, q.sq_psn), (b.qp.qpn(), 0x1000));
    // inline: bytes given at post time
    b.qp.post_recv(&RecvWr::new(5).with_sge(b.mr.sge(0, 64).unwrap()))
        .unwrap();
    a.qp.post_send_inline(&SendWr::new(2, SendOp::Send).signaled(), b"inline!")
        .unwrap();
    assert_eq!(a.next_ok().wr_id, 2);
    let c = b.next_ok();
    assert_eq!(c.byte_len, 7);
    let mut got = [0u8; 7];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"inline!");
    let too_long = [0u8; 65];
    assert_eq!(
        a.qp.post_send_inline(&SendWr::new(3, SendOp::Send), &too_long)
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
    let flagged = SendWr::new(3, SendOp::Send).with_flags(SendFlags::INLINE);
    assert_eq!(a.qp.post_send(&flagged).unwrap_err().errno(), libc::EINVAL);
    // a WRITE with a bad rkey: remote access error, QP to Err, later WRs flushed; neither
    // side's memory changes (b's target region, a's source region)
    fill(&a.mr, 0, 4096, 0xA5A5);
    fill(&b.mr, 0, 4096, 0x5A5A);
    let (before_a, before_b) = (crc(&a.mr, 0, 4096), crc(&b.mr, 0, 4096));
    let op = SendOp::RdmaWrite {
        remote_addr: b.mr.addr(),
        rkey: b.mr.rkey() ^ 0x100,
    };
    a.qp.post_send(
        &SendWr::new(4, op)
            .with_sge(a.mr.sge(0, 16).unwrap())
            .signaled(),
    )
    .unwrap();
    let c = a.next();
    assert_eq!((c.wr_id, c.status), (4, WcStatus::RemAccessErr));
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(
        crc(&b.mr, 0, 4096),
        before_b,
        "the refused WRITE changed the target"
    );
    assert_eq!(
        crc(&a.mr, 0, 4096),
        before_a,
        "the refused WRITE changed the source"
    );
    a.qp.post_send(&SendWr::new(6, SendOp::Send).signaled())
        .unwrap();
    assert_eq!(a.next().status, WcStatus::WrFlushErr);
    // QPNs are not reused at once
    let qpn = a.qp.qpn();
    let init = QpInitAttr::rc(&a.cq, &a.cq);
    let q2 = a.pd.create_qp(&init).unwrap();
    assert_ne!(q2.qpn(), qpn);
    drop(q2);
    let q3 = a.pd.create_qp(&init).unwrap();
    assert_ne!(q3.qpn() & 0xFF_FFFF, 0);
    // a CQ of another device is refused
    let mut other = QpInitAttr::rc(&b.cq, &a.cq);
    other.cap.max_send_wr = 4;
    assert_eq!(a.pd.create_qp(&other).unwrap_err().errno(), libc::EINVAL);
}

/// Blocking on a completion channel drives the device: the receiver sleeps in
/// `wait_event` (no polling) and still ACKs and completes.
#[test]
fn completion_channel_wait_drives_progress() {
    let a = Side::new("127.0.0.13", 1 << 20, None);
    let dev = device("127.0.0.14", None);
    let pd = dev.alloc_pd().unwrap();
    let ch = dev.create_comp_channel().unwrap();
    let cq = dev.create_cq(64, Some(&ch)).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let mr = pd
        .register(vec![0u8; 1 << 20], AccessFlags::LOCAL_WRITE)
        .unwrap();
    let gid_b = "127.0.0.14"
        .parse::<rdma_soft::io::WireAddr>()
        .unwrap()
        .gid();
    a.qp.connect(qp.qpn(), 5, 9, gid_b).unwrap();
    qp.connect(a.qp.qpn(), 9, 5, a.gid).unwrap();
    qp.post_recv(&RecvWr::new(1).with_sge(mr.sge(0, 1 << 20).unwrap()))
        .unwrap();
    fill(&a.mr, 0, 1 << 20, 3);
    // armed before the SEND leaves: a completion that came before the arming would give no
    // event (under load the sender can finish before this thread runs again)
    cq.req_notify(true).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let wr = SendWr::new(1, SendOp::Send)
                .with_sge(a.mr.sge(0, 1 << 20).unwrap())
                .with_flags(SendFlags::SIGNALED | SendFlags::SOLICITED);
            a.qp.post_send(&wr).unwrap();
            a.next_ok();
        });
        let got = ch
            .wait_event(Some(std::time::Duration::from_secs(30)))
            .unwrap()
            .expect("an event");
        assert_eq!(got, cq);
        let c = cq.poll_one().unwrap();
        assert!(c.solicited);
        assert_eq!(c.byte_len, 1 << 20);
    });
    assert_eq!(crc(&mr, 0, 1 << 20), crc(&a.mr, 0, 1 << 20));
}

/// The passive side of a READ never polls and never calls into the device: the progress
/// engine serves it.
#[test]
fn engine_serves_reads_of_a_side_that_never_polls() {
    let n = 8 << 20;
    let a = Side::new("127.0.0.15", n, None);
    let b = Side::new("127.0.0.16", n, None);
    connect(&a, &b);
    fill(&a.mr, 0, n, 11);
    read_stream(&b, 0, n, a.mr.addr(), a.mr.rkey());
    assert_eq!(crc(&b.mr, 0, n), crc(&a.mr, 0, n));
}

// ---- two processes ----

const ROLE: &str = "RDMA_SOFT_TEST_ROLE";
/// The child server's address (each two-process test has its own pair: they run at once).
const SERVER_IP: &str = "RDMA_SOFT_TEST_SERVER_IP";

fn hex(g: &[u8; 16]) -> String {
    g.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> [u8; 16] {
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    g
}

/// The server process: a region of 2n + 8 bytes; the client WRITEs [0, n), SENDs into
/// [n, 2n), READs [n, 2n) back and adds to the word at 2n. Reports CRCs over TCP.
#[test]
#[ignore = "run as a child process by two_processes*"]
fn child_server() {
    let Ok(port) = std::env::var(ROLE) else {
        return;
    };
    let n = bytes_from_env(64 << 20);
    let ip = std::env::var(SERVER_IP).unwrap_or_else(|_| "127.0.0.21".into());
    let me = Side::new(&ip, 2 * n + 8, None);
    let tcp = TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap())).unwrap();
    let mut w = tcp.try_clone().unwrap();
    let mut r = BufReader::new(tcp);
    writeln!(
        w,
        "{} {} {} {}",
        me.qp.qpn(),
        hex(&me.gid),
        me.mr.addr(),
        me.mr.rkey()
    )
    .unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    // PSNs: the server sends from 0x77, expects 0xABC (what the client sends from)
    me.qp
        .connect(f[0].parse().unwrap(), 0xABC, 0x77, unhex(f[1]))
        .unwrap();
    me.qp
        .post_recv(&RecvWr::new(u64::MAX).with_sge(me.mr.sge(0, 0).unwrap()))
        .unwrap();
    // the WRITE's immediate comes first (the client waits for its WRITEs before SENDing)
    let c = me.next_ok();
    assert_eq!(c.imm(), Some(0xD00D));
    recv_stream(&me, n, n);
    writeln!(w, "{} {}", crc(&me.mr, 0, n), crc(&me.mr, n, n)).unwrap();
    // serve READs and atomics until the client says bye
    r.get_ref().set_nonblocking(true).unwrap();
    let mut bye = String::new();
    loop {
        if let Some(c) = me.cq.poll_one() {
            panic!("unexpected completion {c:?}");
        }
        match r.read_line(&mut bye) {
            Ok(0) => break,
            Ok(_) if bye.ends_with('\n') => break,
            _ => {}
        }
    }
    let mut v = [0u8; 8];
    me.mr.read(2 * n, &mut v).unwrap();
    eprintln!("server: word {}", u64::from_ne_bytes(v));
    let wire = me.dev.wire_stats();
    eprintln!("server wire: {wire:?}");
    // the faults this process injected (RDMA_SOFT_FAULTS), for the client to check
    let f = wire.faults_send;
    r.get_ref().set_nonblocking(false).unwrap();
    writeln!(w, "{} {} {}", f.dropped, f.duplicated, f.reordered).unwrap();
}

fn two_processes(faults: Option<&str>, default_bytes: usize, (server, client): (&str, &str)) {
    let n = bytes_from_env(default_bytes);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_server", "--ignored", "--nocapture"])
        .env(ROLE, port.to_string())
        .env(SERVER_IP, server)
        .env("RDMA_SOFT_BYTES", n.to_string());
    match faults {
        Some(f) => cmd.env("RDMA_SOFT_FAULTS", f),
        None => cmd.env_remove("RDMA_SOFT_FAULTS"),
    };
    let mut child = cmd.spawn().unwrap();
    let (tcp, _) = listener.accept().unwrap();
    let mut w = tcp.try_clone().unwrap();
    let mut r = BufReader::new(tcp);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    let (qpn, gid, addr, rkey): (u32, _, u64, u32) = (
        f[0].parse().unwrap(),
        unhex(f[1]),
        f[2].parse().unwrap(),
        f[3].parse().unwrap(),
    );
    let me = Side::new(client, 2 * n, faults);
    writeln!(w, "{} {}", me.qp.qpn(), hex(&me.gid)).unwrap();
    me.qp.connect(qpn, 0x77, 0xABC, gid).unwrap();
    fill(&me.mr, 0, n, 0xFEED);
    let want = crc(&me.mr, 0, n);
    let t = Instant::now();
    write_stream(&me, 0, n, addr, rkey, 0xD00D);
    rate("2 processes WRITE", n, t);
    let t = Instant::now();
    send_stream(&me, 0, n);
    rate("2 processes SEND", n, t);
    line.clear();
    r.read_line(&mut line).unwrap();
    let crcs: Vec<u32> = line
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(crcs, vec![want, want], "server saw different data");
    let t = Instant::now();
    read_stream(&me, n, n, addr + n as u64, rkey);
    rate("2 processes READ", n, t);
    assert_eq!(crc(&me.mr, n, n), want, "READ data differs");
    // atomics: 200 fetch-adds of 1 on the server's word at 2n
    for i in 0..200u64 {
        let op = SendOp::AtomicFetchAndAdd {
            remote_addr: addr + 2 * n as u64,
            rkey,
            add: 1,
        };
        let sge = me.mr.sge(0, 8).unwrap();
        me.qp
            .post_send(&SendWr::new(i, op).with_sge(sge).signaled())
            .unwrap();
        me.next_ok();
        let mut v = [0u8; 8];
        me.mr.read(0, &mut v).unwrap();
        assert_eq!(u64::from_ne_bytes(v), i);
    }
    writeln!(w, "bye").unwrap();
    line.clear();
    r.read_line(&mut line).unwrap();
    let st = child.wait().unwrap();
    assert!(st.success(), "server process failed: {st:?}");
    let server_faults: Vec<u64> = line
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    let wire = me.dev.wire_stats();
    let t = me.qp.transport_stats().unwrap();
    eprintln!("client wire: {wire:?}\nclient transport: {t:?}");
    let f = wire.faults_send;
    let client_faults = vec![f.dropped, f.duplicated, f.reordered];
    if faults.is_some() {
        // every kind of fault happened on both sides, and the losses were recovered
        assert!(
            client_faults.iter().all(|&k| k > 0),
            "client injected (dropped, duplicated, reordered) {client_faults:?}"
        );
        assert!(
            server_faults.iter().all(|&k| k > 0),
            "server injected (dropped, duplicated, reordered) {server_faults:?}"
        );
        assert!(
            t.retransmitted > 0,
            "the client's losses were retransmitted"
        );
    } else {
        assert_eq!(client_faults, [0, 0, 0], "no faults asked for");
        assert_eq!(server_faults, [0, 0, 0], "no faults asked for");
    }
}

#[test]
fn two_processes_send_write_read_atomics() {
    two_processes(None, 64 << 20, ("127.0.0.21", "127.0.0.22"));
}

#[test]
fn two_processes_with_faults() {
    two_processes(
        Some("loss=0.05,dup=0.02,reorder=0.05,seed=7"),
        16 << 20,
        ("127.0.0.23", "127.0.0.24"),
    );
}
