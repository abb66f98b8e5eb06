//! Socket addresses between C (`struct sockaddr`) and Rust.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use libc::{sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage};

/// The Rust address of a C one (AF_INET or AF_INET6; None for NULL or another family).
///
/// # Safety
/// `sa` is NULL or points to a sockaddr of its family's size.
pub unsafe fn from_c(sa: *const sockaddr) -> Option<SocketAddr> {
    // SAFETY: the caller's pointer, read by family.
    let fam = i32::from(unsafe { sa.as_ref() }?.sa_family);
    match fam {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr.
            let s = unsafe { &*sa.cast::<sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                u16::from_be(s.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr.
            let s = unsafe { &*sa.cast::<sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(s.sin6_addr.s6_addr),
                u16::from_be(s.sin6_port),
                s.sin6_flowinfo,
                s.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Writes `a` into a sockaddr_storage.
pub fn to_c(a: &SocketAddr, out: &mut sockaddr_storage) {
    // SAFETY: plain data.
    *out = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage holds a sockaddr_in.
            let s = unsafe { &mut *(out as *mut sockaddr_storage).cast::<sockaddr_in>() };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = v4.port().to_be();
            s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage holds a sockaddr_in6.
            let s = unsafe { &mut *(out as *mut sockaddr_storage).cast::<sockaddr_in6>() };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = v6.port().to_be();
            s.sin6_addr.s6_addr = v6.ip().octets();
            s.sin6_flowinfo = v6.flowinfo();
            s.sin6_scope_id = v6.scope_id();
        }
    }
}

/// The sockaddr length of `a`'s family.
pub fn c_len(a: &SocketAddr) -> libc::socklen_t {
    (match a {
        SocketAddr::V4(_) => std::mem::size_of::<sockaddr_in>(),
        SocketAddr::V6(_) => std::mem::size_of::<sockaddr_in6>(),
    }) as libc::socklen_t
}

/// The GID of an address (IPv4: v4-mapped).
pub fn gid_of(a: &SocketAddr) -> [u8; 16] {
    match a.ip() {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(v6) => v6.octets(),
    }
}
