//! `rdma-soft`: iproute2's `rdma` views of the soft RoCEv2 devices of every live process
//! of this user.
//!
//! ```text
//! rdma-soft [-j [-p]] [-d] link [show]
//! rdma-soft [-j [-p]] [-d] resource [show [qp | cm_id]]
//! rdma-soft [-j [-p]] [-d] statistic [qp] [show]
//! ```

use rdma_tools::cli::Tool;
use rdma_tools::inspect::{self, Proc};

const TOOL: Tool = Tool {
    name: "rdma-soft",
    usage: "Usage: rdma-soft [ OPTIONS ] OBJECT { COMMAND }
where  OBJECT := { link | resource | statistic }
       OPTIONS := { -j[son] -p[retty] -d[ebug logs] -h[elp] }
  link [show]                      ports, their state and netdev
  resource [show]                  QP and CM id counts per device
  resource show qp                 QPs: state, QPN, peer QPN and address, PSNs
  resource show cm_id              the connection managers' ids and their counters
  statistic [show]                 per-device counters and each context's CM counters
  statistic qp [show]              per-QP counters
Every live process of this user that has a soft device answers
(sockets in $RDMA_SOFT_INSPECT_DIR, $XDG_RUNTIME_DIR/rdma-soft or /tmp/rdma-soft-$UID).
",
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut json, mut pretty, mut debug) = (false, false, 0u8);
    let mut words = Vec::new();
    for a in &args {
        match a.as_str() {
            "-j" | "-json" | "--json" => json = true,
            "-p" | "-pretty" | "--pretty" => pretty = true,
            "-d" | "-debug" | "--debug" => debug = debug.saturating_add(1),
            "-h" | "-help" | "--help" => TOOL.usage(),
            s if s.starts_with('-') => {
                TOOL.fail(format_args!("invalid option \"{s}\" (try 'rdma-soft -h')"))
            }
            s => words.push(s),
        }
    }
    rdma_tools::log::init(debug);
    let view: fn(&[Proc]) -> String = match words.as_slice() {
        ["link"] | ["link", "show"] | ["dev"] | ["dev", "show"] => inspect::link,
        ["resource"] | ["resource", "show"] | ["res"] | ["res", "show"] => {
            inspect::resource_summary
        }
        ["resource" | "res", "show", "qp"] => inspect::resource_qp,
        ["resource" | "res", "show", "cm_id"] => inspect::resource_cm_id,
        ["statistic" | "stat"] | ["statistic" | "stat", "show"] => inspect::statistic,
        ["statistic" | "stat", "qp"] | ["statistic" | "stat", "qp", "show"] => {
            inspect::statistic_qp
        }
        [] if json => inspect::resource_summary,
        [] => TOOL.usage(),
        other => TOOL.fail(format_args!(
            "unknown command \"{}\" (try 'rdma-soft -h')",
            other.join(" ")
        )),
    };
    let procs = inspect::processes(TOOL.name);
    if json {
        print!("{}", inspect::json(&procs, pretty));
    } else {
        print!("{}", view(&procs));
    }
}
