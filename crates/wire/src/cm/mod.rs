//! Communication Manager messages (IBA vol1 chapter 12), as carried in CM MADs.
//!
//! Every message is the 232-byte data part of a 256-byte MAD (class 0x07, class version 2);
//! the offsets in this module are relative to that data, as in the kernel's
//! `ibta_vol1_c12.h` (add 24 for an offset into the MAD, 44 for one into a RoCEv2 UDP payload).
//!
//! Each message has a view (`Req`, `Rep`, ...) with getters named after the fields of the
//! IBA tables and a plain `…Repr` with `parse` and `emit`. [`CmMessage`] parses any of them by
//! attribute id, and [`CmMadRepr`] a whole MAD.
//!
//! Reserved fields are ignored by `parse` and written as zero by `emit`; `emit` fills the
//! whole 232 bytes and rejects values wider than their field with [`Error::BadField`].
//!
//! ```
//! use rdma_wire::cm::{CmMadRepr, CmMessage, DrepRepr};
//! use rdma_wire::mad::{method, MAD_LEN};
//!
//! let drep = DrepRepr { local_comm_id: 1, remote_comm_id: 2, private_data: [0; 224] };
//! let mad = CmMadRepr::send(0x42, CmMessage::Drep(drep));
//! let mut buf = [0u8; MAD_LEN];
//! mad.emit(&mut buf).unwrap();
//! assert_eq!(&buf[..4], &[1, 0x07, 2, method::SEND]);
//! assert_eq!(CmMadRepr::parse(&buf).unwrap(), mad);
//! ```

use std::net::Ipv6Addr;

use crate::layout::{check_bits, code_enum};
use crate::mad::{Mad, MadHeaderRepr, MAD_DATA_LEN, MAD_HEADER_LEN, MAD_LEN};
use crate::time::IbaTime;
use crate::{Error, Result};

mod apr;
mod class_port_info;
mod drep;
mod dreq;
mod lap;
mod mra;
mod rej;
mod rep;
mod req;
mod rtu;
mod sidr_rep;
mod sidr_req;

pub use apr::{ApStatus, Apr, AprRepr, APR_ADDITIONAL_INFORMATION_LEN, APR_PRIVATE_DATA_LEN};
pub use class_port_info::{ClassPortInfo, ClassPortInfoRepr, CLASS_PORT_INFO_LEN};
pub use drep::{Drep, DrepRepr, DREP_PRIVATE_DATA_LEN};
pub use dreq::{Dreq, DreqRepr, DREQ_PRIVATE_DATA_LEN};
pub use lap::{Lap, LapRepr, LAP_PRIVATE_DATA_LEN};
pub use mra::{Mra, MraRepr, MRA_PRIVATE_DATA_LEN};
pub use rej::{Rej, RejRepr, RejectReason, REJ_ARI_LEN, REJ_PRIVATE_DATA_LEN};
pub use rep::{Rep, RepRepr, REP_PRIVATE_DATA_LEN};
pub use req::{Req, ReqRepr, REQ_PRIVATE_DATA_LEN};
pub use rtu::{Rtu, RtuRepr, RTU_PRIVATE_DATA_LEN};
pub use sidr_rep::{
    SidrRep, SidrRepRepr, SidrStatus, SIDR_REP_ADDITIONAL_INFORMATION_LEN,
    SIDR_REP_PRIVATE_DATA_LEN,
};
pub use sidr_req::{SidrReq, SidrReqRepr, SIDR_REQ_PRIVATE_DATA_LEN};

/// Length of every CM message: the data part of a MAD.
pub const CM_PAYLOAD_LEN: usize = MAD_DATA_LEN;

/// A CM attribute id: which message a CM MAD carries.
///
/// ```
/// use rdma_wire::cm::CmAttributeId;
/// assert_eq!(CmAttributeId::REQ.0, 0x0010);
/// assert_eq!(CmAttributeId::from(0x0018), CmAttributeId::SIDR_REP);
/// assert!(CmAttributeId(0x0099).name().is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CmAttributeId(pub u16);

impl CmAttributeId {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: CmAttributeId = CmAttributeId(0x0001);
    /// ConnectRequest (REQ).
    pub const REQ: CmAttributeId = CmAttributeId(0x0010);
    /// MsgRcptAck (MRA).
    pub const MRA: CmAttributeId = CmAttributeId(0x0011);
    /// ConnectReject (REJ).
    pub const REJ: CmAttributeId = CmAttributeId(0x0012);
    /// ConnectReply (REP).
    pub const REP: CmAttributeId = CmAttributeId(0x0013);
    /// ReadyToUse (RTU).
    pub const RTU: CmAttributeId = CmAttributeId(0x0014);
    /// DisconnectRequest (DREQ).
    pub const DREQ: CmAttributeId = CmAttributeId(0x0015);
    /// DisconnectReply (DREP).
    pub const DREP: CmAttributeId = CmAttributeId(0x0016);
    /// ServiceIDResReq (SIDR_REQ).
    pub const SIDR_REQ: CmAttributeId = CmAttributeId(0x0017);
    /// ServiceIDResReqResp (SIDR_REP).
    pub const SIDR_REP: CmAttributeId = CmAttributeId(0x0018);
    /// LoadAlternatePath (LAP).
    pub const LAP: CmAttributeId = CmAttributeId(0x0019);
    /// AlternatePathResponse (APR).
    pub const APR: CmAttributeId = CmAttributeId(0x001A);

    /// The short name of a known attribute (`"REQ"`, `"SIDR_REP"`, ...).
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0x0001 => "ClassPortInfo",
            0x0010 => "REQ",
            0x0011 => "MRA",
            0x0012 => "REJ",
            0x0013 => "REP",
            0x0014 => "RTU",
            0x0015 => "DREQ",
            0x0016 => "DREP",
            0x0017 => "SIDR_REQ",
            0x0018 => "SIDR_REP",
            0x0019 => "LAP",
            0x001A => "APR",
            _ => return None,
        })
    }
}

impl From<u16> for CmAttributeId {
    fn from(v: u16) -> Self {
        CmAttributeId(v)
    }
}

impl From<CmAttributeId> for u16 {
    fn from(v: CmAttributeId) -> Self {
        v.0
    }
}

code_enum! {
    /// The 2-bit "message rejected" / "message MRAed" field of REJ and MRA.
    ///
    /// ```
    /// use rdma_wire::cm::MessageRef;
    /// assert_eq!(MessageRef::from(1u8), MessageRef::Rep);
    /// assert_eq!(u8::from(MessageRef::Reserved(3)), 3);
    /// ```
    pub enum MessageRef: u8 {
        /// 0: the REQ.
        Req = 0,
        /// 1: the REP.
        Rep = 1,
        /// 2: another message (the LAP for an MRA; "no message" for a REJ).
        Other = 2,
    }
    /// 3 (reserved), or any value that does not fit the 2-bit field.
    other Reserved
}

/// The fields of one path in a REQ (primary or alternate) or LAP (alternate).
///
/// ```
/// use rdma_wire::cm::CmPathRepr;
/// let p = CmPathRepr::default();
/// assert_eq!(p.flow_label, 0);
/// assert!(p.local_port_gid.is_unspecified());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmPathRepr {
    /// Local Port LID (0xFFFF, permissive, on RoCE).
    pub local_port_lid: u16,
    /// Remote Port LID.
    pub remote_port_lid: u16,
    /// Local Port GID (on RoCE an IPv6 address, IPv4-mapped for IPv4).
    pub local_port_gid: Ipv6Addr,
    /// Remote Port GID.
    pub remote_port_gid: Ipv6Addr,
    /// Flow Label (20 bits).
    pub flow_label: u32,
    /// Packet Rate (6 bits, IBA rate code).
    pub packet_rate: u8,
    /// Traffic Class.
    pub traffic_class: u8,
    /// Hop Limit.
    pub hop_limit: u8,
    /// SL (4 bits).
    pub sl: u8,
    /// Subnet Local.
    pub subnet_local: bool,
    /// Local ACK Timeout.
    pub local_ack_timeout: IbaTime,
}

impl Default for CmPathRepr {
    fn default() -> Self {
        CmPathRepr {
            local_port_lid: 0,
            remote_port_lid: 0,
            local_port_gid: Ipv6Addr::UNSPECIFIED,
            remote_port_gid: Ipv6Addr::UNSPECIFIED,
            flow_label: 0,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 0,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: IbaTime::MIN,
        }
    }
}

impl CmPathRepr {
    /// Checks the widths of the sub-byte fields.
    pub(crate) fn check(&self) -> Result<()> {
        check_bits(self.flow_label.into(), 20, "path.flow_label")?;
        check_bits(self.packet_rate.into(), 6, "path.packet_rate")?;
        check_bits(self.sl.into(), 4, "path.sl")
    }
}

/// Any CM message, by attribute id.
///
/// ```
/// use rdma_wire::cm::{CmAttributeId, CmMessage, RtuRepr, CM_PAYLOAD_LEN};
/// use rdma_wire::Error;
///
/// let mut data = [0u8; CM_PAYLOAD_LEN];
/// data[3] = 9;
/// let msg = CmMessage::parse(CmAttributeId::RTU, &data).unwrap();
/// assert!(matches!(msg, CmMessage::Rtu(RtuRepr { local_comm_id: 9, .. })));
/// assert_eq!(CmMessage::parse(CmAttributeId(0x99), &data), Err(Error::UnknownAttribute(0x99)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CmMessage {
    /// ClassPortInfo (0x0001).
    ClassPortInfo(ClassPortInfoRepr),
    /// REQ (0x0010).
    Req(ReqRepr),
    /// MRA (0x0011).
    Mra(MraRepr),
    /// REJ (0x0012).
    Rej(RejRepr),
    /// REP (0x0013).
    Rep(RepRepr),
    /// RTU (0x0014).
    Rtu(RtuRepr),
    /// DREQ (0x0015).
    Dreq(DreqRepr),
    /// DREP (0x0016).
    Drep(DrepRepr),
    /// SIDR_REQ (0x0017).
    SidrReq(SidrReqRepr),
    /// SIDR_REP (0x0018).
    SidrRep(SidrRepRepr),
    /// LAP (0x0019).
    Lap(LapRepr),
    /// APR (0x001A).
    Apr(AprRepr),
}

impl CmMessage {
    /// Length of every CM message.
    pub const LEN: usize = CM_PAYLOAD_LEN;

    /// Parses the 232-byte data of a CM MAD whose attribute id is `attribute_id`.
    ///
    /// Errors: [`Error::UnknownAttribute`] for an id that names no CM message,
    /// [`Error::Truncated`] if `data` is shorter than 232 bytes.
    pub fn parse(attribute_id: CmAttributeId, data: &[u8]) -> Result<Self> {
        Ok(match attribute_id {
            CmAttributeId::CLASS_PORT_INFO => {
                crate::field::check_len(data, CM_PAYLOAD_LEN)?;
                CmMessage::ClassPortInfo(ClassPortInfoRepr::parse(data)?)
            }
            CmAttributeId::REQ => CmMessage::Req(ReqRepr::parse(data)?),
            CmAttributeId::MRA => CmMessage::Mra(MraRepr::parse(data)?),
            CmAttributeId::REJ => CmMessage::Rej(RejRepr::parse(data)?),
            CmAttributeId::REP => CmMessage::Rep(RepRepr::parse(data)?),
            CmAttributeId::RTU => CmMessage::Rtu(RtuRepr::parse(data)?),
            CmAttributeId::DREQ => CmMessage::Dreq(DreqRepr::parse(data)?),
            CmAttributeId::DREP => CmMessage::Drep(DrepRepr::parse(data)?),
            CmAttributeId::SIDR_REQ => CmMessage::SidrReq(SidrReqRepr::parse(data)?),
            CmAttributeId::SIDR_REP => CmMessage::SidrRep(SidrRepRepr::parse(data)?),
            CmAttributeId::LAP => CmMessage::Lap(LapRepr::parse(data)?),
            CmAttributeId::APR => CmMessage::Apr(AprRepr::parse(data)?),
            CmAttributeId(other) => return Err(Error::UnknownAttribute(other)),
        })
    }

    /// Parses the message of a CM MAD (see [`Mad::new_cm_checked`]).
    pub fn parse_mad<T: AsRef<[u8]>>(mad: &Mad<T>) -> Result<Self> {
        Self::parse(CmAttributeId(mad.attribute_id()), mad.data())
    }

    /// The attribute id that goes with this message.
    pub const fn attribute_id(&self) -> CmAttributeId {
        match self {
            CmMessage::ClassPortInfo(_) => CmAttributeId::CLASS_PORT_INFO,
            CmMessage::Req(_) => CmAttributeId::REQ,
            CmMessage::Mra(_) => CmAttributeId::MRA,
            CmMessage::Rej(_) => CmAttributeId::REJ,
            CmMessage::Rep(_) => CmAttributeId::REP,
            CmMessage::Rtu(_) => CmAttributeId::RTU,
            CmMessage::Dreq(_) => CmAttributeId::DREQ,
            CmMessage::Drep(_) => CmAttributeId::DREP,
            CmMessage::SidrReq(_) => CmAttributeId::SIDR_REQ,
            CmMessage::SidrRep(_) => CmAttributeId::SIDR_REP,
            CmMessage::Lap(_) => CmAttributeId::LAP,
            CmMessage::Apr(_) => CmAttributeId::APR,
        }
    }

    /// Writes the message into the first 232 bytes of `data` (all of them: reserved bytes,
    /// and for ClassPortInfo the 160 bytes after it, are zeroed).
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        crate::layout::check_out(data, CM_PAYLOAD_LEN)?;
        match self {
            CmMessage::ClassPortInfo(m) => {
                data[..CM_PAYLOAD_LEN].fill(0);
                m.emit(data)
            }
            CmMessage::Req(m) => m.emit(data),
            CmMessage::Mra(m) => m.emit(data),
            CmMessage::Rej(m) => m.emit(data),
            CmMessage::Rep(m) => m.emit(data),
            CmMessage::Rtu(m) => m.emit(data),
            CmMessage::Dreq(m) => m.emit(data),
            CmMessage::Drep(m) => m.emit(data),
            CmMessage::SidrReq(m) => m.emit(data),
            CmMessage::SidrRep(m) => m.emit(data),
            CmMessage::Lap(m) => m.emit(data),
            CmMessage::Apr(m) => m.emit(data),
        }
    }
}

/// A whole CM MAD: the header fields that vary, and the message.
///
/// Base version, class and class version are always 1, 0x07 and 2, and the attribute id is
/// the message's; the reserved header bytes are zero.
///
/// ```
/// use rdma_wire::cm::{CmMadRepr, CmMessage, RtuRepr};
/// use rdma_wire::mad::MAD_LEN;
/// let rtu = RtuRepr { local_comm_id: 7, remote_comm_id: 8, private_data: [0; 224] };
/// let m = CmMadRepr::send(0x1234, CmMessage::Rtu(rtu));
/// let mut buf = [0u8; MAD_LEN];
/// m.emit(&mut buf).unwrap();
/// assert_eq!(buf[17], 0x14); // attribute id 0x0014
/// assert_eq!(CmMadRepr::parse(&buf).unwrap(), m);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmMadRepr {
    /// R (response) bit of the Method byte.
    pub r_bit: bool,
    /// Method (7 bits): [`crate::mad::method::SEND`] for every CM protocol message.
    pub method: u8,
    /// Status.
    pub status: u16,
    /// ClassSpecific.
    pub class_specific: u16,
    /// TransactionID.
    pub transaction_id: u64,
    /// AttributeModifier.
    pub attribute_modifier: u32,
    /// The message (it determines the attribute id).
    pub message: CmMessage,
}

impl CmMadRepr {
    /// Length on the wire.
    pub const LEN: usize = MAD_LEN;

    /// A Send-method MAD carrying `message`, status 0, modifier 0.
    pub const fn send(transaction_id: u64, message: CmMessage) -> Self {
        CmMadRepr {
            r_bit: false,
            method: crate::mad::method::SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_modifier: 0,
            message,
        }
    }

    /// Parses a CM MAD: exactly 256 bytes, CM class and version, a known attribute.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let mad = Mad::new_cm_checked(buf)?;
        let h = MadHeaderRepr::parse(mad.header_bytes())?;
        Ok(CmMadRepr {
            r_bit: h.r_bit,
            method: h.method,
            status: h.status,
            class_specific: h.class_specific,
            transaction_id: h.transaction_id,
            attribute_modifier: h.attribute_modifier,
            message: CmMessage::parse_mad(&mad)?,
        })
    }

    /// The MAD header this value emits.
    pub const fn header(&self) -> MadHeaderRepr {
        MadHeaderRepr {
            r_bit: self.r_bit,
            method: self.method,
            status: self.status,
            class_specific: self.class_specific,
            attribute_modifier: self.attribute_modifier,
            ..MadHeaderRepr::cm(
                self.method,
                self.transaction_id,
                self.message.attribute_id().0,
            )
        }
    }

    /// Writes the 256-byte MAD into the first 256 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        crate::layout::check_out(buf, MAD_LEN)?;
        self.header().emit(buf)?;
        self.message.emit(&mut buf[MAD_HEADER_LEN..MAD_LEN])
    }
}
