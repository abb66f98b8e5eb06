//! A neighbour entry (ARP / NDP): its state, its type and its netlink form, below the
//! neighbour resolution (`neigh.rs`) and the monitor that reports entries (`monitor.rs`).

use std::net::IpAddr;

use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState as NlState,
};

use crate::links::MacAddr;

/// State of a neighbour entry (`NUD_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeighState {
    /// Resolution in progress.
    Incomplete,
    /// Confirmed recently.
    Reachable,
    /// Valid but unconfirmed.
    Stale,
    /// Valid, confirmation pending.
    Delay,
    /// Valid, being probed.
    Probe,
    /// Resolution failed.
    Failed,
    /// No resolution needed on this link.
    Noarp,
    /// Static entry.
    Permanent,
    /// No state.
    None,
    /// Another value.
    Other(u16),
}

impl NeighState {
    /// `NUD_VALID`: the entry's MAC can be used right away.
    pub fn is_valid(self) -> bool {
        matches!(
            self,
            NeighState::Reachable
                | NeighState::Stale
                | NeighState::Delay
                | NeighState::Probe
                | NeighState::Noarp
                | NeighState::Permanent
        )
    }
}

impl From<NlState> for NeighState {
    fn from(s: NlState) -> Self {
        match s {
            NlState::Incomplete => NeighState::Incomplete,
            NlState::Reachable => NeighState::Reachable,
            NlState::Stale => NeighState::Stale,
            NlState::Delay => NeighState::Delay,
            NlState::Probe => NeighState::Probe,
            NlState::Failed => NeighState::Failed,
            NlState::Noarp => NeighState::Noarp,
            NlState::Permanent => NeighState::Permanent,
            NlState::None => NeighState::None,
            other => NeighState::Other(u16::from(other)),
        }
    }
}

/// A neighbour entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbour {
    /// ifindex of the link.
    pub link: u32,
    /// The neighbour's IP address.
    pub addr: IpAddr,
    /// Its hardware address, when known.
    pub mac: Option<MacAddr>,
    /// Entry state.
    pub state: NeighState,
}

impl Neighbour {
    pub(crate) fn from_message(m: &NeighbourMessage) -> Option<Neighbour> {
        let mut addr = None;
        let mut mac = None;
        for a in &m.attributes {
            match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
                    addr = Some(IpAddr::V4(*v4))
                }
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                    addr = Some(IpAddr::V6(*v6))
                }
                NeighbourAttribute::LinkLayerAddress(b) => mac = MacAddr::from_slice(b),
                _ => {}
            }
        }
        Some(Neighbour {
            link: m.header.ifindex,
            addr: addr?,
            mac,
            state: m.header.state.into(),
        })
    }
}
