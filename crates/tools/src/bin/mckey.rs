//! `mckey`: rdma-core's mckey over rdmacm-rs: joins a multicast group with `-c` UD ids
//! (port space UDP), then the sender (`-s`) sends `-C` datagrams of `-S` bytes with
//! immediate data (its QPN) to the group, and a receiver waits for as many; with mckey's
//! output lines.
//!
//! ```text
//! mckey -m multicast_address [-M unmapped_multicast_address] [-s] [-b bind_address]
//!       [-c connections] [-C message_count] [-S message_size] [-p port_space] [-o] [-l]
//! ```
//!
//! As mckey: the receiver posts its receives before joining, every id waits 3 seconds
//! after its join before the transfers, `-o` joins send-only (no receive, no IGMP report),
//! `-l` makes the QPs block their own looped-back datagrams. Differences: `-p 0x0002`
//! (IPoIB) is refused (`EINVAL`); `-M` takes the MGID as an IPv6 address (a v4-mapped one
//! is the IPv4 group) and needs `-b`, as mckey; an IPv6 group (`-m ff0e::101`) works here
//! (Linux refuses it on RoCEv2); `-v` prints every CM event by name, `-d` debug logs.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use rdma_soft::verbs::{
    AccessFlags, AddressHandle, CompletionChannel, CompletionQueue, MemoryRegion, ProtectionDomain,
    QpCap, QpInitAttr, QpType, QueuePair, RecvWr, SendOp, SendWr, WcStatus,
};
use rdma_tools::cli::Tool;
use rdma_tools::events::EventLog;
use rdmacm::cm::{CmId, Event, EventChannel, EventType, McJoinFlags, PortSpace};

const TOOL: Tool = Tool {
    name: "mckey",
    usage: "usage: mckey
\t-m multicast_address
\t[-M unmapped_multicast_address]
\t replaces -m and requires -b
\t[-s(ender)]
\t[-b bind_address]
\t[-c connections]
\t[-C message_count]
\t[-S message_size]
\t[-p port_space - 0x111 for UDP (default), 0x2 for IPOIB]
\t[-o join as a send-only full-member]
\t[-l prevent multicast message loopback]
\t[-v] print CM events
\t[-d] debug logs on stderr (-dd: per packet; RUST_LOG wins)
\t[-h] this help
",
};

/// Bytes of the GRH in front of a UD receive.
const GRH_LEN: usize = 40;

/// The run's options.
struct Opts {
    dst: String,
    unmapped: bool,
    sender: bool,
    src: Option<String>,
    connections: usize,
    count: usize,
    size: usize,
    ps: PortSpace,
    send_only: bool,
    block_loopback: bool,
    verbose: bool,
}

fn parse() -> Opts {
    let mut o = Opts {
        dst: String::new(),
        unmapped: false,
        sender: false,
        src: None,
        connections: 1,
        count: 10,
        size: 100,
        ps: PortSpace::Udp,
        send_only: false,
        block_loopback: false,
        verbose: false,
    };
    let mut debug: u8 = 0;
    for opt in TOOL.parse_args("m:M:sb:c:C:S:p:olvdh") {
        let v = opt.value.unwrap_or_default();
        match opt.name {
            'm' => o.dst = v,
            'M' => {
                o.unmapped = true;
                o.dst = v;
            }
            's' => o.sender = true,
            'b' => o.src = Some(v),
            'c' => o.connections = TOOL.num('c', &v),
            'C' => o.count = TOOL.num('C', &v),
            'S' => o.size = TOOL.num('S', &v),
            'p' => {
                let raw: u16 = TOOL.num('p', &v);
                o.ps = match raw {
                    0x0111 => PortSpace::Udp,
                    0x0002 => PortSpace::IpoIb,
                    _ => TOOL.fail(format_args!("-p {v}: not a port space of mckey")),
                }
            }
            'o' => o.send_only = true,
            'l' => o.block_loopback = true,
            'v' => o.verbose = true,
            'd' => debug = debug.saturating_add(1),
            _ => TOOL.usage(),
        }
    }
    rdma_tools::log::init(debug);
    if o.dst.is_empty() {
        TOOL.usage();
    }
    if o.unmapped && o.src.is_none() {
        println!("unmapped multicast address requires binding to source address");
        std::process::exit(1);
    }
    if o.size == 0 {
        o.count = 0;
    }
    o
}

/// One id and its resources.
struct Node {
    id: CmId,
    pd: Option<ProtectionDomain>,
    ch: Option<CompletionChannel>,
    cq: Option<CompletionQueue>,
    qp: Option<std::sync::Arc<QueuePair>>,
    mr: Option<MemoryRegion>,
    ah: Option<AddressHandle>,
    remote_qpn: u32,
    remote_qkey: u32,
    connected: bool,
}

impl Node {
    /// mckey's verify_test_params, init_node and post_recvs, then the join.
    fn addr_handler(&mut self, o: &Opts, group: SocketAddr, index: u64) -> Result<(), String> {
        let dev = self.id.device().ok_or("the id has no device")?;
        let port = self.id.port_num().unwrap_or(1);
        let attr = dev
            .query_port(port)
            .map_err(|e| format!("ibv_query_port: {e}"))?;
        let mtu = 1usize << (attr.active_mtu as u32 + 7);
        if o.count > 0 && o.size > mtu {
            return Err(format!(
                "message_size {} is larger than active mtu {mtu}",
                o.size
            ));
        }
        let pd = dev
            .alloc_pd()
            .map_err(|_| "unable to allocate PD".to_string())?;
        let ch = dev
            .create_comp_channel()
            .map_err(|e| format!("ibv_create_comp_channel: {e}"))?;
        let cqe = if o.count > 0 { o.count * 2 } else { 2 };
        let cq = dev
            .create_cq(cqe, Some(&ch))
            .map_err(|_| "unable to create CQ".to_string())?;
        let mut init = QpInitAttr::ud(&cq, &cq);
        init.qp_type = QpType::Ud;
        init.cap = QpCap {
            max_send_wr: o.count.max(1) as u32,
            max_recv_wr: o.count.max(1) as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            ..QpCap::default()
        };
        let qp = self
            .id
            .create_qp(&pd, &init)
            .map_err(|e| format!("unable to create QP: {e}"))?;
        if o.block_loopback {
            qp.set_block_self_mcast_loopback(true)
                .map_err(|e| format!("unable to create QP: {e}"))?;
        }
        if o.count > 0 {
            let mr = pd
                .alloc(o.size + GRH_LEN, AccessFlags::LOCAL_WRITE)
                .map_err(|_| "failed to reg MR".to_string())?;
            if !o.sender {
                let sge = mr
                    .sge(0, (o.size + GRH_LEN) as u32)
                    .map_err(|e| e.to_string())?;
                for _ in 0..o.count {
                    qp.post_recv(&RecvWr::new(index).with_sge(sge))
                        .map_err(|e| format!("failed to post receives: {e}"))?;
                }
            }
            self.mr = Some(mr);
        }
        (self.pd, self.ch, self.cq, self.qp) = (Some(pd), Some(ch), Some(cq), Some(qp));
        let flags = if o.send_only {
            McJoinFlags::SendOnlyFullMember
        } else {
            McJoinFlags::FullMember
        };
        self.id
            .join_multicast(group, flags, index)
            .map_err(|e| format!("failure joining: {e}"))
    }

    /// mckey's join_handler: prints the group and makes the address handle.
    fn join_handler(&mut self, ev: &Event) -> Result<(), String> {
        let (Some(m), Some(ud)) = (ev.mcast(), ev.ud()) else {
            return Err("MULTICAST_JOIN without its parameters".into());
        };
        let dgid = std::net::Ipv6Addr::from(m.ah_attr.dgid);
        println!("mckey: joined dgid: {dgid} mlid 0x0 sl 0");
        let pd = self.pd.as_ref().ok_or("no PD")?;
        let ah = pd
            .create_ah_on(m.port_num, &m.ah_attr)
            .map_err(|_| "failure creating address handle".to_string())?;
        self.ah = Some(ah);
        self.remote_qpn = ud.qp_num;
        self.remote_qkey = ud.qkey;
        self.connected = true;
        Ok(())
    }

    /// `count` SENDs with immediate (the QPN) to the group.
    fn post_sends(&self, o: &Opts) -> Result<(), String> {
        let (Some(qp), Some(mr), Some(ah)) = (&self.qp, &self.mr, &self.ah) else {
            return Ok(());
        };
        if !self.connected || o.count == 0 {
            return Ok(());
        }
        let sge = mr.sge(0, o.size as u32).map_err(|e| e.to_string())?;
        let op = SendOp::SendWithImm { imm: qp.qpn() };
        for _ in 0..o.count {
            let wr = SendWr::new(0, op)
                .with_sge(sge)
                .with_ud(ah.dest(self.remote_qpn, self.remote_qkey));
            qp.post_send(&wr)
                .map_err(|e| format!("failed to post sends: {e}"))?;
        }
        Ok(())
    }

    /// Waits for `count` completions, printing MULTICAST_ERROR / ADDR_CHANGE as mckey's
    /// CM thread does.
    fn poll(&self, o: &Opts, cm: &EventChannel, log: &EventLog) -> Result<(), String> {
        let (Some(cq), Some(ch)) = (&self.cq, &self.ch) else {
            return Ok(());
        };
        if !self.connected {
            return Ok(());
        }
        let mut wc = Vec::with_capacity(8);
        let mut done = 0;
        while done < o.count {
            wc.clear();
            let n = cq.poll(&mut wc, 8);
            if n > 0 {
                if let Some(c) = wc.iter().find(|c| c.status != WcStatus::Success) {
                    return Err(format!("failed polling CQ: {}", c.status as u32));
                }
                done += n;
                continue;
            }
            cm_events(cm, log);
            cq.req_notify(false)
                .map_err(|e| format!("ibv_req_notify_cq: {e}"))?;
            if cq.poll(&mut wc, 8) > 0 {
                done += wc.len();
                continue;
            }
            let fds = [ch.as_raw_fd(), cm.fd()];
            // EINTR is a wake-up like any other
            let _ = rdma_soft::fd::wait_readable(&fds, None);
            ch.get_event()
                .map_err(|e| format!("ibv_get_cq_event: {e}"))?;
        }
        Ok(())
    }
}

/// The CM events that come while data moves (mckey's cma_thread).
fn cm_events(cm: &EventChannel, log: &EventLog) {
    while let Ok(ev) = cm.try_get_event() {
        log.show(&ev);
        if matches!(ev.kind(), EventType::MulticastError | EventType::AddrChange) {
            println!("mckey: event: {}, status: {}", ev.kind(), ev.status());
        }
    }
}

/// The group's socket address: `-m` resolves the name, `-M` takes an MGID.
fn group_addr(o: &Opts) -> SocketAddr {
    if o.unmapped {
        match o.dst.parse::<std::net::Ipv6Addr>() {
            Ok(g) => match g.to_ipv4_mapped() {
                Some(v4) => SocketAddr::from((v4, 0)),
                None => SocketAddr::from((g, 0)),
            },
            Err(e) => TOOL.fail(format_args!("-M {}: {e}", o.dst)),
        }
    } else {
        TOOL.addr('m', &o.dst, 0)
    }
}

fn main() {
    let o = parse();
    let log = EventLog::new(o.verbose);
    let ch = rdma_tools::cmatose_common::event_channel(&TOOL);
    let mut nodes = Vec::new();
    for _ in 0..o.connections {
        match CmId::new(&ch, o.ps) {
            Ok(id) => nodes.push(Node {
                id,
                pd: None,
                ch: None,
                cq: None,
                qp: None,
                mr: None,
                ah: None,
                remote_qpn: 0,
                remote_qkey: 0,
                connected: false,
            }),
            Err(e) => {
                println!("mckey: rdma_create_id: {e}");
                std::process::exit(1);
            }
        }
    }
    let status = match run(&o, &ch, &log, &mut nodes) {
        Ok(()) => 0,
        Err(e) => {
            println!("mckey: {e}");
            1
        }
    };
    println!("test complete");
    drop(nodes);
    println!("return status {status}");
    std::process::exit(status);
}

fn run(o: &Opts, ch: &EventChannel, log: &EventLog, nodes: &mut [Node]) -> Result<(), String> {
    println!(
        "mckey: starting {}",
        if o.sender { "client" } else { "server" }
    );
    let src = o.src.as_ref().map(|s| TOOL.addr('b', s, 0));
    let group = group_addr(o);
    println!("mckey: joining");
    for (i, n) in nodes.iter_mut().enumerate() {
        if let Some(s) = src {
            n.id.bind_addr(s)
                .map_err(|e| format!("addr bind failure: {e}"))?;
        }
        if o.unmapped {
            n.addr_handler(o, group, i as u64)?;
        } else {
            n.id.resolve_addr(src, group, Duration::from_millis(2000))
                .map_err(|e| format!("resolve addr failure: {e}"))?;
        }
    }
    let result = transfer(o, ch, log, nodes, group);
    for n in nodes.iter() {
        if let Err(e) = n.id.leave_multicast(group) {
            println!("mckey: failure leaving: {e}");
        }
    }
    result
}

fn transfer(
    o: &Opts,
    ch: &EventChannel,
    log: &EventLog,
    nodes: &mut [Node],
    group: SocketAddr,
) -> Result<(), String> {
    let mut left = nodes.len();
    while left > 0 {
        let ev = ch
            .get_event()
            .map_err(|e| format!("rdma_get_cm_event: {e}"))?;
        log.show(&ev);
        let i = ev.context() as usize;
        let i = nodes
            .iter()
            .position(|n| n.id.num() == ev.id_num())
            .unwrap_or(i);
        let Some(n) = nodes.get_mut(i) else { continue };
        match ev.kind() {
            EventType::AddrResolved => n.addr_handler(o, group, i as u64)?,
            EventType::MulticastJoin => {
                n.join_handler(&ev)?;
                left -= 1;
            }
            EventType::AddrError | EventType::RouteError | EventType::MulticastError => {
                return Err(format!("event: {}, error: {}", ev.kind(), ev.status()));
            }
            _ => {}
        }
    }
    // mckey's pause for the switches (and the receivers' joins) before sending
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        cm_events(ch, log);
        std::thread::sleep(Duration::from_millis(50));
    }
    if o.count > 0 {
        if o.sender {
            println!("initiating data transfers");
            for n in nodes.iter() {
                n.post_sends(o)?;
            }
        } else {
            println!("receiving data transfers");
            for n in nodes.iter() {
                n.poll(o, ch, log)?;
            }
        }
        println!("data transfers complete");
    }
    Ok(())
}
