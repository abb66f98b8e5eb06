//! [`SoftConfig`]: every setting of the software device as one value, and
//! [`SoftConfig::from_env`], the one reader of the `RDMA_SOFT_*` variables (docs/CONFIG.md
//! lists them all).
//!
//! Most settings belong to one device's wire ([`UdpConfig`]: faults, GRO, the host-local
//! wire, its rings and pulled WRITEs, where the runtime directory is chosen from). The
//! process has one inspection socket (on or off, and its directory) and one runtime
//! directory it shares its addresses through: the first wire or claim that needs the
//! directory chooses it. The first configuration a process applies
//! ([`SoftConfig::apply_process`], which opening a device and creating an `rdmacm` context
//! do) sets them; without one they come from the environment when first needed.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::io::{
    FaultSpec, RuntimeDirChoice, UdpConfig, FAULTS_ENV, LOCAL_RING_ENV, LOCAL_WIRE_ENV, RUNDIR_ENV,
};
use crate::{Error, Result};

/// Environment variable: `off` turns UDP GRO off ([`UdpConfig::gro`]).
pub const GRO_ENV: &str = "RDMA_SOFT_GRO";

/// Every setting of the software device: its wire's and the process's.
///
/// Build one with [`SoftConfig::builder`], or read the environment with
/// [`SoftConfig::from_env`]; open a device with it through
/// [`Device::open_with_config`](crate::verbs::Device::open_with_config).
///
/// ```
/// use rdma_soft::SoftConfig;
/// let cfg = SoftConfig::builder().host_local(false).inspect(false).build().unwrap();
/// assert!(!cfg.wire.host_local && !cfg.inspect);
/// assert!(cfg.wire.gro, "everything else keeps its default");
/// assert!(SoftConfig::builder().local_ring(1000).build().is_err());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SoftConfig {
    /// The device's wire: faults, GRO, the host-local wire, its ring size, pulled WRITEs.
    pub wire: UdpConfig,
    /// Serve the inspection socket (`ibv_devices`, `rdma-soft resource` read it): on by
    /// default, `RDMA_SOFT_INSPECT=off` turns it off. Process-wide.
    pub inspect: bool,
    /// The directory of the inspection sockets (`RDMA_SOFT_INSPECT_DIR`; `None`:
    /// `$XDG_RUNTIME_DIR/rdma-soft`, else `/tmp/rdma-soft-$UID`). Process-wide.
    pub inspect_dir: Option<PathBuf>,
}

impl Default for SoftConfig {
    fn default() -> SoftConfig {
        SoftConfig {
            wire: UdpConfig::default(),
            inspect: true,
            inspect_dir: None,
        }
    }
}

/// Builds a [`SoftConfig`]; starts from the defaults.
///
/// ```
/// use rdma_soft::SoftConfig;
/// let spec = "loss=0.1,seed=3".parse().unwrap();
/// let cfg = SoftConfig::builder().faults(Some(spec)).gro(false).local_pull(None).build()?;
/// assert_eq!(cfg.wire.faults.unwrap().seed, 3);
/// assert_eq!((cfg.wire.gro, cfg.wire.local_pull), (false, None));
/// # Ok::<(), rdma_soft::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct SoftConfigBuilder {
    cfg: SoftConfig,
}

impl SoftConfigBuilder {
    /// The whole wire configuration (port, batch, buffers ... as well).
    pub fn wire(mut self, wire: UdpConfig) -> Self {
        self.cfg.wire = wire;
        self
    }

    /// Fault injection (`RDMA_SOFT_FAULTS`; `None`: off).
    pub fn faults(mut self, spec: Option<FaultSpec>) -> Self {
        self.cfg.wire.faults = spec;
        self
    }

    /// UDP GRO on receive (`RDMA_SOFT_GRO`; default on).
    pub fn gro(mut self, on: bool) -> Self {
        self.cfg.wire.gro = on;
        self
    }

    /// The host-local wire to our other processes (`RDMA_SOFT_LOCAL_WIRE`; default on).
    pub fn host_local(mut self, on: bool) -> Self {
        self.cfg.wire.host_local = on;
        self
    }

    /// Bytes per host-local ring (`RDMA_SOFT_LOCAL_RING`): a power of two from 64 KiB to
    /// 1 GiB, checked by [`SoftConfigBuilder::build`].
    pub fn local_ring(mut self, bytes: usize) -> Self {
        self.cfg.wire.local_ring = bytes;
        self
    }

    /// The shortest WRITE pulled over the host-local wire (`RDMA_SOFT_LOCAL_PULL`; `None`:
    /// pulls off).
    pub fn local_pull(mut self, min: Option<u32>) -> Self {
        self.cfg.wire.local_pull = min;
        self
    }

    /// Move buffers registered in place onto region files so that their WRITEs and SENDs are pulled
    /// (`RDMA_SOFT_PULL_IN_PLACE`; default on; [`UdpConfig::pull_in_place`]).
    pub fn pull_in_place(mut self, on: bool) -> Self {
        self.cfg.wire.pull_in_place = on;
        self
    }

    /// Serve the inspection socket (`RDMA_SOFT_INSPECT`; default on). Process-wide.
    pub fn inspect(mut self, on: bool) -> Self {
        self.cfg.inspect = on;
        self
    }

    /// The inspection sockets' directory (`RDMA_SOFT_INSPECT_DIR`). Process-wide.
    pub fn inspect_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cfg.inspect_dir = Some(dir.into());
        self
    }

    /// The runtime directory (`RDMA_SOFT_RUNDIR`; [`UdpConfig::runtime_dir`]'s `given`).
    /// Process-wide: the first wire or claim to need it chooses it.
    pub fn runtime_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cfg.wire.runtime_dir.given = Some(dir.into());
        self
    }

    /// The configuration; `EINVAL` ([`Error::Config`]) when the ring size is not a power of
    /// two from 64 KiB to 1 GiB.
    pub fn build(self) -> Result<SoftConfig> {
        if !crate::io::valid_ring_size(self.cfg.wire.local_ring) {
            return Err(Error::Config {
                var: LOCAL_RING_ENV,
                reason: format!(
                    "{}: want a power of two from 65536 to 1073741824",
                    self.cfg.wire.local_ring
                ),
            });
        }
        Ok(self.cfg)
    }
}

impl SoftConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> SoftConfigBuilder {
        SoftConfigBuilder::default()
    }

    /// A builder starting from this configuration.
    ///
    /// ```
    /// let cfg = rdma_soft::SoftConfig::default().into_builder().gro(false).build().unwrap();
    /// assert!(!cfg.wire.gro);
    /// ```
    pub fn into_builder(self) -> SoftConfigBuilder {
        SoftConfigBuilder { cfg: self }
    }

    /// The configuration from the environment: the only place the library reads
    /// `RDMA_SOFT_*` (docs/CONFIG.md has the table). A value that does not parse is an
    /// error naming its variable ([`Error::Config`], [`Error::FaultSpec`]); an unset or
    /// empty one keeps the default.
    pub fn from_env() -> Result<SoftConfig> {
        SoftConfig::from_vars(|name| std::env::var_os(name))
    }

    /// [`SoftConfig::from_env`] over any source of variables (a test's table, a C
    /// library's own lookup).
    ///
    /// ```
    /// use rdma_soft::SoftConfig;
    /// let vars = [("RDMA_SOFT_INSPECT", "off"), ("RDMA_SOFT_LOCAL_PULL", "65536")];
    /// let get = |n: &str| vars.iter().find(|v| v.0 == n).map(|v| v.1.into());
    /// let cfg = SoftConfig::from_vars(get).unwrap();
    /// assert!(!cfg.inspect);
    /// assert_eq!(cfg.wire.local_pull, Some(65536));
    /// let bad = [("RDMA_SOFT_GRO", "maybe")];
    /// let e = SoftConfig::from_vars(|n| bad.iter().find(|v| v.0 == n).map(|v| v.1.into()));
    /// assert!(e.unwrap_err().to_string().contains("RDMA_SOFT_GRO"));
    /// ```
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Result<SoftConfig> {
        let text = |var: &'static str| -> Result<Option<String>> {
            match get(var) {
                None => Ok(None),
                Some(v) => match v.into_string() {
                    Ok(s) if s.trim().is_empty() => Ok(None),
                    Ok(s) => Ok(Some(s.trim().to_owned())),
                    Err(_) => Err(Error::Config {
                        var,
                        reason: "not valid UTF-8".into(),
                    }),
                },
            }
        };
        let switch = |var: &'static str, default: bool| -> Result<bool> {
            text(var)?.map_or(Ok(default), |v| parse_switch(var, &v))
        };
        let mut b = SoftConfig::builder();
        if let Some(s) = text(FAULTS_ENV)? {
            tracing::debug!(spec = %s, "fault injection from {FAULTS_ENV}");
            let spec = s.parse().map_err(|e| match e {
                Error::FaultSpec { spec, reason } => Error::FaultSpec {
                    spec: format!("{FAULTS_ENV}={spec}"),
                    reason,
                },
                other => other,
            })?;
            b = b.faults(Some(spec));
        }
        b = b.gro(switch(GRO_ENV, true)?);
        b = b.host_local(switch(LOCAL_WIRE_ENV, true)?);
        if let Some(v) = text(LOCAL_RING_ENV)? {
            let n = v.parse::<usize>().map_err(|_| Error::Config {
                var: LOCAL_RING_ENV,
                reason: format!("{v:?}: want a power of two from 65536 to 1073741824"),
            })?;
            b = b.local_ring(n);
        }
        if let Some(v) = text(crate::PULL_ENV)? {
            b = b.local_pull(parse_pull(&v)?);
        }
        b = b.pull_in_place(switch(crate::PULL_IN_PLACE_ENV, true)?);
        b = b.inspect(switch(INSPECT_ENV, true)?);
        if let Some(d) = get(INSPECT_DIR_ENV).filter(|d| !d.is_empty()) {
            b = b.inspect_dir(d);
        }
        if let Some(d) = get(RUNDIR_ENV).filter(|d| !d.is_empty()) {
            b = b.runtime_dir(d);
        }
        // the system's, not one of ours: where the usual runtime directory is
        b.cfg.wire.runtime_dir.xdg_runtime_dir = get("XDG_RUNTIME_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        b.build()
    }

    /// Makes this configuration's process-wide settings (inspection on or off, its
    /// directory, the runtime directory) the process's, unless a configuration did so
    /// before (opening a device and creating an `rdmacm` context do); true when this one
    /// was applied. A later different one is ignored with a warning: the process has one
    /// inspection socket and one runtime directory.
    ///
    /// ```
    /// let cfg = rdma_soft::SoftConfig::default();
    /// cfg.apply_process();
    /// assert!(!cfg.apply_process(), "the process's settings are set once");
    /// ```
    pub fn apply_process(&self) -> bool {
        let mine = Process::of(self);
        let mut applied = false;
        let p = PROCESS.get_or_init(|| {
            applied = true;
            mine.clone()
        });
        if !applied && *p != mine {
            tracing::warn!(
                kept = ?p,
                ignored = ?mine,
                "rdma-soft: the process-wide settings (inspection, runtime directory) were set before; these are ignored"
            );
        }
        applied
    }
}

/// The one parser of on/off values: `1`, `on`, `true`, `yes` and `0`, `off`, `false`, `no`
/// (any case, blanks around ignored); anything else is an error naming `var`.
///
/// ```
/// use rdma_soft::config::parse_switch;
/// assert!(parse_switch("X", " On ").unwrap());
/// assert!(!parse_switch("X", "no").unwrap());
/// let e = parse_switch("RDMA_SOFT_GRO", "2").unwrap_err();
/// assert_eq!(e.errno(), libc::EINVAL);
/// assert!(e.to_string().contains("RDMA_SOFT_GRO"), "{e}");
/// ```
pub fn parse_switch(var: &'static str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "true" | "yes" => Ok(true),
        "0" | "off" | "false" | "no" => Ok(false),
        _ => Err(Error::Config {
            var,
            reason: format!("{value:?}: want on or off (1/0, on/off, true/false, yes/no)"),
        }),
    }
}

/// An `RDMA_SOFT_LOCAL_PULL` value: an off switch, or the shortest WRITE pulled in bytes.
fn parse_pull(v: &str) -> Result<Option<u32>> {
    if let Ok(n) = v.parse::<u32>() {
        return Ok((n != 0).then_some(n));
    }
    match parse_switch(crate::PULL_ENV, v) {
        Ok(false) => Ok(None),
        Ok(true) => Ok(Some(crate::PULL_DEFAULT_MIN)),
        Err(_) => Err(Error::Config {
            var: crate::PULL_ENV,
            reason: format!("{v:?}: want off or a number of bytes"),
        }),
    }
}

/// The process-wide part of a [`SoftConfig`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Process {
    pub inspect: bool,
    pub inspect_dir: Option<PathBuf>,
    pub runtime_dir: RuntimeDirChoice,
}

impl Process {
    fn of(c: &SoftConfig) -> Process {
        Process {
            inspect: c.inspect,
            inspect_dir: c.inspect_dir.clone(),
            runtime_dir: c.wire.runtime_dir.clone(),
        }
    }
}

static PROCESS: OnceLock<Process> = OnceLock::new();

/// Environment variable: `off` serves no inspection socket in this process (default: on;
/// read by [`crate::SoftConfig::from_env`]).
pub const INSPECT_ENV: &str = "RDMA_SOFT_INSPECT";

/// Overrides the directory of the inspection sockets (tests, or a tool pointed at another
/// user's directory).
pub const INSPECT_DIR_ENV: &str = "RDMA_SOFT_INSPECT_DIR";

// The wire's part of the environment, here so that this file is the one reader.
impl UdpConfig {
    /// The wire part of [`crate::SoftConfig::from_env`] (fault injection, GRO, the
    /// host-local wire, its rings and pulls from the `RDMA_SOFT_*` variables; an error
    /// names the variable whose value does not parse).
    pub fn from_env() -> Result<UdpConfig> {
        Ok(crate::SoftConfig::from_env()?.wire)
    }
}

/// The process-wide settings: the first applied, else the environment's (a value that does
/// not parse is warned about and the default kept).
pub(crate) fn process() -> &'static Process {
    PROCESS.get_or_init(|| {
        let cfg = SoftConfig::from_env().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "rdma-soft: the environment's settings are ignored");
            SoftConfig::default()
        });
        Process::of(&cfg)
    })
}

/// Where the process's runtime directory is chosen from: the first configuration applied
/// ([`SoftConfig::apply_process`]), else the environment's. A device opened with a
/// configuration builds its wire with this; `rdmacm` gives it to its listeners' port claims.
///
/// ```
/// let c = rdma_soft::config::process_runtime_dir();
/// assert_eq!(c, rdma_soft::config::process_runtime_dir());
/// ```
pub fn process_runtime_dir() -> RuntimeDirChoice {
    process().runtime_dir.clone()
}

/// The process's runtime directory (slots, groups, claims, bells, inspection sockets),
/// chosen once per process from its settings ([`SoftConfig::apply_process`], else the
/// environment's) unless a wire chose it first from its own
/// ([`crate::io::share::choose_runtime_dir`]).
///
/// ```
/// let d = rdma_soft::config::runtime_dir().unwrap();
/// assert_eq!(d, rdma_soft::config::runtime_dir().unwrap(), "chosen once");
/// ```
pub fn runtime_dir() -> Result<PathBuf> {
    crate::io::share::choose_runtime_dir(&process().runtime_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(list: &[(&str, &str)]) -> Result<SoftConfig> {
        let list: Vec<(String, String)> = list
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        SoftConfig::from_vars(|n| list.iter().find(|v| v.0 == n).map(|v| v.1.clone().into()))
    }

    #[test]
    fn every_variable_reaches_its_setting() {
        let c = vars(&[
            ("RDMA_SOFT_FAULTS", "loss=0.5,seed=9"),
            ("RDMA_SOFT_GRO", "false"),
            ("RDMA_SOFT_LOCAL_WIRE", "OFF"),
            ("RDMA_SOFT_LOCAL_RING", "131072"),
            ("RDMA_SOFT_LOCAL_PULL", "off"),
            ("RDMA_SOFT_PULL_IN_PLACE", "off"),
            ("RDMA_SOFT_INSPECT", "no"),
            ("RDMA_SOFT_INSPECT_DIR", "/x/i"),
            ("RDMA_SOFT_RUNDIR", "/x/r"),
            ("XDG_RUNTIME_DIR", "/x/x"),
        ])
        .unwrap();
        assert_eq!(
            c.wire.faults.as_ref().map(|f| (f.loss, f.seed)),
            Some((0.5, 9))
        );
        assert!(!c.wire.gro && !c.wire.host_local && !c.inspect && !c.wire.pull_in_place);
        assert!(SoftConfig::default().wire.pull_in_place, "on by default");
        assert_eq!((c.wire.local_ring, c.wire.local_pull), (131072, None));
        assert_eq!(c.inspect_dir.as_deref(), Some("/x/i".as_ref()));
        assert_eq!(c.wire.runtime_dir.given.as_deref(), Some("/x/r".as_ref()));
        assert_eq!(
            c.wire.runtime_dir.xdg_runtime_dir.as_deref(),
            Some("/x/x".as_ref()),
            "the wire's configuration carries where the usual directory is"
        );
        assert_eq!(vars(&[]).unwrap(), SoftConfig::default());
        // blank: the default
        assert_eq!(
            vars(&[("RDMA_SOFT_INSPECT", " ")]).unwrap(),
            SoftConfig::default()
        );
    }

    #[test]
    fn a_bad_value_is_an_error_naming_its_variable() {
        for (var, v) in [
            ("RDMA_SOFT_GRO", "2"),
            ("RDMA_SOFT_LOCAL_WIRE", "disabled"),
            ("RDMA_SOFT_INSPECT", "nope"),
            ("RDMA_SOFT_PULL_IN_PLACE", "65536"),
            ("RDMA_SOFT_LOCAL_RING", "1000"),
            ("RDMA_SOFT_LOCAL_RING", "lots"),
            ("RDMA_SOFT_LOCAL_PULL", "-3"),
            ("RDMA_SOFT_FAULTS", "loss=oops"),
        ] {
            let e = vars(&[(var, v)]).unwrap_err();
            assert_eq!(e.errno(), libc::EINVAL);
            assert!(e.to_string().contains(var), "{var}={v}: {e}");
        }
    }

    #[test]
    fn pull_takes_a_size_or_a_switch() {
        let pull = |v| {
            vars(&[("RDMA_SOFT_LOCAL_PULL", v)])
                .unwrap()
                .wire
                .local_pull
        };
        assert_eq!(pull("4096"), Some(4096));
        assert_eq!(pull("0"), None);
        assert_eq!(pull("on"), Some(crate::PULL_DEFAULT_MIN));
        assert_eq!(pull("no"), None);
    }
}
