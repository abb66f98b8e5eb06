//! The unsafe edge: socket set-up, socket addresses and control messages through libc.
//!
//! Everything here is a thin, checked wrapper; the batching logic lives in `batch.rs`.

use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use super::WireAddr;
use crate::{Error, Result};

pub(crate) mod cmsg;
pub(crate) mod mmsg;
pub(crate) use cmsg::CmsgBuf;

/// Size of a `sockaddr_storage`, as `socklen_t`.
pub(crate) const STORAGE_LEN: libc::socklen_t = size_of::<libc::sockaddr_storage>() as _;

/// `setsockopt` of an int option.
pub(crate) fn setsockopt_int(fd: RawFd, level: i32, name: i32, value: i32) -> std::io::Result<()> {
    // SAFETY: `value` outlives the call and the length matches its type.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const i32).cast(),
            size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `SOL_UDP` and `UDP_SEGMENT` (linux/udp.h).
pub(crate) const SOL_UDP: i32 = 17;
/// See [`SOL_UDP`].
pub(crate) const UDP_SEGMENT: i32 = 103;

/// Whether the kernel has UDP GSO for this socket: setting `UDP_SEGMENT` to 0 (no
/// segmentation unless a message asks for it) succeeds.
pub(crate) fn has_udp_gso(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    setsockopt_int(fd.as_raw_fd(), SOL_UDP, UDP_SEGMENT, 0).is_ok()
}

/// Asks the kernel to hand over coalesced datagrams (`UDP_GRO`, Linux 5.0): one receive of up
/// to 64 KiB with the segment size in a control message. False where refused.
pub(crate) fn enable_udp_gro(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    setsockopt_int(fd.as_raw_fd(), libc::SOL_UDP, libc::UDP_GRO, 1).is_ok()
}

/// Reads an integer socket option.
#[cfg(test)]
pub(crate) fn getsockopt_int(fd: RawFd, level: i32, name: i32) -> std::io::Result<i32> {
    let mut value: i32 = 0;
    let mut len = size_of::<i32>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes and `len` gives the buffer size.
    let rc =
        unsafe { libc::getsockopt(fd, level, name, (&mut value as *mut i32).cast(), &mut len) };
    if rc == 0 {
        Ok(value)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Opens a non-blocking UDP socket bound to `local:port` that never fragments (DF set,
/// `IP_PMTUDISC_DO`, so the kernel writes IPv4 Identification 0 on `sendto`) and reports the
/// destination address and arrival interface of each datagram, with `ip_meta` its traffic
/// class and hop limit too ([`set_ip_meta`]).
///
/// With `reuseport`, `SO_REUSEPORT` is set first, so that other processes of this user
/// join the socket's group (see [`super::share`]).
pub(crate) fn open_udp(
    local: WireAddr,
    port: u16,
    buf_bytes: i32,
    reuseport: bool,
    ip_meta: bool,
) -> Result<OwnedFd> {
    let fd = new_udp(local, buf_bytes, reuseport, ip_meta)?;
    bind_udp(&fd, local, port)?;
    Ok(fd)
}

/// The IPv4 TTL / IPv6 hop limit of datagrams to a multicast group: what Linux rxe sends
/// (the CM's `IPV6_DEFAULT_HOPLIMIT`), where a socket's default is 1.
pub(crate) const MULTICAST_HOPS: i32 = 64;

/// A non-blocking UDP socket of `local`'s family (a link-local address needs its scope),
/// IPv6-only for IPv6, sending with don't-fragment. An IPv6 socket takes datagrams with a
/// zero UDP checksum (`UDP_NO_CHECK6_RX`): Linux rxe sends RoCEv2 over IPv6 with checksum 0
/// (the ICRC covers the packet; RFC 6935/6936 allow it for tunnels), which the kernel
/// otherwise drops before the socket.
fn udp_socket(local: WireAddr) -> Result<OwnedFd> {
    if local.is_link_local() && local.scope_id() == 0 {
        return Err(Error::ScopeRequired { addr: local });
    }
    let domain = if local.ip().is_ipv6() {
        libc::AF_INET6
    } else {
        libc::AF_INET
    };
    // SAFETY: plain socket(2) call; the result is checked before use.
    let raw = unsafe {
        libc::socket(
            domain,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::IPPROTO_UDP,
        )
    };
    if raw < 0 {
        return Err(Error::last_os("socket", Some(local)));
    }
    // SAFETY: `raw` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let opt = |op, level, name, value| set_opt(&fd, local, op, level, name, value);
    if local.ip().is_ipv6() {
        opt("IPV6_V6ONLY", libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
        opt("UDP_NO_CHECK6_RX", libc::SOL_UDP, libc::UDP_NO_CHECK6_RX, 1)?;
        opt(
            "IPV6_MTU_DISCOVER",
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )?;
        // datagrams to a multicast group leave with the hop limit rxe gives them (64), not 1
        opt(
            "IPV6_MULTICAST_HOPS",
            libc::IPPROTO_IPV6,
            libc::IPV6_MULTICAST_HOPS,
            MULTICAST_HOPS,
        )?;
    } else {
        opt(
            "IP_MTU_DISCOVER",
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )?;
        opt(
            "IP_MULTICAST_TTL",
            libc::IPPROTO_IP,
            libc::IP_MULTICAST_TTL,
            MULTICAST_HOPS,
        )?;
    }
    Ok(fd)
}

/// Sets an integer socket option, naming `op` and `local` in the error.
fn set_opt(
    fd: &OwnedFd,
    local: WireAddr,
    op: &'static str,
    level: i32,
    name: i32,
    value: i32,
) -> Result<()> {
    setsockopt_int(fd.as_raw_fd(), level, name, value).map_err(|source| Error::Os {
        op,
        addr: Some(local),
        source,
    })
}

/// The socket of [`open_udp`], options set, not yet bound.
pub(crate) fn new_udp(
    local: WireAddr,
    buf_bytes: i32,
    reuseport: bool,
    ip_meta: bool,
) -> Result<OwnedFd> {
    let fd = udp_socket(local)?;
    let v6 = local.ip().is_ipv6();
    let opt = |op, level, name, value| set_opt(&fd, local, op, level, name, value);
    if v6 {
        opt(
            "IPV6_RECVPKTINFO",
            libc::IPPROTO_IPV6,
            libc::IPV6_RECVPKTINFO,
            1,
        )?;
    } else {
        opt("IP_PKTINFO", libc::IPPROTO_IP, libc::IP_PKTINFO, 1)?;
    }
    if ip_meta {
        set_ip_meta(fd.as_fd(), v6, true).map_err(|source| Error::Os {
            op: "IP_RECVTOS / IP_RECVTTL (IPv6: RECVTCLASS, RECVHOPLIMIT)",
            addr: Some(local),
            source,
        })?;
    }
    if reuseport {
        opt("SO_REUSEPORT", libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    }
    // Larger buffers absorb bursts; the kernel caps them at rmem_max / wmem_max, which is fine.
    let _ = setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, buf_bytes);
    let _ = setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, buf_bytes);
    Ok(fd)
}

/// Asks the kernel for (or stops asking for) each received datagram's IPv4 TOS / IPv6
/// traffic class and TTL / hop limit, as control messages (off on a new socket; `new_udp`
/// turns them on when asked).
pub(crate) fn set_ip_meta(fd: BorrowedFd<'_>, v6: bool, on: bool) -> std::io::Result<()> {
    let v = i32::from(on);
    let fd = fd.as_raw_fd();
    if v6 {
        setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, v)?;
        setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, v)
    } else {
        setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, v)?;
        setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTTL, v)
    }
}

/// A UDP socket of `local`'s family for sending only: IPv6-only for IPv6, don't-fragment,
/// `SO_REUSEPORT`, a send buffer of `buf_bytes` and the smallest receive buffer (nothing is
/// read from it). Unbound.
pub(crate) fn new_udp_sender(local: WireAddr, buf_bytes: i32) -> Result<OwnedFd> {
    let fd = udp_socket(local)?;
    let opt = |op, level, name, value| set_opt(&fd, local, op, level, name, value);
    opt("SO_REUSEPORT", libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    opt("SO_RCVBUF", libc::SOL_SOCKET, libc::SO_RCVBUF, 0)?;
    // the kernel caps it at wmem_max, which is fine
    let _ = setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, buf_bytes);
    Ok(fd)
}

/// The cookie of the network namespace `fd` was created in (`SO_NETNS_COOKIE`, Linux 5.14);
/// `None` where the kernel does not tell. One `getsockopt`, where reading the calling
/// thread's namespace from `/proc` walks a path (5 µs).
pub(crate) fn netns_cookie(fd: BorrowedFd<'_>) -> Option<u64> {
    let mut v: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid for the call and sized for the option's value.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&mut v as *mut u64).cast(),
            &mut len,
        )
    };
    (rc == 0 && len as usize == std::mem::size_of::<u64>()).then_some(v)
}

/// Binds `fd` to `local:port` (EADDRINUSE and EADDRNOTAVAIL as their typed errors).
pub(crate) fn bind_udp(fd: &OwnedFd, local: WireAddr, port: u16) -> Result<()> {
    if let Err(source) = at_address(fd, local, port, libc::bind) {
        return Err(match source.raw_os_error() {
            Some(libc::EADDRINUSE) => Error::AddrInUse { addr: local, port },
            Some(libc::EADDRNOTAVAIL) => Error::AddrNotAvailable { addr: local },
            _ => Error::Os {
                op: "bind",
                addr: Some(local),
                source,
            },
        });
    }
    Ok(())
}

/// Connects the UDP socket `fd` to `to:port`: its datagrams need no destination and no
/// route lookup each.
pub(crate) fn connect_udp(fd: &OwnedFd, to: WireAddr, port: u16) -> Result<()> {
    at_address(fd, to, port, libc::connect).map_err(|source| Error::Os {
        op: "connect",
        addr: Some(to),
        source,
    })
}

/// `call` (`bind` or `connect`) of `fd` with the socket address of `addr:port`.
fn at_address(
    fd: &OwnedFd,
    addr: WireAddr,
    port: u16,
    call: unsafe extern "C" fn(libc::c_int, *const libc::sockaddr, libc::socklen_t) -> libc::c_int,
) -> std::io::Result<()> {
    let (sa, len) = to_sockaddr(addr, port);
    // SAFETY: `sa` is a valid socket address of `len` bytes and `fd` an open socket.
    let rc = unsafe {
        call(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_storage).cast(),
            len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Level and type of the control message that sets a datagram's IPv4 TOS (`IP_TOS`) or
/// IPv6 traffic class (`IPV6_TCLASS`), both with an int.
pub(crate) fn tclass_cmsg(v6: bool) -> (i32, i32) {
    if v6 {
        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS)
    } else {
        (libc::IPPROTO_IP, libc::IP_TOS)
    }
}

/// Sends one datagram to `to:port` with IPv4 TOS / IPv6 traffic class `tclass` (a control
/// message when it is not 0). Not batched: for datagrams the fault injector held back.
pub(crate) fn send_one(
    fd: RawFd,
    to: WireAddr,
    port: u16,
    tclass: u8,
    data: &[u8],
) -> std::io::Result<()> {
    let (mut sa, len) = to_sockaddr(to, port);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut ctrl = [0u64; 3];
    // SAFETY: all-zero is a valid msghdr; every pointer set below outlives the call.
    let mut h: libc::msghdr = unsafe { zeroed() };
    h.msg_name = (&mut sa as *mut libc::sockaddr_storage).cast();
    h.msg_namelen = len;
    h.msg_iov = &mut iov;
    h.msg_iovlen = 1;
    if tclass != 0 {
        let (level, kind) = tclass_cmsg(to.ip().is_ipv6());
        h.msg_control = ctrl.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE(4) (24 bytes) fits in `ctrl`, which is aligned for cmsghdr.
        unsafe {
            h.msg_controllen = libc::CMSG_SPACE(4) as _;
            let cm = libc::CMSG_FIRSTHDR(&h);
            (*cm).cmsg_level = level;
            (*cm).cmsg_type = kind;
            (*cm).cmsg_len = libc::CMSG_LEN(4) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<i32>(), i32::from(tclass));
        }
    }
    // SAFETY: `h` describes live buffers (data is only read by the kernel).
    let rc = unsafe { libc::sendmsg(fd, &h, 0) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A socket address for `addr:port`.
pub(crate) fn to_sockaddr(addr: WireAddr, port: u16) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr.ip() {
        IpAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: port.to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        IpAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: port.to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.octets(),
                },
                sin6_scope_id: addr.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The address and port in a socket address the kernel filled in; `None` for other families.
pub(crate) fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<(WireAddr, u16)> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin: &libc::sockaddr_in = unsafe { &*(ss as *const libc::sockaddr_storage).cast() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some((WireAddr::from(ip), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6: &libc::sockaddr_in6 =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some((
                WireAddr::new(IpAddr::V6(ip), sin6.sin6_scope_id),
                u16::from_be(sin6.sin6_port),
            ))
        }
        _ => None,
    }
}

/// What the control messages of one received datagram said.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Ancillary {
    /// Destination address in the IP header.
    pub dst: Option<IpAddr>,
    /// Interface the datagram arrived on.
    pub ifindex: u32,
    /// IPv4 TOS or IPv6 traffic class (DSCP and ECN).
    pub tclass: u8,
    /// IPv4 TTL or IPv6 hop limit.
    pub hop_limit: u8,
    /// UDP GRO: the datagrams were coalesced, each this long (the last may be shorter); 0
    /// for a single datagram.
    pub gro_size: u16,
}

/// Parses the control messages the socket options of [`open_udp`] ask for (the
/// `msg_controllen` bytes of a received datagram's [`CmsgBuf`]).
pub(crate) fn parse_ancillary(msgs: cmsg::Messages<'_>) -> Ancillary {
    use std::mem::offset_of;
    let mut out = Ancillary::default();
    for c in msgs {
        match (c.level, c.kind) {
            (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                let at = (
                    offset_of!(libc::in_pktinfo, ipi_addr),
                    offset_of!(libc::in_pktinfo, ipi_ifindex),
                );
                if let Some((ip, ifindex)) = pktinfo::<4>(&c, size_of::<libc::in_pktinfo>(), at) {
                    (out.dst, out.ifindex) = (Some(IpAddr::V4(Ipv4Addr::from(ip))), ifindex);
                }
            }
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                let at = (
                    offset_of!(libc::in6_pktinfo, ipi6_addr),
                    offset_of!(libc::in6_pktinfo, ipi6_ifindex),
                );
                if let Some((ip, ifindex)) = pktinfo::<16>(&c, size_of::<libc::in6_pktinfo>(), at) {
                    (out.dst, out.ifindex) = (Some(IpAddr::V6(Ipv6Addr::from(ip))), ifindex);
                }
            }
            // IP_TOS arrives as one byte, the others as ints.
            (libc::IPPROTO_IP, libc::IP_TOS) => {
                if let Some(&t) = c.data.first() {
                    out.tclass = t;
                }
            }
            (libc::IPPROTO_IP, libc::IP_TTL) | (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                if let Some(v) = c.int() {
                    out.hop_limit = v as u8;
                }
            }
            (libc::SOL_UDP, libc::UDP_GRO) => {
                if let Some(v) = c.int() {
                    out.gro_size = u16::try_from(v).unwrap_or(0);
                }
            }
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                if let Some(v) = c.int() {
                    out.tclass = v as u8;
                }
            }
            _ => {}
        }
    }
    out
}

/// The destination address (`L` bytes) and interface of an `IP_PKTINFO` / `IPV6_PKTINFO`
/// message of at least `size` bytes, with the address and interface index at `at`.
fn pktinfo<const L: usize>(
    c: &cmsg::Cmsg<'_>,
    size: usize,
    at: (usize, usize),
) -> Option<([u8; L], u32)> {
    if c.data.len() < size {
        return None;
    }
    let ip = c.data.get(at.0..at.0 + L)?.try_into().ok()?;
    Some((ip, c.u32_at(at.1).unwrap_or(0)))
}

/// The MTU of a network interface by name (`SIOCGIFMTU`).
pub(crate) fn netdev_mtu(name: &str) -> Result<u32> {
    // SAFETY: all-zero is a valid ifreq.
    let mut req: libc::ifreq = unsafe { zeroed() };
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= req.ifr_name.len() || bytes.contains(&0) {
        return Err(Error::InvalidArgument("interface name"));
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: plain socket(2); checked below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(Error::last_os("socket", None));
    }
    // SAFETY: fresh descriptor owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: SIOCGIFMTU reads the name and writes ifru_mtu inside `req`.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFMTU as _, &mut req) };
    if rc != 0 {
        return Err(Error::last_os("SIOCGIFMTU", None));
    }
    // SAFETY: the ioctl filled the mtu member of the union.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    u32::try_from(mtu).map_err(|_| Error::InvalidArgument("negative MTU"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_round_trip() {
        for s in ["127.0.0.9", "::1", "fe80::5%7"] {
            let a: WireAddr = s.parse().unwrap();
            let (ss, _) = to_sockaddr(a, 4791);
            assert_eq!(from_sockaddr(&ss), Some((a, 4791)));
        }
    }

    #[test]
    fn sockets_never_fragment() {
        let fd = open_udp("127.0.1.40".parse().unwrap(), 0, 1 << 20, false, true).unwrap();
        let v = getsockopt_int(fd.as_raw_fd(), libc::IPPROTO_IP, libc::IP_MTU_DISCOVER).unwrap();
        assert_eq!(v, libc::IP_PMTUDISC_DO);
        let fd = open_udp("::1".parse().unwrap(), 0, 1 << 20, false, true).unwrap();
        let v = getsockopt_int(fd.as_raw_fd(), libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER);
        assert_eq!(v.unwrap(), libc::IPV6_PMTUDISC_DO);
        let v6only = getsockopt_int(fd.as_raw_fd(), libc::IPPROTO_IPV6, libc::IPV6_V6ONLY);
        assert_eq!(v6only.unwrap(), 1);
    }

    #[test]
    fn lo_mtu() {
        assert!(netdev_mtu("lo").unwrap() >= 1500);
        assert!(netdev_mtu("").is_err());
        assert!(netdev_mtu("no-such-if0").is_err());
    }
}
