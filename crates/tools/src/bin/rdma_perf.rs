//! `rdma-perf`: perftest's `ib_send_lat`, `ib_send_bw`, `ib_write_lat`, `ib_write_bw`,
//! `ib_read_lat`, `ib_read_bw` as subcommands, over the connection manager and the software
//! RoCEv2 device. Server when no address is given; client with the server's address last.

fn main() {
    // perftest's -d is the device: logs through RUST_LOG only
    rdma_tools::log::init(0);
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = rdma_tools::perf::main_with(&args) {
        eprintln!("rdma-perf: {e}");
        std::process::exit(1);
    }
}
