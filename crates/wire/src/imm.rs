//! The two 4-byte extended headers that end the header chain (IBA Vol. 1 §9.3): ImmDt
//! (immediate data) and IETH (the R_Key to invalidate).
//!
//! Both hold one big-endian 32-bit value; [`crate::packet::PacketRepr`] carries them as
//! `Option<u32>`.

use crate::field::{check_len, get_u32, set_u32};
use crate::{Error, Result};

/// Length of ImmDt and of IETH in bytes.
pub const IMM_LEN: usize = 4;

fn emit_u32(buf: &mut [u8], v: u32) -> Result<()> {
    if buf.len() < IMM_LEN {
        return Err(Error::BufferTooSmall {
            need: IMM_LEN,
            have: buf.len(),
        });
    }
    set_u32(buf, 0, v);
    Ok(())
}

/// A read/write view of an ImmDt header.
///
/// ```
/// use rdma_wire::imm::ImmDt;
/// let imm = ImmDt::new_checked(&[0x11u8, 0x22, 0x33, 0x44][..]).unwrap();
/// assert_eq!(imm.imm_dt(), 0x1122_3344);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImmDt<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// Wraps a buffer without checking its length; getters panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> Self {
        ImmDt { buffer }
    }

    /// Wraps a buffer after checking that it holds 4 bytes.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check_len(buffer.as_ref(), IMM_LEN)?;
        Ok(ImmDt { buffer })
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Immediate Data, as the big-endian value on the wire.
    pub fn imm_dt(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    /// Sets Immediate Data.
    pub fn set_imm_dt(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 0, v);
    }
}

/// A parsed ImmDt header.
///
/// ```
/// use rdma_wire::imm::{ImmDt, ImmDtRepr};
/// let mut buf = [0u8; 4];
/// ImmDtRepr { imm_dt: 0x0bad_cafe }.emit(&mut ImmDt::new_unchecked(&mut buf[..])).unwrap();
/// assert_eq!(buf, [0x0b, 0xad, 0xca, 0xfe]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImmDtRepr {
    /// Immediate Data.
    pub imm_dt: u32,
}

impl ImmDtRepr {
    /// Length of the header in bytes.
    pub const LEN: usize = IMM_LEN;

    /// Parses an ImmDt view.
    pub fn parse<T: AsRef<[u8]>>(imm: &ImmDt<T>) -> Result<Self> {
        check_len(imm.buffer.as_ref(), IMM_LEN)?;
        Ok(ImmDtRepr {
            imm_dt: imm.imm_dt(),
        })
    }

    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        IMM_LEN
    }

    /// Writes the header into `imm`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, imm: &mut ImmDt<T>) -> Result<()> {
        emit_u32(imm.buffer.as_mut(), self.imm_dt)
    }
}

/// A read/write view of an IETH (Invalidate Extended Transport Header).
///
/// ```
/// use rdma_wire::imm::Ieth;
/// let ieth = Ieth::new_checked(&[0x08u8, 0x00, 0x01, 0x22][..]).unwrap();
/// assert_eq!(ieth.r_key(), 0x0800_0122);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ieth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ieth<T> {
    /// Wraps a buffer without checking its length; getters panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> Self {
        Ieth { buffer }
    }

    /// Wraps a buffer after checking that it holds 4 bytes.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check_len(buffer.as_ref(), IMM_LEN)?;
        Ok(Ieth { buffer })
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// R_Key: the remote key to invalidate.
    pub fn r_key(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    /// Sets R_Key.
    pub fn set_r_key(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 0, v);
    }
}

/// A parsed IETH.
///
/// ```
/// use rdma_wire::imm::{Ieth, IethRepr};
/// let repr = IethRepr::parse(&Ieth::new_checked(&[0u8, 0, 3, 6][..]).unwrap()).unwrap();
/// assert_eq!(repr, IethRepr { r_key: 0x306 });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IethRepr {
    /// R_Key to invalidate.
    pub r_key: u32,
}

impl IethRepr {
    /// Length of the header in bytes.
    pub const LEN: usize = IMM_LEN;

    /// Parses an IETH view.
    pub fn parse<T: AsRef<[u8]>>(ieth: &Ieth<T>) -> Result<Self> {
        check_len(ieth.buffer.as_ref(), IMM_LEN)?;
        Ok(IethRepr {
            r_key: ieth.r_key(),
        })
    }

    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        IMM_LEN
    }

    /// Writes the header into `ieth`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, ieth: &mut Ieth<T>) -> Result<()> {
        emit_u32(ieth.buffer.as_mut(), self.r_key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(v in any::<u32>()) {
            let mut buf = [0u8; IMM_LEN];
            ImmDtRepr { imm_dt: v }.emit(&mut ImmDt::new_unchecked(&mut buf[..])).unwrap();
            prop_assert_eq!(ImmDtRepr::parse(&ImmDt::new_checked(&buf[..]).unwrap()), Ok(ImmDtRepr { imm_dt: v }));
            IethRepr { r_key: v }.emit(&mut Ieth::new_unchecked(&mut buf[..])).unwrap();
            prop_assert_eq!(IethRepr::parse(&Ieth::new_checked(&buf[..]).unwrap()), Ok(IethRepr { r_key: v }));
            prop_assert_eq!(buf, v.to_be_bytes());
        }
    }

    #[test]
    fn truncated() {
        for n in 0..IMM_LEN {
            let short = &[0u8; IMM_LEN][..n];
            assert_eq!(
                ImmDt::new_checked(short).err(),
                Some(Error::Truncated { need: 4, have: n })
            );
            assert!(ImmDtRepr::parse(&ImmDt::new_unchecked(short)).is_err());
            assert!(IethRepr::parse(&Ieth::new_unchecked(short)).is_err());
            let mut buf = [0u8; IMM_LEN];
            assert!(IethRepr { r_key: 1 }
                .emit(&mut Ieth::new_unchecked(&mut buf[..n]))
                .is_err());
            assert!(ImmDtRepr { imm_dt: 1 }
                .emit(&mut ImmDt::new_unchecked(&mut buf[..n]))
                .is_err());
        }
    }
}
