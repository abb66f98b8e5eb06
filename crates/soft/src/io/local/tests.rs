use super::*;
use crate::io::share::Slot;
use std::os::fd::AsRawFd;

fn pair() -> (HostLocal, Slot, HostLocal, Slot) {
    let (sa, sb) = (
        Slot::claim(&Default::default()).unwrap(),
        Slot::claim(&Default::default()).unwrap(),
    );
    let a = HostLocal::new(sa.get(), 1, ring::MIN_CAPACITY).unwrap();
    let b = HostLocal::new(sb.get(), 1, ring::MIN_CAPACITY).unwrap();
    (a, sa, b, sb)
}

fn addrs() -> (WireAddr, WireAddr) {
    ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap())
}

fn readable(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd; a bound, not a timing assertion.
    unsafe { libc::poll(&mut p, 1, 5000) == 1 }
}

fn take(b: &mut HostLocal) -> Vec<(Arrival, Vec<u8>)> {
    let mut got = Vec::new();
    b.recv(&mut |a, p| got.push((*a, p.to_vec())));
    got
}

#[test]
fn packets_cross_in_order_with_their_addresses() {
    let (mut a, _sa, mut b, _sb) = pair();
    let (x, y) = addrs();
    a.connect(b.me()).unwrap();
    assert!(readable(b.bell_fd()), "the ring's fd went to b's bell");
    b.drain_bell();
    assert_eq!(b.stats().rings_in, 1);
    for k in 0..40u8 {
        let meta = TxMeta {
            tclass: k,
            ..Default::default()
        };
        assert!(a.send(b.me(), x, y, meta, &[k; 300]));
    }
    a.flush();
    let mut got = Vec::new();
    while got.len() < 40 {
        let more = take(&mut b);
        assert!(!more.is_empty());
        got.extend(more);
    }
    for (k, (arr, pkt)) in got.iter().enumerate() {
        assert_eq!((arr.remote, arr.local, arr.tclass), (x, y, k as u8));
        assert_eq!(pkt, &vec![k as u8; 300]);
    }
    assert_eq!(a.stats().sent, 40);
    assert_eq!(b.stats().received, 40);
    // a peer nobody connected to: nothing to send through
    let stranger = HostPeer {
        nonce: b.me().nonce ^ 1,
        ..b.me()
    };
    assert!(!a.send(stranger, x, y, TxMeta::default(), b"x"));
    assert_eq!(a.stats().dead, 1);
}

#[test]
fn a_sleeping_receiver_is_woken_once_and_a_busy_one_never() {
    let (mut a, _sa, mut b, _sb) = pair();
    let (x, y) = addrs();
    a.connect(b.me()).unwrap();
    b.drain_bell();
    // busy: no arm, no bell
    assert!(a.send(b.me(), x, y, TxMeta::default(), b"one"));
    a.flush();
    assert_eq!(a.stats().bells, 0);
    assert_eq!(take(&mut b).len(), 1);
    // asleep: one bell for two flushes' worth
    assert!(!b.arm());
    assert!(a.send(b.me(), x, y, TxMeta::default(), b"two"));
    a.flush();
    assert!(a.send(b.me(), x, y, TxMeta::default(), b"three"));
    a.flush();
    assert_eq!(a.stats().bells, 1);
    assert!(readable(b.bell_fd()));
    b.drain_bell();
    assert_eq!(take(&mut b).len(), 2);
    // something published before the arm: the arm says so
    assert!(a.send(b.me(), x, y, TxMeta::default(), b"four"));
    assert!(b.arm());
}

#[test]
fn a_receiver_that_is_gone_makes_its_ring_dead_and_a_closed_sender_is_forgotten() {
    let (mut a, _sa, mut b, sb) = pair();
    let (x, y) = addrs();
    a.connect(b.me()).unwrap();
    b.drain_bell();
    assert!(!b.arm());
    let gone = b.me();
    drop(b);
    drop(sb);
    assert!(a.send(gone, x, y, TxMeta::default(), b"lost"));
    a.flush();
    assert!(!a.reaches(gone));
    assert!(!a.send(gone, x, y, TxMeta::default(), b"lost"));
    assert_eq!(a.stats().dead, 1);
    // connecting again finds nobody
    assert!(a.connect(gone).is_err());

    let (mut c, _sc, mut d, _sd) = pair();
    c.connect(d.me()).unwrap();
    d.drain_bell();
    assert!(c.send(d.me(), x, y, TxMeta::default(), b"last words"));
    drop(c);
    assert_eq!(
        take(&mut d).len(),
        1,
        "what was sent before the close still arrives"
    );
    assert_eq!(d.stats().rings_in, 0);
}

#[test]
fn full_rings_refuse_and_counts_say_so() {
    let (mut a, _sa, mut b, _sb) = pair();
    let (x, y) = addrs();
    a.connect(b.me()).unwrap();
    b.drain_bell();
    let mut sent = 0;
    while a.send(b.me(), x, y, TxMeta::default(), &[7; 4000]) {
        sent += 1;
    }
    assert!(sent >= 10, "{sent}");
    assert_eq!(a.stats().ring_full, 1);
    assert_eq!(take(&mut b).len(), sent.min(RING_BATCH));
    assert!(a.send(b.me(), x, y, TxMeta::default(), &[7; 4000]));
}

#[test]
fn guids_and_settings() {
    let p = HostPeer {
        slot: 1,
        ns: 2,
        nonce: 3,
    };
    assert_eq!(HostPeer::from_guid(p.guid()), Some(p));
    assert_eq!(
        HostPeer::from_guid(GUID_MAGIC << 48),
        None,
        "slot 0 is nobody"
    );
    assert_eq!(p.bell_name(), "bell-1-00000003");
}

/// An epoll set of `b`'s own, as its wire would have.
fn with_epoll(b: &mut HostLocal) -> OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: plain epoll_create1; checked.
    let raw = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: fresh descriptor.
    let ep = unsafe { OwnedFd::from_raw_fd(raw) };
    b.set_epoll(raw);
    ep
}

/// The tokens `epoll` reports now (no wait).
fn tokens(epoll: &OwnedFd) -> Vec<u64> {
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
    // SAFETY: a live array of 8 entries.
    let n = unsafe { libc::epoll_wait(epoll.as_raw_fd(), evs.as_mut_ptr(), 8, 0) };
    evs[..n.max(0) as usize].iter().map(|e| e.u64).collect()
}

/// A consumer with an epoll set hands its producer an eventfd: after the first wake-up
/// (a bell, which also probes that the consumer lives), wake-ups are eventfd writes that
/// the consumer's epoll set reports edge-triggered, once each, and its bell stays empty.
/// After a pause longer than the probe interval the bell rings again, and a consumer
/// that died meanwhile makes the ring dead.
#[test]
fn wake_ups_go_through_the_consumers_eventfd_and_the_bell_probes_it_lives() {
    let (mut a, _sa, mut b, sb) = pair();
    let ep = with_epoll(&mut b);
    let (x, y) = addrs();
    a.connect(b.me()).unwrap();
    b.drain_bell(); // attaches the ring, offers the eventfd
    assert!(readable(a.bell_fd()), "the eventfd went to a's bell");
    a.drain_bell();
    assert_eq!(tokens(&ep), Vec::<u64>::new(), "nothing to wake for yet");

    // first wake-up: the bell (a probe)
    assert!(!b.arm());
    assert!(a.send(b.me(), x, y, TxMeta::default(), b"one"));
    a.flush();
    assert!(readable(b.bell_fd()));
    b.drain_bell();
    assert_eq!(take(&mut b).len(), 1);
    // then the eventfd, reported once per write, the bell untouched
    for k in 0..3u8 {
        assert!(!b.arm());
        assert!(a.send(b.me(), x, y, TxMeta::default(), &[k]));
        a.flush();
        let t = tokens(&ep);
        assert_eq!(t.len(), 1, "wake-up {k}: one event");
        assert_ne!(t[0] & EFD_TOKEN, 0, "wake-up {k}: the eventfd");
        assert_eq!(
            tokens(&ep),
            Vec::<u64>::new(),
            "edge-triggered: reported once"
        );
        assert_eq!(take(&mut b).len(), 1);
    }
    let mut p = libc::pollfd {
        fd: b.bell_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, no wait.
    assert_eq!(
        unsafe { libc::poll(&mut p, 1, 0) },
        0,
        "no datagram on the bell"
    );
    assert_eq!(a.stats().bells, 4);

    // the consumer dies; after the probe interval the next wake-up rings the bell, which
    // refuses: the ring is dead
    assert!(!b.arm());
    let gone = b.me();
    drop(b);
    drop(sb);
    std::thread::sleep(BELL_PROBE * 3);
    assert!(a.send(gone, x, y, TxMeta::default(), b"lost"));
    a.flush();
    assert!(!a.reaches(gone));
    assert!(!a.send(gone, x, y, TxMeta::default(), b"lost"));
    assert_eq!(a.stats().dead, 1);
}

/// An RC WRITE ONLY to QP 0x11 whose payload is `payload` (a pull description).
fn write_first(payload: &[u8]) -> Vec<u8> {
    use rdma_wire::opcode::Opcode;
    use rdma_wire::reth::RethRepr;
    let mut h = rdma_proto::packet::header(Opcode::RcRdmaWriteOnly, 0x11, 7);
    h.reth = Some(RethRepr {
        va: 0x1000,
        r_key: 0x1234,
        dma_len: 16384,
    });
    let mut out = vec![0u8; 512];
    let n = rdma_proto::wire::emit(&h, payload, &mut out, None).unwrap();
    out.truncate(n);
    out
}

/// A pull description: the message's length and PSNs, then one piece.
fn pull_payload(token: u64, offset: u64, len: u64, fd: i32) -> Vec<u8> {
    let mut p = vec![0u8; crate::pull::PREFIX + crate::pull::PIECE];
    p[..4].copy_from_slice(&16384u32.to_le_bytes());
    p[4..8].copy_from_slice(&4u32.to_le_bytes());
    let piece = crate::pull::Piece {
        token,
        offset,
        len,
        fd,
    };
    piece.write(&mut p[crate::pull::PREFIX..]).unwrap();
    p
}

/// The address the receiver resolved the one piece of a delivered pulled packet to.
fn resolved_addr(pkt: &[u8]) -> u64 {
    let p = rdma_proto::wire::parse(pkt, rdma_wire::packet::IcrcCheck::Skip).unwrap();
    assert_eq!(p.payload.len(), crate::pull::PREFIX + crate::pull::RESOLVED);
    u64::from_le_bytes(p.payload[8..16].try_into().unwrap())
}

#[test]
fn pulled_records_wait_for_their_region_and_broken_ones_are_dropped() {
    use crate::verbs::shared_mem::SharedBytes;
    use std::os::fd::AsFd;
    let (mut a, _sa, mut b, _sb) = pair();
    let (x, y) = addrs();
    a.connect(b.me()).unwrap();
    b.drain_bell();
    let region = SharedBytes::new_shared_zeroed(16384);
    region.fill(0, 16384, 0x11);
    let fd = region.file().unwrap();
    let pull = TxMeta {
        placement: TxPlacement::Pull,
        ..Default::default()
    };
    // as a sender does: the region's file to the bell once, then the record
    assert!(a.share(b.me(), 5, fd.as_fd()));
    assert!(a.share(b.me(), 5, fd.as_fd()));
    assert_eq!(a.stats().regions_shared, 1, "handed over once");
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    assert!(a.send(
        b.me(),
        x,
        y,
        pull,
        &write_first(&pull_payload(5, 0, 16384, raw))
    ));
    // the first look finds the file not read yet: b reads its bell, the second delivers
    assert!(take(&mut b).is_empty());
    assert_eq!(b.stats().pull_deferred, 1);
    let got = take(&mut b);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0.placement, TxPlacement::Pull);
    let at = resolved_addr(&got[0].1);
    assert_ne!(at, 0);
    // SAFETY: resolved by b's wire into its live read-only mapping of the region.
    let seen = unsafe { std::slice::from_raw_parts(at as *const u8, 16384) };
    assert!(seen.iter().all(|&v| v == 0x11));
    // a region never handed over: one wait, then delivered unresolved (the responder
    // asks for the WRITE again)
    assert!(a.send(
        b.me(),
        x,
        y,
        pull,
        &write_first(&pull_payload(6, 0, 16, raw))
    ));
    assert!(take(&mut b).is_empty());
    let got = take(&mut b);
    assert_eq!(resolved_addr(&got[0].1), 0);
    // past the end of a known region: unresolved at once
    assert!(a.send(
        b.me(),
        x,
        y,
        pull,
        &write_first(&pull_payload(5, 16000, 1000, raw))
    ));
    assert_eq!(resolved_addr(&take(&mut b)[0].1), 0);
    // a description that breaks the format is dropped; the ring goes on
    let mut broken = pull_payload(5, 0, 16, raw);
    broken.extend_from_slice(&[0; 4]);
    assert!(a.send(b.me(), x, y, pull, &write_first(&broken)));
    assert!(a.send(b.me(), x, y, TxMeta::default(), b"after"));
    let got = take(&mut b);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, b"after");
    assert_eq!((b.stats().malformed_pulls, b.stats().malformed), (1, 0));
}

#[test]
fn a_killed_producers_ring_and_region_files_are_let_go() {
    use crate::verbs::shared_mem::SharedBytes;
    use std::os::fd::AsFd;
    let (mut a, _sa, mut b, _sb) = pair();
    let (x, y) = addrs();
    a.connect(b.me()).unwrap();
    let region = SharedBytes::new_shared_zeroed(16384);
    assert!(a.share(b.me(), 1, region.file().unwrap().as_fd()));
    assert!(a.send(b.me(), x, y, TxMeta::default(), b"last words"));
    b.drain_bell();
    assert_eq!(b.stats().rings_in, 1);
    assert!(b.inbound[0].regions.knows(1));
    // killed: its rings are never closed, its bell goes with the process
    std::mem::forget(std::mem::take(&mut a.outbound));
    drop(a);
    b.swept_at = None;
    b.drain_bell();
    assert!(
        !b.inbound[0].regions.knows(1),
        "its region files unmapped at once"
    );
    assert_eq!(b.stats().rings_in, 1, "its ring kept until read");
    assert_eq!(take(&mut b).len(), 1);
    assert_eq!(b.stats().rings_in, 0, "then let go");
}

#[test]
fn a_region_the_receiver_let_go_is_handed_over_again() {
    use std::os::fd::AsFd;
    let (mut a, _sa, mut b, _sb) = pair();
    a.connect(b.me()).unwrap();
    b.drain_bell();
    let n = regions::MAX_REGIONS + 1;
    let all: Vec<_> = (0..n).map(|_| regions::tests::region_file(64)).collect();
    for (k, f) in all.iter().enumerate() {
        assert!(a.share(b.me(), k as u64 + 1, f.as_fd()));
        if k % 8 == 7 {
            b.drain_bell();
        }
    }
    b.drain_bell();
    let i = &mut b.inbound[0];
    assert!(!i.regions.knows(1), "the receiver let the oldest go");
    assert!(i.regions.knows(n as u64));
    // the sender forgot it too: the next use hands it over again
    assert!(a.share(b.me(), 1, all[0].as_fd()));
    assert_eq!(a.stats().regions_shared, n as u64 + 1);
    b.drain_bell();
    assert!(b.inbound[0].regions.knows(1));
}

/// A pipe made blocking and full: a write to it would block.
fn full_pipe() -> (OwnedFd, OwnedFd) {
    use std::os::fd::FromRawFd;
    let mut p = [0i32; 2];
    // SAFETY: a live two-int array; the results are checked.
    unsafe {
        assert_eq!(
            libc::pipe2(p.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC),
            0
        );
        while libc::write(p[1], [0u8; 4096].as_ptr().cast(), 4096) > 0 {}
        libc::fcntl(p[1], libc::F_SETFL, 0);
        (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1]))
    }
}

#[test]
fn a_wake_up_fd_that_is_not_an_eventfd_is_refused() {
    let (mut a, _sa, mut b, _sb) = pair();
    let (x, y) = addrs();
    a.connect(b.me()).unwrap();
    b.drain_bell();
    // a stranger (same user) hands `a` a full, blocking pipe as b's wake-up eventfd
    let (rd, wr) = full_pipe();
    let stranger = Bell::bind(a.dir.join("test-stranger-bell")).unwrap();
    let to = a.dir.join(a.me().bell_name());
    stranger
        .send(&to, &b.me().bell_msg(MSG_EFD), Some(wr.as_fd()))
        .unwrap();
    a.drain_bell();
    // two wake-ups: the first always rings the bell, the second would use the eventfd
    for k in 0..2u8 {
        assert!(!b.arm());
        assert!(a.send(b.me(), x, y, TxMeta::default(), &[k]));
        a.flush(); // with the pipe taken, this blocks forever
        assert!(readable(b.bell_fd()), "wake-up {k} rang b's bell");
        b.drain_bell();
        assert_eq!(take(&mut b).len(), 1);
    }
    drop(rd);
}

#[test]
fn a_renamed_directory_and_a_strangers_bell_in_its_place_get_nothing() {
    let base = std::env::temp_dir().join(format!("rdma-soft-bell-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir(&base).unwrap();
    let dir = base.join("d");
    // SAFETY: geteuid cannot fail.
    let pinned = crate::io::share::rundir::open_private(&dir, unsafe { libc::geteuid() }).unwrap();
    let (sa, sb) = (
        Slot::claim(&Default::default()).unwrap(),
        Slot::claim(&Default::default()).unwrap(),
    );
    let mut a = HostLocal::in_dir(pinned.path(), sa.get(), 1, ring::MIN_CAPACITY).unwrap();
    let mut b = HostLocal::in_dir(pinned.path(), sb.get(), 1, ring::MIN_CAPACITY).unwrap();
    let (x, y) = addrs();
    a.connect(b.me()).unwrap();
    b.drain_bell();
    // the directory moves away; a stranger's directory and bell take its name
    std::fs::rename(&dir, base.join("moved")).unwrap();
    std::fs::create_dir(&dir).unwrap();
    let stranger = Bell::bind(dir.join(b.me().bell_name())).unwrap();
    assert!(!b.arm());
    assert!(a.send(b.me(), x, y, TxMeta::default(), b"for b"));
    a.flush();
    assert!(readable(b.bell_fd()), "b's own bell rang");
    b.drain_bell();
    assert_eq!(take(&mut b).len(), 1);
    let mut p = libc::pollfd {
        fd: stranger.fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, no wait.
    assert_eq!(
        unsafe { libc::poll(&mut p, 1, 0) },
        0,
        "the stranger got nothing"
    );
    drop((a, b, stranger));
    std::fs::remove_dir_all(&base).unwrap();
}
