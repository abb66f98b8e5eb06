//! Where ports come from and who may take low ones: the ephemeral range and the
//! capability, read from the host.

use crate::error::{Error, Result};

/// Where ports come from and who may take low ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortConfig {
    /// Inclusive range ephemeral ports are taken from (`net.ipv4.ip_local_port_range`).
    pub ephemeral: (u16, u16),
    /// Explicit ports below this need `CAP_NET_BIND_SERVICE` (`PROT_SOCK`, 1024).
    pub privileged_below: u16,
    /// Whether the process has `CAP_NET_BIND_SERVICE`.
    pub may_bind_privileged: bool,
}

impl Default for PortConfig {
    /// Linux's defaults: 32768..=60999, below 1024 privileged, no capability.
    fn default() -> Self {
        PortConfig {
            ephemeral: (32768, 60999),
            privileged_below: 1024,
            may_bind_privileged: false,
        }
    }
}

impl PortConfig {
    /// Reads the calling thread's namespace and process: `ip_local_port_range` from
    /// `/proc/sys` (default range if unreadable) and `CAP_NET_BIND_SERVICE` from the
    /// effective capabilities in `/proc/self/status`.
    pub fn from_host() -> PortConfig {
        let d = PortConfig::default();
        PortConfig {
            ephemeral: read_local_port_range().unwrap_or(d.ephemeral),
            privileged_below: d.privileged_below,
            may_bind_privileged: has_net_bind_service(),
        }
    }
}

/// `net.ipv4.ip_local_port_range` of the calling thread's namespace.
pub(crate) fn read_local_port_range() -> Result<(u16, u16)> {
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")?;
    parse_port_range(&s)
}

pub(super) fn parse_port_range(s: &str) -> Result<(u16, u16)> {
    let bad = || Error::InvalidArgument(format!("bad ip_local_port_range {s:?}"));
    let mut it = s.split_whitespace().map(|x| x.parse::<u16>());
    match (it.next(), it.next()) {
        (Some(Ok(lo)), Some(Ok(hi))) if lo <= hi && lo > 0 => Ok((lo, hi)),
        _ => Err(bad()),
    }
}

/// Whether the process holds `CAP_NET_BIND_SERVICE` (bit 10 of `CapEff`).
fn has_net_bind_service() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 10) != 0)
}
