//! The `migrate` policy's alternate on two rails with no cross routes (two links on two
//! subnets, the common multi-rail layout): the active side has no route to the peer's
//! address through its second netdev, so it cannot name an alternate path by itself. Our
//! two peers complete it in the exchange they already make:
//!
//! 1. **The offer** (REQ): the active side puts its own address on the other rail in the
//!    REQ's alternate path as its "local port GID", with the remote port GID unspecified
//!    and both LIDs 0. A Linux peer does not read it: on RoCE its CM takes a REQ's
//!    alternate path only for a non-zero alternate local LID or an OPA GID
//!    (`cm_req_has_alt_path`), and it answers `failover_accepted` 0 with no more.
//! 2. **The answer** (REP): the passive side, `migrate` on a device group, looks for a
//!    route to the offered address through another up port of its group (as the active
//!    side does for its alternate: `Resolver::alternate`); if there is one it loads that
//!    path (its address there, the offered one) and appends its address on it to the
//!    REP's private data: the last [`ANSWER_LEN`] bytes, [`ANSWER_MAGIC`] then the GID.
//!    The REP carries no path of its own in the IB CM, and the IP CM annex leaves its
//!    private data to the consumer; the answer goes only to a peer that offered (never
//!    to Linux), and only when the consumer's own data leaves room.
//! 3. The active side takes the answer when the address is on the subnet of its own
//!    offered address (on-link on that rail) and hides it from its consumer (zeroed).
//!    With no answer (a Linux peer, a peer without `migrate`) the connection has no
//!    alternate and falls back to `align`, as before.
//!
//! See docs/HA.md ("Two rails without cross routes").

use std::net::{IpAddr, Ipv6Addr};

use rdma_proto::cm::PathParams;
use rdma_wire::cm::CmPathRepr;
use rdma_wire::ip_cm::REP_USER_PRIVATE_DATA_MAX;

use crate::context::device_entry::DevEntry;
use crate::context::held_request::{HeldMad, HeldReq};
use crate::context::state::State;
use crate::ha::migrate::AltPath;
use crate::host::addr::Gid;
use crate::host::resolve::Resolver;

/// The answer's marker at the start of the REP's last [`ANSWER_LEN`] bytes.
pub(crate) const ANSWER_MAGIC: [u8; 4] = *b"rHA1";
/// The answer's length: the marker and a GID.
pub(crate) const ANSWER_LEN: usize = 4 + 16;
/// Where the answer starts in the REP's private data.
const ANSWER_AT: usize = REP_USER_PRIVATE_DATA_MAX - ANSWER_LEN;

pub(crate) use crate::context::id_entry::RailOffer;

fn gid(ip: IpAddr) -> Ipv6Addr {
    Ipv6Addr::from(Gid::from_ip(ip).0)
}

/// True for a GID Linux's CM would take for an OPA one (OUI 00:06:6a in the interface id):
/// such an offer would be read as an alternate path, so none is made.
fn opa_like(ip: IpAddr) -> bool {
    Gid::from_ip(ip).0[8..11] == [0x00, 0x06, 0x6a]
}

impl Resolver {
    /// When no candidate port has a route to `peer`: our address on the first candidate
    /// port's netdev of `peer`'s family (not link-local), to offer in the REQ.
    pub(crate) async fn rail_offer(&self, peer: IpAddr, cands: &[(u8, u32)]) -> Option<RailOffer> {
        if cands.is_empty()
            || crate::host::addr::classify(&peer) == crate::host::addr::AddrClass::LinkLocal
        {
            return None;
        }
        let addrs = self.view().addresses().await.ok()?;
        cands.iter().find_map(|&(port, link)| {
            addrs
                .iter()
                .find(|a| {
                    a.link == link
                        && a.addr.is_ipv4() == peer.is_ipv4()
                        && !a.is_link_local()
                        && !a.addr.is_loopback()
                        && !opa_like(a.addr)
                })
                .map(|a| RailOffer {
                    port,
                    local: a.addr,
                    prefix_len: a.prefix_len,
                })
        })
    }
}

/// The REQ's alternate path fields for an offer: our address as the local port GID, the
/// remote one unspecified, LIDs 0 (so that Linux's CM sees no alternate path).
pub(crate) fn offer_path(o: &RailOffer, primary: &PathParams) -> PathParams {
    PathParams {
        local_gid: gid(o.local),
        remote_gid: Ipv6Addr::UNSPECIFIED,
        local_lid: 0,
        remote_lid: 0,
        ..*primary
    }
}

/// The offered address of a REQ's alternate path fields, if they hold an offer (a local
/// port GID and no remote one).
pub(crate) fn offered(alt: &CmPathRepr) -> Option<IpAddr> {
    (!alt.local_port_gid.is_unspecified() && alt.remote_port_gid.is_unspecified())
        .then(|| Gid(alt.local_port_gid.octets()).to_ip())
}

/// For a held REQ on device `dev` with an offer, for a `migrate` listener on a device
/// group: the offered address and the group's other up ports (where the passive
/// side looks for a path to it, without the lock).
pub(crate) fn passive_query(st: &State, dev: u32, h: &HeldReq) -> Option<(IpAddr, Vec<(u8, u32)>)> {
    let HeldMad::Req(r) = &h.mad else {
        return None;
    };
    let peer_alt = offered(&r.req.alternate_path)?;
    let d = st.devices.get(&dev).filter(|d| d.links.len() > 1)?;
    let l = st.find_listener(dev, r.listener, h.arrival(), h.hdr.dst)?;
    if st.ids.get(&l)?.opts.ha != crate::ha_policy::HaPolicy::Migrate {
        return None;
    }
    let primary = d
        .sgid(h.hdr.dst)
        .map(|(p, _)| p)
        .or_else(|| d.port_of_link(h.arrival()))
        .unwrap_or(1);
    let mut cands = crate::ha::migrate::up_ports(d);
    cands.retain(|&(p, _)| p != primary);
    (!cands.is_empty()).then_some((peer_alt, cands))
}

/// The passive side's alternate for an offer: the path found to the offered address
/// (`found`), on a port other than `primary` whose GID table holds our address, to the
/// offered address itself (also when the route to it has a gateway).
pub(crate) fn answer_alt(
    d: &DevEntry,
    primary: u8,
    offered: IpAddr,
    found: Option<AltPath>,
) -> Option<AltPath> {
    let alt = found.filter(|a| a.port != primary).map(|a| AltPath {
        remote: offered,
        ..a
    });
    crate::ha::migrate::checked(d, alt)
}

/// The REP's private data with the answer for `alt` appended (our address on the other
/// rail), or `None` when the consumer's data leaves no room for it.
pub(crate) fn with_answer(user: &[u8], alt: &AltPath) -> Option<Vec<u8>> {
    if user.len() > ANSWER_AT {
        return None;
    }
    let mut pd = user.to_vec();
    pd.resize(ANSWER_AT, 0);
    pd.extend_from_slice(&ANSWER_MAGIC);
    pd.extend_from_slice(&Gid::from_ip(alt.local).0);
    Some(pd)
}

/// The active side's alternate from the REP: the peer's address in the answer, when there
/// is one, `failover_accepted` is 0 and the address is on our offered address's subnet.
/// The answer's bytes are zeroed in `private_data` (the consumer's copy) when taken.
pub(crate) fn take_answer(
    o: &RailOffer,
    failover_accepted: u8,
    private_data: &mut [u8],
) -> Option<AltPath> {
    if failover_accepted != 0 || private_data.len() != REP_USER_PRIVATE_DATA_MAX {
        return None;
    }
    let tail = &private_data[ANSWER_AT..];
    if tail[..4] != ANSWER_MAGIC {
        return None;
    }
    let mut g = [0u8; 16];
    g.copy_from_slice(&tail[4..]);
    let remote = Gid(g).to_ip();
    if remote == o.local || !same_subnet(o.local, remote, o.prefix_len) {
        return None;
    }
    private_data[ANSWER_AT..].fill(0);
    Some(AltPath {
        port: o.port,
        local: o.local,
        remote,
    })
}

/// Whether `b` is on the subnet `a/prefix_len`: same family and prefix, and not the
/// subnet's network or (IPv4) broadcast address when it has them.
fn same_subnet(a: IpAddr, b: IpAddr, prefix_len: u8) -> bool {
    let (x, y, n) = match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => (u128::from(u32::from(a)), u128::from(u32::from(b)), 32),
        (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b), 128u32),
        _ => return false,
    };
    let p = u32::from(prefix_len);
    if p > n || b.is_multicast() {
        return false;
    }
    let host_bits = n - p;
    let host_mask = match host_bits {
        0 => 0,
        128 => !0,
        k => (1u128 << k) - 1,
    };
    let h = y & host_mask;
    let special = host_bits >= 2 && (h == 0 || (n == 32 && h == host_mask));
    (x ^ y) & !host_mask == 0 && !special
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer() -> RailOffer {
        RailOffer {
            port: 2,
            local: "198.51.100.1".parse().unwrap(),
            prefix_len: 24,
        }
    }

    fn alt(local: &str) -> AltPath {
        AltPath {
            port: 2,
            local: local.parse().unwrap(),
            remote: "198.51.100.1".parse().unwrap(),
        }
    }

    #[test]
    fn an_answer_round_trips_and_is_hidden_from_the_consumer() {
        let mut pd = with_answer(b"hello", &alt("198.51.100.2")).unwrap();
        assert_eq!(pd.len(), REP_USER_PRIVATE_DATA_MAX);
        let a = take_answer(&offer(), 0, &mut pd).unwrap();
        assert_eq!(a.remote, "198.51.100.2".parse::<IpAddr>().unwrap());
        assert_eq!((a.port, a.local), (2, offer().local));
        assert_eq!(&pd[..5], b"hello");
        assert!(pd[5..].iter().all(|&b| b == 0), "the answer is zeroed");
        // no room beside a consumer's long private data: no answer
        assert!(with_answer(&[1; ANSWER_AT + 1], &alt("198.51.100.2")).is_none());
        assert!(with_answer(&[1; ANSWER_AT], &alt("198.51.100.2")).is_some());
    }

    #[test]
    fn a_linux_rep_or_a_foreign_answer_gives_no_alternate() {
        // Linux's REP: the consumer's data (or nothing), zero-padded, failover 0
        let mut pd = vec![0u8; REP_USER_PRIVATE_DATA_MAX];
        assert!(take_answer(&offer(), 0, &mut pd).is_none());
        let mut pd: Vec<u8> = (0..REP_USER_PRIVATE_DATA_MAX).map(|i| i as u8).collect();
        let before = pd.clone();
        assert!(take_answer(&offer(), 0, &mut pd).is_none());
        assert_eq!(pd, before, "a consumer's data is left alone");
        // an answer refused by failover_accepted, off the offered subnet, or our own
        for (failover, addr) in [
            (1, "198.51.100.2"),
            (0, "192.0.2.2"),
            (0, "198.51.100.1"),
            (0, "198.51.100.255"),
            (0, "198.51.100.0"),
            (0, "2001:db8::2"),
        ] {
            let mut pd = with_answer(&[], &alt(addr)).unwrap();
            assert!(take_answer(&offer(), failover, &mut pd).is_none(), "{addr}");
        }
    }

    #[test]
    fn an_offer_is_not_an_alternate_path_to_linux() {
        let primary = PathParams::default();
        let p = offer_path(&offer(), &primary);
        assert_eq!((p.local_lid, p.remote_lid), (0, 0));
        assert!(p.remote_gid.is_unspecified());
        let repr = CmPathRepr {
            local_port_gid: p.local_gid,
            remote_port_gid: p.remote_gid,
            ..CmPathRepr::default()
        };
        assert_eq!(offered(&repr), Some(offer().local));
        let full = CmPathRepr {
            remote_port_gid: gid("192.0.2.2".parse().unwrap()),
            ..repr
        };
        assert_eq!(offered(&full), None, "a whole path is not an offer");
        assert!(opa_like("fe80::6:6a00:0:1".parse().unwrap()));
        assert!(!opa_like(offer().local));
    }

    #[test]
    fn subnets() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(same_subnet(ip("10.0.0.1"), ip("10.0.0.2"), 24));
        assert!(!same_subnet(ip("10.0.0.1"), ip("10.0.1.2"), 24));
        assert!(!same_subnet(ip("10.0.0.1"), ip("10.0.0.2"), 32));
        assert!(same_subnet(ip("2001:db8::1"), ip("2001:db8::2"), 64));
        assert!(!same_subnet(ip("2001:db8::1"), ip("2001:db9::2"), 64));
        assert!(same_subnet(ip("10.0.0.0"), ip("10.0.0.1"), 31));
        assert!(!same_subnet(ip("10.0.0.1"), ip("10.0.0.255"), 24));
        assert!(!same_subnet(ip("10.0.0.1"), ip("2001:db8::2"), 24));
    }
}
