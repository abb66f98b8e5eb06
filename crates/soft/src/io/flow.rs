//! The UDP source port of a QP's datagrams, as Linux chooses it.
//!
//! RoCEv2 lets a sender pick any source port; switches hash it for ECMP and NICs for RSS, so
//! Linux spreads flows with it. rxe gives every QP `0xC000 | hash(qpn)` at creation (the port
//! UD QPs and QP1 keep) and, when a connected QP gets its address vector, the port of its
//! flow label, or of a label derived from both QPNs when the AV's is 0 (the kernel's
//! `rdma_get_udp_sport`). Both ends of an RC connection derive the same label.

/// The lowest source port RoCEv2 senders use (the dynamic range `0xC000..=0xFFFF`).
pub const ROCE_SPORT_MIN: u16 = 0xC000;

/// The source port of a 20-bit flow label: its low 14 bits XOR its high 6, in the dynamic
/// range (the kernel's `rdma_flow_label_to_udp_sport`).
///
/// ```
/// use rdma_soft::io::flow::flow_label_to_udp_sport;
/// assert_eq!(flow_label_to_udp_sport(0), 0xC000);
/// assert_eq!(flow_label_to_udp_sport(0x3FFF), 0xFFFF);
/// assert_eq!(flow_label_to_udp_sport(0x4001), 0xC000); // high bit 0 cancels low bit 0
/// ```
pub const fn flow_label_to_udp_sport(flow_label: u32) -> u16 {
    let low = flow_label & 0x3FFF;
    let high = (flow_label & 0xF_C000) >> 14;
    // masked to 14 bits: the cast keeps every bit
    ROCE_SPORT_MIN | ((low ^ high) & 0x3FFF) as u16
}

/// A flow label from a connection's two QPNs, the same from either end (the kernel's
/// `rdma_calc_flow_label`: their product folded to 20 bits).
///
/// ```
/// use rdma_soft::io::flow::calc_flow_label;
/// assert_eq!(calc_flow_label(0x11, 0x22), calc_flow_label(0x22, 0x11));
/// assert_eq!(calc_flow_label(3, 5), 15);
/// assert!(calc_flow_label(0xFF_FFFF, 0xFF_FFFE) <= 0xF_FFFF);
/// ```
pub const fn calc_flow_label(lqpn: u32, rqpn: u32) -> u32 {
    let mut v = lqpn as u64 * rqpn as u64;
    v ^= v >> 20;
    v ^= v >> 40;
    (v & 0xF_FFFF) as u32
}

/// The source port of a connected QP: that of the path's flow label, or when the label is
/// 0 of [`calc_flow_label`] (the kernel's `rdma_get_udp_sport`, which rxe applies when the
/// address vector is set).
///
/// ```
/// use rdma_soft::io::flow::{connected_udp_sport, flow_label_to_udp_sport};
/// assert_eq!(connected_udp_sport(0x12345, 7, 9), flow_label_to_udp_sport(0x12345));
/// assert_eq!(connected_udp_sport(0, 0x11, 0x22), connected_udp_sport(0, 0x22, 0x11));
/// ```
pub const fn connected_udp_sport(flow_label: u32, lqpn: u32, rqpn: u32) -> u16 {
    let fl = if flow_label == 0 {
        calc_flow_label(lqpn, rqpn)
    } else {
        flow_label
    };
    flow_label_to_udp_sport(fl)
}

/// The source port rxe gives a QP when it is created, and which UD QPs and QP1 keep:
/// `0xC000` plus the top 14 bits of the QPN times the kernel's 32-bit golden ratio
/// (`hash_32(qpn, 14)`).
///
/// ```
/// use rdma_soft::io::flow::{qpn_udp_sport, GSI_UDP_SPORT};
/// assert_eq!(GSI_UDP_SPORT, qpn_udp_sport(1));
/// assert_eq!(qpn_udp_sport(0), 0xC000);
/// assert!(qpn_udp_sport(0x12_3456) >= 0xC000);
/// ```
pub const fn qpn_udp_sport(qpn: u32) -> u16 {
    const GOLDEN_RATIO_32: u32 = 0x61C8_8647;
    ROCE_SPORT_MIN + (qpn.wrapping_mul(GOLDEN_RATIO_32) >> 18) as u16
}

/// The source port of QP1's MADs (rxe's GSI QP is QP number 1).
pub const GSI_UDP_SPORT: u16 = qpn_udp_sport(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_values() {
        // 0x61C88647 >> 18 = 0x1872
        assert_eq!(GSI_UDP_SPORT, 0xD872);
        // 2 * 0x61C88647 = 0xC3910C8E; >> 18 = 0x30E4
        assert_eq!(qpn_udp_sport(2), 0xF0E4);
        // label 0xABCDE: low 0x3CDE ^ high 0x2A = 0x3CF4
        assert_eq!(flow_label_to_udp_sport(0xA_BCDE), 0xFCF4);
        // product 0x1_0000_0000 (2^32): ^ >> 20 = 0x1000; ^ >> 40 = 0 -> 0x1000 & 0xFFFFF
        assert_eq!(calc_flow_label(0x1_0000, 0x1_0000), 0x1000);
        assert_eq!(connected_udp_sport(0, 0x1_0000, 0x1_0000), 0xD000);
    }
}
