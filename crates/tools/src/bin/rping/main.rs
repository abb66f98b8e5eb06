//! `rping`: rdma-core's RDMA ping over rdmacm-rs, with rping's flags, output lines and
//! message exchange (so it talks to rdma-core's rping over the wire).
//!
//! ```text
//! rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port] [-P]
//! rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]
//! ```
//!
//! Differences from rdma-core's rping: a client whose server disconnects before `-C count`
//! pings fails (rping exits 0); `-q` (self-created QP) and `-t` (TOS) are not supported.

mod msg;
mod session;

use std::net::SocketAddr;
use std::sync::Arc;

use rdma_tools::cli::Tool;
use rdma_tools::events::{describe, EventLog};
use rdmacm::cm::{CmId, Cma, EventChannel, EventType, PortSpace};

use session::Opts;

const TOOL: Tool = Tool {
    name: "rping",
    usage: "rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]
rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]
\t-c\t\tclient side
\t-I\t\tSource address to bind to for client.
\t-s\t\tserver side.  To bind to any address with IPv6 use -a ::0
\t-v\t\tdisplay ping data to stdout
\t-V\t\tvalidate ping data
\t-d\t\tdebug printfs and debug logs on stderr (-dd: per packet; RUST_LOG wins)
\t-S size \tping data size
\t-C count\tping count times
\t-a addr\t\taddress
\t-p port\t\tport
\t-P\t\tpersistent server mode allowing multiple connections
\t-h\t\tthis help
",
};

/// Default port, as rping.
const PORT: u16 = 7174;

fn main() {
    let mut server: Option<bool> = None;
    let (mut addr, mut src) = (None::<String>, None::<String>);
    let mut port = PORT;
    let mut persistent = false;
    let mut o = Opts {
        count: 0,
        size: 64,
        verbose: false,
        validate: false,
        debug: false,
    };
    let mut debug = 0u8;
    for opt in TOOL.parse_args("a:I:Pp:C:S:scvVdh") {
        let v = opt.value.as_deref().unwrap_or("");
        match opt.name {
            'a' => addr = Some(v.to_string()),
            'I' => src = Some(v.to_string()),
            'P' => persistent = true,
            'p' => port = TOOL.num('p', v),
            's' => server = Some(true),
            'c' => server = Some(false),
            'S' => {
                let size: usize = TOOL.num('S', v);
                if !(msg::MIN_SIZE..msg::BUFSIZE).contains(&size) {
                    TOOL.fail(format_args!(
                        "Invalid size {size} (valid range is {} to {})",
                        msg::MIN_SIZE,
                        msg::BUFSIZE
                    ));
                }
                o.size = size;
            }
            'C' => o.count = TOOL.num('C', v),
            'v' => o.verbose = true,
            'V' => o.validate = true,
            'd' => {
                o.debug = true;
                debug = debug.saturating_add(1);
            }
            _ => TOOL.usage(),
        }
    }
    rdma_tools::log::init(debug);
    let Some(server) = server else {
        TOOL.fail("one of -s (server) or -c (client) is required (try 'rping -h')");
    };
    let addr = addr.map(|a| TOOL.addr('a', &a, port));
    let src = src.map(|a| TOOL.addr('I', &a, 0));
    let cma = Cma::new().unwrap_or_else(|e| TOOL.fail(format_args!("rdma_cm: {e}")));
    let ch = EventChannel::with_cma(&cma)
        .unwrap_or_else(|e| TOOL.fail(format_args!("rdma_create_event_channel: {e}")));
    let r = if server {
        let bind = addr.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], port)));
        run_server(&cma, &ch, bind, persistent, o)
    } else {
        let Some(dst) = addr else {
            TOOL.fail("the client needs the server's address: -a addr");
        };
        session::client(&ch, src, dst, &o)
    };
    if let Err(e) = r {
        TOOL.fail(e);
    }
}

/// Binds, listens and serves one connection (or, `-P`, each on its own thread forever).
fn run_server(
    cma: &Cma,
    ch: &EventChannel,
    bind: SocketAddr,
    persistent: bool,
    o: Opts,
) -> Result<(), String> {
    let log = EventLog::new(o.debug);
    let listen = CmId::new(ch, PortSpace::Tcp).map_err(|e| format!("rdma_create_id: {e}"))?;
    listen
        .bind_addr(bind)
        .map_err(|e| format!("rdma_bind_addr: {e}"))?;
    listen.listen(3).map_err(|e| format!("rdma_listen: {e}"))?;
    if o.debug {
        println!("rdma_bind_addr successful");
    }
    let o = Arc::new(o);
    loop {
        let mut ev = ch
            .get_event()
            .map_err(|e| format!("rdma_get_cm_event: {e}"))?;
        log.show(&ev);
        if ev.kind() != EventType::ConnectRequest {
            // as rdma-core's rping: a wildcard listener that cannot hear on one address
            // (UDP 4791 held by another process) still serves the others
            if ev.kind() == EventType::AddrChange && ev.id_num() == listen.num() {
                eprintln!("unhandled event: {}, ignoring", ev.kind());
                continue;
            }
            if ev.id_num() == listen.num() {
                return Err(format!("cma event {}", describe(&ev)));
            }
            continue; // a late event of an earlier child
        }
        let Some(id) = ev.take_id() else { continue };
        drop(ev);
        if !persistent {
            return session::serve(&id, ch, &o);
        }
        let cch =
            EventChannel::with_cma(cma).map_err(|e| format!("rdma_create_event_channel: {e}"))?;
        id.migrate(&cch)
            .map_err(|e| format!("rdma_migrate_id: {e}"))?;
        let o = o.clone();
        let spawned = std::thread::Builder::new()
            .name("rping-conn".into())
            .spawn(move || {
                if let Err(e) = session::serve(&id, &cch, &o) {
                    eprintln!("rping: {e}");
                }
            });
        if let Err(e) = spawned {
            eprintln!("rping: pthread_create: {e}");
        }
    }
}
