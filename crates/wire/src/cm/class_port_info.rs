//! ClassPortInfo (IBA vol1 13.4.8.1, table 127; attribute 0x0001): 72 bytes.
//!
//! The CM answers a Get(ClassPortInfo) with it, and REJ (reasons 24/25), APR and SIDR_REP
//! (status Redirect) carry one as their additional information to redirect the requester.

use std::net::Ipv6Addr;

use crate::layout::{check_bits, check_out, view};
use crate::time::IbaTime;
use crate::Result;

/// Length of a ClassPortInfo.
pub const CLASS_PORT_INFO_LEN: usize = 72;

view! {
    /// A zero-copy view of a ClassPortInfo.
    ///
    /// ```
    /// use rdma_wire::cm::ClassPortInfo;
    /// let mut buf = [0u8; 72];
    /// let mut c = ClassPortInfo::new_checked(&mut buf[..]).unwrap();
    /// c.set_redirect_qp(0x12);
    /// c.set_redirect_fl(0xabcde);
    /// c.set_redirect_sl(3);
    /// assert_eq!(&buf[24..28], &[0, 0x3a, 0xbc, 0xde]);
    /// assert_eq!(&buf[32..36], &[0, 0, 0, 0x12]);
    /// ```
    pub struct ClassPortInfo, len = CLASS_PORT_INFO_LEN;
    /// BaseVersion.
    base_version / set_base_version: u8(0);
    /// ClassVersion.
    class_version / set_class_version: u8(1);
    /// CapabilityMask.
    capability_mask / set_capability_mask: u16(2);
    /// CapabilityMask2 (27 bits).
    capability_mask2 / set_capability_mask2: word(4, 5, 27);
    /// RespTimeValue.
    resp_time_value / set_resp_time_value: time(7, 0);
    /// RedirectGID.
    redirect_gid / set_redirect_gid: gid(8);
    /// RedirectTC.
    redirect_tc / set_redirect_tc: u8(24);
    /// RedirectSL (4 bits).
    redirect_sl / set_redirect_sl: bits(25, 4, 4);
    /// RedirectFL (20 bits).
    redirect_fl / set_redirect_fl: word(24, 0, 20);
    /// RedirectLID.
    redirect_lid / set_redirect_lid: u16(28);
    /// RedirectP_Key.
    redirect_p_key / set_redirect_p_key: u16(30);
    /// RedirectQP (24 bits).
    redirect_qp / set_redirect_qp: u24(33);
    /// RedirectQ_Key.
    redirect_q_key / set_redirect_q_key: u32(36);
    /// TrapGID.
    trap_gid / set_trap_gid: gid(40);
    /// TrapTC.
    trap_tc / set_trap_tc: u8(56);
    /// TrapSL (4 bits).
    trap_sl / set_trap_sl: bits(57, 4, 4);
    /// TrapFL (20 bits).
    trap_fl / set_trap_fl: word(56, 0, 20);
    /// TrapLID.
    trap_lid / set_trap_lid: u16(60);
    /// TrapP_Key.
    trap_p_key / set_trap_p_key: u16(62);
    /// TrapHL (hop limit).
    trap_hl / set_trap_hl: u8(64);
    /// TrapQP (24 bits).
    trap_qp / set_trap_qp: u24(65);
    /// TrapQ_Key.
    trap_q_key / set_trap_q_key: u32(68);
}

/// A ClassPortInfo as plain values.
///
/// ```
/// use rdma_wire::cm::ClassPortInfoRepr;
/// let mut c = ClassPortInfoRepr::from_bytes(&[0; 72]);
/// c.base_version = 1;
/// c.class_version = 2;
/// let mut buf = [0u8; 72];
/// c.emit(&mut buf).unwrap();
/// assert_eq!(ClassPortInfoRepr::parse(&buf).unwrap(), c);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClassPortInfoRepr {
    /// BaseVersion.
    pub base_version: u8,
    /// ClassVersion.
    pub class_version: u8,
    /// CapabilityMask.
    pub capability_mask: u16,
    /// CapabilityMask2 (27 bits).
    pub capability_mask2: u32,
    /// RespTimeValue.
    pub resp_time_value: IbaTime,
    /// RedirectGID.
    pub redirect_gid: Ipv6Addr,
    /// RedirectTC.
    pub redirect_tc: u8,
    /// RedirectSL (4 bits).
    pub redirect_sl: u8,
    /// RedirectFL (20 bits).
    pub redirect_fl: u32,
    /// RedirectLID.
    pub redirect_lid: u16,
    /// RedirectP_Key.
    pub redirect_p_key: u16,
    /// RedirectQP (24 bits).
    pub redirect_qp: u32,
    /// RedirectQ_Key.
    pub redirect_q_key: u32,
    /// TrapGID.
    pub trap_gid: Ipv6Addr,
    /// TrapTC.
    pub trap_tc: u8,
    /// TrapSL (4 bits).
    pub trap_sl: u8,
    /// TrapFL (20 bits).
    pub trap_fl: u32,
    /// TrapLID.
    pub trap_lid: u16,
    /// TrapP_Key.
    pub trap_p_key: u16,
    /// TrapHL.
    pub trap_hl: u8,
    /// TrapQP (24 bits).
    pub trap_qp: u32,
    /// TrapQ_Key.
    pub trap_q_key: u32,
}

impl ClassPortInfoRepr {
    /// Length on the wire.
    pub const LEN: usize = CLASS_PORT_INFO_LEN;

    /// Reads a ClassPortInfo from exactly 72 bytes (cannot fail).
    pub fn from_bytes(buf: &[u8; CLASS_PORT_INFO_LEN]) -> Self {
        let v = ClassPortInfo::new_unchecked(&buf[..]);
        ClassPortInfoRepr {
            base_version: v.base_version(),
            class_version: v.class_version(),
            capability_mask: v.capability_mask(),
            capability_mask2: v.capability_mask2(),
            resp_time_value: v.resp_time_value(),
            redirect_gid: v.redirect_gid(),
            redirect_tc: v.redirect_tc(),
            redirect_sl: v.redirect_sl(),
            redirect_fl: v.redirect_fl(),
            redirect_lid: v.redirect_lid(),
            redirect_p_key: v.redirect_p_key(),
            redirect_qp: v.redirect_qp(),
            redirect_q_key: v.redirect_q_key(),
            trap_gid: v.trap_gid(),
            trap_tc: v.trap_tc(),
            trap_sl: v.trap_sl(),
            trap_fl: v.trap_fl(),
            trap_lid: v.trap_lid(),
            trap_p_key: v.trap_p_key(),
            trap_hl: v.trap_hl(),
            trap_qp: v.trap_qp(),
            trap_q_key: v.trap_q_key(),
        }
    }

    /// Reads a ClassPortInfo from the first 72 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let v = ClassPortInfo::new_checked(buf)?;
        Ok(Self::from_bytes(&crate::layout::array(v.into_inner(), 0)))
    }

    /// Writes the ClassPortInfo into the first 72 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_out(buf, Self::LEN)?;
        check_bits(
            self.capability_mask2.into(),
            27,
            "class_port_info.capability_mask2",
        )?;
        check_bits(self.redirect_sl.into(), 4, "class_port_info.redirect_sl")?;
        check_bits(self.redirect_fl.into(), 20, "class_port_info.redirect_fl")?;
        check_bits(self.redirect_qp.into(), 24, "class_port_info.redirect_qp")?;
        check_bits(self.trap_sl.into(), 4, "class_port_info.trap_sl")?;
        check_bits(self.trap_fl.into(), 20, "class_port_info.trap_fl")?;
        check_bits(self.trap_qp.into(), 24, "class_port_info.trap_qp")?;
        buf[..Self::LEN].fill(0);
        let mut v = ClassPortInfo::new_unchecked(buf);
        v.set_base_version(self.base_version);
        v.set_class_version(self.class_version);
        v.set_capability_mask(self.capability_mask);
        v.set_capability_mask2(self.capability_mask2);
        v.set_resp_time_value(self.resp_time_value);
        v.set_redirect_gid(self.redirect_gid);
        v.set_redirect_tc(self.redirect_tc);
        v.set_redirect_sl(self.redirect_sl);
        v.set_redirect_fl(self.redirect_fl);
        v.set_redirect_lid(self.redirect_lid);
        v.set_redirect_p_key(self.redirect_p_key);
        v.set_redirect_qp(self.redirect_qp);
        v.set_redirect_q_key(self.redirect_q_key);
        v.set_trap_gid(self.trap_gid);
        v.set_trap_tc(self.trap_tc);
        v.set_trap_sl(self.trap_sl);
        v.set_trap_fl(self.trap_fl);
        v.set_trap_lid(self.trap_lid);
        v.set_trap_p_key(self.trap_p_key);
        v.set_trap_hl(self.trap_hl);
        v.set_trap_qp(self.trap_qp);
        v.set_trap_q_key(self.trap_q_key);
        Ok(())
    }
}
