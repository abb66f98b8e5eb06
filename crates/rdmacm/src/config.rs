//! The context's configuration ([`CmaConfig`]): which netdevs get a software device
//! (`RDMACM_DEVICES`), the HA policy, the async driver, and the devices' own settings; its
//! `from_env` is the one reader of the environment (docs/CONFIG.md).

use crate::error::{Error, Result};
use rdma_soft::SoftConfig;

use crate::ha_policy::{HaPolicy, HA_ENV};

/// Which netdevs get a software device, and under which names: the `RDMACM_DEVICES`
/// setting, or [`CmaConfig::devices`].
///
/// The embedded default (no setting) is a device on every netdev that has an address,
/// `lo` included, named after the netdev. `RDMACM_DEVICES` is a comma-separated list of
/// `NETDEV` or `NETDEV=NAME` entries: only those netdevs get a device (an id whose
/// address or route needs another netdev fails with `ENODEV`), named `NAME` when given.
/// An entry naming several netdevs joined by `+` (`NAME=h0+h1`, also written `h0+h1=NAME`)
/// is a **device group**: one device with a port per netdev, in order (port 1 on the first),
/// one PD, MR and key space (docs/HA.md); an id on an address of any member gets it.
///
/// ```
/// let c = rdmacm::cm::CmaConfig::parse_devices("ha0=h0+h1, lo").unwrap();
/// let d = c.devices.unwrap();
/// assert_eq!((d[0].netdev.as_str(), d[0].name.as_deref()), ("h0", Some("ha0")));
/// assert_eq!(d[0].more, ["h1"]);
/// assert!(d[1].more.is_empty());
/// // a netdev in two devices, or twice in one group
/// assert!(rdmacm::cm::CmaConfig::parse_devices("g=h0+h1,h1").is_err());
/// assert!(rdmacm::cm::CmaConfig::parse_devices("g=h0+h0").is_err());
/// ```
///
/// ```
/// let c = rdmacm::cm::CmaConfig::parse_devices("lo=soft_lo, eth0").unwrap();
/// let d = c.devices.unwrap();
/// assert_eq!((d[0].netdev.as_str(), d[0].name.as_deref()), ("lo", Some("soft_lo")));
/// assert_eq!((d[1].netdev.as_str(), d[1].name.as_deref()), ("eth0", None));
/// assert_eq!(rdmacm::cm::CmaConfig::parse_devices("=x").unwrap_err().errno(), libc::EINVAL);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CmaConfig {
    /// `None`: every netdev with an address, named after it. `Some`: only these.
    pub devices: Option<Vec<DeviceSpec>>,
    /// The HA policy every new id of the context starts with (`RDMACM_HA`; default
    /// [`HaPolicy::Notify`]); [`crate::cm::CmId::set_ha_policy`] changes one id's.
    pub ha: HaPolicy,
    /// Under [`HaPolicy::Migrate`], stay on the alternate after a migration when the
    /// primary's port comes back (`RDMACM_HA_RETURN=stay`) instead of returning to it (the
    /// default, `return`). Either way the restored path is loaded as the new alternate.
    pub ha_stay: bool,
    /// The async layer's runtime driver (`RDMACM_ASYNC_DRIVER`; default off): one tokio task
    /// per device drives the device of the context's connections when its wire fd is
    /// readable, and the engine leaves the device to it (taking it back within 2 ms from a
    /// blocked runtime). Off, the progress engine drives every device and wakes a waiting
    /// connection future directly. On a quiet 2-core machine the engine alone is a little
    /// faster (docs/BENCHMARKS.md, "async wake-ups"); the driver helps when the cores are
    /// busy.
    pub async_driver: bool,
    /// How long a connect whose REQ is refused for want of a listener (REJ 8, "invalid
    /// service id"; for UD ids a SIDR_REP "service id not supported") keeps resending it
    /// before `REJECTED` (`UNREACHABLE` status 1 for UD) is reported
    /// (`RDMACM_NO_LISTENER_RETRY_MS`; default 250 ms; 0: at once, as Linux). For peers
    /// that tell their client to connect just before they listen: perftest's `-R` does,
    /// between its two connections.
    pub no_listener_retry: std::time::Duration,
    /// The software devices' configuration (`RDMA_SOFT_*`), carried down to every device
    /// the context opens; its process-wide part is applied when the context is created.
    pub soft: SoftConfig,
}

/// The default of [`CmaConfig::no_listener_retry`].
pub const NO_LISTENER_RETRY_DEFAULT: std::time::Duration = std::time::Duration::from_millis(250);

impl Default for CmaConfig {
    fn default() -> Self {
        CmaConfig {
            devices: None,
            ha: HaPolicy::default(),
            ha_stay: false,
            async_driver: false,
            no_listener_retry: NO_LISTENER_RETRY_DEFAULT,
            soft: SoftConfig::default(),
        }
    }
}

/// Builds a [`CmaConfig`]; starts from the defaults (nothing read from the environment).
///
/// ```
/// use rdmacm::cm::{CmaConfig, HaPolicy};
/// let soft = rdma_soft::SoftConfig::builder().host_local(false).build().unwrap();
/// let cfg = CmaConfig::builder()
///     .devices("lo")?
///     .ha(HaPolicy::Align)
///     .async_driver(true)
///     .soft(soft)
///     .build();
/// assert_eq!(cfg.devices.unwrap()[0].netdev, "lo");
/// assert!(cfg.async_driver && !cfg.soft.wire.host_local);
/// # Ok::<(), rdmacm::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct CmaConfigBuilder {
    cfg: CmaConfig,
}

impl CmaConfigBuilder {
    /// The devices, as an `RDMACM_DEVICES` value ([`CmaConfig::parse_devices`]; empty:
    /// every netdev with an address).
    pub fn devices(mut self, spec: &str) -> Result<Self> {
        self.cfg.devices = CmaConfig::parse_devices(spec)?.devices;
        Ok(self)
    }

    /// The devices, as values (`None`: every netdev with an address).
    pub fn device_specs(mut self, specs: Option<Vec<DeviceSpec>>) -> Self {
        self.cfg.devices = specs;
        self
    }

    /// The HA policy of new ids ([`CmaConfig::ha`]).
    pub fn ha(mut self, policy: HaPolicy) -> Self {
        self.cfg.ha = policy;
        self
    }

    /// Stay on the alternate after a migration ([`CmaConfig::ha_stay`]).
    pub fn ha_stay(mut self, stay: bool) -> Self {
        self.cfg.ha_stay = stay;
        self
    }

    /// The async layer's runtime driver ([`CmaConfig::async_driver`]).
    pub fn async_driver(mut self, on: bool) -> Self {
        self.cfg.async_driver = on;
        self
    }

    /// How long a refused REQ is resent ([`CmaConfig::no_listener_retry`]).
    pub fn no_listener_retry(mut self, d: std::time::Duration) -> Self {
        self.cfg.no_listener_retry = d;
        self
    }

    /// The software devices' configuration ([`CmaConfig::soft`]).
    pub fn soft(mut self, soft: SoftConfig) -> Self {
        self.cfg.soft = soft;
        self
    }

    /// The configuration.
    pub fn build(self) -> CmaConfig {
        self.cfg
    }
}

/// One entry of [`CmaConfig::devices`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The netdev's name (a group's first member: port 1).
    pub netdev: String,
    /// The device's name (default: the netdev's; a group's: its netdevs joined by `+`).
    pub name: Option<String>,
    /// A device group's other members, ports 2, 3, ... (empty: a one-port device).
    pub more: Vec<String>,
}

impl DeviceSpec {
    /// Every netdev of the device, port 1 first.
    pub fn netdevs(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.netdev.as_str()).chain(self.more.iter().map(String::as_str))
    }
}

/// At most this many netdevs in a group (the soft device's port count).
const MAX_GROUP: usize = 8;

/// The environment variable read by [`CmaConfig::from_env`].
pub const DEVICES_ENV: &str = "RDMACM_DEVICES";

/// The environment variable that sets [`CmaConfig::ha_stay`] (`stay` or `return`).
pub const HA_RETURN_ENV: &str = "RDMACM_HA_RETURN";

/// The environment variable that sets [`CmaConfig::async_driver`] (on or off).
pub const DRIVER_ENV: &str = "RDMACM_ASYNC_DRIVER";

/// The environment variable that sets [`CmaConfig::no_listener_retry`] (milliseconds).
pub const NO_LISTENER_RETRY_ENV: &str = "RDMACM_NO_LISTENER_RETRY_MS";

impl CmaConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> CmaConfigBuilder {
        CmaConfigBuilder::default()
    }

    /// A builder starting from this configuration.
    pub fn into_builder(self) -> CmaConfigBuilder {
        CmaConfigBuilder { cfg: self }
    }

    /// The configuration from the environment, the only place the library reads it
    /// (docs/CONFIG.md has the table): `RDMACM_DEVICES` (unset or empty: the embedded
    /// default), `RDMACM_HA` (`notify`, `align` or `migrate`; unset or empty: `notify`),
    /// `RDMACM_HA_RETURN` (`stay` or `return`), `RDMACM_ASYNC_DRIVER` (on or off: `1`/`0`,
    /// `on`/`off`, `true`/`false`, `yes`/`no`), `RDMACM_NO_LISTENER_RETRY_MS` (milliseconds,
    /// at most 60000), and the software device's `RDMA_SOFT_*`
    /// ([`SoftConfig::from_env`]). A malformed value is `EINVAL`, with a message naming the
    /// variable.
    pub fn from_env() -> Result<CmaConfig> {
        CmaConfig::from_vars(|name| std::env::var_os(name))
    }

    /// [`CmaConfig::from_env`] over any source of variables (a test's table, a C library's
    /// own lookup).
    ///
    /// ```
    /// use rdmacm::cm::{CmaConfig, HaPolicy};
    /// let vars = [("RDMACM_HA", "align"), ("RDMACM_ASYNC_DRIVER", "on"), ("RDMA_SOFT_GRO", "off")];
    /// let get = |n: &str| vars.iter().find(|v| v.0 == n).map(|v| v.1.into());
    /// let c = CmaConfig::from_vars(get).unwrap();
    /// assert_eq!(c.ha, HaPolicy::Align);
    /// assert!(c.async_driver && !c.soft.wire.gro);
    /// assert_eq!(c.no_listener_retry, rdmacm::cm::NO_LISTENER_RETRY_DEFAULT);
    /// let now = [("RDMACM_NO_LISTENER_RETRY_MS", "0")];
    /// let c = CmaConfig::from_vars(|n| now.iter().find(|v| v.0 == n).map(|v| v.1.into()));
    /// assert!(c.unwrap().no_listener_retry.is_zero());
    /// let bad = [("RDMACM_ASYNC_DRIVER", "sometimes")];
    /// let e = CmaConfig::from_vars(|n| bad.iter().find(|v| v.0 == n).map(|v| v.1.into()));
    /// assert!(e.unwrap_err().to_string().contains("RDMACM_ASYNC_DRIVER"));
    /// ```
    pub fn from_vars(get: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<CmaConfig> {
        let text = |var: &str| -> Result<Option<String>> {
            get(var)
                .map(|v| {
                    v.into_string()
                        .map_err(|_| Error::InvalidArgument(format!("{var}: not valid UTF-8")))
                })
                .transpose()
        };
        let mut c = match text(DEVICES_ENV)? {
            Some(v) => CmaConfig::parse_devices(&v)?,
            None => CmaConfig::default(),
        };
        if let Some(v) = text(HA_ENV)? {
            c.ha = CmaConfig::parse_ha(&v)?;
        }
        if let Some(v) = text(HA_RETURN_ENV)? {
            c.ha_stay = match v.trim().to_ascii_lowercase().as_str() {
                "" | "return" => false,
                "stay" => true,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "{HA_RETURN_ENV}: {v:?}: want stay or return"
                    )))
                }
            };
        }
        if let Some(v) = text(DRIVER_ENV)?.filter(|v| !v.trim().is_empty()) {
            c.async_driver = rdma_soft::config::parse_switch(DRIVER_ENV, &v)
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        }
        if let Some(v) = text(NO_LISTENER_RETRY_ENV)?.filter(|v| !v.trim().is_empty()) {
            let ms: u64 = v
                .trim()
                .parse()
                .ok()
                .filter(|&ms| ms <= 60_000)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "{NO_LISTENER_RETRY_ENV}: {v:?}: want milliseconds, 0 to 60000"
                    ))
                })?;
            c.no_listener_retry = std::time::Duration::from_millis(ms);
        }
        c.soft = SoftConfig::from_vars(&get).map_err(|e| match e {
            rdma_soft::Error::Config { .. } | rdma_soft::Error::FaultSpec { .. } => {
                Error::InvalidArgument(e.to_string())
            }
            e => Error::Device(e),
        })?;
        Ok(c)
    }

    /// Parses a `RDMACM_HA` value (empty: the default, `notify`); errors name the variable.
    ///
    /// ```
    /// use rdmacm::cm::{CmaConfig, HaPolicy};
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
        let mut out: Vec<DeviceSpec> = Vec::new();
        for e in v.split(',') {
            let e = e.trim();
            let bad = |why: &str| {
                Error::InvalidArgument(format!(
                    "{DEVICES_ENV}: bad entry {e:?} ({why}; want NETDEV, NETDEV=NAME or NAME=NETDEV+NETDEV...)"
                ))
            };
            let (nd, name) = match e.split_once('=') {
                // A group names its netdevs on the side with the `+`.
                Some((a, b)) if b.contains('+') && !a.contains('+') => (b.trim(), Some(a.trim())),
                Some((a, b)) => (a.trim(), Some(b.trim())),
                None => (e, None),
            };
            if name.is_some_and(|n| n.is_empty() || n.contains('+') || n.contains('=')) {
                return Err(bad("empty or malformed name"));
            }
            let members: Vec<String> = nd.split('+').map(|m| m.trim().to_owned()).collect();
            if members.iter().any(String::is_empty) {
                return Err(bad("empty netdev"));
            }
            if members.len() > MAX_GROUP {
                return Err(bad("more than 8 netdevs in a group"));
            }
            for (i, m) in members.iter().enumerate() {
                let twice =
                    members[..i].contains(m) || out.iter().any(|d| d.netdevs().any(|n| n == m));
                if twice {
                    return Err(bad(&format!("netdev {m} named twice")));
                }
            }
            let mut members = members.into_iter();
            let first = members.next().unwrap_or_default();
            out.push(DeviceSpec {
                netdev: first,
                name: name.map(str::to_owned),
                more: members.collect(),
            });
        }
        Ok(CmaConfig {
            devices: Some(out),
            ..CmaConfig::default()
        })
    }

    /// The device of `netdev`: its name and every netdev it spans (port 1 first), or
    /// `None` when the netdev gets no device.
    pub(crate) fn device_of(&self, netdev: &str) -> Option<(String, Vec<String>)> {
        match &self.devices {
            None => Some((netdev.to_owned(), vec![netdev.to_owned()])),
            Some(v) => v
                .iter()
                .find(|d| d.netdevs().any(|n| n == netdev))
                .map(|d| {
                    let all: Vec<String> = d.netdevs().map(str::to_owned).collect();
                    let name = d.name.clone().unwrap_or_else(|| all.join("+"));
                    (name, all)
                }),
        }
    }
}
