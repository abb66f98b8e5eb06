//! `ibv_devices`: the soft RoCEv2 devices of every live process of this user, in
//! rdma-core's layout (device name and node GUID).

use rdma_tools::cli::Tool;
use rdma_tools::inspect;

const TOOL: Tool = Tool {
    name: "ibv_devices",
    usage: "Usage: ibv_devices
  List the soft RoCEv2 devices of every live process of this user
  (their inspection sockets in $RDMA_SOFT_INSPECT_DIR, $XDG_RUNTIME_DIR/rdma-soft or /tmp/rdma-soft-$UID).
  -d  debug logs on stderr (RUST_LOG wins)
  -h  this help
",
};

fn main() {
    let mut debug = 0u8;
    for o in TOOL.parse_args("dh") {
        if o.name == 'd' {
            debug = debug.saturating_add(1);
        }
    }
    rdma_tools::log::init(debug);
    print!("{}", inspect::ibv_devices(&inspect::processes(TOOL.name)));
}
