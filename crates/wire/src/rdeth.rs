//! Reliable Datagram Extended Transport Header (IBA Vol. 1 §9.3), 4 bytes: reserved (1),
//! EECnxt (3). Carried by every RD packet.

use crate::bth::MAX_U24;
use crate::field::{check_len, get_u24, set_u24};
use crate::{Error, Result};

/// Length of the RDETH in bytes.
pub const RDETH_LEN: usize = 4;

/// A read/write view of an RDETH.
///
/// ```
/// use rdma_wire::rdeth::Rdeth;
/// let rdeth = Rdeth::new_checked(&[0u8, 0, 0x12, 0x34][..]).unwrap();
/// assert_eq!(rdeth.ee_cnxt(), 0x1234);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rdeth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Rdeth<T> {
    /// Wraps a buffer without checking its length; getters panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> Self {
        Rdeth { buffer }
    }

    /// Wraps a buffer after checking that it holds a whole RDETH.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check_len(buffer.as_ref(), RDETH_LEN)?;
        Ok(Rdeth { buffer })
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The reserved first byte.
    pub fn resv8(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    /// EECnxt: end-to-end context (24 bits).
    pub fn ee_cnxt(&self) -> u32 {
        get_u24(self.buffer.as_ref(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Rdeth<T> {
    /// Sets the reserved byte.
    pub fn set_resv8(&mut self, v: u8) {
        self.buffer.as_mut()[0] = v;
    }

    /// Sets EECnxt (low 24 bits of `v`).
    pub fn set_ee_cnxt(&mut self, v: u32) {
        set_u24(self.buffer.as_mut(), 1, v);
    }
}

/// A parsed RDETH. The reserved byte is kept so that re-emission is byte-exact; send 0.
///
/// ```
/// use rdma_wire::rdeth::{Rdeth, RdethRepr};
/// let repr = RdethRepr { resv8: 0, ee_cnxt: 7 };
/// let mut buf = [0u8; RdethRepr::LEN];
/// repr.emit(&mut Rdeth::new_unchecked(&mut buf[..])).unwrap();
/// assert_eq!(RdethRepr::parse(&Rdeth::new_checked(&buf[..]).unwrap()), Ok(repr));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RdethRepr {
    /// Reserved byte, 0 on send.
    pub resv8: u8,
    /// EECnxt, 24 bits.
    pub ee_cnxt: u32,
}

impl RdethRepr {
    /// Length of the header in bytes.
    pub const LEN: usize = RDETH_LEN;

    /// Parses an RDETH view.
    pub fn parse<T: AsRef<[u8]>>(rdeth: &Rdeth<T>) -> Result<Self> {
        check_len(rdeth.buffer.as_ref(), RDETH_LEN)?;
        Ok(RdethRepr {
            resv8: rdeth.resv8(),
            ee_cnxt: rdeth.ee_cnxt(),
        })
    }

    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        RDETH_LEN
    }

    /// Writes the header into `rdeth`; [`Error::BadField`] if `ee_cnxt` exceeds 24 bits.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, rdeth: &mut Rdeth<T>) -> Result<()> {
        if self.ee_cnxt > MAX_U24 {
            return Err(Error::BadField("rdeth.ee_cnxt"));
        }
        let have = rdeth.buffer.as_ref().len();
        if have < RDETH_LEN {
            return Err(Error::BufferTooSmall {
                need: RDETH_LEN,
                have,
            });
        }
        rdeth.set_resv8(self.resv8);
        rdeth.set_ee_cnxt(self.ee_cnxt);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn bytes_round_trip(bytes in any::<[u8; RDETH_LEN]>()) {
            let repr = RdethRepr::parse(&Rdeth::new_checked(&bytes[..]).unwrap()).unwrap();
            let mut out = [0u8; RDETH_LEN];
            repr.emit(&mut Rdeth::new_unchecked(&mut out[..])).unwrap();
            prop_assert_eq!(out, bytes);
        }
    }

    #[test]
    fn malformed() {
        assert!(RdethRepr::parse(&Rdeth::new_unchecked(&[0u8; 3][..])).is_err());
        let mut buf = [0u8; 4];
        let repr = RdethRepr {
            resv8: 0,
            ee_cnxt: 1 << 24,
        };
        assert_eq!(
            repr.emit(&mut Rdeth::new_unchecked(&mut buf[..])),
            Err(Error::BadField("rdeth.ee_cnxt"))
        );
    }
}
