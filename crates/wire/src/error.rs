//! The error type shared by every parser and emitter in this crate.

use core::fmt;

/// Why a buffer could not be parsed or a value could not be emitted.
///
/// Parsers never panic: every malformed input maps to one of these.
///
/// ```
/// use rdma_wire::Error;
/// let e = Error::Truncated { need: 12, have: 3 };
/// assert_eq!(e.to_string(), "truncated: need 12 bytes, have 3");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// The buffer is shorter than the header or message needs.
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The BTH opcode is not one this crate knows.
    UnknownOpcode(u8),
    /// The pad count is larger than the payload it would be taken from.
    BadPadCount(u8),
    /// The BTH transport header version is not 0.
    BadTransportVersion(u8),
    /// The ICRC at the end of the packet does not match its contents.
    BadIcrc {
        /// The value carried in the packet.
        found: u32,
        /// The value computed over the packet.
        computed: u32,
    },
    /// A MAD whose base version, class or class version this parser does not accept.
    BadMadClass {
        /// Base version.
        base_version: u8,
        /// Management class.
        mgmt_class: u8,
        /// Class version.
        class_version: u8,
    },
    /// A MAD attribute id that does not name a known message of its class.
    UnknownAttribute(u16),
    /// A buffer whose length is not the fixed length of the format.
    BadLength {
        /// Required length.
        expected: usize,
        /// Given length.
        found: usize,
    },
    /// A field holds a value that the specification does not allow.
    BadField(&'static str),
    /// The output buffer is too small for the value being emitted.
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A value does not fit the field it must be emitted into (e.g. too much private data).
    TooLong {
        /// The field.
        field: &'static str,
        /// The maximum allowed.
        max: usize,
        /// The length given.
        len: usize,
    },
    /// An extended header is present or missing contrary to what the BTH opcode requires.
    HeaderMismatch {
        /// The BTH opcode.
        opcode: u8,
        /// The header (`"RETH"`, `"ImmDt"`, ...).
        header: &'static str,
    },
    /// The bytes between the headers and the ICRC (payload and pad) do not suit the opcode:
    /// not a multiple of 4, or not empty for an opcode without payload.
    BadPayloadLength {
        /// The BTH opcode.
        opcode: u8,
        /// Payload plus pad bytes.
        len: usize,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::Truncated { need, have } => write!(f, "truncated: need {need} bytes, have {have}"),
            Error::UnknownOpcode(op) => write!(f, "unknown BTH opcode {op:#04x}"),
            Error::BadPadCount(p) => write!(f, "pad count {p} exceeds the payload"),
            Error::BadTransportVersion(v) => write!(f, "unsupported transport header version {v}"),
            Error::BadIcrc { found, computed } => {
                write!(f, "bad ICRC: packet has {found:#010x}, computed {computed:#010x}")
            }
            Error::BadMadClass { base_version, mgmt_class, class_version } => write!(
                f,
                "unexpected MAD base version {base_version}, class {mgmt_class:#04x}, class version {class_version}"
            ),
            Error::UnknownAttribute(a) => write!(f, "unknown MAD attribute id {a:#06x}"),
            Error::BadLength { expected, found } => {
                write!(f, "bad length: expected {expected} bytes, found {found}")
            }
            Error::BadField(name) => write!(f, "invalid value in field {name}"),
            Error::BufferTooSmall { need, have } => {
                write!(f, "output buffer too small: need {need} bytes, have {have}")
            }
            Error::TooLong { field, max, len } => {
                write!(f, "{field} too long: {len} bytes, at most {max}")
            }
            Error::HeaderMismatch { opcode, header } => {
                write!(f, "{header} presence does not match BTH opcode {opcode:#04x}")
            }
            Error::BadPayloadLength { opcode, len } => {
                write!(f, "payload of {len} bytes not allowed for BTH opcode {opcode:#04x}")
            }
        }
    }
}

impl std::error::Error for Error {}

/// Result alias used across the crate.
pub type Result<T> = core::result::Result<T, Error>;
