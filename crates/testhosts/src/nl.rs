//! The topology's links, addresses and routes over rtnetlink, without an `ip` process.
//!
//! Each call opens a NETLINK_ROUTE socket in the calling thread's network namespace (run it
//! inside [`crate::Host::run`] for a host's own links) on a small current-thread tokio
//! runtime, does its requests and closes it.

use std::fs::File;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

use futures::TryStreamExt;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags};
use rtnetlink::packet_route::link::{InfoData, InfoVeth};
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder};

use crate::ns::NETNS_DIR;

/// Runs `f` with a fresh rtnetlink handle in this thread's namespace.
fn with_handle<T, F, Fut>(f: F) -> io::Result<T>
where
    F: FnOnce(Handle) -> Fut,
    Fut: Future<Output = Result<T, rtnetlink::Error>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    rt.block_on(async {
        let (conn, handle, _) = rtnetlink::new_connection()?;
        let task = tokio::spawn(conn);
        let r = f(handle).await.map_err(io::Error::other);
        task.abort();
        r
    })
}

/// The index of link `name` in this thread's namespace.
async fn index_of(h: &Handle, name: &str) -> Result<u32, rtnetlink::Error> {
    let mut links = h.link().get().match_name(name.to_string()).execute();
    match links.try_next().await? {
        Some(l) => Ok(l.header.index),
        None => Err(rtnetlink::Error::RequestFailed),
    }
}

/// `ip link set NAME up`.
pub(crate) fn link_up(name: &str) -> io::Result<()> {
    let n = name.to_string();
    with_handle(|h| async move {
        h.link()
            .set(LinkUnspec::new_with_name(&n).up().build())
            .execute()
            .await
    })
    .map_err(|e| io::Error::other(format!("link set {name} up: {e}")))
}

/// `ip link add A_IF netns NS_A type veth peer name B_IF netns NS_B`: both ends are made
/// in their namespaces directly, so that equal names in parallel topologies never meet.
pub(crate) fn veth(a_if: &str, ns_a: &str, b_if: &str, ns_b: &str) -> io::Result<()> {
    let fa = File::open(format!("{NETNS_DIR}/{ns_a}"))?;
    let fb = File::open(format!("{NETNS_DIR}/{ns_b}"))?;
    let peer = LinkMessageBuilder::<LinkUnspec>::default()
        .name(b_if)
        .setns_by_fd(fb.as_raw_fd())
        .build();
    let msg = LinkVeth::new(a_if, b_if)
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
        .setns_by_fd(fa.as_raw_fd())
        .build();
    let r = with_handle(|h| async move { h.link().add(msg).execute().await });
    drop((fa, fb));
    r.map_err(|e| io::Error::other(format!("veth {a_if}@{ns_a} - {b_if}@{ns_b}: {e}")))
}

/// Parses `ADDR/LEN`.
fn cidr(s: &str) -> io::Result<(IpAddr, u8)> {
    let bad = || io::Error::new(io::ErrorKind::InvalidInput, format!("bad prefix {s:?}"));
    let (ip, len) = s.split_once('/').ok_or_else(bad)?;
    let ip: IpAddr = ip.parse().map_err(|_| bad())?;
    let len: u8 = len.parse().map_err(|_| bad())?;
    if len > if ip.is_ipv4() { 32 } else { 128 } {
        return Err(bad());
    }
    Ok((ip, len))
}

/// `ip addr add CIDR dev DEV` (with `nodad` for IPv6, so the address is usable at once).
pub(crate) fn addr_add(dev: &str, prefix: &str) -> io::Result<()> {
    let (ip, len) = cidr(prefix)?;
    let d = dev.to_string();
    with_handle(|h| async move {
        let idx = index_of(&h, &d).await?;
        let mut req = h.address().add(idx, ip, len);
        if ip.is_ipv6() {
            req.message_mut()
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        req.execute().await
    })
    .map_err(|e| io::Error::other(format!("addr add {prefix} dev {dev}: {e}")))
}

/// A route given as `ip route add` arguments that this module can say over rtnetlink:
/// `DEST via GATEWAY [dev DEV]` or `DEST dev DEV` (DEST a prefix, or `default`).
#[derive(Debug, PartialEq)]
pub(crate) struct Route {
    dest: (IpAddr, u8),
    via: Option<IpAddr>,
    dev: Option<String>,
}

impl Route {
    /// `None` for any other form (the caller hands those to `ip route add` as they are).
    pub(crate) fn parse(args: &[String]) -> Option<Route> {
        let (first, rest) = args.split_first()?;
        let (mut via, mut dev) = (None, None);
        let mut it = rest.iter();
        while let Some(k) = it.next() {
            let v = it.next()?;
            match k.as_str() {
                "via" if via.is_none() => via = Some(v.parse::<IpAddr>().ok()?),
                "dev" if dev.is_none() => dev = Some(v.clone()),
                _ => return None,
            }
        }
        let dest = if first == "default" {
            let unspec: IpAddr = match via? {
                IpAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
                IpAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
            };
            (unspec, 0)
        } else {
            cidr(first).ok()?
        };
        if via.is_none() && dev.is_none() {
            return None;
        }
        if via.is_some_and(|g| g.is_ipv4() != dest.0.is_ipv4()) {
            return None;
        }
        Some(Route { dest, via, dev })
    }

    /// Adds it in this thread's namespace.
    pub(crate) fn add(&self) -> io::Result<()> {
        let Route { dest, via, dev } = self;
        let (dest, via, dev) = (*dest, *via, dev.clone());
        with_handle(|h| async move {
            let mut b = RouteMessageBuilder::<IpAddr>::new()
                .destination_prefix(dest.0, dest.1)
                .map_err(|_| rtnetlink::Error::RequestFailed)?;
            if let Some(g) = via {
                b = b.gateway(g).map_err(|_| rtnetlink::Error::RequestFailed)?;
            }
            if let Some(d) = &dev {
                b = b.output_interface(index_of(&h, d).await?);
            }
            h.route().add(b.build()).execute().await
        })
        .map_err(|e| io::Error::other(format!("route add {self:?}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn route_forms() {
        let r = Route::parse(&v("198.51.100.0/24 via 192.0.2.254")).unwrap();
        assert_eq!(r.dest, ("198.51.100.0".parse().unwrap(), 24));
        assert_eq!(r.via, Some("192.0.2.254".parse().unwrap()));
        let r = Route::parse(&v("2001:db8:2::/64 via 2001:db8:1::fe dev eth0")).unwrap();
        assert_eq!(r.dev.as_deref(), Some("eth0"));
        assert!(Route::parse(&v("default via 192.0.2.1")).is_some());
        assert!(Route::parse(&v("192.0.2.0/24 dev eth1")).is_some());
        // Anything else goes to `ip route add`.
        for other in [
            "192.0.2.0/24",
            "192.0.2.0/24 via 192.0.2.1 metric 5",
            "192.0.2.0/24 via 2001:db8::1",
            "192.0.2.0/33 via 192.0.2.1",
            "blackhole 192.0.2.0/24",
            "",
        ] {
            assert!(Route::parse(&v(other)).is_none(), "{other}");
        }
    }
}
