//! Times each hostview query (µs per call) over loopback, with links and addresses kept
//! (the default view) and asked of the kernel every time (`HostView::uncached`):
//! `cargo run --release -p rdma-hostview --example nlbench [N]`.

use std::time::Instant;

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let hv = match rdma_hostview::BlockingHostView::new() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("nlbench: {e}");
            return;
        }
    };
    let Ok(uncached) = rdma_hostview::HostView::uncached() else {
        eprintln!("nlbench: no netlink socket");
        return;
    };
    for (kind, v) in [("kept", hv.view().clone()), ("uncached", uncached)] {
        println!("{kind}:");
        run(&hv, &v, n);
    }
}

fn run(hv: &rdma_hostview::BlockingHostView, v: &rdma_hostview::HostView, n: u32) {
    let dst = "127.0.0.1"
        .parse()
        .unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]));
    let src = std::net::IpAddr::from([127, 0, 0, 2]);
    macro_rules! time {
        ($name:expr, $f:expr) => {{
            let t = Instant::now();
            for _ in 0..n {
                let _ = hv.block_on($f);
            }
            println!(
                "  {:<38} {:>8.2} us",
                $name,
                t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
            );
        }};
    }
    time!("link(1)", v.link(1));
    time!("addresses()", v.addresses());
    time!("link_holding(127.0.0.1)", v.link_holding(dst, None));
    time!("index_holding(127.0.0.1)", v.index_holding(dst, None));
    time!("route_get(dst, src)", v.route_get(dst, Some(src), None));
    time!(
        "route_get(dst, src, oif 1)",
        v.route_get(dst, Some(src), Some(1))
    );
    time!("links()", v.links());
}
