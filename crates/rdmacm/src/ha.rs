//! High-availability policies of an id ([`HaPolicy`], `RDMACM_HA`): what the CM does when
//! the path of a connected id changes under it. See docs/CM.md, "Policies".

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::watch::ChangeReason;

/// The environment variable [`crate::CmaConfig::from_env`] reads for the default policy.
pub const HA_ENV: &str = "RDMACM_HA";

/// What the CM does when the path of a connected RC id changes ([`crate::CmId::set_ha_policy`],
/// [`crate::CmOption::HaPolicy`], `RDMACM_HA`).
///
/// - [`HaPolicy::Notify`] (the default): an ADDR_CHANGE event, nothing torn down.
/// - [`HaPolicy::Align`]: when the path's netdev moves (the route to the peer now leaves
///   through another netdev or there is none, the id's local address is gone, its netdev
///   went down), the CM ends the connection: QP to ERR, DREQ to the peer, DISCONNECTED
///   with [`ALIGN_PATH_MOVED`] (`-ENETUNREACH`) or [`ALIGN_ADDR_GONE`] (`-EADDRNOTAVAIL`)
///   as the status. Other changes (a new gateway or neighbour MAC on the same netdev, a
///   new local MAC) stay ADDR_CHANGE: the path's netdev did not move.
///
/// `migrate` (device groups) is recognised by the parser and refused with `EOPNOTSUPP`
/// ("migrate needs a device group") until device groups exist.
///
/// ```
/// use rdmacm::HaPolicy;
/// assert_eq!("align".parse::<HaPolicy>().unwrap(), HaPolicy::Align);
/// assert_eq!(HaPolicy::parse(" Notify ").unwrap(), HaPolicy::Notify);
/// assert_eq!(HaPolicy::parse("migrate").unwrap_err().errno(), libc::EOPNOTSUPP);
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
}

/// The DISCONNECTED status under [`HaPolicy::Align`] when the route to the peer moved to
/// another netdev, no longer exists, or the id's netdev went down.
pub const ALIGN_PATH_MOVED: i32 = -libc::ENETUNREACH;
/// The DISCONNECTED status under [`HaPolicy::Align`] when the id's local address was
/// removed.
pub const ALIGN_ADDR_GONE: i32 = -libc::EADDRNOTAVAIL;

impl HaPolicy {
    /// Parses `notify` or `align` (case and surrounding blanks ignored). `migrate` is
    /// `EOPNOTSUPP` ([`Error::NotSupported`]), anything else `EINVAL`.
    pub fn parse(v: &str) -> Result<HaPolicy> {
        match v.trim().to_ascii_lowercase().as_str() {
            "notify" => Ok(HaPolicy::Notify),
            "align" => Ok(HaPolicy::Align),
            "migrate" => Err(Error::NotSupported(
                "HA policy migrate needs a device group, which this build does not have".into(),
            )),
            _ => Err(Error::InvalidArgument(format!(
                "HA policy {v:?}: want notify or align"
            ))),
        }
    }

    /// The policy's name, as `RDMACM_HA` spells it.
    pub fn name(self) -> &'static str {
        match self {
            HaPolicy::Notify => "notify",
            HaPolicy::Align => "align",
        }
    }

    /// Under this policy, the DISCONNECTED status that `reason` ends a connection with
    /// (whose path leaves through netdev `netdev`), or `None` when it is only an
    /// ADDR_CHANGE.
    ///
    /// ```
    /// use rdmacm::{ChangeReason, HaPolicy};
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
