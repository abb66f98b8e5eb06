//! The verbs vocabulary shared by the transport and the software device.
//!
//! Names and numeric values follow libibverbs (`ibv_wr_opcode`, `ibv_wc_status`,
//! `ibv_wc_opcode`, `ibv_qp_state`, `ibv_qp_attr_mask`, `ibv_access_flags`), so a device can
//! hand them through to a C ABI unchanged.
//!
//! ```
//! use rdma_proto::verbs::{AccessFlags, SendOp, SendWr, Sge};
//! let wr = SendWr::new(7, SendOp::RdmaWrite { remote_addr: 0x1000, rkey: 0x42 })
//!     .with_sge(Sge { addr: 0x2000, length: 64, lkey: 0x11 })
//!     .signaled();
//! assert_eq!(wr.total_len(), 64);
//! assert!(AccessFlags::REMOTE_WRITE.union(AccessFlags::LOCAL_WRITE).contains(AccessFlags::LOCAL_WRITE));
//! ```

use core::fmt;
use core::ops::{BitAnd, BitOr, BitOrAssign};

mod qp_recipe;
mod qp_state;
pub use qp_recipe::{RtrParams, RtsParams};
pub use qp_state::{
    check_modify, MigState, ModifyError, Mtu, PathAttr, QpAttr, QpAttrMask, QpState, QpType,
};

/// A protection domain handle, as the device numbers them.
///
/// ```
/// let pd = rdma_proto::verbs::PdId(3);
/// assert_eq!(pd.0, 3);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PdId(pub u32);

macro_rules! flags_type {
    ($(#[$m:meta])* $name:ident : $repr:ty { $($(#[$fm:meta])* $flag:ident = $val:expr;)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name($repr);

        impl $name {
            $($(#[$fm])* pub const $flag: $name = $name($val);)*
            /// No flag set.
            pub const fn empty() -> Self { $name(0) }
            /// Every flag this type knows.
            pub const fn all() -> Self { $name(0 $(| $val)*) }
            /// The raw bits.
            pub const fn bits(self) -> $repr { self.0 }
            /// From raw bits, dropping unknown ones.
            pub const fn from_bits_truncate(bits: $repr) -> Self { $name(bits & Self::all().0) }
            /// From raw bits, `None` if an unknown bit is set.
            pub const fn from_bits(bits: $repr) -> Option<Self> {
                if bits & !Self::all().0 == 0 { Some($name(bits)) } else { None }
            }
            /// Whether every flag of `other` is set in `self`.
            pub const fn contains(self, other: Self) -> bool { self.0 & other.0 == other.0 }
            /// Whether any flag of `other` is set in `self`.
            pub const fn intersects(self, other: Self) -> bool { self.0 & other.0 != 0 }
            /// Both sets together.
            pub const fn union(self, other: Self) -> Self { $name(self.0 | other.0) }
            /// The flags of `self` not in `other`.
            pub const fn difference(self, other: Self) -> Self { $name(self.0 & !other.0) }
            /// Whether no flag is set.
            pub const fn is_empty(self) -> bool { self.0 == 0 }
            /// Sets or clears `other`.
            pub fn set(&mut self, other: Self, on: bool) {
                if on { self.0 |= other.0 } else { self.0 &= !other.0 }
            }
        }
        impl BitOr for $name {
            type Output = Self;
            fn bitor(self, o: Self) -> Self { $name(self.0 | o.0) }
        }
        impl BitOrAssign for $name {
            fn bitor_assign(&mut self, o: Self) { self.0 |= o.0 }
        }
        impl BitAnd for $name {
            type Output = Self;
            fn bitand(self, o: Self) -> Self { $name(self.0 & o.0) }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut first = true;
                write!(f, "{}(", stringify!($name))?;
                $(if self.contains(Self::$flag) && $val != 0 {
                    if !first { write!(f, " | ")?; }
                    first = false;
                    write!(f, "{}", stringify!($flag))?;
                })*
                let _ = first;
                write!(f, ")")
            }
        }
    };
}
pub(crate) use flags_type;

flags_type! {
    /// Memory region and QP access rights (`ibv_access_flags` values).
    ///
    /// ```
    /// use rdma_proto::verbs::AccessFlags;
    /// let a = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    /// assert!(a.contains(AccessFlags::REMOTE_READ));
    /// assert!(!a.contains(AccessFlags::REMOTE_WRITE));
    /// assert_eq!(a.bits(), 0b101);
    /// ```
    AccessFlags: u32 {
        /// The local side may write (receive buffers, READ and atomic results).
        LOCAL_WRITE = 1;
        /// Remote peers may RDMA WRITE.
        REMOTE_WRITE = 2;
        /// Remote peers may RDMA READ.
        REMOTE_READ = 4;
        /// Remote peers may perform atomics.
        REMOTE_ATOMIC = 8;
    }
}

flags_type! {
    /// Send work request flags (`ibv_send_flags` values).
    ///
    /// ```
    /// use rdma_proto::verbs::SendFlags;
    /// assert_eq!((SendFlags::SIGNALED | SendFlags::INLINE).bits(), 2 | 8);
    /// ```
    SendFlags: u32 {
        /// Wait for earlier READs and atomics to complete before starting this one.
        FENCE = 1;
        /// Generate a completion on success.
        SIGNALED = 2;
        /// Set the solicited-event bit on the last packet.
        SOLICITED = 4;
        /// Copy the data out of the scatter/gather list at post time, without lkey checks.
        INLINE = 8;
    }
}

flags_type! {
    /// Work completion flags (`ibv_wc_flags` values).
    ///
    /// ```
    /// use rdma_proto::verbs::WcFlags;
    /// assert!((WcFlags::GRH | WcFlags::WITH_IMM).contains(WcFlags::GRH));
    /// ```
    WcFlags: u32 {
        /// The first 40 bytes of the receive buffer hold a GRH (UD receives).
        GRH = 1;
        /// `imm_data` is valid.
        WITH_IMM = 2;
        /// Checksum verified (not used by this transport).
        IP_CSUM_OK = 4;
        /// `invalidated_rkey` is valid.
        WITH_INV = 8;
    }
}

/// A scatter/gather element (`ibv_sge`).
///
/// ```
/// let s = rdma_proto::verbs::Sge { addr: 0x1000, length: 4096, lkey: 7 };
/// assert_eq!(s.length, 4096);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Start address in the region's address space.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// Maximum number of scatter/gather elements per work request.
pub const MAX_SGE: usize = 8;

/// A bounded scatter/gather list stored inline (no heap allocation).
///
/// ```
/// use rdma_proto::verbs::{SgList, Sge};
/// let mut l = SgList::new();
/// l.push(Sge { addr: 0, length: 10, lkey: 1 }).unwrap();
/// l.push(Sge { addr: 100, length: 5, lkey: 1 }).unwrap();
/// assert_eq!(l.total_len(), 15);
/// assert_eq!(l.as_slice().len(), 2);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SgList {
    len: u8,
    items: [Sge; MAX_SGE],
}

/// Error for a scatter/gather list with more than [`MAX_SGE`] elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManySges;

impl fmt::Display for TooManySges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "more than {MAX_SGE} scatter/gather elements")
    }
}
impl std::error::Error for TooManySges {}

impl SgList {
    /// An empty list.
    pub const fn new() -> Self {
        SgList {
            len: 0,
            items: [Sge {
                addr: 0,
                length: 0,
                lkey: 0,
            }; MAX_SGE],
        }
    }
    /// A list from a slice.
    pub fn from_slice(s: &[Sge]) -> Result<Self, TooManySges> {
        let mut l = Self::new();
        for &e in s {
            l.push(e)?;
        }
        Ok(l)
    }
    /// Appends an element.
    pub fn push(&mut self, s: Sge) -> Result<(), TooManySges> {
        let i = self.len as usize;
        if i >= MAX_SGE {
            return Err(TooManySges);
        }
        self.items[i] = s;
        self.len += 1;
        Ok(())
    }
    /// The elements.
    pub fn as_slice(&self) -> &[Sge] {
        &self.items[..self.len as usize]
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len as usize
    }
    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Sum of the element lengths (saturating at `u64::MAX`, never overflowing).
    pub fn total_len(&self) -> u64 {
        self.as_slice().iter().map(|s| s.length as u64).sum()
    }
}

impl fmt::Debug for SgList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// Send work request opcodes (`ibv_wr_opcode` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WrOpcode {
    /// RDMA WRITE.
    RdmaWrite = 0,
    /// RDMA WRITE with immediate.
    RdmaWriteWithImm = 1,
    /// SEND.
    Send = 2,
    /// SEND with immediate.
    SendWithImm = 3,
    /// RDMA READ.
    RdmaRead = 4,
    /// Atomic compare and swap.
    AtomicCmpAndSwp = 5,
    /// Atomic fetch and add.
    AtomicFetchAndAdd = 6,
    /// SEND with invalidate.
    SendWithInv = 9,
}

/// The operation of a send work request with its operation-specific arguments.
///
/// ```
/// use rdma_proto::verbs::{SendOp, WrOpcode};
/// let op = SendOp::AtomicFetchAndAdd { remote_addr: 0x40, rkey: 9, add: 1 };
/// assert_eq!(op.opcode(), WrOpcode::AtomicFetchAndAdd);
/// assert!(op.is_read_or_atomic());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate data (network byte order value as the application gave it).
    SendWithImm {
        /// Immediate data.
        imm: u32,
    },
    /// SEND with invalidate of a remote rkey.
    SendWithInv {
        /// The rkey the responder invalidates.
        invalidate_rkey: u32,
    },
    /// RDMA WRITE.
    RdmaWrite {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// RDMA WRITE with immediate (consumes a receive at the responder).
    RdmaWriteWithImm {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ into the local scatter list.
    RdmaRead {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// 64-bit compare and swap: if `*remote == compare { *remote = swap }`; returns the
    /// original value into the (8-byte) local scatter list.
    AtomicCmpAndSwp {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Compare operand.
        compare: u64,
        /// Swap operand.
        swap: u64,
    },
    /// 64-bit fetch and add; returns the original value into the local scatter list.
    AtomicFetchAndAdd {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to add.
        add: u64,
    },
}

impl SendOp {
    /// The `ibv_wr_opcode` of this operation.
    pub fn opcode(&self) -> WrOpcode {
        match self {
            SendOp::Send => WrOpcode::Send,
            SendOp::SendWithImm { .. } => WrOpcode::SendWithImm,
            SendOp::SendWithInv { .. } => WrOpcode::SendWithInv,
            SendOp::RdmaWrite { .. } => WrOpcode::RdmaWrite,
            SendOp::RdmaWriteWithImm { .. } => WrOpcode::RdmaWriteWithImm,
            SendOp::RdmaRead { .. } => WrOpcode::RdmaRead,
            SendOp::AtomicCmpAndSwp { .. } => WrOpcode::AtomicCmpAndSwp,
            SendOp::AtomicFetchAndAdd { .. } => WrOpcode::AtomicFetchAndAdd,
        }
    }
    /// Whether this is a READ or an atomic (limited by `max_rd_atomic`, affected by fences).
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::RdmaRead { .. }
                | SendOp::AtomicCmpAndSwp { .. }
                | SendOp::AtomicFetchAndAdd { .. }
        )
    }
    /// Whether this is an atomic.
    pub fn is_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::AtomicCmpAndSwp { .. } | SendOp::AtomicFetchAndAdd { .. }
        )
    }
    /// The completion opcode a successful requester completion reports.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => {
                WcOpcode::Send
            }
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::AtomicCmpAndSwp { .. } => WcOpcode::CompSwap,
            SendOp::AtomicFetchAndAdd { .. } => WcOpcode::FetchAdd,
        }
    }
}

/// Destination of a UD send (what `ibv_send_wr.wr.ud` carries).
///
/// `ah` is an opaque address handle the device resolves; the transport passes it through to
/// the datagram it asks to transmit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct UdDest {
    /// Opaque address handle of the device.
    pub ah: u32,
    /// Destination QP number (24 bits; 0xFFFFFF for multicast).
    pub remote_qpn: u32,
    /// Q_Key. If its high bit is set the QP's own Q_Key is sent instead (IBA 10.2.5).
    pub remote_qkey: u32,
}

/// A send work request (`ibv_send_wr`), stored by value without heap allocation.
///
/// ```
/// use rdma_proto::verbs::{SendOp, SendWr, Sge, SendFlags};
/// let wr = SendWr::new(1, SendOp::SendWithImm { imm: 0x1122_3344 })
///     .with_sge(Sge { addr: 0, length: 32, lkey: 5 })
///     .with_flags(SendFlags::SIGNALED | SendFlags::SOLICITED);
/// assert!(wr.flags.contains(SendFlags::SOLICITED));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SendWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub op: SendOp,
    /// Flags.
    pub flags: SendFlags,
    /// Local data: gathered for SEND/WRITE, scattered into for READ/atomics.
    pub sg: SgList,
    /// UD destination (ignored on RC).
    pub ud: Option<UdDest>,
}

impl SendWr {
    /// A work request with no data, no flags.
    pub fn new(wr_id: u64, op: SendOp) -> Self {
        SendWr {
            wr_id,
            op,
            flags: SendFlags::empty(),
            sg: SgList::new(),
            ud: None,
        }
    }
    /// Adds a scatter/gather element (silently ignored past [`MAX_SGE`]; use
    /// [`SgList::push`] to see the error).
    pub fn with_sge(mut self, s: Sge) -> Self {
        let _ = self.sg.push(s);
        self
    }
    /// Adds flags.
    pub fn with_flags(mut self, f: SendFlags) -> Self {
        self.flags |= f;
        self
    }
    /// Adds [`SendFlags::SIGNALED`].
    pub fn signaled(self) -> Self {
        self.with_flags(SendFlags::SIGNALED)
    }
    /// Sets the UD destination.
    pub fn with_ud(mut self, d: UdDest) -> Self {
        self.ud = Some(d);
        self
    }
    /// Total length of the local scatter/gather list.
    pub fn total_len(&self) -> u64 {
        self.sg.total_len()
    }
}

/// A receive work request (`ibv_recv_wr`).
///
/// ```
/// use rdma_proto::verbs::{RecvWr, Sge};
/// let r = RecvWr::new(9).with_sge(Sge { addr: 0x100, length: 4096, lkey: 3 });
/// assert_eq!(r.sg.total_len(), 4096);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecvWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where received data is scattered.
    pub sg: SgList,
}

impl RecvWr {
    /// A receive with no buffer (accepts only zero-length messages).
    pub fn new(wr_id: u64) -> Self {
        RecvWr {
            wr_id,
            sg: SgList::new(),
        }
    }
    /// Adds a scatter/gather element (ignored past [`MAX_SGE`]).
    pub fn with_sge(mut self, s: Sge) -> Self {
        let _ = self.sg.push(s);
        self
    }
}

/// Work completion status (`ibv_wc_status` values).
///
/// ```
/// use rdma_proto::verbs::WcStatus;
/// assert_eq!(WcStatus::RetryExcErr as u32, 12);
/// assert_eq!(WcStatus::from_u32(5), Some(WcStatus::WrFlushErr));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    /// Success.
    Success = 0,
    /// Local length error (message larger than the receive buffer, bad lengths).
    LocLenErr = 1,
    /// Local QP operation error (internal consistency).
    LocQpOpErr = 2,
    /// Local EE context operation error (RD only).
    LocEecOpErr = 3,
    /// Local protection error (bad lkey, PD or access on a local buffer).
    LocProtErr = 4,
    /// Flushed because the QP entered the error state.
    WrFlushErr = 5,
    /// Memory window bind error.
    MwBindErr = 6,
    /// Bad response (unexpected opcode from the responder).
    BadRespErr = 7,
    /// Local access error (e.g. a READ response could not be written locally).
    LocAccessErr = 8,
    /// The responder reported an invalid request.
    RemInvReqErr = 9,
    /// The responder reported a remote access error.
    RemAccessErr = 10,
    /// The responder reported a remote operational error.
    RemOpErr = 11,
    /// Transport retries exhausted.
    RetryExcErr = 12,
    /// RNR retries exhausted.
    RnrRetryExcErr = 13,
    /// RD only.
    LocRddViolErr = 14,
    /// RD only.
    RemInvRdReqErr = 15,
    /// Remote aborted.
    RemAbortErr = 16,
    /// RD only.
    InvEecnErr = 17,
    /// RD only.
    InvEecStateErr = 18,
    /// Fatal device error.
    FatalErr = 19,
    /// Response timeout.
    RespTimeoutErr = 20,
    /// Other error.
    GeneralErr = 21,
}

impl WcStatus {
    /// From the `ibv_wc_status` value.
    pub fn from_u32(v: u32) -> Option<Self> {
        use WcStatus::*;
        const ALL: [WcStatus; 22] = [
            Success,
            LocLenErr,
            LocQpOpErr,
            LocEecOpErr,
            LocProtErr,
            WrFlushErr,
            MwBindErr,
            BadRespErr,
            LocAccessErr,
            RemInvReqErr,
            RemAccessErr,
            RemOpErr,
            RetryExcErr,
            RnrRetryExcErr,
            LocRddViolErr,
            RemInvRdReqErr,
            RemAbortErr,
            InvEecnErr,
            InvEecStateErr,
            FatalErr,
            RespTimeoutErr,
            GeneralErr,
        ];
        ALL.get(v as usize).copied()
    }
    /// Whether this is [`WcStatus::Success`].
    pub fn is_success(self) -> bool {
        self == WcStatus::Success
    }
}

/// The status by its `ibv_wc_status_str` name and value, with what it usually means and
/// what to do.
///
/// ```
/// use rdma_proto::verbs::WcStatus;
/// let s = WcStatus::RetryExcErr.to_string();
/// assert!(s.starts_with("transport retry counter exceeded (12)"), "{s}");
/// assert!(WcStatus::WrFlushErr.to_string().contains("error state"));
/// ```
impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use WcStatus::*;
        let (name, meaning) = match self {
            Success => ("success", ""),
            LocLenErr => (
                "local length error",
                "a message was larger than the receive buffer, or a length was wrong",
            ),
            LocQpOpErr => (
                "local QP operation error",
                "a work request the QP cannot run",
            ),
            LocEecOpErr => ("local EE context operation error", "RD only"),
            LocProtErr => (
                "local protection error",
                "a local buffer is not in a registered region of this PD (lkey, bounds, access)",
            ),
            WrFlushErr => (
                "Work Request Flushed Error",
                "the QP is in the error state (disconnected, or an earlier request failed); \
                 look at the first failed completion",
            ),
            MwBindErr => (
                "memory management operation error",
                "memory window bind failed",
            ),
            BadRespErr => (
                "bad response error",
                "the responder answered with an unexpected opcode",
            ),
            LocAccessErr => (
                "local access error",
                "data could not be written into the local buffer (access flags)",
            ),
            RemInvReqErr => (
                "remote invalid request error",
                "the responder refused the request (length, opcode, or no receive posted)",
            ),
            RemAccessErr => (
                "remote access error",
                "the rkey, address range or access flags of the remote region are wrong",
            ),
            RemOpErr => (
                "remote operation error",
                "the responder failed the operation",
            ),
            RetryExcErr => (
                "transport retry counter exceeded",
                "the peer did not acknowledge within the retries: it is gone or unreachable",
            ),
            RnrRetryExcErr => (
                "RNR retry counter exceeded",
                "the peer had no receive posted, retries ran out: post receives before the \
                 peer sends",
            ),
            LocRddViolErr => ("local RDD violation error", "RD only"),
            RemInvRdReqErr => ("remote invalid RD request", "RD only"),
            RemAbortErr => ("operation aborted", "the remote side aborted"),
            InvEecnErr => ("invalid EE context number", "RD only"),
            InvEecStateErr => ("invalid EE context state", "RD only"),
            FatalErr => ("fatal error", "the device failed"),
            RespTimeoutErr => ("response timeout error", "the responder did not answer"),
            GeneralErr => ("general error", "another error"),
        };
        write!(f, "{name} ({})", *self as u32)?;
        if !meaning.is_empty() {
            write!(f, ": {meaning}")?;
        }
        Ok(())
    }
}

/// Work completion opcode (`ibv_wc_opcode` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// A SEND (any flavour) completed at the requester.
    Send = 0,
    /// An RDMA WRITE completed at the requester.
    RdmaWrite = 1,
    /// An RDMA READ completed.
    RdmaRead = 2,
    /// A compare-and-swap completed.
    CompSwap = 3,
    /// A fetch-and-add completed.
    FetchAdd = 4,
    /// A receive completed (SEND at the responder).
    Recv = 128,
    /// A receive consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
}

/// A work completion (`ibv_wc`).
///
/// ```
/// use rdma_proto::verbs::{Completion, WcOpcode, WcStatus, WcFlags};
/// let c = Completion::new(5, WcStatus::Success, WcOpcode::Recv, 7).with_imm(0xabcd);
/// assert_eq!(c.imm(), Some(0xabcd));
/// assert!(c.wc_flags.contains(WcFlags::WITH_IMM));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Completion {
    /// The work request's identifier.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode (meaningful on success; flushed completions report the WR's nominal opcode).
    pub opcode: WcOpcode,
    /// Bytes transferred (receives: bytes written including a UD GRH).
    pub byte_len: u32,
    /// Immediate data, valid with [`WcFlags::WITH_IMM`].
    pub imm_data: u32,
    /// Invalidated rkey, valid with [`WcFlags::WITH_INV`].
    pub invalidated_rkey: u32,
    /// Number of the QP this completion belongs to.
    pub qp_num: u32,
    /// Source QP (UD receives).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// P_Key index (UD receives).
    pub pkey_index: u16,
    /// The message carried the solicited-event bit (for `ibv_req_notify_cq(solicited_only)`;
    /// not an `ibv_wc` field).
    pub solicited: bool,
}

impl Completion {
    /// A completion with no immediate, no flags.
    pub fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> Self {
        Completion {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm_data: 0,
            invalidated_rkey: 0,
            qp_num,
            src_qp: 0,
            wc_flags: WcFlags::empty(),
            pkey_index: 0,
            solicited: false,
        }
    }
    /// Sets the immediate data and [`WcFlags::WITH_IMM`].
    pub fn with_imm(mut self, imm: u32) -> Self {
        self.imm_data = imm;
        self.wc_flags |= WcFlags::WITH_IMM;
        self
    }
    /// Sets the invalidated rkey and [`WcFlags::WITH_INV`].
    pub fn with_inv(mut self, rkey: u32) -> Self {
        self.invalidated_rkey = rkey;
        self.wc_flags |= WcFlags::WITH_INV;
        self
    }
    /// The immediate data, if any.
    pub fn imm(&self) -> Option<u32> {
        self.wc_flags
            .contains(WcFlags::WITH_IMM)
            .then_some(self.imm_data)
    }
    /// The invalidated rkey, if any.
    pub fn invalidated(&self) -> Option<u32> {
        self.wc_flags
            .contains(WcFlags::WITH_INV)
            .then_some(self.invalidated_rkey)
    }
}

/// Why a work request could not be posted (maps to the errno `ibv_post_send`/`ibv_post_recv`
/// returns).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PostError {
    /// The queue is full (`ENOMEM`).
    QueueFull,
    /// The QP state does not allow posting (`EINVAL`).
    InvalidState(QpState),
    /// The work request is not valid for this QP (`EINVAL`): e.g. atomic with a scatter list
    /// that is not 8 bytes, UD without a destination, inline data too long, message too long.
    InvalidWr(&'static str),
}

impl PostError {
    /// The errno this error stands for.
    pub fn errno(&self) -> i32 {
        match self {
            PostError::QueueFull => 12,
            PostError::InvalidState(_) | PostError::InvalidWr(_) => 22,
        }
    }
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PostError::QueueFull => write!(f, "work queue full"),
            PostError::InvalidState(s) => write!(f, "cannot post in QP state {s:?}"),
            PostError::InvalidWr(why) => write!(f, "invalid work request: {why}"),
        }
    }
}
impl std::error::Error for PostError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_values() {
        assert_eq!(AccessFlags::all().bits(), 15);
        assert_eq!(AccessFlags::from_bits(16), None);
        assert_eq!(
            format!(
                "{:?}",
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC
            ),
            "AccessFlags(LOCAL_WRITE | REMOTE_ATOMIC)"
        );
        for v in 0..22 {
            assert_eq!(WcStatus::from_u32(v).map(|s| s as u32), Some(v));
        }
        assert_eq!(WcStatus::from_u32(22), None);
        assert_eq!(WcOpcode::RecvRdmaWithImm as u32, 129);
        assert_eq!(WrOpcode::SendWithInv as u32, 9);
    }

    #[test]
    fn sglist_bounded() {
        let mut l = SgList::new();
        for i in 0..MAX_SGE {
            l.push(Sge {
                addr: i as u64,
                length: u32::MAX,
                lkey: 0,
            })
            .unwrap();
        }
        assert_eq!(l.push(Sge::default()), Err(TooManySges));
        assert_eq!(l.total_len(), MAX_SGE as u64 * u32::MAX as u64);
    }
}
