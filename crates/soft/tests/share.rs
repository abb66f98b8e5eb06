//! Sharing one address between wires and processes: the kernel steers each datagram to the
//! member its QPN names (SO_REUSEPORT + the classic-BPF program), the membership survives a
//! SIGKILLed member, a datagram a stale program sends to the wrong member is handed to its
//! owner over the host-local ring (or dropped without one), and a datagram for nobody is
//! dropped, never delivered.
//!
//! Addresses: 127.0.110.0/24, ports 47940-47949.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::raw::{addr, dreq, packet, req, wire};
use rdma_soft::io::{DatagramWire, UdpConfig, UdpWire, WireAddr};

/// A stop for a test that would otherwise hang, not a speed target.
const HANG: Duration = Duration::from_secs(120);

fn tags(w: &mut UdpWire, want: usize) -> Vec<u32> {
    let end = Instant::now() + HANG;
    let mut got = Vec::new();
    // Until `want` arrived, then a little longer to catch strays (they would be errors).
    let mut quiet = 0;
    while Instant::now() < end && (got.len() < want || quiet < 50) {
        let n = w
            .recv(&mut |_, p| got.push(u32::from_be_bytes([p[12], p[13], p[14], p[15]])))
            .unwrap();
        if n == 0 {
            quiet += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    got.sort_unstable();
    got
}

/// What reaches `w` within a short quiet time: each packet's tag and arrival netdev.
fn arrivals(w: &mut UdpWire) -> Vec<(u32, u32)> {
    let mut got = Vec::new();
    let mut quiet = 0;
    while quiet < 50 {
        let n = w
            .recv(&mut |a, p| {
                got.push((u32::from_be_bytes([p[12], p[13], p[14], p[15]]), a.ifindex))
            })
            .unwrap();
        if n == 0 {
            quiet += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    got
}

/// Sends `n` packets to each slot's QP 5, tagged `slot << 16 | k`.
fn send_to(s: &mut UdpWire, from: WireAddr, to: WireAddr, slots: &[u8], n: u32) {
    for &slot in slots {
        for k in 0..n {
            let qpn = (u32::from(slot) << 16) | 5;
            s.send(from, to, &packet(qpn, (u32::from(slot) << 16) | k))
                .unwrap();
        }
        s.flush().unwrap();
    }
}

fn expect(slot: u8, n: u32) -> Vec<u32> {
    (0..n).map(|k| (u32::from(slot) << 16) | k).collect()
}

#[test]
fn each_datagram_reaches_the_wire_its_qpn_names() {
    let port = 47940;
    let (shared, src) = (addr("127.0.110.1"), addr("127.0.110.2"));
    let mut a = wire(port);
    let mut b = wire(port);
    a.open(shared).unwrap();
    b.open(shared).unwrap();
    let mut s = wire(port);
    s.open(src).unwrap();
    let (sa, sb) = (
        a.share_slot().unwrap().unwrap(),
        b.share_slot().unwrap().unwrap(),
    );
    assert_ne!(sa, sb);
    send_to(&mut s, src, shared, &[sa, sb], 20);
    assert_eq!(tags(&mut a, 20), expect(sa, 20));
    assert_eq!(tags(&mut b, 20), expect(sb, 20));

    // The first member leaves, a third joins: the order is kept and steering follows.
    drop(a);
    let mut c = wire(port);
    c.open(shared).unwrap();
    let sc = c.share_slot().unwrap().unwrap();
    send_to(&mut s, src, shared, &[sb, sc], 20);
    assert_eq!(tags(&mut b, 20), expect(sb, 20));
    assert_eq!(tags(&mut c, 20), expect(sc, 20));
    assert_eq!(b.stats().misdelivered + c.stats().misdelivered, 0);

    // A slot nobody holds: the kernel hashes it to someone, who drops it.
    let nobody = (1..=255u8).find(|x| ![sa, sb, sc].contains(x)).unwrap();
    send_to(&mut s, src, shared, &[nobody], 10);
    let (gb, gc) = (tags(&mut b, 0), tags(&mut c, 0));
    assert!(gb.is_empty() && gc.is_empty(), "{gb:?} {gc:?}");
    assert_eq!(b.stats().misdelivered + c.stats().misdelivered, 10);
}

/// Child mode of the test below, not a test of its own (ignored: run only as that test's
/// child process): joins the address, says its slot, waits to be killed.
#[test]
#[ignore = "run as a child process by a_sigkilled_member_leaves_nothing_behind"]
fn share_child_member() {
    let a = std::env::var("SHARE_CHILD_ADDR")
        .expect("SHARE_CHILD_ADDR: run by a_sigkilled_member_leaves_nothing_behind");
    let mut w = wire(47941);
    w.open(addr(&a)).unwrap();
    println!("slot {}", w.share_slot().unwrap().unwrap());
    let end = Instant::now() + HANG;
    while Instant::now() < end {
        let _ = w.recv(&mut |_, _| {});
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A member of `shared` in a child process (`share_child_member`), and its slot; the
/// caller kills and waits for it.
#[allow(clippy::zombie_processes)]
fn child_member(shared: WireAddr) -> (std::process::Child, u8) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "share_child_member", "--ignored", "--nocapture"])
        .env("SHARE_CHILD_ADDR", shared.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child ended early");
        if let Some(s) = line.trim().strip_prefix("slot ") {
            return (child, s.parse().unwrap());
        }
    }
}

#[test]
fn a_sigkilled_member_leaves_nothing_behind() {
    let port = 47941;
    let (shared, src) = (addr("127.0.110.5"), addr("127.0.110.6"));
    let mut a = wire(port);
    a.open(shared).unwrap();
    // The second member is another process, in the middle of the group's order.
    let (mut child, child_slot) = child_member(shared);
    let mut d = wire(port);
    d.open(shared).unwrap();
    // SIGKILL, by pid: no goodbye, the kernel moves the last member into its place.
    // SAFETY: plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
    child.wait().unwrap();
    // The next process joins at once; the table is repaired on its join.
    let mut c = wire(port);
    c.open(shared).unwrap();
    let mut s = wire(port);
    s.open(src).unwrap();
    let slots = [
        a.share_slot().unwrap().unwrap(),
        d.share_slot().unwrap().unwrap(),
        c.share_slot().unwrap().unwrap(),
    ];
    send_to(&mut s, src, shared, &slots, 20);
    for (w, slot) in [&mut a, &mut d, &mut c].into_iter().zip(slots) {
        assert_eq!(tags(w, 20), expect(slot, 20));
        assert_eq!(w.stats().misdelivered, 0);
    }
    // The dead member's slot: dropped by whoever gets it.
    send_to(&mut s, src, shared, &[child_slot], 5);
    let got: usize = [&mut a, &mut d, &mut c]
        .into_iter()
        .map(|w| tags(w, 0).len())
        .sum();
    assert_eq!(got, 0);
}

/// A member SIGKILLed in the middle of the group and nobody joining after: the program
/// sends the moved member's datagrams past the group's end, which the kernel steers by
/// hash. Whoever gets one hands it to its owner (nothing lost), and takes it as evidence:
/// the dead entry is pruned and steering is exact again.
#[test]
fn a_sigkilled_member_with_no_join_after_loses_nothing_and_heals() {
    let port = 47941;
    let shared = addr("127.0.110.33");
    let mut a = wire(port);
    a.open(shared).unwrap();
    let (mut child, _) = child_member(shared);
    let mut d = wire(port);
    d.open(shared).unwrap();
    // SAFETY: plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
    child.wait().unwrap();
    let slots = [
        a.share_slot().unwrap().unwrap(),
        d.share_slot().unwrap().unwrap(),
    ];
    // senders on three addresses: three flow hashes for the kernel's fallback
    let mut senders: Vec<(UdpWire, WireAddr)> = ["127.0.110.34", "127.0.110.35", "127.0.110.36"]
        .iter()
        .map(|s| {
            let mut w = wire(port);
            w.open(addr(s)).unwrap();
            (w, addr(s))
        })
        .collect();
    // the table settles before a misdelivery counts as evidence
    std::thread::sleep(Duration::from_millis(300));
    let round = |senders: &mut Vec<(UdpWire, WireAddr)>, a: &mut UdpWire, d: &mut UdpWire| {
        for (s, src) in senders.iter_mut() {
            send_to(s, *src, shared, &slots, 10);
        }
        // a forwards what it got of d's first (d's ring then holds them)
        let got_a = tags(a, 30);
        let got_d = tags(d, 30);
        let want = |slot: u8| {
            let mut v: Vec<u32> = (0..3).flat_map(|_| expect(slot, 10)).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(got_a, want(slots[0]));
        assert_eq!(got_d, want(slots[1]));
    };
    round(&mut senders, &mut a, &mut d);
    let first = a.stats().misdelivered + d.stats().misdelivered;
    assert_eq!(
        a.stats().forwarded + d.stats().forwarded,
        first,
        "every misdelivered datagram forwarded"
    );
    std::thread::sleep(Duration::from_millis(300));
    round(&mut senders, &mut a, &mut d);
    assert_eq!(
        a.stats().misdelivered + d.stats().misdelivered,
        first,
        "steering exact after the first misdeliveries"
    );
}

/// The table's guess at the kernel's order can be wrong (two members dying at once): the
/// misdelivered datagrams themselves repair it, and steering is exact again.
#[test]
fn a_wrong_table_is_repaired_by_the_datagrams_it_misdelivers() {
    use std::os::unix::fs::MetadataExt;
    let port = 47942;
    let (shared, src) = (addr("127.0.110.9"), addr("127.0.110.10"));
    let mut a = wire(port);
    let mut b = wire(port);
    a.open(shared).unwrap();
    b.open(shared).unwrap();
    // Swap the two entries behind the kernel's back; the next join builds on that guess.
    let ns = std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino();
    let dir = rdma_soft::config::runtime_dir().unwrap();
    let tab = dir.join(format!("grp-{ns}-{shared}-{port}.tab"));
    let text = std::fs::read_to_string(&tab).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    std::fs::write(&tab, format!("{}\n{}\n", lines[1], lines[0])).unwrap();
    let mut c = wire(port);
    c.open(shared).unwrap();
    let (sa, sb, sc) = (
        a.share_slot().unwrap().unwrap(),
        b.share_slot().unwrap().unwrap(),
        c.share_slot().unwrap().unwrap(),
    );
    let mut s = wire(port);
    s.open(src).unwrap();
    // Evidence counts only once the table has settled.
    std::thread::sleep(Duration::from_millis(300));
    // a's datagrams go to b (and b's to a): never delivered there, but handed to a over
    // the host-local ring (a UD datagram would otherwise be lost for good).
    send_to(&mut s, src, shared, &[sa], 10);
    let gb = tags(&mut b, 0);
    assert!(gb.is_empty(), "{gb:?}");
    assert_eq!((b.stats().misdelivered, b.stats().forwarded), (10, 10));
    assert_eq!(tags(&mut a, 10), expect(sa, 10));
    assert_eq!(a.stats().local.received, 10);
    // b took them as evidence and swapped the entries back: exact again.
    send_to(&mut s, src, shared, &[sa, sb, sc], 10);
    assert_eq!(tags(&mut a, 10), expect(sa, 10));
    assert_eq!(tags(&mut b, 10), expect(sb, 10));
    assert_eq!(tags(&mut c, 10), expect(sc, 10));
    assert_eq!(a.stats().misdelivered + c.stats().misdelivered, 0);
    assert_eq!(b.stats().misdelivered, 10);
    assert_eq!(
        a.stats().local.received,
        10,
        "nothing more came over the ring"
    );
}

/// Without the host-local wire (`RDMA_SOFT_LOCAL_WIRE=0`) a misdelivered datagram has no
/// way to its owner: dropped, never delivered to the wrong process.
#[test]
fn a_misdelivered_datagram_is_dropped_without_the_host_local_wire() {
    use std::os::unix::fs::MetadataExt;
    let port = 47949;
    let (shared, src) = (addr("127.0.110.29"), addr("127.0.110.30"));
    let no_local = || {
        UdpWire::new(UdpConfig {
            port,
            host_local: false,
            ..UdpConfig::default()
        })
        .unwrap()
    };
    let mut a = no_local();
    let mut b = no_local();
    a.open(shared).unwrap();
    b.open(shared).unwrap();
    let ns = std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino();
    let dir = rdma_soft::config::runtime_dir().unwrap();
    let tab = dir.join(format!("grp-{ns}-{shared}-{port}.tab"));
    let text = std::fs::read_to_string(&tab).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    std::fs::write(&tab, format!("{}\n{}\n", lines[1], lines[0])).unwrap();
    // a join attaches the program built on the swapped table
    let mut c = no_local();
    c.open(shared).unwrap();
    let sa = a.share_slot().unwrap().unwrap();
    let mut s = wire(port);
    s.open(src).unwrap();
    send_to(&mut s, src, shared, &[sa], 10);
    let (ga, gb) = (tags(&mut a, 0), tags(&mut b, 0));
    assert!(ga.is_empty() && gb.is_empty(), "{ga:?} {gb:?}");
    assert_eq!((b.stats().misdelivered, b.stats().forwarded), (10, 0));
}

#[test]
fn cm_messages_go_to_their_comm_ids_owner_and_unknown_ones_to_someone() {
    let port = 47943;
    let (shared, src) = (addr("127.0.110.13"), addr("127.0.110.14"));
    let mut a = wire(port);
    let mut b = wire(port);
    a.open(shared).unwrap();
    b.open(shared).unwrap();
    let mut s = wire(port);
    s.open(src).unwrap();
    let (sa, sb) = (
        a.share_slot().unwrap().unwrap(),
        b.share_slot().unwrap().unwrap(),
    );
    for k in 0..10 {
        s.send(src, shared, &dreq(sa, k)).unwrap();
        s.send(src, shared, &dreq(sb, 100 + k)).unwrap();
    }
    s.flush().unwrap();
    assert_eq!(tags(&mut a, 10), (0..10).collect::<Vec<_>>());
    assert_eq!(tags(&mut b, 10), (100..110).collect::<Vec<_>>());
    // A slot no member holds: kept by whoever the hash picks (its CM answers as Linux does
    // for an unknown comm id), exactly once.
    let nobody = (1..=255u8).find(|x| ![sa, sb].contains(x)).unwrap();
    for k in 0..10 {
        s.send(src, shared, &dreq(nobody, 200 + k)).unwrap();
    }
    s.flush().unwrap();
    let end = Instant::now() + HANG;
    let mut got = Vec::new();
    while got.len() < 10 && Instant::now() < end {
        got.extend(tags(&mut a, 0));
        got.extend(tags(&mut b, 0));
    }
    got.sort_unstable();
    assert_eq!(got, (200..210).collect::<Vec<_>>());
    assert_eq!(a.stats().misdelivered + b.stats().misdelivered, 0);
}

/// Equal-size packets to two processes' QPs on one address in one flush: a GSO message is
/// steered as a whole on loopback and veth, so each QP's run must be a message of its own.
#[test]
fn one_batch_to_two_members_reaches_both() {
    let port = 47944;
    let (shared, src) = (addr("127.0.110.17"), addr("127.0.110.18"));
    let mut a = wire(port);
    let mut b = wire(port);
    a.open(shared).unwrap();
    b.open(shared).unwrap();
    let mut s = wire(port);
    s.open(src).unwrap();
    let (sa, sb) = (
        a.share_slot().unwrap().unwrap(),
        b.share_slot().unwrap().unwrap(),
    );
    for k in 0..8 {
        for slot in [sa, sa, sb] {
            let tag = (u32::from(slot) << 16) | k;
            let qpn = (u32::from(slot) << 16) | 5;
            s.send(src, shared, &packet(qpn, tag)).unwrap();
        }
    }
    s.flush().unwrap();
    let (ga, gb) = (tags(&mut a, 16), tags(&mut b, 8));
    assert_eq!(ga.len(), 16, "{ga:?}");
    assert_eq!(gb, expect(sb, 8));
    assert_eq!(a.stats().misdelivered + b.stats().misdelivered, 0);
}

/// A REQ whose listener is another live process's never reaches this one's CM (it would
/// answer REJ 8 and end a connection that has a listener): the wire hands it to the
/// listener's member in the group, or, when it has none here (this test's pid 1), drops
/// it, and the sender's CM retransmits. A REQ for our own listener or
/// for nobody's is delivered (nobody's is ours to refuse, as Linux does).
#[test]
fn a_req_for_another_processs_listener_is_dropped_not_refused() {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    let port = 47945;
    let (shared, src) = (addr("127.0.110.21"), addr("127.0.110.22"));
    let mut a = wire(port);
    a.open(shared).unwrap();
    a.share_slot().unwrap().unwrap();
    let mut s = wire(port);
    s.open(src).unwrap();
    // Another process's listener on port 47001 of the TCP port space: a claim file named
    // for pid 1, its flock held as its owner would hold it.
    let ns = std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino();
    let dir = rdma_soft::config::runtime_dir().unwrap();
    let path = dir.join(format!("claim-{ns}-0106-47001-1-0"));
    let mut f = std::fs::File::create(&path).unwrap();
    // SAFETY: flock on an fd we own.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) },
        0
    );
    writeln!(f, "{} 1", shared.ip()).unwrap();
    let ours =
        rdma_soft::io::PortClaim::acquire(&Default::default(), 0x0106, shared.ip(), 47002, true)
            .unwrap();
    let sid = |p: u64| (0x0106 << 16) | p;
    for k in 0..5 {
        s.send(src, shared, &req(sid(47001), k)).unwrap();
        s.send(src, shared, &req(sid(47002), 100 + k)).unwrap();
        s.send(src, shared, &req(sid(47003), 200 + k)).unwrap();
    }
    s.flush().unwrap();
    let want: Vec<u32> = (100..105).chain(200..205).collect();
    assert_eq!(tags(&mut a, want.len()), want);
    assert_eq!(a.stats().misdelivered, 5);
    // The other process is gone: its service is nobody's, and a REQ for it is delivered.
    drop(f);
    s.send(src, shared, &req(sid(47001), 300)).unwrap();
    s.flush().unwrap();
    assert_eq!(tags(&mut a, 1), vec![300]);
    assert_eq!(a.stats().misdelivered, 5);
    drop(ours);
}

/// A wrong table guess sends a listener's REQs to another member: never refused there but
/// handed to the listener's member over the ring, and they repair the table as misdelivered
/// QP traffic does (the member swaps its entry with the listener's), after which they reach
/// the listener directly.
#[test]
fn reqs_for_a_listener_repair_a_wrong_table() {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    let port = 47946;
    let (shared, src) = (addr("127.0.110.25"), addr("127.0.110.26"));
    let mut a = wire(port);
    let mut b = wire(port);
    a.open(shared).unwrap();
    b.open(shared).unwrap();
    let sb = b.share_slot().unwrap().unwrap();
    let ns = std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino();
    let dir = rdma_soft::config::runtime_dir().unwrap();
    // b stands for another process (pid 1) listening on port 47011: its table entry and a
    // claim file of pid 1, flock held as the owner would hold it.
    let path = dir.join(format!("claim-{ns}-0106-47011-1-0"));
    let mut f = std::fs::File::create(&path).unwrap();
    // SAFETY: flock on an fd we own.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) },
        0
    );
    writeln!(f, "{} 1", shared.ip()).unwrap();
    let tab = dir.join(format!("grp-{ns}-{shared}-{port}.tab"));
    let text = std::fs::read_to_string(&tab).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    // The kernel has a then b; the table says b (as pid 1, its slot file too) then a: a
    // wrong guess.
    std::fs::write(dir.join(format!("slot-{sb}")), "1\n").unwrap();
    let b_line = format!("{sb} 1");
    std::fs::write(&tab, format!("{b_line}\n{}\n", lines[0])).unwrap();
    let mut s = wire(port);
    s.open(src).unwrap();
    // The table must have settled for evidence to count.
    std::thread::sleep(Duration::from_millis(300));
    let sid = (0x0106u64 << 16) | 47011;
    // Rounds of 5 REQs (a retransmission's worth), each after the table settled: the
    // members' drops repair the table a step at a time until the REQs reach b.
    let mut rounds = Vec::new();
    for round in 0..8 {
        let before = (a.stats().misdelivered, b.stats().misdelivered);
        let forwarded = a.stats().forwarded;
        for k in 0..5 {
            s.send(src, shared, &req(sid, round * 10 + k)).unwrap();
        }
        s.flush().unwrap();
        let (ga, gb) = (tags(&mut a, 0), arrivals(&mut b));
        assert!(ga.is_empty(), "never delivered to a: {ga:?}");
        // what reached a went on to b, the listener's member, over the ring (b, standing
        // for pid 1, drops what reaches it from the socket: it is not that process), with
        // the netdev it arrived on (lo), which the listener's CM checks
        assert_eq!(gb.len() as u64, a.stats().forwarded - forwarded, "{gb:?}");
        assert!(gb.iter().all(|&(_, ifindex)| ifindex == 1), "{gb:?}");
        let got = (
            a.stats().misdelivered - before.0,
            b.stats().misdelivered - before.1,
        );
        assert_eq!(got.0 + got.1, 5, "every REQ dropped by one member: {got:?}");
        rounds.push(got);
        if rounds.len() >= 2 && rounds[rounds.len() - 2..] == [(0, 5), (0, 5)] {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    // The program was wrong (a got them) and the drops repaired it (b gets them).
    assert!(rounds.iter().any(|r| r.0 > 0), "{rounds:?}");
    assert_eq!(
        a.stats().forwarded,
        a.stats().misdelivered,
        "every REQ a got went on to b"
    );
    assert_eq!(rounds[rounds.len() - 2..], [(0, 5), (0, 5)], "{rounds:?}");
    drop(f);
}
