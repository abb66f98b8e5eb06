//! What a copy into and out of registered memory costs: `MemoryRegion::write` / `read`
//! (every access atomic, see `verbs/shared_mem.rs`) beside a plain `copy_from_slice`
//! of the same bytes, per size, at the region's aligned start and one byte off it.
//!
//! ```text
//! cargo bench -p rdma-soft --bench mr_copy
//! MR_COPY_BYTES=4000000000 cargo bench -p rdma-soft --bench mr_copy   # bytes per figure
//! ```
//!
//! Run it on a quiet machine. Prints one Markdown row per size and offset (GB/s = 10^9 B/s).
//! Under `cargo test` it copies 4 MiB per figure only (a smoke run).

use std::hint::black_box;
use std::time::Instant;

use rdma_soft::verbs::{AccessFlags, Device, DeviceConfig};

const SIZES: [usize; 4] = [64, 4096, 65536, 1 << 20];

fn gbps(bytes: usize, f: impl FnMut()) -> f64 {
    let mut f = f;
    let t = Instant::now();
    f();
    bytes as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this as a smoke test
    // (a debug build, a few MiB per figure).
    let bench = std::env::args().any(|a| a == "--bench");
    let total: usize = std::env::var("MR_COPY_BYTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if bench { 1 << 30 } else { 4 << 20 });
    let dev = Device::open(DeviceConfig::for_netdev("lo").expect("lo")).expect("device");
    let pd = dev.alloc_pd().expect("pd");
    let len = (1 << 20) + 64;
    let mr = pd
        .register(vec![0u8; len], AccessFlags::LOCAL_WRITE)
        .expect("register");
    let src: Vec<u8> = (0..len).map(|i| i as u8).collect();
    let mut dst = vec![0u8; len];
    let mut plain = vec![0u8; len];
    println!("| size | offset | MR write GB/s | MR read GB/s | copy_from_slice GB/s |");
    println!("| --- | --- | --- | --- | --- |");
    for size in SIZES {
        for off in [0usize, 1] {
            let n = (total / size).max(1);
            let w = gbps(n * size, || {
                for _ in 0..n {
                    mr.write(off, black_box(&src[..size])).expect("write");
                }
            });
            let r = gbps(n * size, || {
                for _ in 0..n {
                    mr.read(off, black_box(&mut dst[..size])).expect("read");
                }
            });
            let c = gbps(n * size, || {
                for _ in 0..n {
                    black_box(&mut plain[off..off + size]).copy_from_slice(black_box(&src[..size]));
                }
            });
            println!("| {size} | {off} | {w:.2} | {r:.2} | {c:.2} |");
        }
    }
    assert_eq!(
        dst[..SIZES[3]],
        src[..SIZES[3]],
        "read back what was written"
    );
}
