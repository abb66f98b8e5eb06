//! Multicast on UD QPs: `ibv_attach_mcast`, `ibv_detach_mcast` and the QP's
//! block-self-loopback flag (`IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`).
//!
//! A multicast GID is the group's IP address as a GID: an IPv4 group `a.b.c.d` is
//! `::ffff:a.b.c.d` (what rdma_cm gives on RoCEv2), an IPv6 group is itself. Attaching the
//! first QP of the device to a group joins it on the QP's port's netdev (the kernel sends
//! the IGMP / MLD report); every datagram to the group then reaches each attached QP once,
//! the device's own sends included (the kernel loops them back) unless the QP blocks them.
//! Sending to a group needs no attach: an address handle to the group's GID and remote QPN
//! `0xFFFFFF` ([`rdma_proto::ud::MULTICAST_QPN`]).

use super::qp::QueuePair;
use crate::io::WireAddr;
use crate::runtime::gid_addr;
use crate::{Error, Result};

/// The group address of multicast GID `gid` (IPv4-mapped GIDs as IPv4); `EINVAL` when it
/// is not a multicast address.
pub fn mcast_group(gid: [u8; 16]) -> Result<WireAddr> {
    let g = gid_addr(gid);
    if !g.ip().is_multicast() {
        return Err(Error::InvalidArgument("not a multicast GID"));
    }
    Ok(g)
}

impl QueuePair {
    /// `ibv_attach_mcast`: the QP receives the datagrams sent to group `gid` (see the module
    /// doc). `lid` is ignored (RoCE has none). `EINVAL` for an RC QP or a GID that is not
    /// multicast; an error from the kernel's join (`ENODEV` for a netdev gone, ...) as is.
    /// Attaching twice does nothing, as with rxe.
    ///
    /// ```no_run
    /// # fn f(qp: &rdma_soft::verbs::QueuePair) -> rdma_soft::Result<()> {
    /// let group: std::net::Ipv4Addr = "239.1.2.3".parse().unwrap();
    /// qp.attach_mcast(group.to_ipv6_mapped().octets(), 0)?;
    /// // ... receive datagrams sent to 239.1.2.3:4791 ...
    /// qp.detach_mcast(group.to_ipv6_mapped().octets(), 0)?;
    /// # Ok(()) }
    /// ```
    pub fn attach_mcast(&self, gid: [u8; 16], lid: u16) -> Result<()> {
        let _ = lid;
        if !self.is_ud() {
            return Err(Error::InvalidArgument("multicast needs a UD QP"));
        }
        let group = mcast_group(gid)?;
        let dev = self.device();
        let port = {
            let mut rt = dev.runtime();
            rt.ud_port(self.qpn())?
        };
        let netdev = dev.cfg().port_parts(port)?.0.to_owned();
        let ifindex = ifindex_of(&netdev)?;
        dev.runtime().mcast_attach(self.qpn(), group, ifindex)
    }

    /// `ibv_detach_mcast`: stops receiving group `gid`'s datagrams; the device leaves the
    /// group with its last QP. `EINVAL` when the QP is not attached to it (as rxe).
    pub fn detach_mcast(&self, gid: [u8; 16], lid: u16) -> Result<()> {
        let _ = lid;
        let group = mcast_group(gid)?;
        self.device().runtime().mcast_detach(self.qpn(), group)
    }

    /// Whether the QP skips the datagrams it sent itself to a group it is attached to
    /// (`IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`; rdma-core's `mckey -l`). Off by default.
    /// `EINVAL` for an RC QP.
    pub fn set_block_self_mcast_loopback(&self, on: bool) -> Result<()> {
        if !self.is_ud() {
            return Err(Error::InvalidArgument("multicast needs a UD QP"));
        }
        self.device().runtime().mcast_block_loopback(self.qpn(), on);
        Ok(())
    }

    /// The groups the QP is attached to (as addresses).
    pub fn mcast_groups(&self) -> Vec<std::net::IpAddr> {
        self.device().runtime().mcast_groups_of(self.qpn())
    }
}

/// The ifindex of `netdev` in the calling thread's network namespace (`ENODEV`).
#[allow(unsafe_code)]
fn ifindex_of(netdev: &str) -> Result<u32> {
    let c = std::ffi::CString::new(netdev).map_err(|_| Error::InvalidArgument("netdev name"))?;
    // SAFETY: `c` is a valid NUL-terminated string for the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(Error::last_os("if_nametoindex", None));
    }
    Ok(i)
}
