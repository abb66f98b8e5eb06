//! The ICRC at the UDP wire: written on send over the IP/UDP header the kernel will write,
//! checked on receive over the header the packet must have had.
//!
//! It lives here, not in the transport, because only the UDP wire knows the outer headers;
//! packets above the wire carry 4 bytes of ICRC room at their end.
//!
//! Sending: our sockets send with DF from an unconnected socket, so Linux writes IPv4
//! Identification 0 and flags DF (checked by the `kernel_sends_identification_zero` test);
//! segment k of a UDP GSO message gets Identification k (`tests/kernel_identification.rs`).
//!
//! Receiving: the UDP socket shows neither the IPv4 Identification nor the flags. We first
//! check exactly with Identification 0 and DF (what we and Linux UDP senders with DF write),
//! then, for a datagram at place k > 0 of a UDP GRO receive, with Identification k; then ask
//! whether *some* Identification makes the ICRC valid ([`rdma_wire::icrc::Ipv4IdSolver`], CRC
//! linearity: Linux rxe sends per-destination counters from `__ip_select_ident`), with DF and
//! then without. We chose the recovery over a packet socket because it needs no privilege
//! and no second copy of every packet. Solvers (17 CRC passes to build) are cached per
//! payload length in a small direct-mapped table. IPv6 headers are known entirely.
//!
//! The recovery guards 16 bits fewer: tried with and without DF, it lets a randomly
//! corrupted datagram through with probability about 2^-15 instead of 2^-31. So which
//! Identifications it may find is limited by what the source is known to send:
//! - below [`PLACE_IDS`] (128, the kernel's largest UDP GSO segment count): a GSO segment's
//!   place, plausible from anyone (a segment received on its own, or first in a GRO receive
//!   that started inside a GSO message). Accepted; it says nothing about the source.
//! - [`PLACE_IDS`] or more: plausible only from a source that sends non-zero
//!   Identifications (rxe). A bounded table ([`SOURCES`] entries, direct-mapped by a hash of
//!   the source IPv4 address, the address kept as a tag; no allocation) counts for each
//!   source its datagrams accepted exactly with Identification 0 since its last large one.
//!   Places, found or checked at a GRO place, do not count: an rxe sender's datagrams
//!   coalesced by GRO from its Identification 0 on would match up to 64 places in a row; a
//!   GSO message of ours counts once, by its first segment. From a source with a run of at
//!   least [`ZERO_RUN`] (16) a large Identification is refused ([`IcrcCheck::Implausible`]:
//!   counted in `WireStats::icrc_implausible_id` and in `icrc_errors` too) and the run is
//!   halved, so that a source that really switched to non-zero Identifications (a peer
//!   restarted as rxe) is trusted again after at most three refusals (RC resends what was
//!   refused). From any other source it is accepted and the source's run starts again
//!   from 0.
//!
//! An rxe-like sender's datagram with Identification 0 (once per 65,536 of its counter)
//! counts one, its next ones (1, 2, ...) are places, then a large one finds a run of 1 and is
//! accepted: such a sender never reaches a run of 16.
//!
//! What remains: from a source known to send 0, a randomly corrupted datagram passes if the
//! solver finds an Identification below 128 (2^-16 * 2^-9 for each of DF and no DF: about
//! 2^-24, or 6e-8) or if its ICRC happens to hold exactly (2^-32 for each header tried).
//! From a source not known to (its first 16 datagrams, one evicted by another source that
//! hashes to its entry, one whose last large Identification came fewer than 16 datagrams of
//! Identification 0 ago, and every rxe peer) it is still about 2^-15.
//!
//! Single-bit errors (the fault injector's `corrupt`) are not random in this sense: a flip's
//! syndrome depends on its offset only, and flipping bit 3 of byte 173 (counted from the
//! BTH) makes the ICRC of every longer datagram hold for Identification 14262, bit 6 of byte
//! 1834 for 33032. Without the source table a datagram of `n` bytes hit by one flip passed
//! with probability 1/(8n) (1/2,400 at 300 bytes), which is how the soak delivered a
//! corrupted datagram; from a known source no single-bit flip in a datagram of up to 4,200
//! bytes passes (tested), from an unknown one those two still do. Two kinds of senders
//! behind one address (ours and rxe) would get the rxe one's datagrams refused while ours
//! keep the run long; we know of no such setup (each wants UDP port 4791 of the address).

use rdma_wire::icrc::{self, Encap, IpInfo, Ipv4IdSolver, Ipv4Info, Ipv6Info, ICRC_LEN};
use std::net::IpAddr;

use super::WireAddr;

/// Solvers cached, by payload length.
const SOLVERS: usize = 16;
/// Identifications below this are the places of UDP GSO segments (segment k gets k from a
/// sender that writes 0): plausible from any sender. The kernel's `UDP_MAX_SEGMENTS` is 64 or
/// 128 (ours send at most `send_batch::GSO_MAX_SEGS`); a GRO receive may start inside a GSO
/// message, so its place and the Identification need not agree.
pub(crate) const PLACE_IDS: u16 = 128;
/// Sources whose runs are kept (direct-mapped).
pub(crate) const SOURCES: usize = 256;
/// A source with this many datagrams of Identification 0 since its last large one sends 0:
/// a large recovered Identification from it is refused.
pub(crate) const ZERO_RUN: u8 = 16;
/// Where a run stops counting (a refusal halves it: from here three refusals bring it below
/// [`ZERO_RUN`]).
const RUN_CAP: u8 = 64;

/// How a received ICRC was judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IcrcCheck {
    /// Accepted exactly, with the header fully known (IPv6, or IPv4 with Identification 0).
    Exact,
    /// Accepted exactly for the IPv4 Identification of its place in a UDP GRO receive (IPv6:
    /// for its headers, at a place after the first).
    Place,
    /// Accepted with a recovered IPv4 Identification (a GSO segment's place, or a large one
    /// from a source not known to send 0).
    RecoveredId(u16),
    /// Refused: the ICRC holds only for this Identification (at least [`PLACE_IDS`]) and the
    /// source is known to send 0; most likely a corrupted datagram.
    Implausible(u16),
    /// Refused: no header makes the ICRC valid.
    Bad,
}

impl IcrcCheck {
    /// Whether the datagram is accepted.
    pub fn accepted(self) -> bool {
        matches!(
            self,
            IcrcCheck::Exact | IcrcCheck::Place | IcrcCheck::RecoveredId(_)
        )
    }
}

/// One entry of the source table: an IPv4 source address and how many of its datagrams were
/// accepted with Identification 0 since the last large one (saturating at [`RUN_CAP`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Source {
    ip: u32,
    run: u8,
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

/// The source table's entry for IPv4 address `ip` (Fibonacci hashing: the top 8 bits of the
/// product).
fn source_slot(ip: u32) -> usize {
    (ip.wrapping_mul(0x9e37_79b9) >> 24) as usize % SOURCES
}

/// Receive-side checker with its cache of Identification solvers and its table of what the
/// sources send (see the module doc). No allocation.
pub(crate) struct IcrcChecker {
    solvers: [Option<Ipv4IdSolver>; SOLVERS],
    sources: [Source; SOURCES],
}

impl IcrcChecker {
    pub fn new() -> IcrcChecker {
        IcrcChecker {
            solvers: [None; SOLVERS],
            sources: [Source::default(); SOURCES],
        }
    }

    fn solver(&mut self, payload_len: usize) -> Option<&Ipv4IdSolver> {
        let slot = &mut self.solvers[(payload_len / 4) % SOLVERS];
        if slot.map(|s| s.payload_len()) != Some(payload_len) {
            *slot = Some(Ipv4IdSolver::new(payload_len).ok()?);
        }
        slot.as_ref()
    }

    /// The table entry of source `ip`, taken over (run 0) if another source held it.
    fn source(&mut self, ip: [u8; 4]) -> &mut Source {
        let ip = u32::from_be_bytes(ip);
        let s = &mut self.sources[source_slot(ip)];
        if s.ip != ip {
            *s = Source { ip, run: 0 };
        }
        s
    }

    /// Checks the ICRC of a received `packet` whose outer headers are `encap` except, for IPv4,
    /// the Identification and flags; `place` is its position in a UDP GRO receive (0: first
    /// or alone). Learns from IPv4 sources what Identifications they send.
    pub fn check(&mut self, encap: &Encap, packet: &[u8], place: u16) -> IcrcCheck {
        // A place says nothing about the source either: an rxe sender's run coalesced by GRO
        // from its Identification 0 on would match up to 64 places in a row.
        if place > 0 && holds(&with_identification(*encap, place), packet) {
            return IcrcCheck::Place;
        }
        let v4 = match encap.ip {
            IpInfo::V6(_) if holds(encap, packet) => return IcrcCheck::Exact,
            IpInfo::V6(_) => return IcrcCheck::Bad,
            IpInfo::V4(v4) => v4,
        };
        let Some(id) = self.solve(encap, v4, packet) else {
            return IcrcCheck::Bad;
        };
        let s = self.source(v4.src);
        match id {
            0 => {
                s.run = (s.run + 1).min(RUN_CAP);
                IcrcCheck::Exact
            }
            // a GSO segment's place: from anyone, and no sign of what the source sends
            id if id < PLACE_IDS => IcrcCheck::RecoveredId(id),
            id if s.run >= ZERO_RUN => {
                s.run /= 2;
                IcrcCheck::Implausible(id)
            }
            id => {
                s.run = 0;
                IcrcCheck::RecoveredId(id)
            }
        }
    }

    /// The IPv4 Identification (0 when exact) for which `packet`'s ICRC holds, with DF or
    /// without.
    fn solve(&mut self, encap: &Encap, v4: Ipv4Info, packet: &[u8]) -> Option<u16> {
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
                return Some(0);
            }
            if let Some(id) = self.solver(body.len())?.solve(found ^ computed) {
                return Some(id);
            }
        }
        None
    }

    /// Sources with a run (at most [`SOURCES`]).
    #[cfg(test)]
    fn known_sources(&self) -> usize {
        self.sources.iter().filter(|s| s.run > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(s: &str, d: &str) -> Encap {
        encap(s.parse().unwrap(), d.parse().unwrap(), 4791, 4791).unwrap()
    }

    /// An RC SEND_ONLY of `len` bytes (ICRC included) whose payload says `tag`, sealed for
    /// `encap` with IPv4 Identification `id`.
    fn sealed(encap: &Encap, id: u16, len: usize, tag: u32) -> Vec<u8> {
        let mut pkt = vec![0u8; len];
        pkt[0] = 0x04;
        pkt[2] = 0xff;
        pkt[3] = 0xff;
        pkt[12..16].copy_from_slice(&tag.to_be_bytes());
        assert!(seal(&with_identification(*encap, id), &mut pkt));
        pkt
    }

    #[test]
    fn seal_then_check_and_recover_identification() {
        let enc = e("127.0.0.1", "127.0.0.2");
        let mut pkt = sealed(&enc, 0, 48, 0);
        let mut c = IcrcChecker::new();
        assert_eq!(c.check(&enc, &pkt, 0), IcrcCheck::Exact);
        // A sender with a random Identification (as rxe): recovered.
        pkt = sealed(&enc, 0xbeef, 48, 0);
        assert_eq!(c.check(&enc, &pkt, 0), IcrcCheck::RecoveredId(0xbeef));
        // A flipped bit is refused.
        pkt[20] ^= 4;
        assert_eq!(c.check(&enc, &pkt, 0), IcrcCheck::Bad);
        // Other addresses: refused.
        pkt[20] ^= 4;
        assert_eq!(
            c.check(&e("127.0.0.1", "127.0.0.3"), &pkt, 0),
            IcrcCheck::Bad
        );
        // Without DF (Identification 0, then recovered).
        let IpInfo::V4(v4) = enc.ip else {
            unreachable!()
        };
        let no_df = Encap {
            ip: IpInfo::V4(Ipv4Info {
                flags_frag: 0,
                ..v4
            }),
            ..enc
        };
        assert_eq!(
            c.check(&enc, &sealed(&no_df, 0, 48, 1), 0),
            IcrcCheck::Exact
        );
        let p = sealed(&no_df, 0x1234, 48, 1);
        assert_eq!(c.check(&enc, &p, 0), IcrcCheck::RecoveredId(0x1234));
        // At a GRO place: checked for the place's Identification.
        assert_eq!(c.check(&enc, &sealed(&enc, 3, 48, 2), 3), IcrcCheck::Place);
        assert_eq!(
            c.check(&enc, &sealed(&enc, 9, 48, 2), 3),
            IcrcCheck::RecoveredId(9)
        );
    }

    #[test]
    fn ipv6_exact_and_bounds() {
        let enc = e("::1", "::1");
        let mut pkt = [7u8; 32];
        assert!(seal(&enc, &mut pkt));
        let mut c = IcrcChecker::new();
        assert_eq!(c.check(&enc, &pkt, 0), IcrcCheck::Exact);
        assert_eq!(c.check(&enc, &pkt, 2), IcrcCheck::Place);
        pkt[31] ^= 1;
        assert_eq!(c.check(&enc, &pkt, 0), IcrcCheck::Bad);
        assert!(!seal(&enc, &mut [0u8; 15]));
        assert_eq!(c.check(&enc, &[0u8; 3], 0), IcrcCheck::Bad);
        assert_eq!(
            c.check(&e("127.0.0.1", "127.0.0.2"), &[0u8; 3], 0),
            IcrcCheck::Bad
        );
        assert!(encap("::1".parse().unwrap(), "127.0.0.1".parse().unwrap(), 1, 2).is_none());
    }

    /// Linux rxe's Identifications: a per-destination counter (`__ip_select_ident`), here
    /// crossing 0, received one by one and coalesced by GRO (a receive starting at its
    /// Identification 0 matches its places): every datagram is accepted, before and after 0.
    #[test]
    fn an_rxe_like_sender_is_accepted_on_every_datagram() {
        let enc = e("192.0.2.7", "192.0.2.1");
        for gro in [1u16, 32] {
            let mut c = IcrcChecker::new();
            // start so that a GRO receive begins at Identification 0
            let start = 0u16.wrapping_sub(40 * gro);
            for k in 0..3000u16 {
                let id = start.wrapping_add(k);
                let place = k % gro;
                let pkt = sealed(&enc, id, 64 + 4 * usize::from(k % 5), u32::from(k));
                let got = c.check(&enc, &pkt, place);
                assert!(
                    got.accepted(),
                    "Identification {id} at place {place}: {got:?}"
                );
            }
        }
        // Random Identifications, with a 0 every few datagrams (far more often than rxe's):
        // still every one.
        let mut c = IcrcChecker::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for k in 0..2000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = if k % 7 == 0 { 0 } else { x as u16 };
            let got = c.check(&enc, &sealed(&enc, id, 48, k), 0);
            assert!(got.accepted(), "Identification {id}: {got:?}");
        }
    }

    /// What the solver accepts from a corrupted datagram is exactly a datagram valid for
    /// another Identification: one sealed for a large Identification, from a source that
    /// sends 0, is refused once the source is known; GSO places still pass.
    #[test]
    fn a_large_identification_from_a_zero_identification_source_is_refused() {
        let enc = e("192.0.2.2", "192.0.2.1");
        let mut c = IcrcChecker::new();
        // not known yet: accepted (and the run starts again)
        for k in 0..ZERO_RUN as u32 - 1 {
            assert_eq!(c.check(&enc, &sealed(&enc, 0, 48, k), 0), IcrcCheck::Exact);
        }
        let p = sealed(&enc, 0x9999, 48, 99);
        assert_eq!(c.check(&enc, &p, 0), IcrcCheck::RecoveredId(0x9999));
        for k in 0..ZERO_RUN as u32 + 4 {
            assert_eq!(c.check(&enc, &sealed(&enc, 0, 48, k), 0), IcrcCheck::Exact);
        }
        // known: refused
        let forged = sealed(&enc, 0xbeef, 48, 7);
        assert_eq!(c.check(&enc, &forged, 0), IcrcCheck::Implausible(0xbeef));
        // GSO places: segments received apart, or a GRO receive that began inside a message
        let mut run = ZERO_RUN + 4;
        run /= 2;
        for _ in 0..2 {
            for id in [1, 5, 63, PLACE_IDS - 1] {
                let p = sealed(&enc, id, 48, 8);
                assert_eq!(c.check(&enc, &p, 0), IcrcCheck::RecoveredId(id));
                assert_eq!(c.check(&enc, &p, id), IcrcCheck::Place);
            }
            // Identification 0 again, up to a run that refuses
            while run < ZERO_RUN {
                assert_eq!(c.check(&enc, &sealed(&enc, 0, 48, 9), 0), IcrcCheck::Exact);
                run += 1;
            }
            let p = sealed(&enc, PLACE_IDS, 48, 10);
            assert_eq!(c.check(&enc, &p, 0), IcrcCheck::Implausible(PLACE_IDS));
            run /= 2;
        }
        // another source, and another destination of the same: not known
        let other = e("192.0.2.3", "192.0.2.1");
        let p = sealed(&other, 0xbeef, 48, 7);
        assert_eq!(c.check(&other, &p, 0), IcrcCheck::RecoveredId(0xbeef));
        // (the run was halved to 8 by the last refusal)
        let to = e("192.0.2.2", "192.0.2.9");
        for k in 0..u32::from(ZERO_RUN) - u32::from(run) {
            assert_eq!(c.check(&to, &sealed(&to, 0, 48, k), 0), IcrcCheck::Exact);
        }
        let p = sealed(&to, 0xbeef, 48, 7);
        assert_eq!(c.check(&to, &p, 0), IcrcCheck::Implausible(0xbeef));
    }

    /// The fault injector's corruption, one random bit flipped, is where the recovery was
    /// weakest: the syndrome of a flip depends on its offset only, so that flipping bit 3 of
    /// byte 173 makes any longer datagram's ICRC hold for Identification 14262 (bit 6 of byte
    /// 1834: 33032), 1 in 8 x length for a datagram hit by one flip, not 2^-15. From a source
    /// known to send 0, no single-bit flip in a datagram of up to 4,200 bytes passes (the
    /// flips of BTH byte 4 are in bits the ICRC masks).
    #[test]
    fn no_single_bit_flip_passes_from_a_known_zero_identification_source() {
        let enc = e("192.0.2.2", "192.0.2.1");
        let mut c = IcrcChecker::new();
        let mut p = sealed(&enc, 0, 4200, 1);
        let mut refused = Vec::new();
        for bit in 0..p.len() * 8 {
            // the source is known (again, after a refusal halved its run)
            if bit == 0 || refused.last().is_some_and(|&(_, at)| at + 1 == bit) {
                for _ in 0..ZERO_RUN {
                    assert_eq!(c.check(&enc, &p, 0), IcrcCheck::Exact);
                }
            }
            let (byte, mask) = (bit / 8, 1u8 << (bit % 8));
            p[byte] ^= mask;
            match c.check(&enc, &p, 0) {
                IcrcCheck::Bad => {}
                IcrcCheck::Exact => assert_eq!(byte, 4, "bit {bit}: masked"),
                IcrcCheck::Implausible(id) => refused.push((id, bit)),
                got => panic!("byte {byte} bit {}: {got:?}", bit % 8),
            }
            p[byte] ^= mask;
        }
        assert_eq!(refused, [(14262, 173 * 8 + 3), (33032, 1834 * 8 + 6)]);
    }

    /// A source known to send 0 that turns into an rxe peer (restarted): at most three of its
    /// datagrams are refused, then all of them pass.
    #[test]
    fn a_source_that_switches_to_large_identifications_is_trusted_again() {
        let enc = e("192.0.2.4", "192.0.2.1");
        let mut c = IcrcChecker::new();
        for k in 0..1000 {
            assert_eq!(c.check(&enc, &sealed(&enc, 0, 48, k), 0), IcrcCheck::Exact);
        }
        let mut refused = 0;
        for k in 0..500u16 {
            let id = 20_000 + k;
            match c.check(&enc, &sealed(&enc, id, 48, u32::from(k)), 0) {
                IcrcCheck::Implausible(i) => {
                    assert_eq!(i, id);
                    assert_eq!(u32::from(k), refused, "refusals come first");
                    refused += 1;
                }
                got => assert_eq!(got, IcrcCheck::RecoveredId(id)),
            }
        }
        assert_eq!(refused, 3);
    }

    /// The source table is fixed: many sources evict one another and it never grows; an
    /// entry taken by another source forgets the old one (checked by its tag).
    #[test]
    fn the_source_table_is_bounded() {
        let mut c = IcrcChecker::new();
        let size = std::mem::size_of_val(&c);
        let src = |n: u32| format!("10.{}.{}.{}", n >> 16, (n >> 8) & 255, n & 255);
        let at = |n: u32| source_slot(n | 10 << 24);
        let mut slots = std::collections::HashSet::new();
        for n in 1..=4096u32 {
            let enc = e(&src(n), "192.0.2.1");
            for _ in 0..ZERO_RUN {
                assert_eq!(c.check(&enc, &sealed(&enc, 0, 48, n), 0), IcrcCheck::Exact);
            }
            slots.insert(at(n));
            assert!(c.known_sources() <= SOURCES);
        }
        assert_eq!(c.known_sources(), slots.len());
        assert!(
            slots.len() > SOURCES * 3 / 4,
            "spread: {} slots",
            slots.len()
        );
        assert_eq!(std::mem::size_of_val(&c), size);
        // the last source is known; one that shares its entry is not, and takes it over
        let last = e(&src(4096), "192.0.2.1");
        let twin = (5000..).find(|&n| at(n) == at(4096)).unwrap();
        let twin = e(&src(twin), "192.0.2.1");
        let p = sealed(&twin, 0xbeef, 48, 1);
        assert_eq!(c.check(&twin, &p, 0), IcrcCheck::RecoveredId(0xbeef));
        let p = sealed(&last, 0xbeef, 48, 1);
        assert_eq!(c.check(&last, &p, 0), IcrcCheck::RecoveredId(0xbeef));
    }
}
