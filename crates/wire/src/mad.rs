//! Management datagrams (IBA vol1 13.4): the 24-byte common MAD header and the 256-byte MAD.
//!
//! On RoCEv2 a MAD is the payload of a UD SEND Only to QP1 (the GSI). The CM class (0x07,
//! class version 2) carries the messages of [`crate::cm`]; [`Mad::new_cm_checked`] accepts only
//! those.
//!
//! The reserved 16 bits at byte 18 are ignored on parse and written as zero.

use crate::layout::{array, bytes_field, check_out, view};
use crate::{Error, Result};

/// Length of a MAD on the wire.
pub const MAD_LEN: usize = 256;
/// Length of the common MAD header.
pub const MAD_HEADER_LEN: usize = 24;
/// Length of the class-specific data after the common header.
pub const MAD_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;

/// Base version of every MAD this crate knows.
pub const BASE_VERSION: u8 = 1;
/// Management class of the Communication Manager.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// Class version of the CM class spoken by Linux and by this crate.
pub const CM_CLASS_VERSION: u8 = 2;

/// Method values (the low 7 bits of the Method byte; the R bit marks responses).
pub mod method {
    /// Get: request an attribute.
    pub const GET: u8 = 0x01;
    /// Set: write an attribute.
    pub const SET: u8 = 0x02;
    /// Send: a datagram with no response (every CM protocol message).
    pub const SEND: u8 = 0x03;
    /// Trap: an unsolicited notice.
    pub const TRAP: u8 = 0x05;
    /// Report: forward a subscribed event.
    pub const REPORT: u8 = 0x06;
    /// TrapRepress: stop a trap from being resent.
    pub const TRAP_REPRESS: u8 = 0x07;
    /// The R (response) bit of the Method byte: GetResp is `RESPONSE | GET` (0x81).
    pub const RESPONSE: u8 = 0x80;
}

view! {
    /// A zero-copy view of the 24-byte common MAD header.
    ///
    /// ```
    /// use rdma_wire::mad::MadHeader;
    /// let mut buf = [0u8; 24];
    /// let mut h = MadHeader::new_checked(&mut buf[..]).unwrap();
    /// h.set_base_version(1);
    /// h.set_mgmt_class(0x07);
    /// h.set_method(0x03);
    /// h.set_transaction_id(0x2_91ca_7e74);
    /// h.set_attribute_id(0x0010);
    /// assert_eq!(h.attribute_id(), 0x0010);
    /// assert!(!h.r_bit());
    /// assert_eq!(&buf[8..16], &[0, 0, 0, 2, 0x91, 0xca, 0x7e, 0x74]);
    /// ```
    pub struct MadHeader, len = MAD_HEADER_LEN;
    /// BaseVersion: 1 for every IBA MAD.
    base_version / set_base_version: u8(0);
    /// MgmtClass: 0x07 for the CM.
    mgmt_class / set_mgmt_class: u8(1);
    /// ClassVersion: 2 for the CM.
    class_version / set_class_version: u8(2);
    /// R: the response bit (top bit of the Method byte).
    r_bit / set_r_bit: flag(3, 7);
    /// Method: the low 7 bits of the Method byte (see [`method`]).
    method / set_method: bits(3, 0, 7);
    /// Status.
    status / set_status: u16(4);
    /// ClassSpecific.
    class_specific / set_class_specific: u16(6);
    /// TransactionID.
    transaction_id / set_transaction_id: u64(8);
    /// AttributeID: which message or attribute the data holds.
    attribute_id / set_attribute_id: u16(16);
    /// AttributeModifier (the CM puts ECE options here).
    attribute_modifier / set_attribute_modifier: u32(20);
}

/// The common MAD header as plain values.
///
/// ```
/// use rdma_wire::mad::{MadHeaderRepr, MAD_HEADER_LEN};
/// let h = MadHeaderRepr::cm(0x03, 0x1234, 0x0014);
/// let mut buf = [0u8; MAD_HEADER_LEN];
/// h.emit(&mut buf).unwrap();
/// assert_eq!(&buf[..4], &[1, 0x07, 2, 0x03]);
/// assert_eq!(MadHeaderRepr::parse(&buf).unwrap(), h);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadHeaderRepr {
    /// BaseVersion.
    pub base_version: u8,
    /// MgmtClass.
    pub mgmt_class: u8,
    /// ClassVersion.
    pub class_version: u8,
    /// R (response) bit.
    pub r_bit: bool,
    /// Method (7 bits).
    pub method: u8,
    /// Status.
    pub status: u16,
    /// ClassSpecific.
    pub class_specific: u16,
    /// TransactionID.
    pub transaction_id: u64,
    /// AttributeID.
    pub attribute_id: u16,
    /// AttributeModifier.
    pub attribute_modifier: u32,
}

impl MadHeaderRepr {
    /// Length on the wire.
    pub const LEN: usize = MAD_HEADER_LEN;

    /// A CM-class header (base version 1, class 0x07, class version 2), status 0, modifier 0.
    pub const fn cm(method: u8, transaction_id: u64, attribute_id: u16) -> Self {
        MadHeaderRepr {
            base_version: BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            r_bit: false,
            method,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            attribute_modifier: 0,
        }
    }

    /// True if base version, class and class version are the CM's (1, 0x07, 2).
    pub const fn is_cm(&self) -> bool {
        self.base_version == BASE_VERSION
            && self.mgmt_class == MGMT_CLASS_CM
            && self.class_version == CM_CLASS_VERSION
    }

    /// Reads the header from the first 24 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let h = MadHeader::new_checked(buf)?;
        Ok(MadHeaderRepr {
            base_version: h.base_version(),
            mgmt_class: h.mgmt_class(),
            class_version: h.class_version(),
            r_bit: h.r_bit(),
            method: h.method(),
            status: h.status(),
            class_specific: h.class_specific(),
            transaction_id: h.transaction_id(),
            attribute_id: h.attribute_id(),
            attribute_modifier: h.attribute_modifier(),
        })
    }

    /// Writes the header into the first 24 bytes of `buf` (reserved bytes zeroed).
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(buf, Self::LEN)?;
        crate::layout::check_bits(self.method.into(), 7, "mad.method")?;
        buf[..Self::LEN].fill(0);
        let mut h = MadHeader::new_unchecked(buf);
        h.set_base_version(self.base_version);
        h.set_mgmt_class(self.mgmt_class);
        h.set_class_version(self.class_version);
        h.set_r_bit(self.r_bit);
        h.set_method(self.method);
        h.set_status(self.status);
        h.set_class_specific(self.class_specific);
        h.set_transaction_id(self.transaction_id);
        h.set_attribute_id(self.attribute_id);
        h.set_attribute_modifier(self.attribute_modifier);
        Ok(())
    }
}

view! {
    /// A zero-copy view of a whole 256-byte MAD: the common header, then 232 bytes of data.
    ///
    /// ```
    /// use rdma_wire::mad::{Mad, MAD_LEN};
    /// use rdma_wire::Error;
    /// let mut buf = [0u8; MAD_LEN];
    /// buf[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
    /// buf[16..18].copy_from_slice(&0x0014u16.to_be_bytes());
    /// let mad = Mad::new_cm_checked(&buf[..]).unwrap();
    /// assert_eq!(mad.attribute_id(), 0x0014);
    /// assert_eq!(mad.data().len(), 232);
    /// assert!(matches!(Mad::new_cm_checked(&buf[..255]), Err(Error::BadLength { .. })));
    /// ```
    pub struct Mad, len = MAD_LEN;
    /// BaseVersion.
    base_version / set_base_version: u8(0);
    /// MgmtClass.
    mgmt_class / set_mgmt_class: u8(1);
    /// ClassVersion.
    class_version / set_class_version: u8(2);
    /// R: the response bit of the Method byte.
    r_bit / set_r_bit: flag(3, 7);
    /// Method (7 bits).
    method / set_method: bits(3, 0, 7);
    /// Status.
    status / set_status: u16(4);
    /// ClassSpecific.
    class_specific / set_class_specific: u16(6);
    /// TransactionID.
    transaction_id / set_transaction_id: u64(8);
    /// AttributeID.
    attribute_id / set_attribute_id: u16(16);
    /// AttributeModifier.
    attribute_modifier / set_attribute_modifier: u32(20);
}

bytes_field!(Mad,
    /// The common header (bytes 0..24).
    header_bytes / header_bytes_mut: 0..MAD_HEADER_LEN);
bytes_field!(Mad,
    /// The class-specific data (bytes 24..256): for the CM, the message.
    data / data_mut: MAD_HEADER_LEN..MAD_LEN);

impl<T: AsRef<[u8]>> Mad<T> {
    /// Wraps a CM MAD: the buffer must be exactly 256 bytes ([`Error::BadLength`]) with base
    /// version 1, class 0x07 and class version 2 ([`Error::BadMadClass`]).
    pub fn new_cm_checked(buffer: T) -> Result<Self> {
        let len = buffer.as_ref().len();
        if len != MAD_LEN {
            return Err(Error::BadLength {
                expected: MAD_LEN,
                found: len,
            });
        }
        let mad = Self::new_unchecked(buffer);
        let (base_version, mgmt_class, class_version) =
            (mad.base_version(), mad.mgmt_class(), mad.class_version());
        if (base_version, mgmt_class, class_version)
            != (BASE_VERSION, MGMT_CLASS_CM, CM_CLASS_VERSION)
        {
            return Err(Error::BadMadClass {
                base_version,
                mgmt_class,
                class_version,
            });
        }
        Ok(mad)
    }
}

/// A whole MAD as plain values: header plus the 232 data bytes, uninterpreted.
///
/// ```
/// use rdma_wire::mad::{MadHeaderRepr, MadRepr, MAD_DATA_LEN, MAD_LEN};
/// let m = MadRepr { header: MadHeaderRepr::cm(0x03, 7, 0x0015), data: [0xab; MAD_DATA_LEN] };
/// let mut buf = [0u8; MAD_LEN];
/// m.emit(&mut buf).unwrap();
/// assert_eq!(MadRepr::parse(&buf).unwrap(), m);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MadRepr {
    /// The common header.
    pub header: MadHeaderRepr,
    /// The class-specific data.
    pub data: [u8; MAD_DATA_LEN],
}

impl MadRepr {
    /// Length on the wire.
    pub const LEN: usize = MAD_LEN;

    /// Reads a MAD from the first 256 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let mad = Mad::new_checked(buf)?;
        Ok(MadRepr {
            header: MadHeaderRepr::parse(buf)?,
            data: array(mad.data(), 0),
        })
    }

    /// Writes the MAD into the first 256 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(buf, Self::LEN)?;
        self.header.emit(buf)?;
        buf[MAD_HEADER_LEN..MAD_LEN].copy_from_slice(&self.data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cm_checks() {
        let mut buf = [0u8; MAD_LEN];
        MadHeaderRepr::cm(method::SEND, 1, 0x10)
            .emit(&mut buf)
            .unwrap();
        assert!(Mad::new_cm_checked(&buf[..]).is_ok());
        assert_eq!(
            Mad::new_cm_checked(&buf[..10]).unwrap_err(),
            Error::BadLength {
                expected: 256,
                found: 10
            }
        );
        let mut long = [0u8; 300];
        long[..256].copy_from_slice(&buf);
        assert!(matches!(
            Mad::new_cm_checked(&long[..]),
            Err(Error::BadLength { .. })
        ));
        for (i, v) in [(0, 2u8), (1, 0x03), (2, 1)] {
            let mut b = buf;
            b[i] = v;
            assert!(matches!(
                Mad::new_cm_checked(&b[..]),
                Err(Error::BadMadClass { .. })
            ));
        }
        assert_eq!(
            MadHeaderRepr::parse(&buf[..23]).unwrap_err(),
            Error::Truncated { need: 24, have: 23 }
        );
    }

    #[test]
    fn response_bit_is_separate_from_method() {
        let mut buf = [0u8; MAD_HEADER_LEN];
        buf[3] = method::RESPONSE | method::GET;
        let h = MadHeaderRepr::parse(&buf).unwrap();
        assert!(h.r_bit);
        assert_eq!(h.method, method::GET);
        let mut out = [0xffu8; MAD_HEADER_LEN];
        h.emit(&mut out).unwrap();
        assert_eq!(out, buf);
        let bad = MadHeaderRepr { method: 0x80, ..h };
        assert_eq!(bad.emit(&mut out), Err(Error::BadField("mad.method")));
    }
}
