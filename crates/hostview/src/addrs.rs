//! Addresses: which link holds which IPv4/IPv6 address, with scope.

use std::net::IpAddr;

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::address::AddressMessage;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::addr_entry::{family_of, Address};
use crate::cache::Cache;
use crate::error::{Error, Result};
use crate::links::Link;
use crate::HostView;

impl HostView {
    /// Every address of every link, IPv4 and IPv6.
    pub async fn addresses(&self) -> Result<Vec<Address>> {
        match &self.cache {
            Some(c) => Ok(self.kept_addresses(c, self.sync_first())?.to_vec()),
            None => self.dump_addresses(AddressFamily::Unspec),
        }
    }

    /// The addresses `c` keeps (dumped if stale, brought up to date first if `sync`).
    fn kept_addresses(&self, c: &Cache, sync: bool) -> Result<std::sync::Arc<[Address]>> {
        c.addresses(sync, || self.dump_addresses(AddressFamily::Unspec))
    }

    /// The addresses of one family (`Unspec`: both); the kernel dumps only that family.
    fn dump_addresses(&self, family: AddressFamily) -> Result<Vec<Address>> {
        let mut req = AddressMessage::default();
        req.header.family = family;
        let mut out = Vec::new();
        self.nl.exchange(
            "RTM_GETADDR",
            RouteNetlinkMessage::GetAddress(req),
            NLM_F_DUMP,
            |h, payload| {
                if h.message_type == libc::RTM_NEWADDR {
                    out.extend(Address::from_raw(payload));
                }
                Ok(())
            },
        )?;
        Ok(out)
    }

    /// The link that holds `ip`. For a link-local address `scope` (an ifindex) selects among
    /// links holding the same address. `EADDRNOTAVAIL` if no link holds it.
    pub async fn link_holding(&self, ip: IpAddr, scope: Option<u32>) -> Result<Link> {
        let index = self.index_holding(ip, scope).await?;
        self.link(index).await
    }

    /// The ifindex of the link that holds `ip`, as [`HostView::link_holding`] finds it, without
    /// reading the link itself.
    /// Answered from the kept addresses; without them, only `ip`'s family is dumped. An IPv6
    /// address the kept ones lack is asked of the kernel at a question that brings them up to
    /// date: the kernel lists a new IPv6 address before it announces it (see the cache), and
    /// a bind right after `ip addr add` must find it.
    pub async fn index_holding(&self, ip: IpAddr, scope: Option<u32>) -> Result<u32> {
        let dump = || self.dump_addresses(family_of(&ip));
        let found = match &self.cache {
            Some(c) => {
                let sync = self.sync_first();
                let kept = self.kept_addresses(c, sync)?;
                let (found, fresh) = holder_in(&kept, ip, scope, sync, dump)?;
                if fresh {
                    // the kept list lacks it: the next question dumps again
                    c.forget_addresses();
                }
                found
            }
            None => find_holder(&dump()?, ip, scope),
        };
        found.ok_or(Error::AddressNotAvailable(ip))
    }
}

fn find_holder(addrs: &[Address], ip: IpAddr, scope: Option<u32>) -> Option<u32> {
    addrs.iter().find(|a| a.is(ip, scope)).map(|a| a.link)
}

/// The holder of `ip` in the kept addresses; for an IPv6 address they lack, at a question
/// that synced (`sync`), in `dump`'s answer, and then true (the kept list is behind the
/// kernel's). IPv4 addresses are announced inside the call that adds them: a synced miss
/// is the kernel's answer.
fn holder_in(
    kept: &[Address],
    ip: IpAddr,
    scope: Option<u32>,
    sync: bool,
    dump: impl FnOnce() -> Result<Vec<Address>>,
) -> Result<(Option<u32>, bool)> {
    if let Some(i) = find_holder(kept, ip, scope) {
        return Ok((Some(i), false));
    }
    if !(sync && ip.is_ipv6()) {
        return Ok((None, false));
    }
    let found = find_holder(&dump()?, ip, scope);
    Ok((found, found.is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr_entry::Scope;

    fn addr(link: u32, ip: &str) -> Address {
        Address {
            link,
            addr: ip.parse().unwrap(),
            prefix_len: 64,
            scope: Scope::Global,
        }
    }

    #[test]
    fn a_synced_ipv6_miss_asks_the_kernel() {
        let kept = [addr(2, "2001:db8:1::1"), addr(2, "192.0.2.1")];
        let kernel = || Ok(vec![addr(2, "2001:db8:1::1"), addr(3, "2001:db8:9::7")]);
        let new6: IpAddr = "2001:db8:9::7".parse().unwrap();
        // kept: no dump
        let asked = std::cell::Cell::new(false);
        let r = holder_in(&kept, "2001:db8:1::1".parse().unwrap(), None, true, || {
            asked.set(true);
            kernel()
        });
        assert_eq!(r.unwrap(), (Some(2), false));
        assert!(!asked.get());
        // not kept yet, the kernel has it
        assert_eq!(
            holder_in(&kept, new6, None, true, kernel).unwrap(),
            (Some(3), true)
        );
        assert_eq!(
            holder_in(&kept, new6, Some(3), true, kernel).unwrap(),
            (Some(3), true)
        );
        assert_eq!(
            holder_in(&kept, new6, Some(2), true, kernel).unwrap(),
            (None, false)
        );
        // a question that did not sync answers as of the view's first one
        let r = holder_in(&kept, new6, None, false, || panic!("asked"));
        assert_eq!(r.unwrap(), (None, false));
        // an IPv4 miss is the kernel's answer
        let r = holder_in(&kept, "198.51.100.7".parse().unwrap(), None, true, || {
            panic!("asked")
        });
        assert_eq!(r.unwrap(), (None, false));
        // nobody holds it
        let r = holder_in(&kept, "2001:db8:5::1".parse().unwrap(), None, true, kernel);
        assert_eq!(r.unwrap(), (None, false));
        // the kernel's error is the answer's
        let r = holder_in(&kept, new6, None, true, || {
            Err(Error::Netlink("boom".into()))
        });
        assert!(r.is_err());
    }
}
