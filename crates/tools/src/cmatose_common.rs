//! What `ucmatose` and `udaddy` share: their options (`-s -b -c -C -S -t -p -v -h`), the
//! event channel they run on, and the client/server choice with its start and end lines.

use std::fmt::Display;
use std::net::SocketAddr;

use rdmacm::cm::{Cma, EventChannel};

use crate::cli::Tool;

/// The options both tools take.
#[derive(Debug, Clone)]
pub struct Options {
    /// `-s`: the server's address; a client when given, a server otherwise.
    pub dst: Option<String>,
    /// `-b`: the address to bind (the server's listen address, the client's source).
    pub src: Option<String>,
    /// `-p`: the port.
    pub port: u16,
    /// `-c`: connections (at least 1).
    pub connections: usize,
    /// `-C`: messages each way per connection (0 when `-S` is 0).
    pub count: usize,
    /// `-S`: bytes per message.
    pub size: usize,
    /// `-t`: type of service.
    pub tos: Option<u8>,
    /// `-v`: print every CM event.
    pub verbose: bool,
    /// `-d` given this many times: debug logs on stderr (see [`crate::log`]).
    pub debug: u8,
}

/// Which side a run takes, with its addresses.
#[derive(Debug, Clone, Copy)]
pub enum Role {
    /// `-s` given: connect from `src` (`-b`, any port) to `dst` (`-s`, `-p`).
    Client {
        /// The source address, when `-b` is given.
        src: Option<SocketAddr>,
        /// The server's address and port.
        dst: SocketAddr,
    },
    /// No `-s`: listen on `bind` (`-b` or the wildcard, with `-p`).
    Server {
        /// The listen address and port.
        bind: SocketAddr,
    },
}

impl Options {
    /// Parses the process arguments, with `port` as the default `-p`; `-h` prints the usage
    /// and a bad value fails with one line.
    pub fn parse(tool: &Tool, port: u16) -> Options {
        let mut o = Options {
            dst: None,
            src: None,
            port,
            connections: 1,
            count: 10,
            size: 100,
            tos: None,
            verbose: false,
            debug: 0,
        };
        for opt in tool.parse_args("s:b:c:C:S:t:p:vdh") {
            let v = opt.value.as_deref().unwrap_or("");
            match opt.name {
                's' => o.dst = Some(v.to_string()),
                'b' => o.src = Some(v.to_string()),
                'c' => o.connections = tool.num('c', v),
                'C' => o.count = tool.num('C', v),
                'S' => o.size = tool.num('S', v),
                't' => o.tos = Some(tool.num('t', v)),
                'p' => o.port = tool.num('p', v),
                'v' => o.verbose = true,
                'd' => o.debug = o.debug.saturating_add(1),
                _ => tool.usage(),
            }
        }
        crate::log::init(o.debug);
        if o.size == 0 {
            o.count = 0;
        }
        if o.connections == 0 {
            tool.fail("invalid value '0' for -c");
        }
        o
    }
}

/// Opens the connection manager and an event channel on it, failing with one line.
pub fn event_channel(tool: &Tool) -> EventChannel {
    let cma = Cma::new().unwrap_or_else(|e| tool.fail(format_args!("rdma_cm: {e}")));
    EventChannel::with_cma(&cma)
        .unwrap_or_else(|e| tool.fail(format_args!("failed to create event channel: {e}")))
}

/// Prints `name: starting client` (or `server`), resolves the addresses, runs `body` with
/// the role and ends with `test complete` / `return status 0`, or fails with its error.
pub fn run<E: Display>(tool: &Tool, opts: &Options, body: impl FnOnce(Role) -> Result<(), E>) {
    let role = match &opts.dst {
        Some(d) => {
            println!("{}: starting client", tool.name);
            let dst = tool.addr('s', d, opts.port);
            let src = opts.src.as_ref().map(|s| tool.addr('b', s, 0));
            Role::Client { src, dst }
        }
        None => {
            println!("{}: starting server", tool.name);
            let bind = match &opts.src {
                Some(s) => tool.addr('b', s, opts.port),
                None => SocketAddr::from(([0, 0, 0, 0], opts.port)),
            };
            Role::Server { bind }
        }
    };
    if let Err(e) = body(role) {
        tool.fail(e);
    }
    println!("test complete");
    println!("return status 0");
}
