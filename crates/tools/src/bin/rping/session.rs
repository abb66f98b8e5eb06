//! One rping connection: the client's ping loop and the server's READ/WRITE loop, with
//! rping's message exchange:
//!
//! client SEND source descriptor → server RDMA READ of it → server SEND "go ahead" →
//! client SEND sink descriptor → server RDMA WRITE of the data into it → server SEND
//! "go ahead" → (next ping).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rdma_soft::verbs::{
    AccessFlags, Completion, MemoryRegion, QpCap, QpType, RecvWr, SendOp, SendWr, WcOpcode,
    WcStatus,
};
use rdma_tools::endpoint::{Endpoint, Step};
use rdma_tools::events::{describe, EventLog};
use rdmacm::cm::{CmId, ConnParam, EventChannel, EventType};

use crate::msg::{c_str, fill_ping, Desc, DESC_LEN};

/// Settings of one run (from the command line).
#[derive(Debug, Clone)]
pub struct Opts {
    /// Pings to make (client) or serve (server); 0: until the peer disconnects.
    pub count: u64,
    /// Ping data size (`-S`).
    pub size: usize,
    /// `-v`: print ping data.
    pub verbose: bool,
    /// `-V`: check the echoed data.
    pub validate: bool,
    /// `-d`: debug lines and CM events.
    pub debug: bool,
}

impl Opts {
    fn log(&self) -> EventLog {
        EventLog::new(self.debug)
    }

    fn debug(&self, line: impl FnOnce() -> String) {
        if self.debug {
            println!("{}", line());
        }
    }
}

/// rping's queue depths: 16 sends, 2 receives, a CQ of 32.
fn endpoint(id: &CmId) -> Result<Endpoint, String> {
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 2,
        max_send_sge: 1,
        max_recv_sge: 1,
        ..QpCap::default()
    };
    Endpoint::new(id, QpType::Rc, 32, cap)
}

const WR_SEND: u64 = 1;
const WR_RECV: u64 = 2;
const WR_RDMA: u64 = 3;

/// The registered buffers of a connection.
struct Bufs {
    recv: MemoryRegion,
    send: MemoryRegion,
    rdma: MemoryRegion,
    /// The client's source buffer (READ by the server).
    start: Option<MemoryRegion>,
}

impl Bufs {
    fn new(ep: &Endpoint, size: usize, client: bool) -> Result<Bufs, String> {
        let remote =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        Ok(Bufs {
            recv: ep.register(DESC_LEN, AccessFlags::LOCAL_WRITE)?,
            send: ep.register(DESC_LEN, AccessFlags::empty())?,
            rdma: ep.register(size, remote)?,
            start: if client {
                Some(ep.register(size, remote)?)
            } else {
                None
            },
        })
    }

    fn post_recv(&self, ep: &Endpoint) -> Result<(), String> {
        let sge = self
            .recv
            .sge(0, DESC_LEN as u32)
            .map_err(|e| e.to_string())?;
        ep.qp
            .post_recv(&RecvWr::new(WR_RECV).with_sge(sge))
            .map_err(|e| format!("ibv_post_recv: {e}"))
    }

    fn post_send(&self, ep: &Endpoint, desc: Option<Desc>) -> Result<(), String> {
        let bytes = desc.map(|d| d.encode()).unwrap_or([0u8; DESC_LEN]);
        self.send.write(0, &bytes).map_err(|e| e.to_string())?;
        let sge = self
            .send
            .sge(0, DESC_LEN as u32)
            .map_err(|e| e.to_string())?;
        ep.qp
            .post_send(&SendWr::new(WR_SEND, SendOp::Send).with_sge(sge).signaled())
            .map_err(|e| format!("post send error {e}"))
    }
}

fn desc_of(mr: &MemoryRegion, size: usize) -> Desc {
    Desc {
        addr: mr.addr(),
        rkey: mr.rkey(),
        len: size as u32,
    }
}

/// What the wait for a receive ended with.
enum Got {
    /// A 16-byte message (a descriptor or a "go ahead").
    Msg([u8; DESC_LEN]),
    /// The peer disconnected.
    Disconnected,
}

fn check(c: &Completion) -> Result<(), String> {
    if c.status != WcStatus::Success && c.status != WcStatus::WrFlushErr {
        return Err(format!(
            "cq completion failed status {} ({:?})",
            c.status as u32, c.status
        ));
    }
    Ok(())
}

/// The reason to exit with when DISCONNECTED says our own CM ended the connection
/// because its path moved (`RDMACM_HA=align`); `None` for a peer's disconnect.
fn align_end(ev: &rdmacm::cm::Event) -> Option<String> {
    let s = ev.status();
    if s != rdmacm::cm::ALIGN_PATH_MOVED && s != rdmacm::cm::ALIGN_ADDR_GONE {
        return None;
    }
    let what = if s == rdmacm::cm::ALIGN_ADDR_GONE {
        "the connection's local address was removed"
    } else {
        "the route to the peer moved off the connection's netdev"
    };
    Some(format!(
        "connection ended by RDMACM_HA=align: {what} ({}, error {s})",
        std::io::Error::from_raw_os_error(-s)
    ))
}

/// After the CM ended the connection itself (align), stays until its DREQ was answered
/// (TIMEWAIT_EXIT follows the DREP) or 5 s passed: the CM lives in this process, and
/// leaving at once would stop the DREQ before it reached the peer.
fn linger(ep: &Endpoint, cm: &EventChannel, o: &Opts) {
    let until = Instant::now() + Duration::from_secs(5);
    while let Ok(Some(step)) = ep.next(cm, &o.log(), Some(until)) {
        if let Step::Cm(ev) = step {
            if ev.kind() == EventType::TimewaitExit {
                return;
            }
        }
    }
}

/// Events rdma-core's rping does not handle: its event handler prints
/// `unhandled event: NAME, ignoring` and goes on (ADDR_CHANGE is a hint: the connection
/// stays), so ours does the same instead of failing.
fn ignored(ev: &rdmacm::cm::Event) -> bool {
    match ev.kind() {
        EventType::AddrChange => {
            eprintln!("unhandled event: {}, ignoring", ev.kind().name());
            true
        }
        EventType::TimewaitExit => true,
        _ => false,
    }
}

/// Waits for `want` as `expect_event` does, passing over the events rping ignores.
fn expect_past_hints(
    cm: &EventChannel,
    want: EventType,
    t: Duration,
    log: &rdma_tools::events::EventLog,
) -> Result<(), String> {
    loop {
        let ev = rdma_tools::events::next_event(cm, t, log, want)?;
        if ev.kind() == want {
            return Ok(());
        }
        if !ignored(&ev) {
            return Err(format!("cma event {}", describe(&ev)));
        }
    }
}

/// Waits for the next receive (reposting the buffer), passing over send completions and
/// ESTABLISHED; `what` names the awaited step in errors.
fn wait_recv(
    ep: &Endpoint,
    cm: &EventChannel,
    bufs: &Bufs,
    o: &Opts,
    who: &str,
) -> Result<Got, String> {
    loop {
        match ep.next(cm, &o.log(), None)? {
            None => continue,
            Some(Step::Wc(c)) => {
                check(&c)?;
                if c.status == WcStatus::WrFlushErr {
                    continue;
                }
                match c.opcode {
                    WcOpcode::Send => o.debug(|| "send completion".into()),
                    WcOpcode::Recv => {
                        o.debug(|| "recv completion".into());
                        if c.byte_len as usize != DESC_LEN {
                            return Err(format!("Received bogus data, size {}", c.byte_len));
                        }
                        let mut m = [0u8; DESC_LEN];
                        bufs.recv.read(0, &mut m).map_err(|e| e.to_string())?;
                        bufs.post_recv(ep)?;
                        return Ok(Got::Msg(m));
                    }
                    other => return Err(format!("unexpected completion {other:?}")),
                }
            }
            Some(Step::Cm(ev)) => match ev.kind() {
                EventType::Established => {}
                _ if ignored(&ev) => {}
                EventType::Disconnected => {
                    eprintln!("{who} DISCONNECT EVENT...");
                    if let Some(why) = align_end(&ev) {
                        drop(ev);
                        linger(ep, cm, o);
                        return Err(why);
                    }
                    return Ok(Got::Disconnected);
                }
                _ => return Err(format!("cma event {}", describe(&ev))),
            },
        }
    }
}

/// Waits for the completion of the RDMA READ or WRITE just posted.
fn wait_rdma(ep: &Endpoint, cm: &EventChannel, o: &Opts, want: WcOpcode) -> Result<(), String> {
    loop {
        match ep.next(cm, &o.log(), None)? {
            None => continue,
            Some(Step::Wc(c)) => {
                check(&c)?;
                if c.status == WcStatus::WrFlushErr {
                    return Err("connection flushed during RDMA".into());
                }
                if c.opcode == want {
                    return Ok(());
                }
                if c.opcode != WcOpcode::Send {
                    return Err(format!("unexpected completion {:?}", c.opcode));
                }
            }
            Some(Step::Cm(ev)) => match ev.kind() {
                EventType::Established => {}
                _ if ignored(&ev) => {}
                EventType::Disconnected => {
                    return Err(align_end(&ev)
                        .unwrap_or_else(|| "server DISCONNECT EVENT during RDMA".into()));
                }
                _ => return Err(format!("cma event {}", describe(&ev))),
            },
        }
    }
}

/// Serves one accepted request on `id` (events on `cm`) until the client disconnects (as
/// rping, the server ignores `-C`).
pub fn serve(id: &CmId, cm: &EventChannel, o: &Opts) -> Result<(), String> {
    let ep = endpoint(id)?;
    let bufs = Bufs::new(&ep, o.size, false)?;
    bufs.post_recv(&ep)?;
    o.debug(|| "accepting client connection request".into());
    id.accept(&ConnParam::default())
        .map_err(|e| format!("rdma_accept: {e}"))?;
    let result = loop {
        // The client's source descriptor.
        let src = match wait_recv(&ep, cm, &bufs, o, "server")? {
            Got::Msg(m) => Desc::decode(&m),
            Got::Disconnected => break Ok(()),
        };
        o.debug(|| {
            format!(
                "Received rkey {:x} addr {:x} len {} from peer",
                src.rkey, src.addr, src.len
            )
        });
        if src.len as usize > o.size {
            break Err(format!(
                "client's size {} exceeds the server's -S {}",
                src.len, o.size
            ));
        }
        let sge = bufs.rdma.sge(0, src.len).map_err(|e| e.to_string())?;
        let op = SendOp::RdmaRead {
            remote_addr: src.addr,
            rkey: src.rkey,
        };
        ep.qp
            .post_send(&SendWr::new(WR_RDMA, op).with_sge(sge).signaled())
            .map_err(|e| format!("post send error {e}"))?;
        o.debug(|| "server posted rdma read req ".into());
        wait_rdma(&ep, cm, o, WcOpcode::RdmaRead)?;
        o.debug(|| "server received read complete".into());
        let data = bufs.rdma.to_vec();
        if o.verbose {
            println!("server ping data: {}", c_str(&data));
        }
        bufs.post_send(&ep, None)?;
        o.debug(|| "server posted go ahead".into());
        // The client's sink descriptor.
        let sink = match wait_recv(&ep, cm, &bufs, o, "server")? {
            Got::Msg(m) => Desc::decode(&m),
            Got::Disconnected => break Ok(()),
        };
        o.debug(|| "server received sink adv".into());
        let len = data.iter().position(|&b| b == 0).unwrap_or(data.len() - 1) + 1;
        let len = len.min(sink.len as usize) as u32;
        let sge = bufs.rdma.sge(0, len).map_err(|e| e.to_string())?;
        let op = SendOp::RdmaWrite {
            remote_addr: sink.addr,
            rkey: sink.rkey,
        };
        ep.qp
            .post_send(&SendWr::new(WR_RDMA, op).with_sge(sge).signaled())
            .map_err(|e| format!("post send error {e}"))?;
        wait_rdma(&ep, cm, o, WcOpcode::RdmaWrite)?;
        o.debug(|| "server rdma write complete ".into());
        bufs.post_send(&ep, None)?;
        o.debug(|| "server posted go ahead".into());
    };
    let _ = id.disconnect();
    result
}

/// Resolves, connects from `src` (if given) to `dst` and runs the ping loop.
pub fn client(
    cm: &EventChannel,
    src: Option<SocketAddr>,
    dst: SocketAddr,
    o: &Opts,
) -> Result<(), String> {
    let t = Duration::from_millis(2000);
    let log = o.log();
    let id =
        CmId::new(cm, rdmacm::cm::PortSpace::Tcp).map_err(|e| format!("rdma_create_id: {e}"))?;
    id.resolve_addr(src, dst, t)
        .map_err(|e| format!("rdma_resolve_addr: {e}"))?;
    expect_past_hints(cm, EventType::AddrResolved, t * 2, &log)?;
    id.resolve_route(t)
        .map_err(|e| format!("rdma_resolve_route: {e}"))?;
    expect_past_hints(cm, EventType::RouteResolved, t * 2, &log)?;
    o.debug(|| "rdma_resolve_addr - rdma_resolve_route successful".into());
    let ep = endpoint(&id)?;
    let bufs = Bufs::new(&ep, o.size, true)?;
    bufs.post_recv(&ep)?;
    id.connect(&ConnParam::default())
        .map_err(|e| format!("rdma_connect: {e}"))?;
    loop {
        match ep.next(cm, &log, None)? {
            Some(Step::Cm(ev)) if ev.kind() == EventType::Established => break,
            Some(Step::Cm(ev)) if ignored(&ev) => {}
            Some(Step::Cm(ev)) => return Err(format!("cma event {}", describe(&ev))),
            Some(Step::Wc(c)) => check(&c)?,
            None => {}
        }
    }
    o.debug(|| "rdma_connect successful".into());
    let start = bufs.start.as_ref().ok_or("no start buffer")?;
    let mut pattern = vec![0u8; o.size];
    let mut ping = 0u64;
    let mut peer_gone = false;
    while o.count == 0 || ping < o.count {
        fill_ping(&mut pattern, ping);
        start.write(0, &pattern).map_err(|e| e.to_string())?;
        let d = desc_of(start, o.size);
        o.debug(|| format!("RDMA addr {:x} rkey {:x} len {}", d.addr, d.rkey, d.len));
        bufs.post_send(&ep, Some(d))?;
        if let Got::Disconnected = wait_recv(&ep, cm, &bufs, o, "client")? {
            peer_gone = true;
            break;
        }
        let d = desc_of(&bufs.rdma, o.size);
        o.debug(|| format!("RDMA addr {:x} rkey {:x} len {}", d.addr, d.rkey, d.len));
        bufs.post_send(&ep, Some(d))?;
        if let Got::Disconnected = wait_recv(&ep, cm, &bufs, o, "client")? {
            peer_gone = true;
            break;
        }
        let echoed = bufs.rdma.to_vec();
        if o.validate && echoed != pattern {
            return Err("data mismatch!".into());
        }
        if o.verbose {
            println!("ping data: {}", c_str(&echoed));
        }
        ping += 1;
    }
    if peer_gone {
        if o.count != 0 {
            return Err(format!(
                "server disconnected after {ping} of {} pings",
                o.count
            ));
        }
        return Ok(());
    }
    id.disconnect()
        .map_err(|e| format!("rdma_disconnect: {e}"))?;
    // The DREP (or the CM's DREQ timeout, after its retries) ends the connection: wait for
    // it. Our CM lives in this process, so leaving earlier would stop the DREQ's
    // retransmissions: a lost DREQ then never reaches the server, which waits for its next
    // receive forever (seen under 5 % injected loss: 4 of 50 lossy runs). The bound is
    // only a safety net above the CM's own (15 retries of the peer's response timeout).
    let until = Instant::now() + Duration::from_secs(90);
    while let Some(step) = ep.next(cm, &log, Some(until))? {
        if let Step::Cm(ev) = step {
            if ev.kind() == EventType::Disconnected {
                eprintln!("client DISCONNECT EVENT...");
                break;
            }
        }
    }
    Ok(())
}
