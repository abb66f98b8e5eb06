//! Multicast groups on [`UdpWire`]: one receive socket per joined group, bound to
//! `GROUP:4791`.
//!
//! The kernel hands a multicast datagram to *every* socket that matches it
//! (`__udp4_lib_mcast_deliver` / `__udp6_lib_mcast_deliver` clone it for each; a
//! `SO_REUSEPORT` group and its steering program play no part), and a socket matches when
//! its bound address is the group (or the wildcard) and, with `IP_MULTICAST_ALL` off, it
//! joined the group on the arrival interface itself (`ip_mc_sf_allow`). So each of our
//! wires that joined gets exactly one copy, whatever other processes share the port, and
//! a wire (a process) that did not join has no socket bound to the group and gets none.
//! The unicast sockets bound to `ADDR:4791` never match a group's datagram.
//!
//! Joining (`IP_ADD_MEMBERSHIP` / `IPV6_ADD_MEMBERSHIP`) makes the kernel send the IGMP /
//! MLD report and accept the group's MAC; closing the socket leaves the group (the kernel
//! does it when the process dies, too). Sending to a group needs nothing here: every socket
//! of the wire sends with TTL / hop limit 64 to groups ([`sys::MULTICAST_HOPS`]), from the
//! netdev of its bound source address, and the kernel loops the datagram back to this
//! host's members (`IP_MULTICAST_LOOP` on by default).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use super::{Local, UdpWire};
use crate::io::peers::PeerSockets;
use crate::io::ports::SportSockets;
use crate::io::send_batch::SendBatch;
use crate::io::{share, sys, WireAddr};
use crate::{Error, Result};

/// `IPV6_MULTICAST_ALL` (linux/in6.h; not in the libc crate).
const IPV6_MULTICAST_ALL: i32 = 29;

#[allow(unsafe_code)]
fn set_raw<T>(
    fd: &OwnedFd,
    group: WireAddr,
    op: &'static str,
    level: i32,
    name: i32,
    v: &T,
) -> Result<()> {
    // SAFETY: `v` points at a live value of its type, whose size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(Error::Os {
            op,
            addr: Some(group),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// A socket bound to `group:port` with `SO_REUSEADDR` and `SO_REUSEPORT` (other processes
/// of the user join too), member of `group` on interface `ifindex`, receiving only the
/// groups it joined itself on that interface (`IP_MULTICAST_ALL` off).
pub(super) fn open_group(
    group: WireAddr,
    ifindex: u32,
    port: u16,
    buf: i32,
    ip_meta: bool,
) -> Result<OwnedFd> {
    if !group.ip().is_multicast() {
        return Err(Error::InvalidArgument("not a multicast group address"));
    }
    let fd = sys::new_udp(group, buf, true, ip_meta)?;
    let one: i32 = 1;
    let zero: i32 = 0;
    set_raw(
        &fd,
        group,
        "SO_REUSEADDR",
        libc::SOL_SOCKET,
        libc::SO_REUSEADDR,
        &one,
    )?;
    match group.ip() {
        std::net::IpAddr::V4(g) => {
            let ifindex = i32::try_from(ifindex).map_err(|_| Error::InvalidArgument("ifindex"))?;
            set_raw(
                &fd,
                group,
                "IP_MULTICAST_ALL",
                libc::IPPROTO_IP,
                libc::IP_MULTICAST_ALL,
                &zero,
            )?;
            let mreq = libc::ip_mreqn {
                imr_multiaddr: libc::in_addr {
                    s_addr: u32::from(g).to_be(),
                },
                imr_address: libc::in_addr { s_addr: 0 },
                imr_ifindex: ifindex,
            };
            set_raw(
                &fd,
                group,
                "IP_ADD_MEMBERSHIP",
                libc::IPPROTO_IP,
                libc::IP_ADD_MEMBERSHIP,
                &mreq,
            )?;
        }
        std::net::IpAddr::V6(g) => {
            set_raw(
                &fd,
                group,
                "IPV6_MULTICAST_ALL",
                libc::IPPROTO_IPV6,
                IPV6_MULTICAST_ALL,
                &zero,
            )?;
            let mreq = libc::ipv6_mreq {
                ipv6mr_multiaddr: libc::in6_addr {
                    s6_addr: g.octets(),
                },
                ipv6mr_interface: ifindex,
            };
            set_raw(
                &fd,
                group,
                "IPV6_ADD_MEMBERSHIP",
                libc::IPPROTO_IPV6,
                libc::IPV6_ADD_MEMBERSHIP,
                &mreq,
            )?;
        }
    }
    sys::bind_udp(&fd, group, port)?;
    Ok(fd)
}

impl UdpWire {
    /// [`crate::io::DatagramWire::join_group`].
    pub(super) fn join(&mut self, group: WireAddr, ifindex: u32) -> Result<()> {
        if self.is_group_open(group) {
            return Ok(());
        }
        let buf = i32::try_from(self.cfg.socket_buffer).unwrap_or(i32::MAX);
        let fd = open_group(group, ifindex, self.cfg.port, buf, self.ip_meta)?;
        let rc = super::park::socket_ctl(self.epoll.as_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd());
        if rc != 0 {
            return Err(Error::last_os("epoll_ctl", Some(group)));
        }
        tracing::debug!(%group, ifindex, "multicast group joined");
        let ports = SportSockets::of_socket(fd.as_fd());
        self.locals.push(Local {
            addr: group,
            fd,
            // receive only: the group's socket sends nothing
            out: SendBatch::new(1, 64),
            member: None,
            ports,
            peers: PeerSockets::default(),
            netns: share::current_netns(),
            quiet: true,
        });
        Ok(())
    }

    fn is_group_open(&self, group: WireAddr) -> bool {
        self.local_index(group).is_some()
    }
}
