//! RDMA Extended Transport Header (IBA Vol. 1 §9.3), 16 bytes: VA (8), R_Key (4),
//! DMA Length (4). Carried by RDMA WRITE First/Only and RDMA READ Request.

use crate::field::{check_len, get_u32, get_u64, set_u32, set_u64};
use crate::{Error, Result};

/// Length of the RETH in bytes.
pub const RETH_LEN: usize = 16;

mod field {
    pub const VA: usize = 0;
    pub const R_KEY: usize = 8;
    pub const DMA_LEN: usize = 12;
}

/// A read/write view of a RETH.
///
/// ```
/// use rdma_wire::reth::Reth;
/// let mut buf = [0u8; 16];
/// let mut reth = Reth::new_checked(&mut buf[..]).unwrap();
/// reth.set_va(0x1000);
/// reth.set_r_key(0x5ad);
/// reth.set_dma_len(64);
/// assert_eq!((reth.va(), reth.r_key(), reth.dma_len()), (0x1000, 0x5ad, 64));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Reth<T> {
    /// Wraps a buffer without checking its length; getters panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> Self {
        Reth { buffer }
    }

    /// Wraps a buffer after checking that it holds a whole RETH.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check_len(buffer.as_ref(), RETH_LEN)?;
        Ok(Reth { buffer })
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// VA: virtual address.
    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::VA)
    }

    /// R_Key: remote key.
    pub fn r_key(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::R_KEY)
    }

    /// DMA Length, in bytes.
    pub fn dma_len(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::DMA_LEN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    /// Sets VA.
    pub fn set_va(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), field::VA, v);
    }

    /// Sets R_Key.
    pub fn set_r_key(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::R_KEY, v);
    }

    /// Sets DMA Length.
    pub fn set_dma_len(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::DMA_LEN, v);
    }
}

/// A parsed RETH.
///
/// ```
/// use rdma_wire::reth::{Reth, RethRepr};
/// let repr = RethRepr { va: 0x55d7_bdcf_a6e0, r_key: 0x5ad, dma_len: 64 };
/// let mut buf = [0u8; RethRepr::LEN];
/// repr.emit(&mut Reth::new_unchecked(&mut buf[..])).unwrap();
/// assert_eq!(RethRepr::parse(&Reth::new_checked(&buf[..]).unwrap()), Ok(repr));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RethRepr {
    /// VA.
    pub va: u64,
    /// R_Key.
    pub r_key: u32,
    /// DMA Length.
    pub dma_len: u32,
}

impl RethRepr {
    /// Length of the header in bytes.
    pub const LEN: usize = RETH_LEN;

    /// Parses a RETH view.
    pub fn parse<T: AsRef<[u8]>>(reth: &Reth<T>) -> Result<Self> {
        check_len(reth.buffer.as_ref(), RETH_LEN)?;
        Ok(RethRepr {
            va: reth.va(),
            r_key: reth.r_key(),
            dma_len: reth.dma_len(),
        })
    }

    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        RETH_LEN
    }

    /// Writes the header into `reth`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, reth: &mut Reth<T>) -> Result<()> {
        let have = reth.buffer.as_ref().len();
        if have < RETH_LEN {
            return Err(Error::BufferTooSmall {
                need: RETH_LEN,
                have,
            });
        }
        reth.set_va(self.va);
        reth.set_r_key(self.r_key);
        reth.set_dma_len(self.dma_len);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(va in any::<u64>(), r_key in any::<u32>(), dma_len in any::<u32>()) {
            let repr = RethRepr { va, r_key, dma_len };
            let mut buf = [0u8; RETH_LEN];
            repr.emit(&mut Reth::new_unchecked(&mut buf[..])).unwrap();
            prop_assert_eq!(RethRepr::parse(&Reth::new_checked(&buf[..]).unwrap()), Ok(repr));
            let mut again = [0u8; RETH_LEN];
            RethRepr::parse(&Reth::new_unchecked(&buf[..])).unwrap().emit(&mut Reth::new_unchecked(&mut again[..])).unwrap();
            prop_assert_eq!(again, buf);
        }
    }

    #[test]
    fn truncated() {
        for n in 0..RETH_LEN {
            assert_eq!(
                Reth::new_checked(&[0u8; RETH_LEN][..n]).err(),
                Some(Error::Truncated {
                    need: RETH_LEN,
                    have: n
                })
            );
            assert!(RethRepr::parse(&Reth::new_unchecked(&[0u8; RETH_LEN][..n])).is_err());
            let mut buf = [0u8; RETH_LEN];
            assert!(RethRepr {
                va: 1,
                r_key: 2,
                dma_len: 3
            }
            .emit(&mut Reth::new_unchecked(&mut buf[..n]))
            .is_err());
        }
    }
}
