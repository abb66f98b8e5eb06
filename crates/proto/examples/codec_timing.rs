//! Times emitting and parsing 1,000,000 packets through `rdma_proto::wire` (headers, payload,
//! pad, ICRC computed and checked). Not a benchmark harness: run it in release mode,
//! `cargo run --release -p rdma-proto --example codec_timing`, and compare figures.

use rdma_proto::packet::{ack, header};
use rdma_proto::wire::{emit, parse};
use rdma_wire::deth::DethRepr;
use rdma_wire::icrc::{Encap, IpInfo, Ipv4Info};
use rdma_wire::opcode::Opcode;
use rdma_wire::packet::{IcrcCheck, PacketRepr};
use rdma_wire::reth::RethRepr;
use std::hint::black_box;
use std::time::Instant;

const N: usize = 1_000_000;

fn headers() -> [(PacketRepr, usize); 4] {
    let mut send = header(Opcode::RcSendOnly, 0x12, 7);
    send.bth.ack_req = true;
    let mut write = header(Opcode::RcRdmaWriteFirst, 0x12, 8);
    write.reth = Some(RethRepr {
        va: 0x1000,
        r_key: 0x55,
        dma_len: 4096,
    });
    let mut acknowledge = header(Opcode::RcAcknowledge, 0x13, 9);
    acknowledge.aeth = Some(ack(3));
    let mut ud = header(Opcode::UdSendOnly, 1, 0);
    ud.deth = Some(DethRepr {
        q_key: 0x8001_0000,
        resv8: 0,
        src_qp: 1,
    });
    [(send, 61), (write, 1024), (acknowledge, 0), (ud, 256)]
}

fn main() {
    let encap = Encap::new(
        IpInfo::V4(Ipv4Info::new([192, 0, 2, 2], [192, 0, 2, 3])),
        49152,
        4791,
    );
    let payload = vec![0xA5u8; 1024];
    let hs = headers();
    for (label, check) in [("icrc", true), ("no icrc", false)] {
        let e = check.then_some(&encap);
        let mut bufs: Vec<Vec<u8>> = Vec::new();
        let mut buf = [0u8; 2048];
        let t = Instant::now();
        let mut bytes = 0usize;
        for i in 0..N {
            let (h, len) = &hs[i % hs.len()];
            let n = emit(black_box(h), &payload[..*len], &mut buf, e).unwrap();
            bytes += black_box(&buf[..n]).len();
        }
        let emit_ns = t.elapsed().as_nanos() as f64 / N as f64;
        for (h, len) in &hs {
            let n = emit(h, &payload[..*len], &mut buf, e).unwrap();
            bufs.push(buf[..n].to_vec());
        }
        let icrc = match e {
            Some(e) => IcrcCheck::Exact(e),
            None => IcrcCheck::Skip,
        };
        let t = Instant::now();
        let mut psns = 0u64;
        for i in 0..N {
            let p = parse(black_box(&bufs[i % bufs.len()]), icrc).unwrap();
            psns += u64::from(p.header.bth.psn) + p.payload.len() as u64;
        }
        let parse_ns = t.elapsed().as_nanos() as f64 / N as f64;
        black_box((bytes, psns));
        println!("{label}: emit {emit_ns:.1} ns/packet, parse {parse_ns:.1} ns/packet ({N} each, mix of SEND 61 B, WRITE First 1024 B, ACK, UD SEND 256 B)");
    }
}
