//! Raw datagrams for tests of the UDP wire itself (no QP behind them): wires on a port,
//! RC SEND_ONLY packets and CM REQs / DREQs to QP1, each tagged in its first four bytes after
//! the BTH, with room for the ICRC.

use rdma_soft::io::{UdpConfig, UdpWire, WireAddr};

/// `s` as a wire address ("ip:port").
pub fn addr(s: &str) -> WireAddr {
    s.parse().unwrap()
}

/// A UDP wire on `port` (the default configuration otherwise).
pub fn wire(port: u16) -> UdpWire {
    UdpWire::new(UdpConfig {
        port,
        ..UdpConfig::default()
    })
    .unwrap()
}

/// An RC SEND_ONLY to `qpn` carrying `tag`, with room for the ICRC.
pub fn packet(qpn: u32, tag: u32) -> [u8; 24] {
    let mut p = [0u8; 24];
    p[0] = 0x04;
    p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    p[12..16].copy_from_slice(&tag.to_be_bytes());
    p
}

/// A CM DREQ (UD SEND_ONLY to QP1) naming our comm id's slot (at "remote comm id"),
/// tagged like [`packet`].
pub fn dreq(slot: u8, tag: u32) -> Vec<u8> {
    let mut p = vec![0u8; 12 + 8 + 256 + 4];
    p[0] = 0x64; // UD SEND_ONLY
    p[7] = 1;
    p[12..16].copy_from_slice(&tag.to_be_bytes());
    p[20..24].copy_from_slice(&[1, 7, 2, 3]); // CM class
    p[36..38].copy_from_slice(&0x0015u16.to_be_bytes());
    p[48] = slot;
    p
}

/// A CM REQ on QP1 for `service_id`, tagged like [`packet`].
pub fn req(service_id: u64, tag: u32) -> Vec<u8> {
    let mut p = dreq(0, tag);
    p[36..38].copy_from_slice(&0x0010u16.to_be_bytes());
    p[52..60].copy_from_slice(&service_id.to_be_bytes());
    p
}
