//! Neighbours (ARP / NDP entries) and resolving a next hop's MAC address.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::Duration;

use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage,
    NeighbourState as NlState,
};
use netlink_packet_route::RouteNetlinkMessage;

use crate::addr_entry::family_of;
use crate::error::{Error, Result};
use crate::links::MacAddr;
use crate::monitor::{Event, Monitor};
use crate::neigh_entry::{NeighState, Neighbour};
use crate::HostView;

fn neigh_message(link: u32, ip: IpAddr) -> NeighbourMessage {
    let mut m = NeighbourMessage::default();
    m.header.family = family_of(&ip);
    m.header.ifindex = link;
    m.attributes.push(NeighbourAttribute::Destination(match ip {
        IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
        IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
    }));
    m
}

impl HostView {
    /// The neighbour entry for `ip` on `link`, if there is one (RTM_GETNEIGH).
    pub async fn neighbour(&self, link: u32, ip: IpAddr) -> Result<Option<Neighbour>> {
        let r = self.nl.request(
            "RTM_GETNEIGH",
            RouteNetlinkMessage::GetNeighbour(neigh_message(link, ip)),
            0,
        );
        match r {
            Ok(msgs) => Ok(msgs.iter().find_map(|m| match m {
                RouteNetlinkMessage::NewNeighbour(n) => Neighbour::from_message(n),
                _ => None,
            })),
            Err(e) if e.errno() == libc::ENOENT => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Resolves the MAC address of `next_hop` on `link` within `timeout`.
    ///
    /// A valid entry (REACHABLE, STALE, DELAY, PROBE, PERMANENT, NOARP) answers at once.
    /// Otherwise resolution is kicked (see the crate docs) and awaited on a neighbour
    /// [`Monitor`] subscribed before the first look, so no update is missed and nothing polls.
    /// Loopback links answer with their own MAC (all zero for `lo`), NOARP links with all zero.
    ///
    /// Errors: [`Error::HostUnreachable`] when the entry goes FAILED, [`Error::TimedOut`] at
    /// the deadline, [`Error::NoDevice`] for an unknown link.
    pub async fn resolve_neighbour(
        &self,
        link: u32,
        next_hop: IpAddr,
        timeout: Duration,
    ) -> Result<MacAddr> {
        let deadline = tokio::time::Instant::now() + timeout;
        let l = self.link(link).await?;
        if !l.needs_neighbour() {
            return Ok(if l.flags.loopback {
                l.mac.unwrap_or_default()
            } else {
                MacAddr::default()
            });
        }
        let mut mon = Monitor::neighbours_only().await?;
        if let Some(n) = self.neighbour(link, next_hop).await? {
            if let (true, Some(mac)) = (n.state.is_valid(), n.mac) {
                return Ok(mac);
            }
        }
        self.kick_resolution(link, &l.name, next_hop).await?;
        // this waits: a view made `at_once` brings what is kept up to date again after it
        self.sync_again();
        loop {
            match mon.next_before(deadline).await? {
                Event::Neighbour(n) if n.link == link && n.addr == next_hop => {
                    match (n.state, n.mac) {
                        (s, Some(mac)) if s.is_valid() => return Ok(mac),
                        (NeighState::Failed, _) => return Err(Error::HostUnreachable),
                        _ => {}
                    }
                }
                Event::Overrun => {
                    if let Some(Neighbour {
                        state,
                        mac: Some(mac),
                        ..
                    }) = self.neighbour(link, next_hop).await?
                    {
                        if state.is_valid() {
                            return Ok(mac);
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// Starts resolution: RTM_NEWNEIGH with NTF_USE (the kernel runs `neigh_event_send` on
    /// the entry, creating it if needed, exactly as when a packet waits for it); if the kernel
    /// refuses that, an empty UDP datagram to the discard port (9) of `ip`, sent out of `link`.
    async fn kick_resolution(&self, link: u32, link_name: &str, ip: IpAddr) -> Result<()> {
        let mut m = neigh_message(link, ip);
        m.header.flags = NeighbourFlags::Use;
        m.header.state = NlState::None;
        let r = self.nl.request(
            "RTM_NEWNEIGH(NTF_USE)",
            RouteNetlinkMessage::NewNeighbour(m),
            NLM_F_CREATE | NLM_F_ACK,
        );
        match r {
            Ok(_) => Ok(()),
            Err(_) => udp_kick(link, link_name, ip),
        }
    }
}

/// Fallback kick: one empty datagram to `ip`:9 out of `link` makes the kernel resolve `ip`.
fn udp_kick(link: u32, link_name: &str, ip: IpAddr) -> Result<()> {
    let (bind, dst): (SocketAddr, SocketAddr) = match ip {
        IpAddr::V4(v4) => ("0.0.0.0:0".parse().unwrap(), (v4, 9).into()),
        IpAddr::V6(v6) => (
            "[::]:0".parse().unwrap(),
            std::net::SocketAddrV6::new(v6, 9, 0, link).into(),
        ),
    };
    let sock = UdpSocket::bind(bind)?;
    bind_to_device(&sock, link_name)?;
    sock.send_to(&[], dst)?;
    Ok(())
}

fn bind_to_device(sock: &UdpSocket, name: &str) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: valid socket fd; name bytes and length passed as SO_BINDTODEVICE expects.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlockingHostView;

    /// The fallback kick alone (no NTF_USE) gets the peer resolved.
    #[test]
    fn udp_kick_starts_resolution() {
        if !rdma_testhosts::require_root("udp_kick_starts_resolution") {
            return;
        }
        let t = rdma_testhosts::topologies::two_hosts_one_link().unwrap();
        t.host("a").run(|| {
            let hv = BlockingHostView::new().unwrap();
            let eth0 = hv.link_by_name("eth0").unwrap().index;
            for ip in ["192.0.2.2", "2001:db8:1::2"] {
                let ip: IpAddr = ip.parse().unwrap();
                let mut mon = hv.block_on(Monitor::neighbours_only()).unwrap();
                udp_kick(eth0, "eth0", ip).unwrap();
                let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
                let mac = hv.block_on(async {
                    loop {
                        if let Event::Neighbour(n) = mon.next_before(deadline).await.unwrap() {
                            if n.addr == ip && n.state.is_valid() {
                                break n.mac;
                            }
                        }
                    }
                });
                assert!(mac.is_some_and(|m| !m.is_zero()), "{ip}");
            }
        });
    }
}
