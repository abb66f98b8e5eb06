//! `cmtime`: per-step timing of RDMA CM connection setup and teardown over many
//! connections (rdma-core's `cmtime`). Server when no `-s` is given. Speaks both cmtime
//! generations: with an out-of-band TCP sync (rdma-core 52 and later; the server then serves
//! that one client's run and exits with it) and without (rdma-core 51 and older).

use std::time::Duration;

use rdma_tools::cli::Tool;
use rdma_tools::cmtime::{run_client, run_server, ClientOpts, SyncMode};

const TOOL: Tool = Tool {
    name: "cmtime",
    usage: "usage: cmtime [options]
options:
   -s server_address
   -b bind_address
   -c connections (default 100)
   -p port_number (default 7471)
   -r retries (default 2)
   -t timeout_ms (default 2000)
   -O client: no out-of-band sync with the server (as rdma-core 51 and older's cmtime;
      without -O the client syncs, or runs without when the server refuses the socket)
   -d debug logs on stderr (-dd: per packet; RUST_LOG wins)
   -h this help
server mode when no -s is given
",
};

fn main() {
    let opts = TOOL.parse_args("s:b:c:p:r:t:Odh");
    let (mut server, mut bind) = (None, None);
    let (mut conns, mut port, mut retries, mut timeout) = (100usize, 7471u16, 2u8, 2000u64);
    let mut debug = 0u8;
    let mut sync = SyncMode::Auto;
    for o in &opts {
        let v = o.value.as_deref().unwrap_or("");
        match o.name {
            's' => server = Some(v.to_string()),
            'b' => bind = Some(v.to_string()),
            'c' => conns = TOOL.num('c', v),
            'p' => port = TOOL.num('p', v),
            'r' => retries = TOOL.num('r', v),
            't' => timeout = TOOL.num('t', v),
            'O' => sync = SyncMode::Off,
            'd' => debug = debug.saturating_add(1),
            _ => {}
        }
    }
    rdma_tools::log::init(debug);
    if conns == 0 {
        TOOL.fail("invalid value '0' for -c");
    }
    match server {
        Some(s) => {
            let o = ClientOpts {
                dst: TOOL.addr('s', &s, port),
                src: bind.map(|b| TOOL.addr('b', &b, 0)),
                connections: conns,
                retries,
                timeout: Duration::from_millis(timeout.max(1)),
                sync,
            };
            match run_client(&o) {
                Ok(t) => print!("{}", t.table()),
                Err(e) => TOOL.fail(e),
            }
        }
        None => {
            let addr = match bind {
                Some(b) => TOOL.addr('b', &b, port),
                None => std::net::SocketAddr::from(([0, 0, 0, 0], port)),
            };
            if let Err(e) = run_server(addr) {
                TOOL.fail(e);
            }
        }
    }
}
