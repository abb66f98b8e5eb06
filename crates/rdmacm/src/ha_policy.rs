//! The high-availability policy of an id ([`HaPolicy`], `RDMACM_HA`): what the CM does when
//! the path of a connected id changes under it (a value the context and the configuration
//! hold; `ha/` carries the policies out). See docs/CM.md, "Policies".

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::host::watch::ChangeReason;

/// The environment variable [`crate::cm::CmaConfig::from_env`] reads for the default policy.
pub const HA_ENV: &str = "RDMACM_HA";

/// What the CM does when the path of a connected RC id changes ([`crate::cm::CmId::set_ha_policy`],
/// [`crate::cm::CmOption::HaPolicy`], `RDMACM_HA`).
///
/// - [`HaPolicy::Notify`] (the default): an ADDR_CHANGE event, nothing torn down.
/// - [`HaPolicy::Align`]: when the path's netdev moves (the route to the peer now leaves
///   through another netdev or there is none, the id's local address is gone, its netdev
///   went down), the CM ends the connection: QP to ERR, DREQ to the peer, DISCONNECTED
///   with [`ALIGN_PATH_MOVED`] (`-ENETUNREACH`) or [`ALIGN_ADDR_GONE`] (`-EADDRNOTAVAIL`)
///   as the status. Other changes (a new gateway or neighbour MAC on the same netdev, a
///   new local MAC) stay ADDR_CHANGE: the path's netdev did not move.
///
/// - [`HaPolicy::Migrate`]: on a device group (`RDMACM_DEVICES=ha0=h0+h1`), the
///   connection carries an alternate path on another port (the REQ's alternate path,
///   accepted in the REP, loaded Armed into both QPs) and the transport moves to it by
///   itself when the current path fails (its port goes down, its retries run out), with no
///   byte lost and nothing re-registered; the id gets ADDR_CHANGE and the device
///   `IBV_EVENT_PATH_MIG`; when the port comes back, the connection returns to it
///   (`RDMACM_HA_RETURN=stay` keeps it). A connection without an alternate (no device
///   group, no up port with a route to the peer, or a peer that refuses it, as Linux
///   does) falls back to `align`: it ends when its path moves, and the async layer's
///   `Connection::reconnect` continues on the new path with the same PD and MRs (on a
///   group, the same device). See docs/HA.md.
///
/// ```
/// use rdmacm::cm::HaPolicy;
/// assert_eq!("align".parse::<HaPolicy>().unwrap(), HaPolicy::Align);
/// assert_eq!(HaPolicy::parse(" Notify ").unwrap(), HaPolicy::Notify);
/// assert_eq!(HaPolicy::parse("migrate").unwrap(), HaPolicy::Migrate);
/// assert_eq!(HaPolicy::parse("sideways").unwrap_err().errno(), libc::EINVAL);
/// assert_eq!(HaPolicy::default(), HaPolicy::Notify);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum HaPolicy {
    /// ADDR_CHANGE only: the connection stays on its device and path (seed 002, option 1).
    #[default]
    Notify,
    /// End the connection when its path moves to another netdev (the RFC's
    /// RDMA_ALIGN_WITH_NETDEVICE mode).
    Align,
    /// Move the connection to an alternate path on another port of its device group
    /// (seed 002, option 2).
    Migrate,
}

/// The DISCONNECTED status under [`HaPolicy::Align`] when the route to the peer moved to
/// another netdev, no longer exists, or the id's netdev went down.
pub const ALIGN_PATH_MOVED: i32 = -libc::ENETUNREACH;
/// The DISCONNECTED status under [`HaPolicy::Align`] when the id's local address was
/// removed.
pub const ALIGN_ADDR_GONE: i32 = -libc::EADDRNOTAVAIL;

impl HaPolicy {
    /// Parses `notify`, `align` or `migrate` (case and surrounding blanks ignored);
    /// anything else is `EINVAL`.
    pub fn parse(v: &str) -> Result<HaPolicy> {
        match v.trim().to_ascii_lowercase().as_str() {
            "notify" => Ok(HaPolicy::Notify),
            "align" => Ok(HaPolicy::Align),
            "migrate" => Ok(HaPolicy::Migrate),
            _ => Err(Error::InvalidArgument(format!(
                "HA policy {v:?}: want notify, align or migrate"
            ))),
        }
    }

    /// The policy's name, as `RDMACM_HA` spells it.
    pub fn name(self) -> &'static str {
        match self {
            HaPolicy::Notify => "notify",
            HaPolicy::Align => "align",
            HaPolicy::Migrate => "migrate",
        }
    }

    /// Under this policy, the DISCONNECTED status that `reason` ends a connection with
    /// (whose path leaves through netdev `netdev`), or `None` when it is only an
    /// ADDR_CHANGE.
    ///
    /// ```
    /// use rdmacm::host::ChangeReason;
    /// use rdmacm::cm::HaPolicy;
    /// let moved = ChangeReason::RouteChanged { netdev: Some(3), gateway: None };
    /// assert_eq!(HaPolicy::Align.ends(&moved, 2), Some(-libc::ENETUNREACH));
    /// assert_eq!(HaPolicy::Align.ends(&moved, 3), None); // same netdev, new gateway
    /// assert_eq!(HaPolicy::Notify.ends(&moved, 2), None);
    /// ```
    pub fn ends(self, reason: &ChangeReason, netdev: u32) -> Option<i32> {
        if self != HaPolicy::Align {
            return None;
        }
        match reason {
            ChangeReason::RouteChanged { netdev: now, .. } if *now != Some(netdev) => {
                Some(ALIGN_PATH_MOVED)
            }
            ChangeReason::NetdevDown => Some(ALIGN_PATH_MOVED),
            ChangeReason::SourceAddressRemoved => Some(ALIGN_ADDR_GONE),
            _ => None,
        }
    }
}

impl FromStr for HaPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<HaPolicy> {
        HaPolicy::parse(s)
    }
}

impl fmt::Display for HaPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
