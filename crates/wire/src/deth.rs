//! Datagram Extended Transport Header (IBA Vol. 1 §9.3), 8 bytes: Q_Key (4),
//! reserved (1), SrcQP (3). Carried by UD (and RD) requests.

use crate::bth::MAX_U24;
use crate::field::{check_len, get_u24, get_u32, set_u24, set_u32};
use crate::{Error, Result};

/// Length of the DETH in bytes.
pub const DETH_LEN: usize = 8;

mod field {
    pub const Q_KEY: usize = 0;
    pub const RESV8: usize = 4;
    pub const SRC_QP: usize = 5;
}

/// A read/write view of a DETH.
///
/// ```
/// use rdma_wire::deth::Deth;
/// let bytes = [0x80, 0x01, 0x00, 0x00, 0, 0, 0, 1];
/// let deth = Deth::new_checked(&bytes[..]).unwrap();
/// assert_eq!((deth.q_key(), deth.src_qp()), (0x8001_0000, 1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Deth<T> {
    /// Wraps a buffer without checking its length; getters panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> Self {
        Deth { buffer }
    }

    /// Wraps a buffer after checking that it holds a whole DETH.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check_len(buffer.as_ref(), DETH_LEN)?;
        Ok(Deth { buffer })
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Q_Key: queue key.
    pub fn q_key(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::Q_KEY)
    }

    /// The reserved byte between Q_Key and SrcQP.
    pub fn resv8(&self) -> u8 {
        self.buffer.as_ref()[field::RESV8]
    }

    /// SrcQP: source queue pair number (24 bits).
    pub fn src_qp(&self) -> u32 {
        get_u24(self.buffer.as_ref(), field::SRC_QP)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    /// Sets Q_Key.
    pub fn set_q_key(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::Q_KEY, v);
    }

    /// Sets the reserved byte.
    pub fn set_resv8(&mut self, v: u8) {
        self.buffer.as_mut()[field::RESV8] = v;
    }

    /// Sets SrcQP (low 24 bits of `v`).
    pub fn set_src_qp(&mut self, v: u32) {
        set_u24(self.buffer.as_mut(), field::SRC_QP, v);
    }
}

/// A parsed DETH. The reserved byte is kept so that re-emission is byte-exact; send 0.
///
/// ```
/// use rdma_wire::deth::{Deth, DethRepr};
/// let repr = DethRepr { q_key: 0x8001_0000, resv8: 0, src_qp: 1 };
/// let mut buf = [0u8; DethRepr::LEN];
/// repr.emit(&mut Deth::new_unchecked(&mut buf[..])).unwrap();
/// assert_eq!(buf, [0x80, 0x01, 0, 0, 0, 0, 0, 1]);
/// assert_eq!(DethRepr::parse(&Deth::new_checked(&buf[..]).unwrap()), Ok(repr));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DethRepr {
    /// Q_Key.
    pub q_key: u32,
    /// Reserved byte, 0 on send.
    pub resv8: u8,
    /// SrcQP, 24 bits.
    pub src_qp: u32,
}

impl DethRepr {
    /// Length of the header in bytes.
    pub const LEN: usize = DETH_LEN;

    /// Parses a DETH view.
    pub fn parse<T: AsRef<[u8]>>(deth: &Deth<T>) -> Result<Self> {
        check_len(deth.buffer.as_ref(), DETH_LEN)?;
        Ok(DethRepr {
            q_key: deth.q_key(),
            resv8: deth.resv8(),
            src_qp: deth.src_qp(),
        })
    }

    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        DETH_LEN
    }

    /// Writes the header into `deth`; [`Error::BadField`] if `src_qp` exceeds 24 bits.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, deth: &mut Deth<T>) -> Result<()> {
        if self.src_qp > MAX_U24 {
            return Err(Error::BadField("deth.src_qp"));
        }
        let have = deth.buffer.as_ref().len();
        if have < DETH_LEN {
            return Err(Error::BufferTooSmall {
                need: DETH_LEN,
                have,
            });
        }
        deth.set_q_key(self.q_key);
        deth.set_resv8(self.resv8);
        deth.set_src_qp(self.src_qp);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(q_key in any::<u32>(), resv8 in any::<u8>(), src_qp in 0..=MAX_U24) {
            let repr = DethRepr { q_key, resv8, src_qp };
            let mut buf = [0u8; DETH_LEN];
            repr.emit(&mut Deth::new_unchecked(&mut buf[..])).unwrap();
            prop_assert_eq!(DethRepr::parse(&Deth::new_checked(&buf[..]).unwrap()), Ok(repr));
        }

        #[test]
        fn bytes_round_trip(bytes in any::<[u8; DETH_LEN]>()) {
            let mut out = [0u8; DETH_LEN];
            DethRepr::parse(&Deth::new_unchecked(&bytes[..])).unwrap().emit(&mut Deth::new_unchecked(&mut out[..])).unwrap();
            prop_assert_eq!(out, bytes);
        }
    }

    #[test]
    fn malformed() {
        for n in 0..DETH_LEN {
            assert_eq!(
                DethRepr::parse(&Deth::new_unchecked(&[0u8; 8][..n])),
                Err(Error::Truncated { need: 8, have: n })
            );
        }
        let mut buf = [0u8; DETH_LEN];
        let big = DethRepr {
            q_key: 0,
            resv8: 0,
            src_qp: 1 << 24,
        };
        assert_eq!(
            big.emit(&mut Deth::new_unchecked(&mut buf[..])),
            Err(Error::BadField("deth.src_qp"))
        );
        let ok = DethRepr { src_qp: 1, ..big };
        assert_eq!(
            ok.emit(&mut Deth::new_unchecked(&mut buf[..7])),
            Err(Error::BufferTooSmall { need: 8, have: 7 })
        );
    }
}
