//! 24-bit packet sequence numbers with modulo arithmetic.
//!
//! ```
//! use rdma_proto::psn::{psn_add, psn_diff};
//! assert_eq!(psn_add(0xFF_FFFF, 2), 1);
//! assert_eq!(psn_diff(1, 0xFF_FFFF), 2);
//! assert_eq!(psn_diff(0xFF_FFFF, 1), -2);
//! ```

/// Mask of the 24 PSN bits.
pub const PSN_MASK: u32 = 0xFF_FFFF;

/// `a + n` modulo 2^24.
#[inline]
pub fn psn_add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & PSN_MASK
}

/// `a - b` as a signed distance in `-2^23 .. 2^23` (positive: `a` is after `b`).
#[inline]
pub fn psn_diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b)) << 8) as i32 >> 8
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn wraps() {
        assert_eq!(psn_diff(5, 5), 0);
        assert_eq!(psn_diff(0x80_0000, 0), -0x80_0000);
        assert_eq!(psn_diff(0x7F_FFFF, 0), 0x7F_FFFF);
        assert_eq!(psn_add(0x7F_FFFF, 1), 0x80_0000);
        for a in [0u32, 1, 0xFF_FFFF, 0x12_3456] {
            for n in [0u32, 1, 100, 0x7F_FFFF] {
                assert_eq!(psn_diff(psn_add(a, n), a), n as i32);
            }
        }
    }
}
