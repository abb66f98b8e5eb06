//! `udaddy`: rdma-core's udaddy over rdmacm-rs: UD "connections" in the UDP port space,
//! set up with SIDR (the client's connect sends a SIDR REQ, the server's accept answers
//! with its QPN and Q_Key), then `-C` datagrams of `-S` bytes with immediate data each way;
//! with udaddy's output lines.
//!
//! ```text
//! udaddy [-s server_address] [-b bind_address] [-c connections] [-C message_count]
//!        [-S message_size] [-t type_of_service] [-p port_number]
//! ```
//!
//! Differences: `-p` is the port (rdma-core's udaddy always uses 7174 and takes `-p` as the
//! port space, 0x111, for backwards compatibility; `-p 0x111` here would mean port 273);
//! any failing event ends the run at once with one line (`udaddy: event:
//! RDMA_CM_EVENT_UNREACHABLE, error: 1`) and exit status 1; `-f`, `-P` are not supported;
//! `-v` prints every CM event by name.

mod node;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use rdma_tools::cli::Tool;
use rdma_tools::cmatose_common::{self, Options, Role};
use rdma_tools::events::EventLog;
use rdmacm::cm::{CmId, CmOption, ConnParam, Event, EventChannel, EventType, PortSpace};

use node::{Msgs, Node};

const TOOL: Tool = Tool {
    name: "udaddy",
    usage: "usage: udaddy
\t[-s server_address]
\t[-b bind_address]
\t[-c connections]
\t[-C message_count]
\t[-S message_size]
\t[-t type_of_service]
\t[-p port_number]
\t[-v] print CM events
\t[-d] debug logs on stderr (-dd: per packet; RUST_LOG wins)
\t[-h] this help
",
};

/// The run's state.
struct Run {
    ch: EventChannel,
    log: EventLog,
    msgs: Msgs,
    connections: usize,
    tos: Option<u8>,
    nodes: Vec<Node>,
    by_id: HashMap<u64, usize>,
}

fn main() {
    let opts = Options::parse(&TOOL, 7174);
    let ch = cmatose_common::event_channel(&TOOL);
    let mut run = Run {
        ch,
        log: EventLog::new(opts.verbose),
        msgs: Msgs {
            count: opts.count,
            size: opts.size,
        },
        connections: opts.connections,
        tos: opts.tos,
        nodes: Vec::new(),
        by_id: HashMap::new(),
    };
    cmatose_common::run(&TOOL, &opts, |role| match role {
        Role::Client { src, dst } => run.client(src, dst),
        Role::Server { bind } => run.server(bind),
    });
}

impl Run {
    fn client(&mut self, src: Option<SocketAddr>, dst: SocketAddr) -> Result<(), String> {
        println!("udaddy: connecting");
        for _ in 0..self.connections {
            let id =
                CmId::new(&self.ch, PortSpace::Udp).map_err(|e| format!("rdma_create_id: {e}"))?;
            id.resolve_addr(src, dst, Duration::from_millis(2000))
                .map_err(|e| format!("failure getting addr: {e}"))?;
            self.by_id.insert(id.num(), self.nodes.len());
            self.nodes.push(Node::new(id));
        }
        self.connect_events()?;
        if self.msgs.count > 0 {
            println!("initiating data transfers");
            for n in &self.nodes {
                n.post_sends(self.msgs, false)?;
            }
            println!("receiving data transfers");
            self.poll_all()?;
            println!("data transfers complete");
        }
        Ok(())
    }

    fn server(&mut self, bind: SocketAddr) -> Result<(), String> {
        let listen = CmId::new(&self.ch, PortSpace::Udp)
            .map_err(|e| format!("listen request failed: {e}"))?;
        listen
            .bind_addr(bind)
            .map_err(|e| format!("bind address failed: {e}"))?;
        listen
            .listen(0)
            .map_err(|e| format!("failure trying to listen: {e}"))?;
        self.connect_events()?;
        if self.msgs.count > 0 {
            println!("receiving data transfers");
            self.poll_all()?;
            println!("sending replies");
            for n in &self.nodes {
                n.post_sends(self.msgs, true)?;
            }
            self.poll_all()?;
            println!("data transfers complete");
        }
        Ok(())
    }

    fn poll_all(&mut self) -> Result<(), String> {
        for n in &mut self.nodes {
            n.poll(self.msgs, &self.ch, &self.log)?;
        }
        Ok(())
    }

    fn node_of(&mut self, ev: &Event) -> Option<&mut Node> {
        let i = *self.by_id.get(&ev.id_num())?;
        self.nodes.get_mut(i)
    }

    /// Runs SIDR for every connection.
    fn connect_events(&mut self) -> Result<(), String> {
        let mut connects_left = self.connections;
        while connects_left > 0 {
            let mut ev = self
                .ch
                .get_event()
                .map_err(|e| format!("rdma_get_cm_event: {e}"))?;
            self.log.show(&ev);
            match ev.kind() {
                EventType::AddrResolved => {
                    let tos = self.tos;
                    let Some(n) = self.node_of(&ev) else { continue };
                    if let Some(t) = tos {
                        n.id.set_option(CmOption::Tos(t))
                            .map_err(|e| format!("set TOS option failed: {e}"))?;
                    }
                    n.id.resolve_route(Duration::from_millis(2000))
                        .map_err(|e| format!("resolve route failed: {e}"))?;
                }
                EventType::RouteResolved => {
                    let m = self.msgs;
                    let Some(n) = self.node_of(&ev) else { continue };
                    n.verify(m)?;
                    n.init(m)?;
                    let p = ConnParam {
                        qp_num: n.qpn(),
                        ..ConnParam::default()
                    };
                    n.id.connect(&p)
                        .map_err(|e| format!("failure connecting: {e}"))?;
                }
                EventType::ConnectRequest => {
                    let Some(id) = ev.take_id() else { continue };
                    drop(ev);
                    if self.nodes.len() == self.connections {
                        println!("udaddy: failing connection request");
                        let _ = id.reject(&[]);
                        continue;
                    }
                    let mut n = Node::new(id);
                    n.verify(self.msgs)?;
                    n.init(self.msgs)?;
                    let p = ConnParam {
                        qp_num: n.qpn(),
                        ..ConnParam::default()
                    };
                    n.id.accept(&p)
                        .map_err(|e| format!("failure accepting: {e}"))?;
                    n.connected = true;
                    connects_left -= 1;
                    self.by_id.insert(n.id.num(), self.nodes.len());
                    self.nodes.push(n);
                }
                EventType::Established => {
                    let ud = ev.ud().copied();
                    let Some(n) = self.node_of(&ev) else { continue };
                    let ud = ud.ok_or("ESTABLISHED without UD parameters")?;
                    n.set_peer(ud.peer.ip(), ud.qp_num, ud.qkey)?;
                    n.connected = true;
                    connects_left -= 1;
                }
                EventType::AddrError
                | EventType::RouteError
                | EventType::ConnectError
                | EventType::Unreachable
                | EventType::Rejected => {
                    return Err(format!(
                        "event: {}, error: {}",
                        ev.kind().name(),
                        ev.status()
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }
}
