//! The process-wide connection-manager context: devices and their CM agents, port tables,
//! the resolver and the change watcher, every id and every channel. The process's progress
//! engine (`rdma_soft::engine`) drives it: MADs, CM timers, host changes.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Instant;

use rdma_soft::engine::Source;
use rdma_soft::verbs::Device;

use crate::config::CmaConfig;
use crate::context::run_on::run_on;
use crate::context::state::State;
use crate::context::Inner;
use crate::context::{CmSource, Ctx};
use crate::engine::watch_task::start_watcher;
use crate::error::{Error, Result};
use crate::host::resolve::Resolver;
use crate::ports::PortTables;
use rdma_soft::fd::EventFd;

/// The connection-manager context: owns the software devices (one per netdev, created on
/// first use), their IB CM agents, the port tables, the resolver and watcher, every id and
/// every event channel.
///
/// Most applications use [`Cma::global`] implicitly through [`EventChannel::new`](crate::cm::EventChannel::new); tests
/// and embedders may make their own with [`Cma::new`] (created in the network namespace it
/// should see).
///
/// The process's progress engine (one thread, asleep in `epoll` while nothing happens)
/// drives the CM whatever the application does: it answers MADs, runs the CM's timers and
/// host changes and queues events, so [`EventChannel::get_event`](crate::cm::EventChannel::get_event) and the channel's fd only
/// wait.
///
/// ```no_run
/// let cma = rdmacm::cm::Cma::new()?;
/// let ch = rdmacm::cm::EventChannel::with_cma(&cma)?;
/// # Ok::<(), rdmacm::Error>(())
/// ```
#[derive(Clone)]
pub struct Cma {
    pub(crate) inner: Arc<Ctx>,
}

impl std::fmt::Debug for Cma {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cma").finish_non_exhaustive()
    }
}

static GLOBAL: OnceLock<Cma> = OnceLock::new();

impl Cma {
    /// A new context in the calling thread's network namespace. It owns a small tokio
    /// runtime (one worker thread, asleep in `epoll` unless netlink answers or host changes
    /// arrive) for address resolution and the change watcher. Configured by
    /// [`CmaConfig::from_env`] (`RDMACM_*`, `RDMA_SOFT_*`; `EINVAL` if malformed).
    pub fn new() -> Result<Cma> {
        Cma::with_config(CmaConfig::from_env()?)
    }

    /// A new context with an explicit configuration (the environment is not read). Its
    /// devices get `config.soft`; its process-wide settings (inspection, runtime directory)
    /// become the process's unless a context or device set them before
    /// ([`rdma_soft::SoftConfig::apply_process`]).
    ///
    /// ```no_run
    /// use rdmacm::cm::{Cma, CmaConfig};
    /// let cfg = CmaConfig::builder().devices("lo")?.async_driver(true).build();
    /// let cma = Cma::with_config(cfg)?;
    /// # Ok::<(), rdmacm::Error>(())
    /// ```
    pub fn with_config(config: CmaConfig) -> Result<Cma> {
        config.soft.apply_process();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("rdmacm-netlink")
            .enable_all()
            .build()
            .map_err(Error::Io)?;
        let handle = rt.handle().clone();
        let resolver = run_on(&handle, async { Resolver::new() })?;
        let seed = crate::engine::device_open::os_seed()?;
        let inner = Arc::new(Inner {
            rt: Mutex::new(Some(rt)),
            rt_handle: handle,
            resolver,
            state: Mutex::new(State {
                ids: Default::default(),
                ack_waiters: 0,
                next_id: 1,
                devices: Default::default(),
                members: Default::default(),
                returning: Vec::new(),
                channels: Default::default(),
                next_channel: 1,
                ports: PortTables::from_host()
                    .with_runtime_dir(rdma_soft::config::process_runtime_dir()),
                seed,
                cm_response_timeout: 20,
                max_cm_retries: 15,
                counters: Default::default(),
                held: Default::default(),
            }),
            acked: Condvar::new(),
            wake: EventFd::new()?,
            notifications: Mutex::new(VecDeque::new()),
            host_events: Mutex::new(VecDeque::new()),
            watch_cmds: Mutex::new(Vec::new()),
            watch_notify: Arc::new(tokio::sync::Notify::new()),
            epoch: Instant::now(),
            config,
            engine: OnceLock::new(),
            lookup_hold: Mutex::new(None),
            netns: crate::context::netns::NetNs::current().ok(),
            paused: std::sync::atomic::AtomicBool::new(false),
            inspect: OnceLock::new(),
        });
        let src = Arc::new(CmSource::new(&inner));
        let weak: Weak<dyn Source> = Arc::downgrade(&src) as Weak<dyn Source>;
        let reg = rdma_soft::engine::register(weak)?;
        reg.add_fd(inner.wake.raw())?;
        // Cannot be set already: the Arc is ours alone.
        let _ = inner.engine.set((src, reg));
        let _ = inner.inspect.set(crate::context::inspect::register(&inner));
        start_watcher(&inner);
        Ok(Cma {
            inner: Arc::new(Ctx::new(inner)),
        })
    }

    /// The process-wide context, created on first use ([`Cma::new`]: configured from the
    /// environment) unless [`Cma::global_with`] made it first.
    pub fn global() -> Result<Cma> {
        Cma::global_with(CmaConfig::from_env)
    }

    /// The process-wide context if it was made already (no blocking call).
    pub(crate) fn global_made() -> Option<Cma> {
        GLOBAL.get().cloned()
    }

    /// The process-wide context; when there is none yet, made with the configuration `config`
    /// returns (a C library that builds its configuration its own way).
    ///
    /// ```no_run
    /// let cma = rdmacm::cm::Cma::global_with(|| Ok(rdmacm::cm::CmaConfig::default()))?;
    /// # Ok::<(), rdmacm::Error>(())
    /// ```
    pub fn global_with(config: impl FnOnce() -> Result<CmaConfig>) -> Result<Cma> {
        if let Some(c) = GLOBAL.get() {
            return Ok(c.clone());
        }
        let c = Cma::with_config(config()?)?;
        Ok(GLOBAL.get_or_init(|| c).clone())
    }

    /// Ends every connection of this context as destroying its id would (a DREQ, the DREP
    /// a received DREQ waits for, a REJ), sent before this returns, without waiting for
    /// events handed out: what Linux does when a process's rdma_cm file closes at exit. For
    /// a C library's `atexit` (programs that exit without destroying their ids); the ids
    /// stay, with no connection.
    ///
    /// ```no_run
    /// rdmacm::cm::Cma::global()?.end_connections();
    /// # Ok::<(), rdmacm::Error>(())
    /// ```
    pub fn end_connections(&self) {
        crate::engine::run::end_all(&self.inner);
    }

    /// For tests that need a MAD to wait before the CM looks at it (a host change racing
    /// with a request): the engine leaves this context's CM alone until the guard is
    /// dropped (MADs stay queued on the devices). Not for applications.
    #[doc(hidden)]
    pub fn pause_progress(&self) -> PauseGuard {
        self.inner
            .paused
            .store(true, std::sync::atomic::Ordering::Release);
        PauseGuard(self.inner.clone())
    }

    /// For tests that need to see the passive side between a request's arrival and its
    /// path: the next route lookups for requests wait, with the context's lock released,
    /// until the hold is released or dropped. Not for applications.
    #[doc(hidden)]
    pub fn hold_passive_lookups(&self) -> crate::context::held_request::LookupHold {
        let shared = Arc::new(crate::context::held_request::HoldShared::default());
        *self
            .inner
            .lookup_hold
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(shared.clone());
        let weak = Arc::downgrade(&self.inner);
        crate::context::held_request::LookupHold {
            shared,
            clear: Box::new(move || {
                if let Some(i) = weak.upgrade() {
                    *i.lookup_hold.lock().unwrap_or_else(|e| e.into_inner()) = None;
                }
            }),
        }
    }

    /// Runs the CM once without blocking: receives MADs, runs timers, delivers events.
    /// Returns how many events were queued.
    pub fn progress(&self) -> usize {
        self.inner.progress()
    }

    /// The devices created so far: (name, ifindex).
    pub fn devices(&self) -> Vec<(String, u32)> {
        let st = self.inner.lock();
        let mut v: Vec<_> = st
            .devices
            .values()
            .map(|d| (d.netdev.name.clone(), d.netdev.index))
            .collect();
        v.sort_by_key(|x| x.1);
        v
    }

    /// The device list (`rdma_get_devices`): a software device for every netdev that has
    /// an address, `lo` included, named after it (the embedded default), in ifindex order;
    /// `RDMACM_DEVICES` / [`CmaConfig`] restricts and renames them. Opens them. Each
    /// device's GID table holds its netdev's addresses and follows their changes.
    pub fn device_list(&self) -> Result<Vec<Device>> {
        let links = self.inner.block(|r| async move {
            let addrs = r.view().addresses().await?;
            let mut idx: Vec<u32> = addrs.iter().map(|a| a.link).collect();
            idx.sort_unstable();
            idx.dedup();
            Ok::<_, Error>(idx)
        })?;
        let mut out = Vec::new();
        let mut seen = Vec::new();
        for i in links {
            let key = match self.inner.ensure_device(i) {
                Ok(k) => k,
                // Not selected by the configuration, or gone meanwhile.
                Err(Error::NoDevice(_)) => continue,
                Err(e) => return Err(e),
            };
            // A device group is listed once, for its first member that has an address.
            if seen.contains(&key) {
                continue;
            }
            seen.push(key);
            if let Some(d) = self.inner.lock().devices.get(&key) {
                out.push(d.dev.clone());
            }
        }
        Ok(out)
    }

    /// How many connection requests this context's listeners refused, by cause (causes
    /// never seen are left out). Each refusal is also logged (`tracing`, target `rdmacm`).
    ///
    /// ```no_run
    /// let cma = rdmacm::cm::Cma::new()?;
    /// for (cause, n) in cma.reject_counts() {
    ///     println!("{n} refused: {cause}");
    /// }
    /// # Ok::<(), rdmacm::Error>(())
    /// ```
    pub fn reject_counts(&self) -> Vec<(crate::error::RejectCause, u64)> {
        let st = self.inner.lock();
        st.counters.rejects.iter().map(|(c, n)| (*c, *n)).collect()
    }

    /// The context's connection-manager statistics: requests its listeners took and
    /// refused (by cause, as [`Cma::reject_counts`]) and its CM agents' MAD counters
    /// (malformed, unmatched, duplicates, retransmissions). The same numbers, with every
    /// id's own counters, are in the inspection view (`rdma-soft statistic`,
    /// `rdma-soft resource show cm_id`).
    pub fn statistics(&self) -> crate::context::counters::CmStatistics {
        crate::context::inspect::statistics(&self.inner.lock())
    }

    /// Sets the CM response timeout (IBA time code: 4.096 µs · 2^t, rdma_cm's
    /// `CMA_CM_RESPONSE_TIMEOUT` = 20) and the retry count (`CMA_MAX_CM_RETRIES` = 15) used
    /// in the REQs and SIDR_REQs of later connects. With Linux's values an unanswered REQ
    /// gives UNREACHABLE after about 74 s; tests use smaller ones. `EINVAL` for a timeout
    /// above 31 or retries above 15.
    ///
    /// ```no_run
    /// let cma = rdmacm::cm::Cma::new()?;
    /// cma.set_cm_timeouts(14, 3)?; // ~0.6 s per try, 4 tries
    /// # Ok::<(), rdmacm::Error>(())
    /// ```
    pub fn set_cm_timeouts(&self, response_timeout: u8, max_retries: u8) -> Result<()> {
        if response_timeout > 31 || max_retries > 15 {
            return Err(Error::InvalidArgument(
                "CM response timeout above 31 or retries above 15".into(),
            ));
        }
        let mut st = self.inner.lock();
        st.cm_response_timeout = response_timeout;
        st.max_cm_retries = max_retries;
        Ok(())
    }
}

/// See [`Cma::pause_progress`].
#[doc(hidden)]
pub struct PauseGuard(Arc<Ctx>);

impl Drop for PauseGuard {
    fn drop(&mut self) {
        self.0
            .paused
            .store(false, std::sync::atomic::Ordering::Release);
        self.0.wake.signal();
    }
}
