//! The process-wide connection-manager context: devices and their CM agents, port tables,
//! the resolver and the change watcher, every id and every channel. The process's progress
//! engine (`rdma_soft::engine`) drives it: MADs, CM timers, host changes.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use rdma_proto::cm::{AgentConfig, CmAgent, ConnHandle, OverloadPolicy, PeerAddr};
use rdma_soft::engine::{Registration, Run, Source};
use rdma_soft::io::WireAddr;
use rdma_soft::verbs::{Device, DeviceConfig, QueuePair};

use crate::addr::{classify, AddrClass};
use crate::channel::EventChannel;
use crate::error::{Error, Result};
use crate::event::{ConnEventParam, EventType, PendingEvent, UdParam};
use crate::fd::EventFd;
use crate::id::{CmId, IdState, QpKind};
use crate::ports::{BindHandle, PortSpace, PortTables};
use crate::resolve::{Binding, Netdev, ResolvedAddr, Resolver};
use crate::route::RocePath;
use crate::watch::{Notification, Watcher};

/// Number of an id: never reused within a context.
pub(crate) type IdNum = u64;

/// What the peer told us in its REQ or REP.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Remote {
    pub qpn: u32,
    pub psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub rnr_retry: u8,
    pub retry: u8,
}

/// Per-id options (`rdma_set_option`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IdOptions {
    pub tos: Option<u8>,
    pub reuseaddr: bool,
    pub afonly: Option<bool>,
    pub ack_timeout: Option<u8>,
}

/// A listener's bookkeeping.
#[derive(Debug, Default)]
pub(crate) struct ListenState {
    pub backlog: usize,
    /// CONNECT_REQUEST events queued and not yet handed out (Linux's backlog measure).
    pub queued: usize,
    /// (device ifindex, service id) registrations.
    pub regs: Vec<(u32, u64)>,
}

/// The state of one id.
#[derive(Debug)]
pub(crate) struct IdSlot {
    pub state: IdState,
    pub channel: u64,
    pub ps: PortSpace,
    pub context: u64,
    pub opts: IdOptions,
    pub bind: Option<BindHandle>,
    pub binding: Option<Binding>,
    pub local: Option<SocketAddr>,
    pub peer: Option<SocketAddr>,
    /// ifindex of the device (netdev) the id is attached to.
    pub dev: Option<u32>,
    pub resolved: Option<ResolvedAddr>,
    pub path: Option<RocePath>,
    pub qp: Option<Arc<QueuePair>>,
    pub qp_kind: QpKind,
    pub conn: Option<ConnHandle>,
    pub rq_psn: u32,
    pub remote: Option<Remote>,
    pub listen: Option<ListenState>,
    pub parent: Option<IdNum>,
    /// Events handed out and not yet dropped.
    pub outstanding: usize,
    pub user_qpn: Option<u32>,
    pub conn_param: Option<crate::event::ConnParam>,
    pub watched: bool,
    /// The REP's parameters, reported with ESTABLISHED on the active side.
    pub est_param: ConnEventParam,
    /// The application establishes itself (user QP): no ESTABLISHED event.
    pub suppress_est: bool,
    /// A passive id was accepted or rejected.
    pub accepted: bool,
}

impl IdSlot {
    pub(crate) fn new(channel: u64, ps: PortSpace, qp_kind: QpKind) -> IdSlot {
        IdSlot {
            state: IdState::Idle,
            channel,
            ps,
            context: 0,
            opts: IdOptions::default(),
            bind: None,
            binding: None,
            local: None,
            peer: None,
            dev: None,
            resolved: None,
            path: None,
            qp: None,
            qp_kind,
            conn: None,
            rq_psn: 0,
            remote: None,
            listen: None,
            parent: None,
            outstanding: 0,
            user_qpn: None,
            conn_param: None,
            watched: false,
            est_param: ConnEventParam::default(),
            suppress_est: false,
            accepted: false,
        }
    }

    pub(crate) fn afonly(&self) -> bool {
        match self.opts.afonly {
            Some(v) => v,
            None => match self.local {
                Some(SocketAddr::V6(_)) => read_bindv6only(),
                _ => true,
            },
        }
    }
}

fn read_bindv6only() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only")
        .map(|s| s.trim() == "1")
        .unwrap_or(false)
}

/// A software device with its CM agent and GSI bookkeeping.
pub(crate) struct DevEntry {
    pub netdev: Netdev,
    pub dev: Device,
    pub agent: CmAgent,
    /// Local addresses opened for MADs.
    pub open: HashSet<WireAddr>,
    /// Connection → id.
    pub conns: HashMap<ConnHandle, IdNum>,
    /// Service id → listeners registered on this device.
    pub listeners: HashMap<u64, Vec<IdNum>>,
    /// Our local comm id → the local address its MADs leave from.
    pub comm_local: HashMap<u32, WireAddr>,
    /// Our local comm id → the traffic class (the id's TOS) its MADs leave with, kept for
    /// the MADs sent after the id is gone (DREQ of a destroy); leaves with `comm_local`.
    pub comm_tos: HashMap<u32, u8>,
    /// Peer GID → local address its last MAD arrived on (answers to unknown connections).
    pub arrival_local: HashMap<Ipv6Addr, WireAddr>,
}

impl DevEntry {
    /// The GID-table index of `ip` (the QP's `sgid_index`).
    pub(crate) fn sgid_index(&self, ip: IpAddr) -> Option<u8> {
        self.dev.gid_index(ip)
    }

    /// `ip` as a wire address of this device (link-local: scoped to its netdev).
    pub(crate) fn wire_addr(&self, ip: IpAddr) -> WireAddr {
        gid_of(ip, self.netdev.index)
    }

    /// Puts `ip` in the device's GID table (an address of its netdev, or any 127.0.0.0/8
    /// address on the device of `lo`).
    pub(crate) fn ensure_gid(&self, ip: IpAddr) -> Result<()> {
        if self.dev.gid_index(ip).is_none() {
            self.dev.add_gid(self.wire_addr(ip))?;
        }
        Ok(())
    }
}

/// The GID (wire address) of `ip` on netdev `index`.
pub(crate) fn gid_of(ip: IpAddr, index: u32) -> WireAddr {
    let scope = if classify(&ip) == AddrClass::LinkLocal {
        index
    } else {
        0
    };
    WireAddr::new(ip, scope)
}

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
    /// The configuration from the environment (`RDMACM_DEVICES`; unset or empty: the
    /// embedded default). `EINVAL` for a malformed value.
    pub fn from_env() -> Result<CmaConfig> {
        match std::env::var(DEVICES_ENV) {
            Ok(v) => CmaConfig::parse_devices(&v),
            Err(_) => Ok(CmaConfig::default()),
        }
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
        Ok(CmaConfig { devices: Some(out) })
    }

    /// The device name for `netdev`, or `None` when it gets no device.
    fn device_name(&self, netdev: &str) -> Option<String> {
        match &self.devices {
            None => Some(netdev.to_owned()),
            Some(v) => v
                .iter()
                .find(|d| d.netdev == netdev)
                .map(|d| d.name.clone().unwrap_or_else(|| netdev.to_owned())),
        }
    }
}

/// A channel's queue.
pub(crate) struct ChanState {
    pub queue: VecDeque<PendingEvent>,
    pub efd: Arc<EventFd>,
}

/// Everything behind the context's lock.
pub(crate) struct State {
    pub ids: HashMap<IdNum, IdSlot>,
    pub next_id: IdNum,
    pub devices: HashMap<u32, DevEntry>,
    pub channels: HashMap<u64, ChanState>,
    pub next_channel: u64,
    pub ports: PortTables,
    pub seed: u64,
    /// CM response timeout (IBA time code) put in our REQs (rdma_cm: 20).
    pub cm_response_timeout: u8,
    /// REQ / SIDR_REQ retries (rdma_cm: 15).
    pub max_cm_retries: u8,
}

/// A request to the watcher task.
#[derive(Debug)]
pub(crate) enum WatchCmd {
    Watch(IdNum, Box<ResolvedAddr>),
    Unwatch(IdNum),
}

/// The shared part of a [`Cma`].
pub(crate) struct Inner {
    rt: Mutex<Option<tokio::runtime::Runtime>>,
    rt_handle: tokio::runtime::Handle,
    pub(crate) resolver: Resolver,
    state: Mutex<State>,
    /// Signalled when an event is acknowledged (destroy waits on it).
    acked: Condvar,
    /// Wakes waiters: notifications, new devices, new deadlines.
    pub(crate) wake: EventFd,
    /// Host-change notifications from the watcher task (own lock: the task never takes the
    /// state lock, which may be held while waiting for the resolver on the same runtime).
    notifications: Mutex<VecDeque<Notification>>,
    /// Address and link changes for the device registry (from the watcher task).
    host_events: Mutex<VecDeque<rdma_hostview::Event>>,
    watch_cmds: Mutex<Vec<WatchCmd>>,
    watch_notify: Arc<tokio::sync::Notify>,
    epoch: Instant,
    config: CmaConfig,
    /// The CM's place in the process's progress engine: it runs [`Inner::progress`] when a
    /// MAD is queued on a device's GSI, `wake` is signalled or a CM timer is due.
    engine: OnceLock<(Arc<CmSource>, Registration)>,
    /// The namespace the context was made in: the engine runs its CM there.
    netns: Option<crate::netns::NetNs>,
    /// Tests only ([`Cma::pause_progress`]): the engine leaves the CM alone.
    paused: std::sync::atomic::AtomicBool,
}

/// What the progress engine drives: the context's CM (held weakly: a dropped context stops).
pub(crate) struct CmSource(Weak<Inner>);

impl Source for CmSource {
    fn run(&self, now: Instant) -> Run {
        if self.0.strong_count() == 0 {
            return Run::Idle;
        }
        // Borrowed without a count of its own, so that the engine never keeps the context
        // alive: when the application drops its last handle during this run, `Inner`'s
        // drop first unregisters, which waits for this run to end (rdma_soft::engine's
        // gate), and only then tears the devices and sockets down, in its own thread.
        // SAFETY: the engine runs us only while the registration is alive (see above), so
        // the pointee is live for the whole run; the `ManuallyDrop` never decrements.
        let inner = std::mem::ManuallyDrop::new(unsafe { Arc::from_raw(self.0.as_ptr()) });
        if inner.paused.load(std::sync::atomic::Ordering::Acquire) {
            return Run::Deferred(now + Duration::from_millis(5));
        }
        let _ns = inner.netns.as_ref().and_then(|n| n.enter());
        inner.wake.clear();
        inner.progress();
        Run::Idle
    }
}

/// The connection-manager context: owns the software devices (one per netdev, created on
/// first use), their IB CM agents, the port tables, the resolver and watcher, every id and
/// every event channel.
///
/// Most applications use [`Cma::global`] implicitly through [`EventChannel::new`]; tests
/// and embedders may make their own with [`Cma::new`] (created in the network namespace it
/// should see).
///
/// The process's progress engine (one thread, asleep in `epoll` while nothing happens)
/// drives the CM whatever the application does: it answers MADs, runs the CM's timers and
/// host changes and queues events, so [`EventChannel::get_event`] and the channel's fd only
/// wait.
///
/// ```no_run
/// let cma = rdmacm::Cma::new()?;
/// let ch = rdmacm::EventChannel::with_cma(&cma)?;
/// # Ok::<(), rdmacm::Error>(())
/// ```
#[derive(Clone)]
pub struct Cma {
    pub(crate) inner: Arc<Inner>,
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
    /// arrive) for address resolution and the change watcher. Devices as
    /// [`CmaConfig::from_env`] says (`RDMACM_DEVICES`; `EINVAL` if malformed).
    pub fn new() -> Result<Cma> {
        Cma::with_config(CmaConfig::from_env()?)
    }

    /// A new context with an explicit configuration (the environment is not read).
    pub fn with_config(config: CmaConfig) -> Result<Cma> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("rdmacm-netlink")
            .enable_all()
            .build()
            .map_err(Error::Io)?;
        let handle = rt.handle().clone();
        let resolver = run_on(&handle, async { Resolver::new() })?;
        let seed = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0),
            );
            h.write_u32(std::process::id());
            h.finish()
        };
        let inner = Arc::new(Inner {
            rt: Mutex::new(Some(rt)),
            rt_handle: handle,
            resolver,
            state: Mutex::new(State {
                ids: HashMap::new(),
                next_id: 1,
                devices: HashMap::new(),
                channels: HashMap::new(),
                next_channel: 1,
                ports: PortTables::from_host(),
                seed,
                cm_response_timeout: 20,
                max_cm_retries: 15,
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
            netns: crate::netns::NetNs::current().ok(),
            paused: std::sync::atomic::AtomicBool::new(false),
        });
        let src = Arc::new(CmSource(Arc::downgrade(&inner)));
        let weak: Weak<dyn Source> = Arc::downgrade(&src) as Weak<dyn Source>;
        let reg = rdma_soft::engine::register(weak)?;
        reg.add_fd(inner.wake.raw())?;
        // Cannot be set already: the Arc is ours alone.
        let _ = inner.engine.set((src, reg));
        start_watcher(&inner);
        Ok(Cma { inner })
    }

    /// The process-wide context, created on first use.
    pub fn global() -> Result<Cma> {
        if let Some(c) = GLOBAL.get() {
            return Ok(c.clone());
        }
        let c = Cma::new()?;
        Ok(GLOBAL.get_or_init(|| c).clone())
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
        for i in links {
            match self.inner.ensure_device(i) {
                Ok(()) => {}
                // Not selected by the configuration, or gone meanwhile.
                Err(Error::NoDevice(_)) => continue,
                Err(e) => return Err(e),
            }
            if let Some(d) = self.inner.lock().devices.get(&i) {
                out.push(d.dev.clone());
            }
        }
        Ok(out)
    }

    /// Sets the CM response timeout (IBA time code: 4.096 µs · 2^t, rdma_cm's
    /// `CMA_CM_RESPONSE_TIMEOUT` = 20) and the retry count (`CMA_MAX_CM_RETRIES` = 15) used
    /// in the REQs and SIDR_REQs of later connects. With Linux's values an unanswered REQ
    /// gives UNREACHABLE after about 74 s; tests use smaller ones. `EINVAL` for a timeout
    /// above 31 or retries above 15.
    ///
    /// ```no_run
    /// let cma = rdmacm::Cma::new()?;
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

    /// Creates an event channel on this context.
    pub fn create_channel(&self) -> Result<EventChannel> {
        EventChannel::with_cma(self)
    }
}

/// See [`Cma::pause_progress`].
#[doc(hidden)]
pub struct PauseGuard(Arc<Inner>);

impl Drop for PauseGuard {
    fn drop(&mut self) {
        self.0
            .paused
            .store(false, std::sync::atomic::Ordering::Release);
        self.0.wake.signal();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Leave the engine first (waiting for a CM run in progress), then tear down.
        if let Some((src, reg)) = self.engine.take() {
            drop(reg);
            drop(src);
        }
        if let Some(rt) = self.rt.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            rt.shutdown_background();
        }
    }
}

/// Runs a future on `handle` from any thread (also from inside another runtime, where
/// `block_on` would panic). It is first polled once in the calling thread (inside the
/// runtime's context): netlink queries complete there (the kernel answers within the
/// request's `send`), so bind, resolve_addr on loopback and resolve_route cost no thread
/// hop. A future that is still pending (neighbour resolution, a timer) is spawned and
/// awaited as before; it is polled again with the runtime's waker.
fn run_on<F, T>(handle: &tokio::runtime::Handle, f: F) -> T
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let mut f = Box::pin(f);
    {
        let _cx = handle.enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    handle.spawn(async move {
        let _ = tx.send(f.await);
    });
    match rx.recv() {
        Ok(v) => v,
        // The runtime was shut down under us: only at teardown.
        Err(_) => std::process::abort(),
    }
}

fn start_watcher(inner: &Arc<Inner>) {
    let weak = Arc::downgrade(inner);
    let resolver = inner.resolver.clone();
    let notify = inner.watch_notify.clone();
    // Subscribed before the context is handed out, so no host change made after
    // `Cma::new` returns can be missed (it used to subscribe whenever the task first ran).
    let w = run_on(
        &inner.rt_handle,
        async move { Watcher::new(&resolver).await },
    );
    inner.rt_handle.spawn(async move {
        let Ok(mut w) = w else {
            return;
        };
        w.track_host();
        loop {
            {
                let Some(inner) = weak.upgrade() else { return };
                let cmds: Vec<WatchCmd> = std::mem::take(
                    &mut *inner.watch_cmds.lock().unwrap_or_else(|e| e.into_inner()),
                );
                for c in cmds {
                    match c {
                        WatchCmd::Watch(id, a) => w.watch(id, &a),
                        WatchCmd::Unwatch(id) => {
                            w.unwatch(id);
                        }
                    }
                }
                let host = w.take_host_events();
                let mut notes = Vec::new();
                while let Some(n) = w.pop() {
                    notes.push(n);
                }
                if !host.is_empty() || !notes.is_empty() {
                    inner
                        .host_events
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend(host);
                    inner
                        .notifications
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend(notes);
                    inner.wake.signal();
                }
            }
            // Only the wait is raced with watch requests (it is cancel-safe); the processing
            // of a host change runs to completion, so a request arriving mid-way cannot
            // cancel it and lose the change.
            let ev = tokio::select! {
                _ = notify.notified() => continue,
                ev = w.next_event() => ev,
            };
            match ev {
                Ok(ev) => {
                    if w.handle_event(ev).await.is_err() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    });
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn instant(&self, nanos: u64) -> Instant {
        self.epoch + Duration::from_nanos(nanos)
    }

    /// Runs an async resolver call to completion from this (blocking) thread.
    pub(crate) fn block<F, Fut, T>(&self, f: F) -> T
    where
        F: FnOnce(Resolver) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        run_on(&self.rt_handle, f(self.resolver.clone()))
    }

    pub(crate) fn watch(&self, st: &mut State, id: IdNum, a: &ResolvedAddr) {
        self.watch_cmds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(WatchCmd::Watch(id, Box::new(a.clone())));
        if let Some(s) = st.ids.get_mut(&id) {
            s.watched = true;
        }
        self.watch_notify.notify_one();
    }

    pub(crate) fn unwatch(&self, st: &mut State, id: IdNum) {
        if st.ids.get(&id).is_some_and(|s| s.watched) {
            self.watch_cmds
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(WatchCmd::Unwatch(id));
            self.watch_notify.notify_one();
        }
    }

    /// Opens (once) the software device of netdev `index`, with its CM agent. Its GID
    /// table starts with the netdev's addresses and then follows the host's changes
    /// (`apply_host_events`); `ENODEV` when the configuration gives the netdev no device.
    pub(crate) fn ensure_device(&self, index: u32) -> Result<()> {
        if self.lock().devices.contains_key(&index) {
            return Ok(());
        }
        let (netdev, gids) = self.block(move |r| async move {
            let nd = r.netdev(index).await?;
            let gids = r.gid_table(index).await?;
            Ok::<_, Error>((nd, gids))
        })?;
        let name = self.config.device_name(&netdev.name).ok_or_else(|| {
            Error::NoDevice(format!(
                "netdev {} has no device ({DEVICES_ENV} does not list it)",
                netdev.name
            ))
        })?;
        let mut gids: Vec<WireAddr> = gids.iter().map(|g| gid_of(g.ip, index)).collect();
        gids.truncate(256); // rdma_soft::verbs::device::MAX_GIDS
        let mut cfg = DeviceConfig::for_netdev(&netdev.name)?;
        cfg.name = name;
        cfg.gids = gids;
        cfg.up = netdev.up;
        let mac = netdev.mac.0;
        // The EUI-64 of the MAC, except that its 0xfffe middle is replaced by 16 bits of
        // this context's seed: every context (process) is a CA of its own, and several of
        // them share lo's MAC and GIDs. Their QPNs start over at the same values in every
        // process, so a client run right after another one reuses the QPNs a server still
        // holds in timewait; the CM's remote-QPN (stale connection) check is keyed by peer
        // GID, CA GUID and QPN, so a distinct CA GUID keeps the new process's REQs from
        // being rejected as stale (REJ 10). See docs/CM.md.
        let ca_tag = u64::from((self.lock().seed >> 48) as u16 ^ 0xfffe) << 24;
        let guid = ca_tag
            ^ u64::from_be_bytes([
                mac[0] ^ 2,
                mac[1],
                mac[2],
                0xff,
                0xfe,
                mac[3],
                mac[4],
                mac[5],
            ])
            ^ u64::from(index);
        cfg.node_guid = guid;
        let dev = Device::open(cfg)?;
        // Room for a burst of requests from one peer (a client opening hundreds of
        // connections at once); the per-peer share still bounds a flooding peer.
        dev.gsi_set_limits(rdma_soft::gsi::GsiLimits {
            queue_len: 8192,
            per_peer: 2048,
        })?;
        let mut st = self.lock();
        if st.devices.contains_key(&index) {
            return Ok(());
        }
        st.seed = st
            .seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let agent = CmAgent::new(AgentConfig {
            ca_guid: guid,
            seed: st.seed ^ u64::from(index),
            overload: OverloadPolicy::Drop,
            ..AgentConfig::default()
        });
        st.devices.insert(
            index,
            DevEntry {
                netdev,
                dev,
                agent,
                open: HashSet::new(),
                conns: HashMap::new(),
                listeners: HashMap::new(),
                comm_local: HashMap::new(),
                comm_tos: HashMap::new(),
                arrival_local: HashMap::new(),
            },
        );
        let gsi_fd = st.devices.get(&index).map(|d| d.dev.gsi_wait_fds().event);
        drop(st);
        if let (Some(fd), Some((_, reg))) = (gsi_fd, self.engine.get()) {
            // MADs queued on this device's GSI make the engine run the CM
            reg.add_fd(fd)?;
        }
        self.wake.signal();
        Ok(())
    }

    /// Tells the engine when the CM must run next: the earliest timer of any agent.
    /// Called with the state locked (so a concurrent `wake_by` is not overwritten).
    fn set_engine_wake(&self, st: &State) {
        let Some((_, reg)) = self.engine.get() else {
            return;
        };
        let next = st
            .devices
            .values()
            .filter_map(|d| d.agent.poll_timeout())
            .min()
            .map(|t| self.instant(t));
        reg.set_wake(next);
    }

    /// Opens UDP 4791 / QP1 of device `index` on local address `ip`.
    pub(crate) fn open_gsi(st: &mut State, index: u32, ip: IpAddr) -> Result<()> {
        let d = st
            .devices
            .get_mut(&index)
            .ok_or_else(|| Error::NoDevice(format!("device {index}")))?;
        let w = d.wire_addr(ip);
        if d.open.contains(&w) {
            return Ok(());
        }
        // Every address an id uses is in the GID table (127.0.0.0/8 beyond lo's own
        // addresses included: they are local through lo's /8).
        d.ensure_gid(ip)?;
        d.dev.gsi_open(w)?;
        if let Some(slot) = d.dev.share_slot()? {
            d.agent.set_comm_id_slot(slot); // steering across processes (rdma_soft::io::steer)
        }
        d.open.insert(w);
        Ok(())
    }

    /// Queues an event for an id's channel.
    pub(crate) fn push_event(st: &mut State, ev: PendingEvent) {
        let Some(slot) = st.ids.get(&ev.id) else {
            return;
        };
        let ch = match ev.listen_id.and_then(|l| st.ids.get(&l)) {
            Some(l) if ev.kind == EventType::ConnectRequest => l.channel,
            _ => slot.channel,
        };
        if let Some(c) = st.channels.get_mut(&ch) {
            if c.queue.is_empty() {
                c.efd.signal();
            }
            c.queue.push_back(ev);
        }
    }

    pub(crate) fn event(
        st: &mut State,
        id: IdNum,
        kind: EventType,
        status: i32,
        param: ConnEventParam,
    ) {
        Inner::push_event(
            st,
            PendingEvent {
                id,
                kind,
                status,
                param,
                ud: None,
                listen_id: None,
            },
        );
    }

    pub(crate) fn event_ud(st: &mut State, id: IdNum, ud: UdParam, param: ConnEventParam) {
        Inner::push_event(
            st,
            PendingEvent {
                id,
                kind: EventType::Established,
                status: 0,
                param,
                ud: Some(ud),
                listen_id: None,
            },
        );
    }

    /// An event was dropped by the application.
    pub(crate) fn ack(&self, id: IdNum) {
        let mut st = self.lock();
        if let Some(s) = st.ids.get_mut(&id) {
            s.outstanding = s.outstanding.saturating_sub(1);
        }
        drop(st);
        self.acked.notify_all();
    }

    /// Waits until `id` has no outstanding event (`rdma_destroy_id`).
    pub(crate) fn wait_acked<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        id: IdNum,
    ) -> MutexGuard<'a, State> {
        while st.ids.get(&id).is_some_and(|s| s.outstanding > 0) {
            st = self.acked.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st
    }

    /// Takes the next event of channel `ch` (run progress first).
    pub(crate) fn take_event(self: &Arc<Self>, ch: u64) -> Option<crate::event::Event> {
        let mut st = self.lock();
        let c = st.channels.get_mut(&ch)?;
        let ev = c.queue.pop_front()?;
        if c.queue.is_empty() {
            c.efd.clear();
        }
        if ev.kind == EventType::ConnectRequest {
            if let Some(l) = ev.listen_id.and_then(|l| st.ids.get_mut(&l)) {
                if let Some(ls) = l.listen.as_mut() {
                    ls.queued = ls.queued.saturating_sub(1);
                }
            }
        }
        let mut context = 0;
        if let Some(s) = st.ids.get_mut(&ev.id) {
            s.outstanding += 1;
            context = s.context;
        }
        let new_id = if ev.kind == EventType::ConnectRequest {
            if let Some(l) = ev.listen_id.and_then(|l| st.ids.get(&l)) {
                context = l.context;
            }
            Some(CmId::from_num(self.clone(), ev.id))
        } else {
            None
        };
        Some(crate::event::Event {
            inner: self.clone(),
            ev,
            context,
            new_id,
            acked: false,
        })
    }

    /// One non-blocking round: MADs in, agents, timers, MADs out, events; host changes.
    /// Returns the number of events queued.
    pub(crate) fn progress(self: &Arc<Self>) -> usize {
        let mut st = self.lock();
        let before: usize = st.channels.values().map(|c| c.queue.len()).sum();
        let now = self.now();
        let idx: Vec<u32> = st.devices.keys().copied().collect();
        for i in idx {
            // Receive.
            while let Some(d) = st.devices.get_mut(&i).filter(|d| !d.open.is_empty()) {
                let m = match d.dev.gsi_recv() {
                    Ok(Some(m)) => m,
                    _ => break,
                };
                let gid = Ipv6Addr::from(m.remote.gid());
                d.arrival_local.insert(gid, m.local);
                let peer = PeerAddr::new(gid, rdma_proto::cm::ROCE_UDP_PORT, m.ifindex);
                d.agent.handle_mad(now, peer, &m.mad);
                self.drain_agent(&mut st, i);
            }
            // Timers.
            if let Some(d) = st.devices.get_mut(&i) {
                if d.agent.poll_timeout().is_some_and(|t| t <= now) {
                    d.agent.handle_timeout(now);
                }
            }
            self.drain_agent(&mut st, i);
        }
        // Host changes.
        let notes: Vec<Notification> = self
            .notifications
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for n in notes {
            self.on_notification(&mut st, n);
        }
        let host: Vec<rdma_hostview::Event> = self
            .host_events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        if !host.is_empty() {
            st = self.apply_host_events(st, host);
        }
        self.set_engine_wake(&st);
        let after: usize = st.channels.values().map(|c| c.queue.len()).sum();
        after.saturating_sub(before)
    }

    /// The device registry follows the host: an address added to a netdev enters its
    /// device's GID table (and the wildcard listeners' addresses), a removed one leaves it;
    /// a netdev that gets an address while a wildcard listener exists gets its device and
    /// the listener. After lost notifications (overrun) every GID table is re-read.
    /// Opening a device needs the resolver, so the lock is released for it.
    fn apply_host_events<'a>(
        self: &'a Arc<Self>,
        mut st: MutexGuard<'a, State>,
        host: Vec<rdma_hostview::Event>,
    ) -> MutexGuard<'a, State> {
        use rdma_hostview::Event as H;
        let mut new_dev: Vec<(u32, IpAddr)> = Vec::new();
        let mut resync = false;
        for ev in host {
            match ev {
                H::AddressAdded(a) => {
                    if let Some(d) = st.devices.get(&a.link) {
                        let _ = d.ensure_gid(a.addr);
                        crate::listen::wildcard_listen_on(&mut st, a.link, a.addr);
                    } else if crate::listen::has_wildcard_listener(&st) {
                        new_dev.push((a.link, a.addr));
                    }
                }
                H::AddressRemoved(a) => {
                    if let Some(d) = st.devices.get(&a.link) {
                        // 127.0.0.0/8 stays usable through lo's /8 route.
                        if !(d.netdev.loopback && a.addr.is_loopback()) {
                            d.dev.remove_gid(a.addr);
                        }
                    }
                }
                H::Overrun => resync = true,
                _ => {}
            }
        }
        if new_dev.is_empty() && !resync {
            return st;
        }
        let known: Vec<u32> = st.devices.keys().copied().collect();
        drop(st);
        for (link, _) in &new_dev {
            // ENODEV when the configuration leaves the netdev out: nothing to do.
            let _ = self.ensure_device(*link);
        }
        let tables: Vec<(u32, Vec<IpAddr>)> = if resync {
            known
                .iter()
                .filter_map(|&i| {
                    self.block(move |r| async move { r.gid_table(i).await })
                        .ok()
                        .map(|g| (i, g.iter().map(|e| e.ip).collect()))
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut st = self.lock();
        for (link, addr) in new_dev {
            if st.devices.contains_key(&link) {
                crate::listen::wildcard_listen_on(&mut st, link, addr);
            }
        }
        for (i, ips) in tables {
            let Some(d) = st.devices.get(&i) else {
                continue;
            };
            for g in d.dev.gids() {
                let keep = ips.contains(&g.ip()) || (d.netdev.loopback && g.ip().is_loopback());
                if !keep {
                    d.dev.remove_gid(g.ip());
                }
            }
            for ip in &ips {
                let _ = d.ensure_gid(*ip);
            }
        }
        st
    }

    /// Sends what the agent of device `i` wants to send and turns its events into ours,
    /// until it has nothing left.
    pub(crate) fn drain_agent(self: &Arc<Self>, st: &mut State, i: u32) {
        loop {
            let Some(d) = st.devices.get_mut(&i) else {
                return;
            };
            let ids = &st.ids;
            let mut did = false;
            while let Some((peer, mad)) = d.agent.poll_transmit() {
                did = true;
                let comm = u32::from_be_bytes([mad[24], mad[25], mad[26], mad[27]]);
                let local = d
                    .comm_local
                    .get(&comm)
                    .or_else(|| d.arrival_local.get(&peer.gid))
                    .copied();
                if let Some(local) = local {
                    let remote = WireAddr::new(
                        crate::addr::Gid(peer.gid.octets()).to_ip(),
                        if local.scope_id() != 0
                            && classify(&crate::addr::Gid(peer.gid.octets()).to_ip())
                                == AddrClass::LinkLocal
                        {
                            local.scope_id()
                        } else {
                            0
                        },
                    );
                    // As Linux's CM: a connection's MADs carry its path's traffic class.
                    let tos = d
                        .agent
                        .conn_by_local_comm_id(comm)
                        .and_then(|c| d.conns.get(&c))
                        .and_then(|n| ids.get(n))
                        .and_then(|s| s.path.as_ref())
                        .map(|p| p.traffic_class);
                    let tclass = match tos {
                        Some(t) => {
                            d.comm_tos.insert(comm, t);
                            t
                        }
                        None => d.comm_tos.get(&comm).copied().unwrap_or(0),
                    };
                    // A send error (e.g. the address went away) is a lost MAD: the CM's
                    // retries and timeouts handle it.
                    let meta = rdma_soft::io::TxMeta { tclass };
                    let _ = d.dev.gsi_send_with(&local, &remote, meta, &mad);
                }
            }
            let ev = d.agent.poll_event();
            match ev {
                Some(ev) => self.on_cm_event(st, i, ev),
                None if !did => {
                    // an API call may have armed a timer: the engine must wake for it
                    if let (Some(t), Some((_, reg))) = (d.agent.poll_timeout(), self.engine.get()) {
                        reg.wake_by(self.instant(t));
                    }
                    return;
                }
                None => {}
            }
        }
    }
}

/// Lets a destroyed id's connection linger in its agent (timewait) and forgets it.
pub(crate) fn forget_conn(st: &mut State, now: u64, dev: u32, conn: ConnHandle) {
    if let Some(d) = st.devices.get_mut(&dev) {
        // The local address stays known (`comm_local`) until the caller has drained what
        // the agent sends for the destroy.
        let _ = d.agent.destroy(now, conn);
        d.conns.remove(&conn);
    }
}
