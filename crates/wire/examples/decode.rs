//! Decodes the RoCEv2 packets of a pcap file: one line per packet, with its opcode, queue pair,
//! PSN, extended headers, CM message if any, and whether its ICRC is valid.
//!
//! ```sh
//! cargo run -p rdma-wire --example decode -- ../shared/captures/cm-consumer-reject.pcap
//! ```
#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::process::ExitCode;

use rdma_wire::cm::{CmMadRepr, CmMessage};
use rdma_wire::icrc::Encap;
use rdma_wire::packet::{IcrcCheck, Packet, PacketRepr};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args.iter().any(|a| a == "-h" || a == "--help") {
        eprintln!("usage: decode FILE.pcap [FILE.pcap ...]");
        return ExitCode::from(if args.is_empty() { 2 } else { 0 });
    }
    let (mut good, mut bad) = (0usize, 0usize);
    for path in args.iter().map(PathBuf::from) {
        let datagrams = match support::pcap_roce_datagrams(&path) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("decode: {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        };
        println!("{}: {} RoCEv2 datagrams", path.display(), datagrams.len());
        for (frame, ip, udp, payload) in datagrams {
            match describe(&ip, &udp, &payload) {
                Ok(line) => {
                    good += 1;
                    println!("{frame:5}  {line}");
                }
                Err(e) => {
                    bad += 1;
                    println!("{frame:5}  REJECTED: {e}");
                }
            }
        }
    }
    println!("{good} packets valid (ICRC checked), {bad} rejected");
    ExitCode::SUCCESS
}

fn describe(ip: &[u8], udp: &[u8; 8], payload: &[u8]) -> Result<String, rdma_wire::Error> {
    let encap = Encap::from_headers(ip, udp)?;
    let pkt = Packet::new_checked(payload)?;
    let repr = PacketRepr::parse(&pkt, IcrcCheck::Exact(&encap))?;
    let bth = &repr.bth;
    let mut line = format!(
        "{:?} qp {:#08x} psn {:#08x}{}",
        bth.opcode,
        bth.dest_qp,
        bth.psn,
        if bth.ack_req { " ackreq" } else { "" }
    );
    if let Some(reth) = repr.reth {
        line += &format!(
            " va {:#x} rkey {:#x} len {}",
            reth.va, reth.r_key, reth.dma_len
        );
    }
    if let Some(aeth) = repr.aeth {
        line += &format!(" {:?} msn {}", aeth.syndrome, aeth.msn);
    }
    if let Some(imm) = repr.imm_dt {
        line += &format!(" imm {:#010x}", imm);
    }
    if bth.dest_qp == 1 && pkt.payload().len() >= CmMadRepr::LEN {
        let mad = CmMadRepr::parse(&pkt.payload()[..CmMadRepr::LEN])?;
        line += &format!(
            " tid {:#x} {}",
            mad.transaction_id,
            cm_summary(&mad.message)
        );
    } else {
        line += &format!(" payload {} B", pkt.payload().len());
    }
    Ok(line + " icrc ok")
}

fn cm_summary(m: &CmMessage) -> String {
    match m {
        CmMessage::Req(r) => format!(
            "REQ comm {:#x} service {:#x} qpn {:#x} psn {:#x}",
            r.local_comm_id, r.service_id, r.local_qpn, r.starting_psn
        ),
        CmMessage::Rep(r) => format!(
            "REP comm {:#x}->{:#x} qpn {:#x} psn {:#x}",
            r.local_comm_id, r.remote_comm_id, r.local_qpn, r.starting_psn
        ),
        CmMessage::Rej(r) => format!(
            "REJ comm {:#x}->{:#x} reason {:?}",
            r.local_comm_id, r.remote_comm_id, r.reason
        ),
        CmMessage::Rtu(r) => format!("RTU comm {:#x}->{:#x}", r.local_comm_id, r.remote_comm_id),
        CmMessage::Mra(r) => format!("MRA comm {:#x}->{:#x}", r.local_comm_id, r.remote_comm_id),
        CmMessage::Dreq(r) => format!("DREQ comm {:#x}->{:#x}", r.local_comm_id, r.remote_comm_id),
        CmMessage::Drep(r) => format!("DREP comm {:#x}->{:#x}", r.local_comm_id, r.remote_comm_id),
        CmMessage::SidrReq(r) => format!(
            "SIDR_REQ id {:#x} service {:#x}",
            r.request_id, r.service_id
        ),
        CmMessage::SidrRep(r) => format!(
            "SIDR_REP id {:#x} qpn {:#x} status {:?}",
            r.request_id, r.qpn, r.status
        ),
        other => format!("{other:?}"),
    }
}
