//! Packets per second through requester + responder with no sockets: RDMA WRITEs and SENDs
//! from A to B, ACKs back, either handing packet descriptions across directly or through
//! `rdma-wire` bytes with the ICRC computed and checked.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rdma_proto::packet::Packet;
use rdma_proto::sim::{ConnParams, Faults, Node, RcPair};
use rdma_proto::verbs::{Mtu, RecvWr, SendOp, SendWr, Sge};
use rdma_proto::wire;
use rdma_wire::icrc::{Encap, IpInfo, Ipv4Info};
use rdma_wire::packet::IcrcCheck;

const BATCH: u64 = 64;

/// Builds the operation against B's buffer.
type MakeOp = fn(&Node) -> SendOp;

/// Moves every pending packet from `from` to `to`; returns how many.
fn pump(
    from: &mut Node,
    to: &mut Node,
    buf: &mut [u8],
    dgram: &mut [u8],
    encap: Option<&Encap>,
) -> u64 {
    let mut n = 0;
    while let Some(t) = from.qp.poll_transmit(0, &mut from.mem, buf) {
        n += 1;
        match encap {
            None => {
                let pkt = Packet {
                    header: t.header,
                    payload: &buf[..t.payload_len],
                };
                to.qp.handle_packet(0, &mut to.mem, &pkt);
            }
            Some(e) => {
                let len = wire::emit(&t.header, &buf[..t.payload_len], dgram, Some(e)).unwrap();
                let pkt = wire::parse(&dgram[..len], IcrcCheck::Exact(e)).unwrap();
                to.qp.handle_packet(0, &mut to.mem, &pkt);
            }
        }
    }
    n
}

fn run(
    s: &mut RcPair,
    op: MakeOp,
    len: u32,
    encap: Option<&Encap>,
    buf: &mut [u8],
    dgram: &mut [u8],
) -> u64 {
    for i in 0..BATCH {
        if matches!(op(&s.b), SendOp::Send) {
            let r = RecvWr::new(i).with_sge(Sge {
                addr: s.b.buf_addr,
                length: 8192,
                lkey: s.b.lkey,
            });
            s.b.qp.post_recv(&r).unwrap();
        }
        let mut wr = SendWr::new(i, op(&s.b)).with_sge(Sge {
            addr: s.a.buf_addr,
            length: len,
            lkey: s.a.lkey,
        });
        if i + 1 == BATCH {
            wr = wr.signaled();
        }
        s.a.qp.post_send(&s.a.mem, &wr).unwrap();
    }
    let mut pkts = 0;
    loop {
        let n = pump(&mut s.a, &mut s.b, buf, dgram, encap)
            + pump(&mut s.b, &mut s.a, buf, dgram, encap);
        if n == 0 {
            break;
        }
        pkts += n;
    }
    while s.a.qp.poll_send_completion().is_some() {}
    while s.b.qp.poll_recv_completion().is_some() {}
    pkts
}

fn bench(c: &mut Criterion) {
    let encap = Encap::new(
        IpInfo::V4(Ipv4Info::new([192, 0, 2, 2], [192, 0, 2, 3])),
        49152,
        4791,
    );
    let cases: [(&str, MakeOp, u32); 3] = [
        (
            "write_4096",
            |b| SendOp::RdmaWrite {
                remote_addr: b.buf_addr,
                rkey: b.rkey,
            },
            4096,
        ),
        (
            "write_64",
            |b| SendOp::RdmaWrite {
                remote_addr: b.buf_addr,
                rkey: b.rkey,
            },
            64,
        ),
        ("send_64", |_| SendOp::Send, 64),
    ];
    for (wire_name, e) in [("direct", None), ("wire+icrc", Some(&encap))] {
        let mut g = c.benchmark_group(format!("rc_{wire_name}"));
        for (name, op, len) in cases {
            let p = ConnParams {
                mtu: Mtu::Mtu4096,
                ..ConnParams::default()
            };
            let mut s = RcPair::with_attrs(1, Faults::clean(), &p);
            let mut buf = vec![0u8; 4096];
            let mut dgram = vec![0u8; 4096 + 64];
            // request packets per batch: BATCH; ACKs: one per AckReq (every message)
            let per_iter = run(&mut s, op, len, e, &mut buf, &mut dgram);
            g.throughput(Throughput::Elements(per_iter));
            g.bench_function(name, |bch| {
                bch.iter(|| run(&mut s, op, len, e, &mut buf, &mut dgram))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
