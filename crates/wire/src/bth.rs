//! Base Transport Header (IBA Vol. 1 §9.2), 12 bytes, the first header of every RoCEv2
//! UDP payload.
//!
//! | byte | bits | field |
//! |---|---|---|
//! | 0 | 8 | OpCode |
//! | 1 | 1/1/2/4 | SE, M (MigReq), PadCnt, TVer |
//! | 2..4 | 16 | P_Key |
//! | 4 | 1/1/6 | FECN, BECN (RoCEv2 use of IBA Resv8a), Resv6a |
//! | 5..8 | 24 | DestQP |
//! | 8 | 1/7 | A (AckReq), Resv7 |
//! | 9..12 | 24 | PSN |

use crate::field::{check_len, get_u16, get_u24, set_u16, set_u24};
use crate::opcode::Opcode;
use crate::{Error, Result};

/// Length of the BTH in bytes (defined with the header lengths of the opcode table, which
/// counts extended-header offsets from the BTH's start).
pub use crate::opcode::BTH_LEN;

/// Largest value of a 24-bit field (QPN, PSN).
pub const MAX_U24: u32 = 0x00ff_ffff;

mod field {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const P_KEY: usize = 2;
    pub const RESV8A: usize = 4;
    pub const DEST_QP: usize = 5;
    pub const ACK: usize = 8;
    pub const PSN: usize = 9;
}

/// A read/write view of a BTH at the start of a buffer.
///
/// ```
/// use rdma_wire::bth::Bth;
/// let bytes = [0x64, 0x00, 0xff, 0xff, 0, 0, 0, 1, 0x80, 0, 0, 7];
/// let bth = Bth::new_checked(&bytes[..]).unwrap();
/// assert_eq!((bth.opcode(), bth.p_key(), bth.dest_qp(), bth.ack_req(), bth.psn()),
///            (0x64, 0xffff, 1, true, 7));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Bth<T> {
    /// Wraps a buffer without checking its length; getters panic if it is shorter than
    /// [`BTH_LEN`].
    pub const fn new_unchecked(buffer: T) -> Self {
        Bth { buffer }
    }

    /// Wraps a buffer after checking that it holds a whole BTH.
    pub fn new_checked(buffer: T) -> Result<Self> {
        check_len(buffer.as_ref(), BTH_LEN)?;
        Ok(Bth { buffer })
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// OpCode, raw.
    pub fn opcode(&self) -> u8 {
        self.b()[field::OPCODE]
    }

    /// SE: solicited event.
    pub fn se(&self) -> bool {
        self.b()[field::FLAGS] & 0x80 != 0
    }

    /// M: migration request (MigReq).
    pub fn mig_req(&self) -> bool {
        self.b()[field::FLAGS] & 0x40 != 0
    }

    /// PadCnt: pad bytes (0..=3) before the ICRC.
    pub fn pad_cnt(&self) -> u8 {
        (self.b()[field::FLAGS] >> 4) & 0x3
    }

    /// TVer: transport header version, 0 today.
    pub fn tver(&self) -> u8 {
        self.b()[field::FLAGS] & 0xf
    }

    /// P_Key: partition key.
    pub fn p_key(&self) -> u16 {
        get_u16(self.b(), field::P_KEY)
    }

    /// FECN: forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.b()[field::RESV8A] & 0x80 != 0
    }

    /// BECN: backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        self.b()[field::RESV8A] & 0x40 != 0
    }

    /// Resv6a: the six reserved bits after FECN and BECN.
    pub fn resv6a(&self) -> u8 {
        self.b()[field::RESV8A] & 0x3f
    }

    /// DestQP: destination queue pair number (24 bits).
    pub fn dest_qp(&self) -> u32 {
        get_u24(self.b(), field::DEST_QP)
    }

    /// A: acknowledge request.
    pub fn ack_req(&self) -> bool {
        self.b()[field::ACK] & 0x80 != 0
    }

    /// Resv7: the seven reserved bits after A.
    pub fn resv7(&self) -> u8 {
        self.b()[field::ACK] & 0x7f
    }

    /// PSN: packet sequence number (24 bits).
    pub fn psn(&self) -> u32 {
        get_u24(self.b(), field::PSN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    fn set_bit(&mut self, at: usize, mask: u8, v: bool) {
        let b = &mut self.bm()[at];
        *b = if v { *b | mask } else { *b & !mask };
    }

    /// Sets OpCode.
    pub fn set_opcode(&mut self, v: u8) {
        self.bm()[field::OPCODE] = v;
    }

    /// Sets SE.
    pub fn set_se(&mut self, v: bool) {
        self.set_bit(field::FLAGS, 0x80, v);
    }

    /// Sets M (MigReq).
    pub fn set_mig_req(&mut self, v: bool) {
        self.set_bit(field::FLAGS, 0x40, v);
    }

    /// Sets PadCnt (low 2 bits of `v`).
    pub fn set_pad_cnt(&mut self, v: u8) {
        let b = &mut self.bm()[field::FLAGS];
        *b = (*b & !0x30) | ((v & 0x3) << 4);
    }

    /// Sets TVer (low 4 bits of `v`).
    pub fn set_tver(&mut self, v: u8) {
        let b = &mut self.bm()[field::FLAGS];
        *b = (*b & !0x0f) | (v & 0xf);
    }

    /// Sets P_Key.
    pub fn set_p_key(&mut self, v: u16) {
        set_u16(self.bm(), field::P_KEY, v);
    }

    /// Sets FECN.
    pub fn set_fecn(&mut self, v: bool) {
        self.set_bit(field::RESV8A, 0x80, v);
    }

    /// Sets BECN.
    pub fn set_becn(&mut self, v: bool) {
        self.set_bit(field::RESV8A, 0x40, v);
    }

    /// Sets Resv6a (low 6 bits of `v`).
    pub fn set_resv6a(&mut self, v: u8) {
        let b = &mut self.bm()[field::RESV8A];
        *b = (*b & 0xc0) | (v & 0x3f);
    }

    /// Sets DestQP (low 24 bits of `v`).
    pub fn set_dest_qp(&mut self, v: u32) {
        set_u24(self.bm(), field::DEST_QP, v);
    }

    /// Sets A (AckReq).
    pub fn set_ack_req(&mut self, v: bool) {
        self.set_bit(field::ACK, 0x80, v);
    }

    /// Sets Resv7 (low 7 bits of `v`).
    pub fn set_resv7(&mut self, v: u8) {
        let b = &mut self.bm()[field::ACK];
        *b = (*b & 0x80) | (v & 0x7f);
    }

    /// Sets PSN (low 24 bits of `v`).
    pub fn set_psn(&mut self, v: u32) {
        set_u24(self.bm(), field::PSN, v);
    }
}

/// A parsed BTH.
///
/// Parsing rejects unknown opcodes ([`Error::UnknownOpcode`]) and a TVer other than 0
/// ([`Error::BadTransportVersion`]). The reserved bits are kept (`resv6a`, `resv7`) so that
/// re-emitting a parsed header reproduces it byte for byte; senders set them to 0.
///
/// ```
/// use rdma_wire::bth::{Bth, BthRepr};
/// use rdma_wire::opcode::Opcode;
/// let repr = BthRepr {
///     opcode: Opcode::RcSendOnly, se: false, mig_req: false, pad_cnt: 0, p_key: 0xffff,
///     fecn: false, becn: false, resv6a: 0, dest_qp: 0x11, ack_req: true, resv7: 0, psn: 42,
/// };
/// let mut buf = [0u8; BthRepr::LEN];
/// repr.emit(&mut Bth::new_unchecked(&mut buf[..])).unwrap();
/// assert_eq!(BthRepr::parse(&Bth::new_checked(&buf[..]).unwrap()), Ok(repr));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// OpCode.
    pub opcode: Opcode,
    /// SE: solicited event.
    pub se: bool,
    /// M: migration request.
    pub mig_req: bool,
    /// PadCnt, 0..=3.
    pub pad_cnt: u8,
    /// P_Key.
    pub p_key: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// Resv6a, 0..=0x3f; 0 on send.
    pub resv6a: u8,
    /// DestQP, 24 bits.
    pub dest_qp: u32,
    /// A: acknowledge request.
    pub ack_req: bool,
    /// Resv7, 0..=0x7f; 0 on send.
    pub resv7: u8,
    /// PSN, 24 bits.
    pub psn: u32,
}

impl BthRepr {
    /// Length of the header in bytes.
    pub const LEN: usize = BTH_LEN;

    /// Parses a BTH view.
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<Self> {
        check_len(bth.b(), BTH_LEN)?;
        let opcode = Opcode::try_from(bth.opcode())?;
        if bth.tver() != 0 {
            return Err(Error::BadTransportVersion(bth.tver()));
        }
        Ok(BthRepr {
            opcode,
            se: bth.se(),
            mig_req: bth.mig_req(),
            pad_cnt: bth.pad_cnt(),
            p_key: bth.p_key(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            resv6a: bth.resv6a(),
            dest_qp: bth.dest_qp(),
            ack_req: bth.ack_req(),
            resv7: bth.resv7(),
            psn: bth.psn(),
        })
    }

    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        BTH_LEN
    }

    /// Checks that every field fits its bits.
    pub fn check(&self) -> Result<()> {
        if self.pad_cnt > 3 {
            Err(Error::BadPadCount(self.pad_cnt))
        } else if self.resv6a > 0x3f {
            Err(Error::BadField("bth.resv6a"))
        } else if self.dest_qp > MAX_U24 {
            Err(Error::BadField("bth.dest_qp"))
        } else if self.resv7 > 0x7f {
            Err(Error::BadField("bth.resv7"))
        } else if self.psn > MAX_U24 {
            Err(Error::BadField("bth.psn"))
        } else {
            Ok(())
        }
    }

    /// Writes the header (TVer 0) into `bth`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bth: &mut Bth<T>) -> Result<()> {
        self.check()?;
        let have = bth.b().len();
        if have < BTH_LEN {
            return Err(Error::BufferTooSmall {
                need: BTH_LEN,
                have,
            });
        }
        bth.set_opcode(self.opcode.into());
        bth.bm()[field::FLAGS] = 0;
        bth.set_se(self.se);
        bth.set_mig_req(self.mig_req);
        bth.set_pad_cnt(self.pad_cnt);
        bth.set_tver(0);
        bth.set_p_key(self.p_key);
        bth.bm()[field::RESV8A] = 0;
        bth.set_fecn(self.fecn);
        bth.set_becn(self.becn);
        bth.set_resv6a(self.resv6a);
        bth.set_dest_qp(self.dest_qp);
        bth.bm()[field::ACK] = 0;
        bth.set_ack_req(self.ack_req);
        bth.set_resv7(self.resv7);
        bth.set_psn(self.psn);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn any_bth() -> impl Strategy<Value = BthRepr> {
        (
            proptest::sample::select(Opcode::ALL),
            any::<(bool, bool, bool, bool, bool)>(),
            0u8..4,
            any::<u16>(),
            0u8..0x40,
            0u32..=MAX_U24,
            0u8..0x80,
            0u32..=MAX_U24,
        )
            .prop_map(
                |(
                    opcode,
                    (se, mig_req, fecn, becn, ack_req),
                    pad_cnt,
                    p_key,
                    resv6a,
                    dest_qp,
                    resv7,
                    psn,
                )| {
                    BthRepr {
                        opcode,
                        se,
                        mig_req,
                        pad_cnt,
                        p_key,
                        fecn,
                        becn,
                        resv6a,
                        dest_qp,
                        ack_req,
                        resv7,
                        psn,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn repr_round_trips(repr in any_bth()) {
            let mut buf = [0xa5u8; BTH_LEN];
            repr.emit(&mut Bth::new_unchecked(&mut buf[..])).unwrap();
            prop_assert_eq!(BthRepr::parse(&Bth::new_checked(&buf[..]).unwrap()), Ok(repr));
        }

        #[test]
        fn bytes_round_trip_or_typed_error(bytes in proptest::array::uniform12(any::<u8>())) {
            match BthRepr::parse(&Bth::new_unchecked(&bytes[..])) {
                Ok(repr) => {
                    let mut out = [0u8; BTH_LEN];
                    repr.emit(&mut Bth::new_unchecked(&mut out[..])).unwrap();
                    prop_assert_eq!(out, bytes);
                }
                Err(Error::UnknownOpcode(op)) => prop_assert_eq!(op, bytes[0]),
                Err(Error::BadTransportVersion(v)) => prop_assert_eq!(v, bytes[1] & 0xf),
                Err(e) => prop_assert!(false, "unexpected {e:?}"),
            }
        }
    }

    #[test]
    fn truncated_and_out_of_range() {
        for n in 0..BTH_LEN {
            assert_eq!(
                Bth::new_checked(&[0u8; 12][..n]).err(),
                Some(Error::Truncated { need: 12, have: n })
            );
            assert!(BthRepr::parse(&Bth::new_unchecked(&[0u8; 12][..n])).is_err());
        }
        let mut repr = BthRepr::parse(&Bth::new_unchecked(
            &[4u8, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1][..],
        ))
        .unwrap();
        let mut buf = [0u8; 12];
        repr.emit(&mut Bth::new_unchecked(&mut buf[..11]))
            .unwrap_err();
        repr.psn = 1 << 24;
        assert_eq!(
            repr.emit(&mut Bth::new_unchecked(&mut buf[..])),
            Err(Error::BadField("bth.psn"))
        );
        repr.psn = 0;
        repr.pad_cnt = 4;
        assert_eq!(
            repr.emit(&mut Bth::new_unchecked(&mut buf[..])),
            Err(Error::BadPadCount(4))
        );
    }

    #[test]
    fn setters_touch_only_their_bits() {
        let mut buf = [0xffu8; 12];
        let mut bth = Bth::new_unchecked(&mut buf[..]);
        bth.set_se(false);
        bth.set_pad_cnt(1);
        bth.set_fecn(false);
        bth.set_resv7(0);
        assert_eq!(
            buf,
            [0xff, 0x5f, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff, 0x80, 0xff, 0xff, 0xff]
        );
    }
}
