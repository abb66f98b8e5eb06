//! Golden vectors: every RoCEv2 packet in `../shared/captures/` (real traffic between two
//! Linux hosts running rdma_rxe), with its IP and UDP headers and tshark's decode of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use pcap_file::pcap::PcapReader;

/// UDP port of RoCEv2.
pub const ROCE_PORT: u16 = 4791;

/// One RoCEv2 datagram from a capture.
#[derive(Debug, Clone)]
pub struct Captured {
    /// Capture case, e.g. `write-imm`.
    pub case: String,
    /// tshark's 1-based frame number in the pcap.
    pub frame: usize,
    /// The IPv4 or IPv6 header exactly as on the wire (IPv4 options included).
    pub ip_header: Vec<u8>,
    /// The UDP header as on the wire.
    pub udp_header: [u8; 8],
    /// The UDP payload: BTH through ICRC.
    pub payload: Vec<u8>,
    /// tshark -V lines of this frame as (key, value), indentation stripped, in order.
    pub decode: Vec<(String, String)>,
    /// A deliberately malformed probe from the third host (192.0.2.1): must be rejected.
    pub probe: bool,
}

impl Captured {
    /// True for an IPv6 packet.
    pub fn is_ipv6(&self) -> bool {
        self.ip_header[0] >> 4 == 6
    }

    /// Every decode value whose key is `key`, in order.
    pub fn values<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.decode
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The first decode value whose key is `key`.
    pub fn value(&self, key: &str) -> Option<&str> {
        self.decode
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A short label for assertion messages.
    pub fn label(&self) -> String {
        format!("{} frame {}", self.case, self.frame)
    }
}

/// The shared captures folder (`../shared/captures` beside the repository).
pub fn captures_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("RDMA_CAPTURES_DIR") {
        return PathBuf::from(dir);
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    // crates/wire -> repository root -> its parent holds shared/
    manifest.join("../../../shared/captures")
}

/// Every capture case name (pcap files), sorted.
pub fn cases() -> Vec<String> {
    let dir = captures_dir();
    let mut out: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read captures folder {}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".pcap").map(str::to_owned)
        })
        .collect();
    out.sort();
    out
}

/// Every RoCEv2 packet (UDP source or destination port 4791) of every capture.
pub fn roce_packets() -> Vec<Captured> {
    cases().iter().flat_map(|c| case_packets(c)).collect()
}

/// A UDP datagram read from a pcap: frame number, IP header, UDP header, payload.
pub type Datagram = (usize, Vec<u8>, [u8; 8], Vec<u8>);

/// Every RoCEv2 datagram (UDP port 4791 either way) of an Ethernet pcap file.
pub fn pcap_roce_datagrams(path: &Path) -> std::io::Result<Vec<Datagram>> {
    let file = File::open(path)?;
    let mut reader =
        PcapReader::new(file).map_err(|e| std::io::Error::other(format!("pcap header: {e}")))?;
    let mut out = Vec::new();
    let mut frame = 0usize;
    while let Some(pkt) = reader.next_packet() {
        let pkt = pkt.map_err(|e| std::io::Error::other(format!("pcap record: {e}")))?;
        frame += 1;
        let Some((ip_header, udp_header, payload)) = split_ethernet(&pkt.data) else {
            continue;
        };
        let sport = u16::from_be_bytes([udp_header[0], udp_header[1]]);
        let dport = u16::from_be_bytes([udp_header[2], udp_header[3]]);
        if sport != ROCE_PORT && dport != ROCE_PORT {
            continue;
        }
        let udp: [u8; 8] = udp_header.try_into().expect("8-byte UDP header");
        out.push((frame, ip_header.to_vec(), udp, payload.to_vec()));
    }
    Ok(out)
}

/// The RoCEv2 packets of one capture case.
pub fn case_packets(case: &str) -> Vec<Captured> {
    let dir = captures_dir();
    let decode = read_decode(&dir.join(format!("{case}.decode.txt")));
    let datagrams = pcap_roce_datagrams(&dir.join(format!("{case}.pcap")))
        .unwrap_or_else(|e| panic!("{case}.pcap: {e}"));
    datagrams
        .into_iter()
        .map(|(frame, ip_header, udp_header, payload)| {
            let probe = ip_header[0] >> 4 == 4 && ip_header[12..16] == [192, 0, 2, 1];
            let lines = decode
                .get(&frame)
                .unwrap_or_else(|| panic!("{case}: frame {frame} missing from decode text"))
                .clone();
            Captured {
                case: case.to_owned(),
                frame,
                ip_header,
                udp_header,
                payload,
                decode: lines,
                probe,
            }
        })
        .collect()
}

/// Splits an Ethernet frame into (IP header, UDP header, UDP payload); None if not IP/UDP.
fn split_ethernet(frame: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    if frame.len() < 14 {
        return None;
    }
    let mut ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    let mut at = 14;
    if ethertype == 0x8100 {
        ethertype = u16::from_be_bytes([frame[16], frame[17]]);
        at = 18;
    }
    let ip = &frame[at..];
    let (hdr_len, proto, total) = match ethertype {
        0x0800 if ip.len() >= 20 => {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            (ihl, ip[9], usize::from(u16::from_be_bytes([ip[2], ip[3]])))
        }
        0x86dd if ip.len() >= 40 => {
            let plen = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            (40, ip[6], 40 + plen)
        }
        _ => return None,
    };
    if proto != 17 || ip.len() < total || total < hdr_len + 8 {
        return None;
    }
    let udp = &ip[hdr_len..hdr_len + 8];
    let udp_len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    if udp_len < 8 || hdr_len + udp_len > total {
        return None;
    }
    Some((&ip[..hdr_len], udp, &ip[hdr_len + 8..hdr_len + udp_len]))
}

/// Parses a `tshark -V` text into frame number -> (key, value) lines.
fn read_decode(path: &Path) -> BTreeMap<usize, Vec<(String, String)>> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut out = BTreeMap::new();
    let mut current: Option<(usize, Vec<(String, String)>)> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Frame ") {
            if let Some(num) = rest.split(':').next().and_then(|n| n.parse().ok()) {
                if let Some((n, lines)) = current.take() {
                    out.insert(n, lines);
                }
                current = Some((num, Vec::new()));
                continue;
            }
        }
        if let Some((_, lines)) = current.as_mut() {
            let trimmed = line.trim();
            if !trimmed.is_empty() {
                lines.push(split_decode_line(trimmed));
            }
        }
    }
    if let Some((n, lines)) = current.take() {
        out.insert(n, lines);
    }
    out
}

/// `..00 .... = Pad Count: 0` -> ("Pad Count", "0"); `Partition Key: 65535` -> ("Partition Key", "65535").
fn split_decode_line(line: &str) -> (String, String) {
    let body = match line.find(" = ") {
        Some(i)
            if line[..i]
                .chars()
                .all(|c| matches!(c, '0' | '1' | '.' | ' ')) =>
        {
            &line[i + 3..]
        }
        _ => line,
    };
    match body.split_once(": ") {
        Some((k, v)) => (k.trim().to_owned(), v.trim().to_owned()),
        None => (body.trim_end_matches(':').trim().to_owned(), String::new()),
    }
}

/// Parses tshark's integers: `0x1f`, `65535`, or a leading number followed by text.
pub fn num(v: &str) -> u64 {
    let tok = v.split_whitespace().next().unwrap_or(v);
    if let Some(h) = tok.strip_prefix("0x") {
        u64::from_str_radix(h, 16).unwrap_or_else(|_| panic!("bad hex {v:?}"))
    } else {
        tok.parse().unwrap_or_else(|_| panic!("bad number {v:?}"))
    }
}

/// The number in parentheses at the end of a value, e.g. `SEND only (100)` -> 100.
pub fn paren_num(v: &str) -> u64 {
    let open = v
        .rfind('(')
        .unwrap_or_else(|| panic!("no (number) in {v:?}"));
    let close = v
        .rfind(')')
        .unwrap_or_else(|| panic!("no (number) in {v:?}"));
    num(&v[open + 1..close])
}
