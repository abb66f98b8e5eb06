//! The ICRC at the UDP wire: written on send over the IP/UDP header the kernel will write,
//! checked on receive over the header the packet must have had.
//!
//! It lives here, not in the transport, because only the UDP wire knows the outer headers;
//! packets above the wire carry 4 bytes of ICRC room at their end.
//!
//! Sending: our sockets send with DF from an unconnected socket, so Linux writes IPv4
//! Identification 0 and flags DF (checked by the `kernel_sends_identification_zero` test).
//!
//! Receiving: the UDP socket shows neither the IPv4 Identification nor the flags. We first
//! check exactly with Identification 0 and DF (what we and Linux UDP senders with DF write),
//! then ask whether *some* Identification makes the ICRC valid
//! ([`rdma_wire::icrc::Ipv4IdSolver`], CRC linearity: Linux rxe picks random Identifications),
//! with DF and then without. The recovery guards 16 bits fewer (a random corruption passes with
//! probability 2^-16 instead of 2^-32); we chose it over a packet socket because it needs no
//! privilege and no second copy of every packet. Solvers (17 CRC passes to build) are cached
//! per payload length in a small direct-mapped table. IPv6 headers are known entirely.

use rdma_wire::icrc::{self, Encap, IpInfo, Ipv4IdSolver, Ipv4Info, Ipv6Info, ICRC_LEN};
use std::net::IpAddr;

use super::WireAddr;

/// Solvers cached, by payload length.
const SOLVERS: usize = 16;

/// How a received ICRC was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IcrcOk {
    /// Exactly, with the header fully known (IPv6, or IPv4 with Identification 0).
    Exact,
    /// With a recovered IPv4 Identification.
    RecoveredId(u16),
}

/// The outer headers of a datagram between `src` and `dst` (both of one family).
pub(crate) fn encap(src: WireAddr, dst: WireAddr, sport: u16, dport: u16) -> Option<Encap> {
    let ip = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IpInfo::V4(Ipv4Info::new(s.octets(), d.octets())),
        (IpAddr::V6(s), IpAddr::V6(d)) => IpInfo::V6(Ipv6Info::new(s.octets(), d.octets())),
        _ => return None,
    };
    Some(Encap::new(ip, sport, dport))
}

/// `encap` for a datagram whose IPv4 Identification is `id` (IPv6 has none: unchanged).
pub(crate) fn with_identification(encap: Encap, id: u16) -> Encap {
    match encap.ip {
        IpInfo::V4(v4) if id != 0 => Encap {
            ip: IpInfo::V4(Ipv4Info {
                identification: id,
                ..v4
            }),
            ..encap
        },
        _ => encap,
    }
}

/// Whether `packet`'s ICRC holds for exactly the outer headers `encap` (what [`seal`] wrote).
pub(crate) fn holds(encap: &Encap, packet: &[u8]) -> bool {
    let (Ok(found), Some(body)) = (
        icrc::stored(packet),
        packet.len().checked_sub(ICRC_LEN).map(|n| &packet[..n]),
    ) else {
        return false;
    };
    encap.compute(body).is_ok_and(|c| c == found)
}

/// Writes the ICRC into the last 4 bytes of `packet`. False when the packet is shorter than a
/// BTH plus ICRC or the addresses are of different families.
pub(crate) fn seal(encap: &Encap, packet: &mut [u8]) -> bool {
    let Some(body) = packet.len().checked_sub(ICRC_LEN) else {
        return false;
    };
    match encap.compute(&packet[..body]) {
        Ok(crc) => {
            packet[body..].copy_from_slice(&crc.to_le_bytes());
            true
        }
        Err(_) => false,
    }
}

/// Receive-side checker with its cache of Identification solvers.
pub(crate) struct IcrcChecker {
    solvers: [Option<Ipv4IdSolver>; SOLVERS],
}

impl IcrcChecker {
    pub fn new() -> IcrcChecker {
        IcrcChecker {
            solvers: [None; SOLVERS],
        }
    }

    fn solver(&mut self, payload_len: usize) -> Option<&Ipv4IdSolver> {
        let slot = &mut self.solvers[(payload_len / 4) % SOLVERS];
        if slot.map(|s| s.payload_len()) != Some(payload_len) {
            *slot = Some(Ipv4IdSolver::new(payload_len).ok()?);
        }
        slot.as_ref()
    }

    /// Checks the ICRC of a received `packet` whose outer headers are `encap` except, for IPv4,
    /// the Identification and flags.
    pub fn check(&mut self, encap: &Encap, packet: &[u8]) -> Option<IcrcOk> {
        let v4 = match encap.ip {
            IpInfo::V6(_) => return holds(encap, packet).then_some(IcrcOk::Exact),
            IpInfo::V4(v4) => v4,
        };
        let found = icrc::stored(packet).ok()?;
        let body = &packet[..packet.len().checked_sub(ICRC_LEN)?];
        for flags_frag in [Ipv4Info::DF, 0] {
            let e = Encap {
                ip: IpInfo::V4(Ipv4Info {
                    identification: 0,
                    flags_frag,
                    ..v4
                }),
                ..*encap
            };
            let computed = e.compute(body).ok()?;
            if computed == found {
                return Some(IcrcOk::Exact);
            }
            if let Some(id) = self.solver(body.len())?.solve(found ^ computed) {
                return Some(IcrcOk::RecoveredId(id));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(s: &str, d: &str) -> Encap {
        encap(s.parse().unwrap(), d.parse().unwrap(), 4791, 4791).unwrap()
    }

    #[test]
    fn seal_then_check_and_recover_identification() {
        let mut pkt = [0u8; 48];
        pkt[0] = 0x04; // RC SEND_ONLY
        pkt[2] = 0xff;
        pkt[3] = 0xff;
        let enc = e("127.0.0.1", "127.0.0.2");
        assert!(seal(&enc, &mut pkt));
        let mut c = IcrcChecker::new();
        assert_eq!(c.check(&enc, &pkt), Some(IcrcOk::Exact));
        // A sender with a random Identification (as rxe): recovered.
        let IpInfo::V4(v4) = enc.ip else {
            unreachable!()
        };
        let rxe = Encap {
            ip: IpInfo::V4(Ipv4Info {
                identification: 0xbeef,
                ..v4
            }),
            ..enc
        };
        assert!(seal(&rxe, &mut pkt));
        assert_eq!(c.check(&enc, &pkt), Some(IcrcOk::RecoveredId(0xbeef)));
        // A flipped bit is refused.
        pkt[20] ^= 4;
        assert_eq!(c.check(&enc, &pkt), None);
        // Other addresses: refused.
        pkt[20] ^= 4;
        assert_eq!(c.check(&e("127.0.0.1", "127.0.0.3"), &pkt), None);
    }

    #[test]
    fn ipv6_exact_and_bounds() {
        let enc = e("::1", "::1");
        let mut pkt = [7u8; 32];
        assert!(seal(&enc, &mut pkt));
        let mut c = IcrcChecker::new();
        assert_eq!(c.check(&enc, &pkt), Some(IcrcOk::Exact));
        pkt[31] ^= 1;
        assert_eq!(c.check(&enc, &pkt), None);
        assert!(!seal(&enc, &mut [0u8; 15]));
        assert_eq!(c.check(&enc, &[0u8; 3]), None);
        assert!(encap("::1".parse().unwrap(), "127.0.0.1".parse().unwrap(), 1, 2).is_none());
    }
}
