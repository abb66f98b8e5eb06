//! Which netdevs get a software device (`RDMACM_DEVICES`, [`CmaConfig`]).

use crate::error::{Error, Result};
use crate::ha::{HaPolicy, HA_ENV};

/// Which netdevs get a software device, and under which names: the `RDMACM_DEVICES`
/// setting, or [`CmaConfig::devices`].
///
/// The embedded default (no setting) is a device on every netdev that has an address,
/// `lo` included, named after the netdev. `RDMACM_DEVICES` is a comma-separated list of
/// `NETDEV` or `NETDEV=NAME` entries: only those netdevs get a device (an id whose
/// address or route needs another netdev fails with `ENODEV`), named `NAME` when given.
///
/// ```
/// let c = rdmacm::CmaConfig::parse_devices("lo=soft_lo, eth0").unwrap();
/// let d = c.devices.unwrap();
/// assert_eq!((d[0].netdev.as_str(), d[0].name.as_deref()), ("lo", Some("soft_lo")));
/// assert_eq!((d[1].netdev.as_str(), d[1].name.as_deref()), ("eth0", None));
/// assert_eq!(rdmacm::CmaConfig::parse_devices("=x").unwrap_err().errno(), libc::EINVAL);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CmaConfig {
    /// `None`: every netdev with an address, named after it. `Some`: only these.
    pub devices: Option<Vec<DeviceSpec>>,
    /// The HA policy every new id of the context starts with (`RDMACM_HA`; default
    /// [`HaPolicy::Notify`]); [`crate::CmId::set_ha_policy`] changes one id's.
    pub ha: HaPolicy,
}

/// One entry of [`CmaConfig::devices`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The netdev's name.
    pub netdev: String,
    /// The device's name (default: the netdev's).
    pub name: Option<String>,
}

/// The environment variable read by [`CmaConfig::from_env`].
pub const DEVICES_ENV: &str = "RDMACM_DEVICES";

impl CmaConfig {
    /// The configuration from the environment: `RDMACM_DEVICES` (unset or empty: the
    /// embedded default) and `RDMACM_HA` (`notify` or `align`; unset or empty: `notify`).
    /// A malformed value is `EINVAL`, `RDMACM_HA=migrate` `EOPNOTSUPP`, with a message
    /// naming the variable.
    pub fn from_env() -> Result<CmaConfig> {
        let mut c = match std::env::var(DEVICES_ENV) {
            Ok(v) => CmaConfig::parse_devices(&v)?,
            Err(_) => CmaConfig::default(),
        };
        if let Ok(v) = std::env::var(HA_ENV) {
            c.ha = CmaConfig::parse_ha(&v)?;
        }
        Ok(c)
    }

    /// Parses a `RDMACM_HA` value (empty: the default, `notify`); errors name the variable.
    ///
    /// ```
    /// use rdmacm::{CmaConfig, HaPolicy};
    /// assert_eq!(CmaConfig::parse_ha("align").unwrap(), HaPolicy::Align);
    /// assert_eq!(CmaConfig::parse_ha("").unwrap(), HaPolicy::Notify);
    /// let e = CmaConfig::parse_ha("aligned").unwrap_err();
    /// assert_eq!(e.errno(), libc::EINVAL);
    /// assert!(e.to_string().contains("RDMACM_HA"), "{e}");
    /// ```
    pub fn parse_ha(v: &str) -> Result<HaPolicy> {
        if v.trim().is_empty() {
            return Ok(HaPolicy::default());
        }
        HaPolicy::parse(v).map_err(|e| match e {
            Error::NotSupported(m) => Error::NotSupported(format!("{HA_ENV}: {m}")),
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{HA_ENV}: {m}")),
            e => e,
        })
    }

    /// Parses a `RDMACM_DEVICES` value (`NETDEV[=NAME][,...]`; empty: the default).
    pub fn parse_devices(v: &str) -> Result<CmaConfig> {
        if v.trim().is_empty() {
            return Ok(CmaConfig::default());
        }
        let mut out = Vec::new();
        for e in v.split(',') {
            let e = e.trim();
            let (nd, name) = match e.split_once('=') {
                Some((a, b)) => (a.trim(), Some(b.trim())),
                None => (e, None),
            };
            if nd.is_empty() || name.is_some_and(str::is_empty) {
                return Err(Error::InvalidArgument(format!(
                    "{DEVICES_ENV}: bad entry {e:?} (want NETDEV or NETDEV=NAME)"
                )));
            }
            out.push(DeviceSpec {
                netdev: nd.to_owned(),
                name: name.map(str::to_owned),
            });
        }
        Ok(CmaConfig {
            devices: Some(out),
            ..CmaConfig::default()
        })
    }

    /// The device name for `netdev`, or `None` when it gets no device.
    pub(crate) fn device_name(&self, netdev: &str) -> Option<String> {
        match &self.devices {
            None => Some(netdev.to_owned()),
            Some(v) => v
                .iter()
                .find(|d| d.netdev == netdev)
                .map(|d| d.name.clone().unwrap_or_else(|| netdev.to_owned())),
        }
    }
}
