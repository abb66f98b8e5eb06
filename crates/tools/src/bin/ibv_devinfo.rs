//! `ibv_devinfo`: device and port attributes (and with `-v` the GID table) of the soft
//! RoCEv2 devices of every live process of this user, in rdma-core's layout.

use rdma_tools::cli::Tool;
use rdma_tools::inspect;

const TOOL: Tool = Tool {
    name: "ibv_devinfo",
    usage: "Usage: ibv_devinfo             print the soft RoCEv2 devices of every live process
  Options:
    -d <dev>         use IB device <dev> (default all devices found)
    -i <port>        use port <port> of IB device (default all ports)
    -l               print only the IB devices names
    -v               print all the attributes of the IB device(s) (GID table)
    -D               debug logs on stderr (RUST_LOG wins)
    -h               this help
",
};

fn main() {
    let (mut dev, mut names, mut verbose, mut debug) = (None, false, false, 0u8);
    let mut port = None;
    for o in TOOL.parse_args("d:i:lvDh") {
        match o.name {
            'd' => dev = o.value,
            'i' => match o.value.as_deref().map(str::parse::<u64>) {
                Some(Ok(p)) if p >= 1 => port = Some(p),
                _ => TOOL.fail(format_args!("Invalid port")),
            },
            'l' => names = true,
            'v' => verbose = true,
            'D' => debug = debug.saturating_add(1),
            _ => TOOL.usage(),
        }
    }
    rdma_tools::log::init(debug);
    let procs = inspect::processes(TOOL.name);
    if names {
        print!("{}", inspect::ibv_devinfo_list(&procs));
        return;
    }
    let out = inspect::ibv_devinfo_port(&procs, dev.as_deref(), port, verbose);
    if out.is_empty() {
        match dev {
            Some(d) => TOOL.fail(format_args!("IB device {d} wasn't found")),
            None => println!("No IB devices found"),
        }
        return;
    }
    print!("{out}");
}
