//! Helpers of the multicast tests: a bridged topology (hosts `a`, `b`, `c` on one Ethernet
//! segment, so a group datagram reaches every host) and a group member (a UD id with its
//! QP, receives posted) that sends numbered datagrams and reports what it received.
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;

use rdma_testhosts::{Host, Topology};
use rdmacm::cm::{CmId, Cma, Event, EventChannel, EventType, McJoinFlags, PortSpace};
use rdmacm::verbs::{
    AccessFlags, AddressHandle, CompletionQueue, MemoryRegion, ProtectionDomain, QpInitAttr,
    QueuePair, RecvWr, SendOp, SendWr, WcStatus,
};

/// Bytes of the GRH in front of a UD receive.
pub const GRH: usize = 40;
/// Bytes of each test datagram.
pub const SIZE: usize = 200;
/// How long a wait for an event or a datagram may take.
pub const T: Duration = Duration::from_secs(10);
/// A hang guard, not a speed target: a wait that passes it has stopped, not slowed.
pub const HANG: Duration = Duration::from_secs(120);

/// Datagrams per sender (`RDMA_MCAST_COUNT`; CI runs the default, 32; the full run 1000).
pub fn count() -> usize {
    std::env::var("RDMA_MCAST_COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}

/// Hosts `a` (192.0.2.1, 2001:db8::1), `b` (.2, ::2) and `c` (.3, ::3), each with `eth0`
/// on a bridge in host `sw` (multicast snooping off: the bridge floods group traffic).
pub fn bridged() -> Topology {
    let mut t = Topology::builder("mcast");
    for (h, n) in [("a", 1), ("b", 2), ("c", 3)] {
        t = t
            .host(h)
            .link("sw", &format!("p{h}"), h, "eth0")
            .addr(h, "eth0", &format!("192.0.2.{n}/24"))
            .addr(h, "eth0", &format!("2001:db8::{n}/64"));
    }
    let t = t.host("sw").build().expect("topology");
    let sw = t.host("sw");
    sw.ip(&[
        "link",
        "add",
        "br0",
        "type",
        "bridge",
        "mcast_snooping",
        "0",
    ])
    .expect("bridge");
    for p in ["pa", "pb", "pc"] {
        sw.ip(&["link", "set", p, "master", "br0"]).expect("port");
        sw.ip(&["link", "set", p, "up"]).expect("up");
    }
    sw.ip(&["link", "set", "br0", "up"]).expect("br0 up");
    for h in ["a", "b", "c"] {
        t.host(h).wait_carrier("eth0");
    }
    t
}

/// Parses a socket address.
pub fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// The next event, which must be `kind`.
pub fn expect(ch: &EventChannel, kind: EventType) -> Event {
    let ev = ch
        .get_event_timeout(T)
        .unwrap()
        .unwrap_or_else(|| panic!("timed out waiting for {kind}"));
    assert_eq!(ev.kind(), kind, "status {}", ev.status());
    ev
}

/// What a member received: one datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Got {
    /// The sender's tag and the datagram's number (the payload's first 8 bytes).
    pub tag: u32,
    pub idx: u32,
    pub src_qp: u32,
    pub imm: Option<u32>,
    pub len: u32,
    /// IP source and destination in the GRH.
    pub grh_src: IpAddr,
    pub grh_dst: IpAddr,
    /// The payload is the pattern of (tag, idx), byte for byte.
    pub exact: bool,
}

/// The payload of datagram `idx` of sender `tag`.
pub fn pattern(tag: u32, idx: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(SIZE);
    p.extend_from_slice(&tag.to_be_bytes());
    p.extend_from_slice(&idx.to_be_bytes());
    let mut x = tag.wrapping_mul(2_654_435_761) ^ idx.wrapping_mul(40_503);
    while p.len() < SIZE {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        p.push((x >> 16) as u8);
    }
    p
}

/// A UD id bound to `bind`, resolved to the group, with a QP (receives posted) and a
/// buffer per receive; made inside the host's namespace thread.
pub struct Member {
    pub cma: Cma,
    pub ch: EventChannel,
    pub id: CmId,
    pub pd: ProtectionDomain,
    pub cq: CompletionQueue,
    pub qp: Arc<QueuePair>,
    pub mr: MemoryRegion,
    pub recvs: usize,
    pub group: SocketAddr,
    pub ah: Option<AddressHandle>,
}

impl Member {
    /// `recvs` receives of one datagram each; `block` blocks the QP's own loopback.
    pub fn new(bind: &str, group: &str, recvs: usize, block: bool) -> Member {
        let cma = Cma::new().unwrap();
        let ch = EventChannel::with_cma(&cma).unwrap();
        let id = CmId::new(&ch, PortSpace::Udp).unwrap();
        let group = sa(group);
        id.resolve_addr(Some(sa(bind)), group, T).unwrap();
        expect(&ch, EventType::AddrResolved);
        let dev = id.device().unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(2 * recvs + 16, None).unwrap();
        let mut init = QpInitAttr::ud(&cq, &cq);
        init.cap.max_recv_wr = recvs as u32 + 1;
        init.cap.max_send_wr = 256;
        let qp = id.create_qp(&pd, &init).unwrap();
        qp.set_block_self_mcast_loopback(block).unwrap();
        let slot = GRH + SIZE;
        let mr = pd
            .alloc(slot * recvs.max(1), AccessFlags::LOCAL_WRITE)
            .unwrap();
        for i in 0..recvs {
            let sge = mr.sge(i * slot, slot as u32).unwrap();
            qp.post_recv(&RecvWr::new(i as u64).with_sge(sge)).unwrap();
        }
        Member {
            cma,
            ch,
            id,
            pd,
            cq,
            qp,
            mr,
            recvs,
            group,
            ah: None,
        }
    }

    /// Joins the group with `flags`; checks the MULTICAST_JOIN event as Linux gives it and
    /// makes the address handle to the group.
    pub fn join(&mut self, flags: McJoinFlags) {
        self.id.join_multicast(self.group, flags, 0x5eed).unwrap();
        let ev = expect(&self.ch, EventType::MulticastJoin);
        let ud = *ev.ud().expect("ud params");
        assert_eq!(ud.qp_num, 0xFF_FFFF);
        assert_eq!(ud.qkey, 0x0123_4567);
        let m = ev.mcast().expect("join params").clone();
        assert_eq!(m.context, 0x5eed);
        assert_eq!(m.group, self.group.ip());
        assert_eq!(m.ah_attr.hop_limit, 64);
        let want = match self.group.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        };
        assert_eq!(m.ah_attr.dgid, want, "MGID");
        drop(ev);
        self.ah = Some(self.pd.create_ah_on(m.port_num, &m.ah_attr).unwrap());
    }

    /// Sends datagrams `from..to` of sender `tag` to the group (SEND with immediate: the
    /// QPN, as mckey).
    pub fn send(&self, tag: u32, range: std::ops::Range<u32>) {
        let ah = self.ah.as_ref().expect("joined");
        let src = self.pd.alloc(SIZE * 64, AccessFlags::LOCAL_WRITE).unwrap();
        let op = SendOp::SendWithImm { imm: self.qp.qpn() };
        let mut wc = Vec::new();
        for idx in range {
            let off = (idx as usize % 64) * SIZE;
            src.write(off, &pattern(tag, idx)).unwrap();
            let wr = SendWr::new(u64::from(idx), op)
                .with_sge(src.sge(off, SIZE as u32).unwrap())
                .with_ud(ah.dest(0xFF_FFFF, 0x0123_4567))
                .signaled();
            self.qp.post_send(&wr).unwrap();
            // one in flight per buffer slot: wait for the send to complete
            let hang = Instant::now() + HANG;
            loop {
                wc.clear();
                self.cq.poll(&mut wc, 1);
                if let Some(c) = wc.first() {
                    if c.opcode == rdmacm::verbs::WcOpcode::Send {
                        assert_eq!(c.status, WcStatus::Success);
                        break;
                    }
                    panic!("a receive completion while sending: use another member to send");
                }
                assert!(Instant::now() < hang, "hang: send {idx} never completed");
                std::thread::yield_now();
            }
            // a little pacing: the receivers' socket buffers are not the subject here
            if idx % 8 == 7 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Collects receive completions until none came for `quiet`.
    pub fn collect(&self, quiet: Duration) -> Vec<Got> {
        let mut got = Vec::new();
        let mut wc = Vec::new();
        let mut last = Instant::now();
        while last.elapsed() < quiet {
            wc.clear();
            if self.cq.poll(&mut wc, 16) == 0 {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            last = Instant::now();
            for c in &wc {
                if c.opcode != rdmacm::verbs::WcOpcode::Recv {
                    continue;
                }
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                let slot = GRH + SIZE;
                let mut buf = vec![0u8; slot];
                self.mr.read(c.wr_id as usize * slot, &mut buf).unwrap();
                got.push(parse_got(&buf, c.src_qp, c.imm(), c.byte_len));
            }
        }
        got
    }
}

/// A received buffer (GRH and datagram) as a [`Got`].
pub fn parse_got(buf: &[u8], src_qp: u32, imm: Option<u32>, len: u32) -> Got {
    let (grh, data) = buf.split_at(GRH);
    let v4 = grh[20] >> 4 == 4;
    let (grh_src, grh_dst) = if v4 {
        let s: [u8; 4] = grh[32..36].try_into().unwrap();
        let d: [u8; 4] = grh[36..40].try_into().unwrap();
        (IpAddr::from(s), IpAddr::from(d))
    } else {
        let s: [u8; 16] = grh[8..24].try_into().unwrap();
        let d: [u8; 16] = grh[24..40].try_into().unwrap();
        (IpAddr::from(s), IpAddr::from(d))
    };
    let tag = u32::from_be_bytes(data[0..4].try_into().unwrap());
    let idx = u32::from_be_bytes(data[4..8].try_into().unwrap());
    Got {
        tag,
        idx,
        src_qp,
        imm,
        len,
        grh_src,
        grh_dst,
        exact: len as usize == GRH + SIZE && data == &pattern(tag, idx)[..],
    }
}

/// Checks that `got` is every datagram `0..n` of `tag` from `src_qp` (immediate: the QPN)
/// exactly once, byte for byte, with the GRH's addresses `src` → `group`.
pub fn assert_once(
    who: &str,
    got: &[Got],
    tag: u32,
    n: u32,
    src_qp: u32,
    src: IpAddr,
    group: IpAddr,
) {
    let mut seen = vec![0u32; n as usize];
    for g in got {
        assert_eq!(g.tag, tag, "{who}: a datagram of another sender: {g:?}");
        assert!(g.idx < n, "{who}: datagram number {} out of range", g.idx);
        assert!(g.exact, "{who}: datagram {} differs", g.idx);
        assert_eq!(
            (g.src_qp, g.imm),
            (src_qp, Some(src_qp)),
            "{who}: QPN / immediate"
        );
        assert_eq!((g.grh_src, g.grh_dst), (src, group), "{who}: GRH addresses");
        seen[g.idx as usize] += 1;
    }
    let missing: Vec<_> = (0..n).filter(|&i| seen[i as usize] == 0).collect();
    let twice: Vec<_> = (0..n).filter(|&i| seen[i as usize] > 1).collect();
    assert!(
        missing.is_empty() && twice.is_empty(),
        "{who}: missing {missing:?}, more than once {twice:?}"
    );
}

impl Got {
    /// One line of a member process's report.
    pub fn line(&self) -> String {
        format!(
            "GOT {} {} {} {} {} {} {} {}",
            self.tag,
            self.idx,
            self.src_qp,
            self.imm.map_or(-1, i64::from),
            self.len,
            self.grh_src,
            self.grh_dst,
            self.exact
        )
    }

    /// Parses [`Got::line`].
    pub fn parse(line: &str) -> Got {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!((f.len(), f[0]), (9, "GOT"), "{line}");
        let imm: i64 = f[4].parse().unwrap();
        Got {
            tag: f[1].parse().unwrap(),
            idx: f[2].parse().unwrap(),
            src_qp: f[3].parse().unwrap(),
            imm: u32::try_from(imm).ok(),
            len: f[5].parse().unwrap(),
            grh_src: f[6].parse().unwrap(),
            grh_dst: f[7].parse().unwrap(),
            exact: f[8] == "true",
        }
    }
}

/// Sends from a member that also receives: its receive completions wait in the CQ (the
/// sender's `send` wants none in between, so they go through `collect` later).
pub fn send_then(m: &Member, tag: u32, n: u32) {
    let ah = m.ah.as_ref().unwrap();
    let src =
        m.pd.alloc(SIZE * n as usize, AccessFlags::LOCAL_WRITE)
            .unwrap();
    let op = SendOp::SendWithImm { imm: m.qp.qpn() };
    for idx in 0..n {
        let off = idx as usize * SIZE;
        src.write(off, &pattern(tag, idx)).unwrap();
        let wr = SendWr::new(u64::from(idx), op)
            .with_sge(src.sge(off, SIZE as u32).unwrap())
            .with_ud(ah.dest(0xFF_FFFF, 0x0123_4567));
        m.qp.post_send(&wr).unwrap();
        // paced: two receiving devices in this process share one progress engine, and a
        // full socket buffer drops datagrams as UD may (not the subject here)
        if idx % 4 == 3 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A running member process and its report lines.
pub struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    /// This test binary re-run in `h` as `child_member` with `MCAST_CHILD` = `spec`.
    pub fn start(h: &Host, spec: &str) -> Proc {
        let exe = std::env::current_exe().unwrap();
        let mut child = h
            .command(exe.to_str().unwrap())
            .args([
                "--ignored",
                "--exact",
                "child_member",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("MCAST_CHILD", spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Proc { child, lines }
    }

    /// Waits for the READY line.
    pub fn ready(&self) {
        loop {
            let l = self
                .lines
                .recv_timeout(T)
                .expect("member process never got ready");
            // libtest's "test child_member ... " may start the line
            if l.contains("READY ") {
                return;
            }
        }
    }

    /// Tells it the sender is done; its report.
    pub fn finish(mut self) -> Vec<Got> {
        drop(self.child.stdin.take());
        let mut got = Vec::new();
        loop {
            let l = self
                .lines
                .recv_timeout(T)
                .expect("member process never ended");
            if l.ends_with("END") {
                break;
            }
            if let Some(at) = l.find("GOT ") {
                got.push(Got::parse(&l[at..]));
            }
        }
        assert!(self.child.wait().unwrap().success());
        got
    }
}
