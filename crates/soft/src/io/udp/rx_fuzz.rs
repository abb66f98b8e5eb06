//! Fuzzing entry point for GRO splitting (feature `fuzzing`): one UDP GRO receive, split
//! into its datagrams and each checked as the receive path does.

use rdma_wire::icrc::{Encap, IpInfo, Ipv4Info};

use super::{accept, segments};
use crate::io::icrc::{self, IcrcCheck, IcrcChecker, PLACE_IDS};
use crate::io::{Arrival, TxPlacement, WireAddr, WireStats};

/// Input: byte 0 flags (bit 0: IPv6), bytes 1-2 the GRO segment size (0: no GRO), byte 3
/// the IPv4 Identification of the first segment (a receive may start inside a GSO message),
/// bytes 4-11 which segments to seal (bit `j % 64`), then the received bytes. Segment `j`,
/// when sealed, gets the ICRC of Identification `first + j`.
///
/// Checks: the segments are the receive's bytes in order, none empty, each of the GRO size
/// but the last (at most that), numbered from 0; a sealed segment whose Identification is
/// a GSO place is accepted; an accepted segment's ICRC holds for the header its verdict
/// names; the ICRC counters move by one per refused segment.
pub(crate) fn gro_receive(input: &[u8]) {
    if input.len() < 12 {
        return;
    }
    let v6 = input[0] & 1 != 0;
    let gro_size = u16::from_be_bytes([input[1], input[2]]);
    let first = u16::from(input[3]);
    let mask = u64::from_be_bytes(input[4..12].try_into().unwrap_or_default());
    let mut whole = input[12..].to_vec();
    if whole.is_empty() {
        return;
    }
    let (src, dst): (WireAddr, WireAddr) = if v6 {
        ("fd00::2".parse().unwrap(), "fd00::1".parse().unwrap())
    } else {
        ("10.0.0.2".parse().unwrap(), "10.0.0.1".parse().unwrap())
    };
    let (sport, port) = (49152, 4791);
    let Some(base) = icrc::encap(src, dst, sport, port) else {
        return;
    };
    let id_of = |j: usize| first.wrapping_add(j as u16);
    // seal the chosen segments
    let mut sealed = Vec::new();
    for (place, seg) in segments(&mut whole, gro_size) {
        let j = usize::from(place);
        let want = mask >> (j % 64) & 1 != 0;
        sealed.push(want && icrc::seal(&icrc::with_identification(base, id_of(j)), seg));
    }
    let original = whole.clone();
    let arrival = Arrival {
        local: dst,
        remote: src,
        ifindex: 0,
        tclass: 0,
        hop_limit: 64,
        placement: TxPlacement::Inline,
    };
    let mut checker = IcrcChecker::new();
    let mut stats = WireStats::default();
    let mut seen = 0usize;
    for (k, (place, seg)) in segments(&mut whole, gro_size).enumerate() {
        let j = usize::from(place);
        assert_eq!(j, k, "segments numbered in order");
        assert!(!seg.is_empty(), "an empty segment");
        if gro_size > 0 {
            assert!(seg.len() <= usize::from(gro_size));
            assert!(
                seg.len() == usize::from(gro_size) || seen + seg.len() == original.len(),
                "only the last segment may be short"
            );
        }
        assert_eq!(&original[seen..seen + seg.len()], &seg[..]);
        seen += seg.len();
        let errors = stats.icrc_errors;
        let ok = accept(
            &mut checker,
            &mut stats,
            port,
            (&arrival, sport, place),
            seg,
        );
        assert_eq!(stats.icrc_errors, errors + u64::from(!ok));
        if sealed[j] && (v6 || id_of(j) < PLACE_IDS) {
            assert!(ok, "segment {j} sealed for its place refused");
        }
        if ok {
            // what the checker says now, from a fresh one (the verdict, not the bool)
            let verdict = IcrcChecker::new().check(&base, seg, place);
            assert!(verdict.accepted(), "{verdict:?}");
            let holds = match verdict {
                IcrcCheck::Place => icrc::holds(&icrc::with_identification(base, place), seg),
                IcrcCheck::Exact if v6 => icrc::holds(&base, seg),
                IcrcCheck::Exact => holds_v4(&base, 0, seg),
                IcrcCheck::RecoveredId(id) => holds_v4(&base, id, seg),
                _ => false,
            };
            assert!(
                holds,
                "accepted but no header makes the ICRC hold: {verdict:?}"
            );
        }
    }
    assert_eq!(seen, original.len(), "the segments cover the receive");
}

/// Whether the ICRC holds for IPv4 Identification `id`, with or without DF.
fn holds_v4(base: &Encap, id: u16, seg: &[u8]) -> bool {
    let IpInfo::V4(v4) = base.ip else {
        return false;
    };
    [Ipv4Info::DF, 0].into_iter().any(|flags_frag| {
        let e = Encap {
            ip: IpInfo::V4(Ipv4Info {
                identification: id,
                flags_frag,
                ..v4
            }),
            ..*base
        };
        icrc::holds(&e, seg)
    })
}
