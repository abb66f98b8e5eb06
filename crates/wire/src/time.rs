//! The IBA time encoding used by CM timeouts and ACK delays.
//!
//! A 5-bit value `t` stands for 4.096 µs × 2^t (IBA vol1 12.6 and 9.7.6.1.3), from 4.096 µs
//! (`t` = 0) to about 2.4 hours (`t` = 31).

use core::time::Duration;

/// A 5-bit IBA time value: 4.096 µs × 2^t.
///
/// ```
/// use rdma_wire::time::IbaTime;
/// use std::time::Duration;
///
/// let t = IbaTime::new(20).unwrap();          // rdma_cm's CM response timeout
/// assert_eq!(t.to_duration(), Duration::from_nanos(4096 << 20)); // ≈ 4.29 s
/// assert_eq!(t.to_linux_cm_ms(), 4096);       // Linux's cm_convert_to_ms
/// assert_eq!(IbaTime::from_duration_ceil(Duration::from_secs(4)), Some(t));
/// assert_eq!(IbaTime::new(32), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct IbaTime(u8);

impl IbaTime {
    /// The shortest time, 4.096 µs.
    pub const MIN: IbaTime = IbaTime(0);
    /// The longest time, 4.096 µs × 2^31 (about 2.4 hours).
    pub const MAX: IbaTime = IbaTime(31);

    /// The value `t`, or `None` if it does not fit in 5 bits.
    pub const fn new(t: u8) -> Option<IbaTime> {
        if t <= 31 {
            Some(IbaTime(t))
        } else {
            None
        }
    }

    /// The low 5 bits of `t` (what a 5-bit wire field holds).
    pub const fn from_bits_truncate(t: u8) -> IbaTime {
        IbaTime(t & 0x1f)
    }

    /// The encoded value `t` (0..=31).
    pub const fn value(self) -> u8 {
        self.0
    }

    /// The exact duration, 4.096 µs × 2^t.
    pub const fn to_duration(self) -> Duration {
        Duration::from_nanos(4096u64 << self.0)
    }

    /// The smallest value whose duration is at least `d`; `None` if `d` is longer than
    /// [`IbaTime::MAX`].
    pub fn from_duration_ceil(d: Duration) -> Option<IbaTime> {
        (0u8..=31).map(IbaTime).find(|t| t.to_duration() >= d)
    }

    /// Linux's approximation in milliseconds (`cm_convert_to_ms`): `1 << max(t - 8, 0)`.
    ///
    /// It is what the kernel's CM uses for its timers, e.g. 4096 ms for `t` = 20 where the
    /// exact value is 4295 ms, and 1 ms for every `t` ≤ 8.
    pub const fn to_linux_cm_ms(self) -> u64 {
        1u64 << self.0.saturating_sub(8)
    }

    /// [`Self::to_linux_cm_ms`] as a `Duration`.
    pub const fn to_linux_cm_duration(self) -> Duration {
        Duration::from_millis(self.to_linux_cm_ms())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_round_trips_through_its_duration() {
        for t in 0..=31 {
            let x = IbaTime::new(t).unwrap();
            assert_eq!(IbaTime::from_duration_ceil(x.to_duration()), Some(x));
            let just_over = x.to_duration() + Duration::from_nanos(1);
            assert_eq!(
                IbaTime::from_duration_ceil(just_over),
                IbaTime::new(t + 1),
                "t={t}"
            );
        }
        assert_eq!(
            IbaTime::from_duration_ceil(Duration::ZERO),
            Some(IbaTime::MIN)
        );
    }

    #[test]
    fn linux_approximation() {
        assert_eq!(IbaTime::new(0).unwrap().to_linux_cm_ms(), 1);
        assert_eq!(IbaTime::new(8).unwrap().to_linux_cm_ms(), 1);
        assert_eq!(IbaTime::new(9).unwrap().to_linux_cm_ms(), 2);
        assert_eq!(IbaTime::new(16).unwrap().to_linux_cm_ms(), 256);
        assert_eq!(IbaTime::new(24).unwrap().to_linux_cm_ms(), 65536);
        assert_eq!(IbaTime::MAX.to_linux_cm_ms(), 1 << 23);
        assert_eq!(IbaTime::from_bits_truncate(0xff), IbaTime::MAX);
    }
}
