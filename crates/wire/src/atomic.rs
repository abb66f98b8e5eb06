//! The atomic extended headers (IBA Vol. 1 §9.3): AtomicETH (28 bytes: VA,
//! R_Key, SwapData/AddData, CompareData) on CmpSwap and FetchAdd requests, and AtomicAckETH
//! (8 bytes: OrigRemData) on ATOMIC Acknowledge.

use crate::field::{check_len, get_u32, get_u64, set_u32, set_u64};
use crate::{Error, Result};

/// Length of the AtomicETH in bytes.
pub const ATOMIC_ETH_LEN: usize = 28;
/// Length of the AtomicAckETH in bytes.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;

mod field {
    pub const VA: usize = 0;
    pub const R_KEY: usize = 8;
    pub const SWAP_ADD: usize = 12;
    pub const COMPARE: usize = 20;
}

fn room(buf: &[u8], need: usize) -> Result<()> {
    if buf.len() < need {
        Err(Error::BufferTooSmall {
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// A read/write view of an AtomicETH.
///
/// ```
/// use rdma_wire::atomic::AtomicEth;
/// let mut buf = [0u8; 28];
/// let mut eth = AtomicEth::new_checked(&mut buf[..]).unwrap();
/// eth.set_swap_add_data(1);
/// assert_eq!((eth.swap_add_data(), eth.compare_data()), (1, 0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicEth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// Wraps a buffer without checking its length; getters panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> Self {
        AtomicEth { buffer }
    }

    /// Wraps a buffer after checking that it holds a whole AtomicETH.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check_len(buffer.as_ref(), ATOMIC_ETH_LEN)?;
        Ok(AtomicEth { buffer })
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// VA: virtual address of the 8-byte target.
    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::VA)
    }

    /// R_Key: remote key.
    pub fn r_key(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::R_KEY)
    }

    /// SwapData (CmpSwap) or AddData (FetchAdd).
    pub fn swap_add_data(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::SWAP_ADD)
    }

    /// CompareData (CmpSwap; ignored by FetchAdd).
    pub fn compare_data(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::COMPARE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    /// Sets VA.
    pub fn set_va(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), field::VA, v);
    }

    /// Sets R_Key.
    pub fn set_r_key(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::R_KEY, v);
    }

    /// Sets SwapData/AddData.
    pub fn set_swap_add_data(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), field::SWAP_ADD, v);
    }

    /// Sets CompareData.
    pub fn set_compare_data(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), field::COMPARE, v);
    }
}

/// A parsed AtomicETH.
///
/// ```
/// use rdma_wire::atomic::{AtomicEth, AtomicEthRepr};
/// let repr = AtomicEthRepr { va: 0x561d_29c0_b000, r_key: 0x306, swap_add_data: 1, compare_data: 0 };
/// let mut buf = [0u8; AtomicEthRepr::LEN];
/// repr.emit(&mut AtomicEth::new_unchecked(&mut buf[..])).unwrap();
/// assert_eq!(AtomicEthRepr::parse(&AtomicEth::new_checked(&buf[..]).unwrap()), Ok(repr));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicEthRepr {
    /// VA.
    pub va: u64,
    /// R_Key.
    pub r_key: u32,
    /// SwapData or AddData.
    pub swap_add_data: u64,
    /// CompareData.
    pub compare_data: u64,
}

impl AtomicEthRepr {
    /// Length of the header in bytes.
    pub const LEN: usize = ATOMIC_ETH_LEN;

    /// Parses an AtomicETH view.
    pub fn parse<T: AsRef<[u8]>>(eth: &AtomicEth<T>) -> Result<Self> {
        check_len(eth.buffer.as_ref(), ATOMIC_ETH_LEN)?;
        Ok(AtomicEthRepr {
            va: eth.va(),
            r_key: eth.r_key(),
            swap_add_data: eth.swap_add_data(),
            compare_data: eth.compare_data(),
        })
    }

    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ETH_LEN
    }

    /// Writes the header into `eth`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, eth: &mut AtomicEth<T>) -> Result<()> {
        room(eth.buffer.as_ref(), ATOMIC_ETH_LEN)?;
        eth.set_va(self.va);
        eth.set_r_key(self.r_key);
        eth.set_swap_add_data(self.swap_add_data);
        eth.set_compare_data(self.compare_data);
        Ok(())
    }
}

/// A read/write view of an AtomicAckETH.
///
/// ```
/// use rdma_wire::atomic::AtomicAckEth;
/// let ack = AtomicAckEth::new_checked(&[0u8, 0, 0, 0, 0, 0, 0, 9][..]).unwrap();
/// assert_eq!(ack.orig_rem_dt(), 9);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicAckEth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// Wraps a buffer without checking its length; getters panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> Self {
        AtomicAckEth { buffer }
    }

    /// Wraps a buffer after checking that it holds a whole AtomicAckETH.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check_len(buffer.as_ref(), ATOMIC_ACK_ETH_LEN)?;
        Ok(AtomicAckEth { buffer })
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// OrigRemDt: the value at the target before the atomic operation.
    pub fn orig_rem_dt(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    /// Sets OrigRemDt.
    pub fn set_orig_rem_dt(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), 0, v);
    }
}

/// A parsed AtomicAckETH.
///
/// ```
/// use rdma_wire::atomic::{AtomicAckEth, AtomicAckEthRepr};
/// let mut buf = [0u8; AtomicAckEthRepr::LEN];
/// AtomicAckEthRepr { orig_rem_dt: 5 }.emit(&mut AtomicAckEth::new_unchecked(&mut buf[..])).unwrap();
/// assert_eq!(buf, [0, 0, 0, 0, 0, 0, 0, 5]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicAckEthRepr {
    /// OrigRemDt.
    pub orig_rem_dt: u64,
}

impl AtomicAckEthRepr {
    /// Length of the header in bytes.
    pub const LEN: usize = ATOMIC_ACK_ETH_LEN;

    /// Parses an AtomicAckETH view.
    pub fn parse<T: AsRef<[u8]>>(eth: &AtomicAckEth<T>) -> Result<Self> {
        check_len(eth.buffer.as_ref(), ATOMIC_ACK_ETH_LEN)?;
        Ok(AtomicAckEthRepr {
            orig_rem_dt: eth.orig_rem_dt(),
        })
    }

    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ACK_ETH_LEN
    }

    /// Writes the header into `eth`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, eth: &mut AtomicAckEth<T>) -> Result<()> {
        room(eth.buffer.as_ref(), ATOMIC_ACK_ETH_LEN)?;
        eth.set_orig_rem_dt(self.orig_rem_dt);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(va in any::<u64>(), r_key in any::<u32>(), s in any::<u64>(), c in any::<u64>()) {
            let repr = AtomicEthRepr { va, r_key, swap_add_data: s, compare_data: c };
            let mut buf = [0u8; ATOMIC_ETH_LEN];
            repr.emit(&mut AtomicEth::new_unchecked(&mut buf[..])).unwrap();
            prop_assert_eq!(AtomicEthRepr::parse(&AtomicEth::new_checked(&buf[..]).unwrap()), Ok(repr));
            let ack = AtomicAckEthRepr { orig_rem_dt: s };
            let mut abuf = [0u8; ATOMIC_ACK_ETH_LEN];
            ack.emit(&mut AtomicAckEth::new_unchecked(&mut abuf[..])).unwrap();
            prop_assert_eq!(AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(&abuf[..]).unwrap()), Ok(ack));
        }
    }

    #[test]
    fn truncated() {
        for n in 0..ATOMIC_ETH_LEN {
            assert!(
                AtomicEthRepr::parse(&AtomicEth::new_unchecked(&[0u8; ATOMIC_ETH_LEN][..n]))
                    .is_err()
            );
            let mut buf = [0u8; ATOMIC_ETH_LEN];
            let repr = AtomicEthRepr {
                va: 0,
                r_key: 0,
                swap_add_data: 0,
                compare_data: 0,
            };
            assert!(repr
                .emit(&mut AtomicEth::new_unchecked(&mut buf[..n]))
                .is_err());
        }
        for n in 0..ATOMIC_ACK_ETH_LEN {
            assert!(AtomicAckEth::new_checked(&[0u8; 8][..n]).is_err());
            assert!(AtomicAckEthRepr::parse(&AtomicAckEth::new_unchecked(&[0u8; 8][..n])).is_err());
        }
    }
}
