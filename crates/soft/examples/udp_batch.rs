//! Datagrams per second through `UdpWire` over loopback, by batch size.
//!
//! `cargo run --release -p rdma-soft --example udp_batch [packets] [payload bytes]`
//!
//! A sender thread and a receiver thread, each with its own wire on 127.0.0.0/8; prints, for
//! each batch size, the send rate, the receive rate and how many datagrams arrived.

use std::time::{Duration, Instant};

use rdma_soft::io::{DatagramWire, UdpConfig, UdpWire, WireAddr};

fn run(batch: usize, packets: usize, size: usize, tag: u8) {
    let cfg = UdpConfig {
        batch,
        share: false, // raw packets to made-up QPNs
        ..UdpConfig::default()
    };
    let la: WireAddr = format!("127.0.2.{}", 2 * tag).parse().unwrap();
    let lb: WireAddr = format!("127.0.2.{}", 2 * tag + 1).parse().unwrap();
    let mut rx = UdpWire::new(cfg.clone()).unwrap();
    rx.open(lb).unwrap();
    let receiver = std::thread::spawn(move || {
        let mut got = 0usize;
        let mut first = None;
        let mut last = Instant::now();
        while last.elapsed() < Duration::from_millis(300) {
            let n = rx.recv(&mut |_, _| {}).unwrap();
            if n > 0 {
                first.get_or_insert_with(Instant::now);
                last = Instant::now();
                got += n;
            }
        }
        let secs = first.map_or(1.0, |f| (last - f).as_secs_f64().max(1e-9));
        (got, secs, rx.stats())
    });
    let mut tx = UdpWire::new(cfg).unwrap();
    tx.open(la).unwrap();
    let mut pkt = vec![0u8; size];
    pkt[0] = 0x04;
    let start = Instant::now();
    for i in 0..packets {
        tx.send(la, lb, &pkt).unwrap();
        if (i + 1) % batch == 0 {
            tx.flush().unwrap();
        }
    }
    tx.flush().unwrap();
    let send_secs = start.elapsed().as_secs_f64();
    let (got, recv_secs, rs) = receiver.join().unwrap();
    println!(
        "batch {batch:3}: send {:8.0} pkt/s ({} sendmmsg), receive {:8.0} pkt/s ({} recvmmsg, {:.1}/call), delivered {got}/{packets}",
        packets as f64 / send_secs,
        tx.stats().send_calls,
        got as f64 / recv_secs,
        rs.recv_calls,
        got as f64 / rs.recv_calls.max(1) as f64,
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let packets: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let size: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1024 + 16);
    println!("{packets} datagrams of {size} bytes over loopback");
    for (tag, batch) in [1usize, 8, 32, 64].into_iter().enumerate() {
        run(batch, packets, size, tag as u8 + 1);
    }
}
