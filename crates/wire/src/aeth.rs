//! ACK Extended Transport Header (IBA Vol. 1 §9.3, §9.7.5), 4 bytes: Syndrome (1),
//! MSN (3). Carried by acknowledgements and by the first, last and only RDMA READ responses.
//!
//! Syndrome bit 7 is reserved, bits 6:5 say what the low five bits mean: `00` ACK (credit
//! count), `01` RNR NAK (RNR timer), `11` NAK (NAK code); `10` is reserved.
//!
//! Choices: a syndrome with bit 7 set or with the reserved type `10` has no meaning and is
//! rejected with [`Error::BadField`]`("aeth.syndrome")`. The reserved NAK codes 5..=31 are kept
//! representable as [`NakCode::Reserved`], because the IBA tells the requester how to react to
//! them (as to an invalid request), which only the layer above can do.

use core::time::Duration;

use crate::bth::MAX_U24;
use crate::field::{check_len, get_u24, set_u24};
use crate::{Error, Result};

/// Length of the AETH in bytes.
pub const AETH_LEN: usize = 4;

/// A read/write view of an AETH.
///
/// ```
/// use rdma_wire::aeth::Aeth;
/// let aeth = Aeth::new_checked(&[0x1fu8, 0, 0, 5][..]).unwrap();
/// assert_eq!((aeth.syndrome(), aeth.msn()), (0x1f, 5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aeth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Aeth<T> {
    /// Wraps a buffer without checking its length; getters panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> Self {
        Aeth { buffer }
    }

    /// Wraps a buffer after checking that it holds a whole AETH.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check_len(buffer.as_ref(), AETH_LEN)?;
        Ok(Aeth { buffer })
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Syndrome, raw.
    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    /// MSN: message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        get_u24(self.buffer.as_ref(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    /// Sets Syndrome.
    pub fn set_syndrome(&mut self, v: u8) {
        self.buffer.as_mut()[0] = v;
    }

    /// Sets MSN (low 24 bits of `v`).
    pub fn set_msn(&mut self, v: u32) {
        set_u24(self.buffer.as_mut(), 1, v);
    }
}

/// An RNR timer code (0..=31), the minimum time a requester waits after an RNR NAK.
///
/// ```
/// use core::time::Duration;
/// use rdma_wire::aeth::RnrTimer;
/// assert_eq!(RnrTimer::new(0).unwrap().duration(), Duration::from_micros(655_360));
/// assert_eq!(RnrTimer::new(1).unwrap().duration(), Duration::from_micros(10));
/// assert_eq!(RnrTimer::new(31).unwrap().duration(), Duration::from_micros(491_520));
/// assert!(RnrTimer::new(32).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RnrTimer(u8);

/// RNR timer durations in microseconds, by code (IBA Vol. 1 ch. 9).
const RNR_MICROS: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

impl RnrTimer {
    /// A timer from its 5-bit code; [`Error::BadField`] above 31.
    pub fn new(code: u8) -> Result<Self> {
        if code < 32 {
            Ok(RnrTimer(code))
        } else {
            Err(Error::BadField("aeth.rnr_timer"))
        }
    }

    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// The time the code stands for (code 0 is the longest, 655.36 ms).
    pub fn duration(self) -> Duration {
        Duration::from_micros(u64::from(RNR_MICROS[usize::from(self.0 & 0x1f)]))
    }
}

/// The NAK codes of a NAK syndrome.
///
/// ```
/// use rdma_wire::aeth::NakCode;
/// assert_eq!(NakCode::from_code(2), NakCode::RemoteAccessError);
/// assert_eq!(NakCode::from_code(9), NakCode::Reserved(9));
/// assert_eq!(NakCode::Reserved(9).code(), 9);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error.
    PsnSequenceError,
    /// 1: invalid request.
    InvalidRequest,
    /// 2: remote access error.
    RemoteAccessError,
    /// 3: remote operational error.
    RemoteOperationalError,
    /// 4: invalid RD request.
    InvalidRdRequest,
    /// 5..=31: reserved codes, kept as received.
    Reserved(u8),
}

impl NakCode {
    /// The code for the low five bits of a syndrome (higher bits ignored).
    pub const fn from_code(code: u8) -> Self {
        match code & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }

    /// The 5-bit code (a `Reserved` value is returned as held, even if out of range).
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c,
        }
    }
}

/// Credit counts by ACK credit code 0..=30 (IBA Vol. 1 ch. 9); code 31 means "invalid".
const CREDITS: [u16; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

/// The decoded AETH syndrome.
///
/// ```
/// use rdma_wire::aeth::{AethSyndrome, NakCode, RnrTimer};
/// assert_eq!(AethSyndrome::from_byte(0x1f), Ok(AethSyndrome::Ack { credits: 0x1f }));
/// assert_eq!(AethSyndrome::from_byte(0x20), Ok(AethSyndrome::RnrNak { timer: RnrTimer::new(0).unwrap() }));
/// assert_eq!(AethSyndrome::from_byte(0x62), Ok(AethSyndrome::Nak(NakCode::RemoteAccessError)));
/// assert!(AethSyndrome::from_byte(0x40).is_err());
/// assert_eq!(AethSyndrome::Nak(NakCode::PsnSequenceError).to_byte(), Ok(0x60));
/// assert_eq!(AethSyndrome::Ack { credits: 5 }.credit_count(), Some(6));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethSyndrome {
    /// ACK, with the 5-bit credit code (0x1f = credits invalid, e.g. with an SRQ).
    Ack {
        /// Credit code, 0..=31.
        credits: u8,
    },
    /// Receiver not ready, retry after the timer.
    RnrNak {
        /// The RNR timer code.
        timer: RnrTimer,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
}

impl AethSyndrome {
    /// The credit code meaning "credit count invalid".
    pub const CREDITS_INVALID: u8 = 0x1f;

    /// Decodes a syndrome byte; [`Error::BadField`] for bit 7 set or the reserved type `10`.
    pub fn from_byte(b: u8) -> Result<Self> {
        let low = b & 0x1f;
        match b >> 5 {
            0 => Ok(AethSyndrome::Ack { credits: low }),
            1 => Ok(AethSyndrome::RnrNak {
                timer: RnrTimer(low),
            }),
            3 => Ok(AethSyndrome::Nak(NakCode::from_code(low))),
            _ => Err(Error::BadField("aeth.syndrome")),
        }
    }

    /// Encodes the syndrome byte; [`Error::BadField`] if a code does not fit 5 bits.
    pub fn to_byte(self) -> Result<u8> {
        let (kind, low) = match self {
            AethSyndrome::Ack { credits } => (0, credits),
            AethSyndrome::RnrNak { timer } => (1, timer.code()),
            AethSyndrome::Nak(code) => (3, code.code()),
        };
        if low > 0x1f {
            return Err(Error::BadField("aeth.syndrome"));
        }
        Ok(kind << 5 | low)
    }

    /// The ACK advertising `available` receive WQEs: the largest credit count of the table
    /// not above it (codes 0..=30; at most 32768).
    ///
    /// ```
    /// use rdma_wire::aeth::AethSyndrome;
    /// assert_eq!(AethSyndrome::ack_with_credits(0), AethSyndrome::Ack { credits: 0 });
    /// assert_eq!(AethSyndrome::ack_with_credits(7).credit_count(), Some(6));
    /// assert_eq!(AethSyndrome::ack_with_credits(256).credit_count(), Some(256));
    /// assert_eq!(AethSyndrome::ack_with_credits(usize::MAX).credit_count(), Some(32768));
    /// ```
    pub fn ack_with_credits(available: usize) -> Self {
        let code = CREDITS.partition_point(|&c| usize::from(c) <= available) - 1;
        AethSyndrome::Ack {
            credits: code as u8,
        }
    }

    /// For an ACK, the credit count its code stands for; `None` for code 0x1f (invalid) and
    /// for NAKs.
    pub fn credit_count(self) -> Option<u16> {
        match self {
            AethSyndrome::Ack { credits } => CREDITS.get(usize::from(credits)).copied(),
            _ => None,
        }
    }
}

/// A parsed AETH.
///
/// ```
/// use rdma_wire::aeth::{Aeth, AethRepr, AethSyndrome, NakCode};
/// let repr = AethRepr { syndrome: AethSyndrome::Nak(NakCode::PsnSequenceError), msn: 3 };
/// let mut buf = [0u8; AethRepr::LEN];
/// repr.emit(&mut Aeth::new_unchecked(&mut buf[..])).unwrap();
/// assert_eq!(buf, [0x60, 0, 0, 3]);
/// assert_eq!(AethRepr::parse(&Aeth::new_checked(&buf[..]).unwrap()), Ok(repr));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// Syndrome.
    pub syndrome: AethSyndrome,
    /// MSN, 24 bits.
    pub msn: u32,
}

impl AethRepr {
    /// Length of the header in bytes.
    pub const LEN: usize = AETH_LEN;

    /// Parses an AETH view.
    pub fn parse<T: AsRef<[u8]>>(aeth: &Aeth<T>) -> Result<Self> {
        check_len(aeth.buffer.as_ref(), AETH_LEN)?;
        Ok(AethRepr {
            syndrome: AethSyndrome::from_byte(aeth.syndrome())?,
            msn: aeth.msn(),
        })
    }

    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        AETH_LEN
    }

    /// Writes the header into `aeth`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, aeth: &mut Aeth<T>) -> Result<()> {
        let syndrome = self.syndrome.to_byte()?;
        if self.msn > MAX_U24 {
            return Err(Error::BadField("aeth.msn"));
        }
        let have = aeth.buffer.as_ref().len();
        if have < AETH_LEN {
            return Err(Error::BufferTooSmall {
                need: AETH_LEN,
                have,
            });
        }
        aeth.set_syndrome(syndrome);
        aeth.set_msn(self.msn);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn bytes_round_trip_or_reserved(bytes in any::<[u8; AETH_LEN]>()) {
            match AethRepr::parse(&Aeth::new_checked(&bytes[..]).unwrap()) {
                Ok(repr) => {
                    let mut out = [0u8; AETH_LEN];
                    repr.emit(&mut Aeth::new_unchecked(&mut out[..])).unwrap();
                    prop_assert_eq!(out, bytes);
                }
                Err(e) => {
                    prop_assert_eq!(e, Error::BadField("aeth.syndrome"));
                    prop_assert!(bytes[0] & 0x80 != 0 || bytes[0] >> 5 == 2);
                }
            }
        }

        #[test]
        fn repr_round_trips(kind in 0u8..3, low in 0u8..32, msn in 0..=MAX_U24) {
            let syndrome = match kind {
                0 => AethSyndrome::Ack { credits: low },
                1 => AethSyndrome::RnrNak { timer: RnrTimer::new(low).unwrap() },
                _ => AethSyndrome::Nak(NakCode::from_code(low)),
            };
            let repr = AethRepr { syndrome, msn };
            let mut buf = [0u8; AETH_LEN];
            repr.emit(&mut Aeth::new_unchecked(&mut buf[..])).unwrap();
            prop_assert_eq!(AethRepr::parse(&Aeth::new_unchecked(&buf[..])), Ok(repr));
        }
    }

    #[test]
    fn table_values_and_errors() {
        assert_eq!(
            RnrTimer::new(14).unwrap().duration(),
            Duration::from_micros(1280)
        );
        assert_eq!(
            RnrTimer::new(20).unwrap().duration(),
            Duration::from_micros(10_240)
        );
        assert_eq!(AethSyndrome::Ack { credits: 31 }.credit_count(), None);
        assert_eq!(
            AethSyndrome::Ack { credits: 30 }.credit_count(),
            Some(32768)
        );
        assert_eq!(
            AethSyndrome::Nak(NakCode::InvalidRdRequest).credit_count(),
            None
        );
        assert_eq!(
            AethSyndrome::Ack { credits: 32 }.to_byte(),
            Err(Error::BadField("aeth.syndrome"))
        );
        assert_eq!(
            AethSyndrome::Nak(NakCode::Reserved(40)).to_byte(),
            Err(Error::BadField("aeth.syndrome"))
        );
        let mut buf = [0u8; 4];
        let repr = AethRepr {
            syndrome: AethSyndrome::Ack { credits: 0 },
            msn: 1 << 24,
        };
        assert_eq!(
            repr.emit(&mut Aeth::new_unchecked(&mut buf[..])),
            Err(Error::BadField("aeth.msn"))
        );
        let repr = AethRepr { msn: 0, ..repr };
        assert_eq!(
            repr.emit(&mut Aeth::new_unchecked(&mut buf[..3])),
            Err(Error::BufferTooSmall { need: 4, have: 3 })
        );
        for n in 0..AETH_LEN {
            assert!(AethRepr::parse(&Aeth::new_unchecked(&[0u8; 4][..n])).is_err());
        }
    }
}
