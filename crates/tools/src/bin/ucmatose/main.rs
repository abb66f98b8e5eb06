//! `ucmatose`: rdma-core's cmatose (installed as `ucmatose`) over rdmacm-rs: connect `-c`
//! connections, exchange `-C` messages of `-S` bytes each way on each, disconnect; with
//! cmatose's output lines.
//!
//! ```text
//! ucmatose [-s server_address] [-b bind_address] [-c connections] [-C message_count]
//!          [-S message_size] [-t type_of_service] [-p port_number]
//! ```
//!
//! Differences: any failing event ends the run at once with one line
//! (`cmatose: event: RDMA_CM_EVENT_REJECTED, error: 8`) and exit status 1 (cmatose goes on
//! to print "test complete" and returns the status); `-f`, `-P` and `-m` are not supported;
//! `-v` prints every CM event by name.

mod node;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use rdma_soft::verbs::WcOpcode;
use rdma_tools::cli::Tool;
use rdma_tools::cmatose_common::{self, Options, Role};
use rdma_tools::events::EventLog;
use rdmacm::cm::{CmId, CmOption, ConnParam, Event, EventChannel, EventType, PortSpace};

use node::{Msgs, Node};

const TOOL: Tool = Tool {
    name: "cmatose",
    usage: "usage: ucmatose
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

/// The run's settings.
struct Run {
    ch: EventChannel,
    log: EventLog,
    msgs: Msgs,
    connections: usize,
    tos: Option<u8>,
    nodes: Vec<Node>,
    by_id: HashMap<u64, usize>,
    later: VecDeque<Event>,
}

fn main() {
    let opts = Options::parse(&TOOL, 7471);
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
        later: VecDeque::new(),
    };
    cmatose_common::run(&TOOL, &opts, |role| match role {
        Role::Client { src, dst } => run.client(src, dst),
        Role::Server { bind } => run.server(bind),
    });
}

impl Run {
    fn client(&mut self, src: Option<SocketAddr>, dst: SocketAddr) -> Result<(), String> {
        println!("cmatose: connecting");
        for _ in 0..self.connections {
            let id =
                CmId::new(&self.ch, PortSpace::Tcp).map_err(|e| format!("rdma_create_id: {e}"))?;
            id.resolve_addr(src, dst, Duration::from_millis(2000))
                .map_err(|e| format!("failure getting addr: {e}"))?;
            self.by_id.insert(id.num(), self.nodes.len());
            self.nodes.push(Node::new(id));
        }
        self.connect_events()?;
        if self.msgs.count > 0 {
            println!("receiving data transfers");
            self.complete_all(WcOpcode::Recv)?;
            println!("sending replies");
            for n in &self.nodes {
                n.post_sends(self.msgs)?;
            }
            println!("data transfers complete");
        }
        self.disconnect_events()
    }

    fn server(&mut self, bind: SocketAddr) -> Result<(), String> {
        let listen = CmId::new(&self.ch, PortSpace::Tcp)
            .map_err(|e| format!("listen request failed: {e}"))?;
        listen
            .bind_addr(bind)
            .map_err(|e| format!("bind address failed: {e}"))?;
        listen
            .listen(0)
            .map_err(|e| format!("failure trying to listen: {e}"))?;
        self.connect_events()?;
        if self.msgs.count > 0 {
            println!("initiating data transfers");
            for n in &self.nodes {
                n.post_sends(self.msgs)?;
            }
            println!("completing sends");
            self.complete_all(WcOpcode::Send)?;
            println!("receiving data transfers");
            self.complete_all(WcOpcode::Recv)?;
            println!("data transfers complete");
        }
        println!("cmatose: disconnecting");
        for n in &mut self.nodes {
            if n.connected {
                n.id.disconnect()
                    .map_err(|e| format!("rdma_disconnect: {e}"))?;
            }
        }
        self.disconnect_events()?;
        println!("disconnected");
        Ok(())
    }

    fn complete_all(&mut self, want: WcOpcode) -> Result<(), String> {
        for n in &self.nodes {
            n.complete(self.msgs, want, &self.ch, &self.log, &mut self.later)?;
        }
        Ok(())
    }

    fn next_event(&mut self) -> Result<Event, String> {
        if let Some(ev) = self.later.pop_front() {
            return Ok(ev);
        }
        let ev = self
            .ch
            .get_event()
            .map_err(|e| format!("failure in rdma_get_cm_event: {e}"))?;
        self.log.show(&ev);
        Ok(ev)
    }

    fn node_of(&mut self, ev: &Event) -> Option<&mut Node> {
        let i = *self.by_id.get(&ev.id_num())?;
        self.nodes.get_mut(i)
    }

    /// Runs the connection phase until every connection is ESTABLISHED.
    fn connect_events(&mut self) -> Result<(), String> {
        let mut connects_left = self.connections;
        while connects_left > 0 {
            let mut ev = self.next_event()?;
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
                    n.init(m)?;
                    let p = ConnParam {
                        retry_count: 5,
                        ..ConnParam::default()
                    };
                    n.id.connect(&p)
                        .map_err(|e| format!("failure connecting: {e}"))?;
                }
                EventType::ConnectRequest => {
                    let Some(id) = ev.take_id() else { continue };
                    drop(ev);
                    if self.nodes.len() == self.connections {
                        println!("cmatose: failing connection request");
                        let _ = id.reject(&[]);
                        continue;
                    }
                    let mut n = Node::new(id);
                    n.init(self.msgs)?;
                    n.id.accept(&ConnParam::default())
                        .map_err(|e| format!("failure accepting: {e}"))?;
                    self.by_id.insert(n.id.num(), self.nodes.len());
                    self.nodes.push(n);
                }
                EventType::Established => {
                    if let Some(n) = self.node_of(&ev) {
                        n.connected = true;
                        connects_left -= 1;
                    }
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

    /// Waits for DISCONNECTED on every connection, answering each with a disconnect.
    fn disconnect_events(&mut self) -> Result<(), String> {
        let mut left = self.nodes.iter().filter(|n| n.connected).count();
        while left > 0 {
            let ev = self.next_event()?;
            if ev.kind() == EventType::Disconnected {
                if let Some(n) = self.node_of(&ev) {
                    if n.connected {
                        n.connected = false;
                        let _ = n.id.disconnect();
                        left -= 1;
                    }
                }
            }
        }
        Ok(())
    }
}
