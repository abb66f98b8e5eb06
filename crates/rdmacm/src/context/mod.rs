//! The shared state of a context ([`crate::cm::Cma`]): the lock over the id table, devices and
//! channels, the resolver's runtime, the watcher's queues, the engine registration.

pub(crate) mod counters;
pub(crate) mod device_entry;
pub(crate) mod event_queue;
pub(crate) mod held_request;
pub(crate) mod id_entry;
pub(crate) mod inspect;
pub(crate) mod netns;
pub(crate) mod run_on;
pub(crate) mod state;

use crate::config::CmaConfig;
use crate::context::id_entry::IdNum;
use crate::context::run_on::run_on;
use crate::context::state::{State, WatchCmd};
use crate::error::Result;
use crate::host::resolve::{ResolvedAddr, Resolver};
use crate::host::watch::Notification;
use rdma_soft::engine::Registration;
use rdma_soft::fd::EventFd;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// The shared part of a [`Cma`].
pub(crate) struct Inner {
    pub(crate) rt: Mutex<Option<tokio::runtime::Runtime>>,
    pub(crate) rt_handle: tokio::runtime::Handle,
    pub(crate) resolver: Resolver,
    pub(crate) state: Mutex<State>,
    /// Signalled when an event is acknowledged (destroy waits on it).
    pub(crate) acked: Condvar,
    /// Wakes waiters: notifications, new devices, new deadlines.
    pub(crate) wake: EventFd,
    /// Host-change notifications from the watcher task (own lock: the task never takes the
    /// state lock, which may be held while waiting for the resolver on the same runtime).
    pub(crate) notifications: Mutex<VecDeque<Notification>>,
    /// Address and link changes for the device registry (from the watcher task).
    pub(crate) host_events: Mutex<VecDeque<rdma_hostview::Event>>,
    pub(crate) watch_cmds: Mutex<Vec<WatchCmd>>,
    pub(crate) watch_notify: Arc<tokio::sync::Notify>,
    pub(crate) epoch: Instant,
    pub(crate) config: CmaConfig,
    /// The CM's place in the process's progress engine: it runs [`Inner::progress`] when a
    /// MAD is queued on a device's GSI, `wake` is signalled or a CM timer is due.
    pub(crate) engine: OnceLock<(Arc<CmSource>, Registration)>,
    /// The namespace the context was made in: the engine runs its CM there.
    pub(crate) netns: Option<crate::context::netns::NetNs>,
    /// Tests only ([`Cma::pause_progress`]): the engine leaves the CM alone.
    pub(crate) paused: std::sync::atomic::AtomicBool,
    /// Tests only ([`crate::cm::Cma::hold_passive_lookups`]): passive route lookups wait here.
    pub(crate) lookup_hold: Mutex<Option<Arc<crate::context::held_request::HoldShared>>>,
    /// The inspection providers of the ids and the statistics (`crate::context::inspect`; dropped
    /// first).
    pub(crate) inspect: OnceLock<[rdma_soft::inspect::Provider; 2]>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        drop(self.inspect.take());
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

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    pub(crate) fn instant(&self, nanos: u64) -> Instant {
        self.epoch + Duration::from_nanos(nanos)
    }

    /// Runs an async resolver call to completion from this (blocking) thread.
    pub(crate) fn block<F, Fut, T>(&self, f: F) -> T
    where
        F: FnOnce(Resolver) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        // one operation: the host view is brought up to date once, at its first question
        run_on(&self.rt_handle, f(self.resolver.at_once()))
    }

    /// An async resolver call awaited by the caller (a task on its own runtime, or
    /// [`run_on::block_here`]); it runs on the context's runtime when it has to wait.
    pub(crate) fn resolve<F, Fut, T>(
        &self,
        f: F,
    ) -> impl Future<Output = Result<T>> + Send + 'static
    where
        F: FnOnce(Resolver) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        // one operation: the host view is brought up to date once, at its first question
        let fut = f(self.resolver.at_once());
        let handle = self.rt_handle.clone();
        async move { run_on::await_on(&handle, fut).await }
    }

    pub(crate) fn watch(&self, st: &mut State, id: IdNum, a: &ResolvedAddr) {
        let gen = st.ids.get(&id).map_or(0, |s| s.watch_gen);
        self.watch_cmd(WatchCmd::Watch(watch_key(id, gen), Box::new(a.clone())));
        if let Some(s) = st.ids.get_mut(&id) {
            s.watched = true;
            s.path_netdev = Some(a.netdev.index);
        }
    }

    /// Moves a watched id's watch onto the path from `local` to `remote` through `netdev`
    /// (a migration): what is still queued about the old path is dropped.
    pub(crate) fn rewatch(
        &self,
        st: &mut State,
        id: IdNum,
        local: std::net::IpAddr,
        remote: std::net::IpAddr,
        netdev: u32,
    ) {
        let Some(s) = st.ids.get_mut(&id).filter(|s| s.watched) else {
            return;
        };
        let old = watch_key(id, s.watch_gen);
        s.watch_gen = s.watch_gen.wrapping_add(1);
        s.path_netdev = Some(netdev);
        let new = watch_key(id, s.watch_gen);
        self.watch_cmd(WatchCmd::Unwatch(old));
        self.watch_cmd(WatchCmd::Rewatch(new, local, remote, netdev));
    }

    pub(crate) fn unwatch(&self, st: &mut State, id: IdNum) {
        if let Some(s) = st.ids.get(&id).filter(|s| s.watched) {
            self.watch_cmd(WatchCmd::Unwatch(watch_key(id, s.watch_gen)));
        }
    }

    /// Queues a request for the watcher task. Watch and unwatch requests matter only when
    /// a host change comes, and the task applies every queued request before it looks at
    /// one, so they wake the task only when [`WATCH_BATCH`] are queued (memory stays
    /// bounded without a host change): a connection costs the task no wake-up. A rewatch
    /// (a path to resolve now) wakes it at once.
    fn watch_cmd(&self, c: WatchCmd) {
        let now = matches!(c, WatchCmd::Rewatch(..));
        let mut q = self.watch_cmds.lock().unwrap_or_else(|e| e.into_inner());
        q.push(c);
        let wake = now || q.len() >= WATCH_BATCH;
        drop(q);
        if wake {
            self.watch_notify.notify_one();
        }
    }
}

/// Watch and unwatch requests queued before they wake the watcher task.
const WATCH_BATCH: usize = 64;

/// The watcher's id for watch `gen` of id `id`: the generation in the top 16 bits.
pub(crate) fn watch_key(id: IdNum, gen: u16) -> u64 {
    id | (u64::from(gen) << 48)
}

/// The id and generation of a watcher's id ([`watch_key`]).
pub(crate) fn watch_id(key: u64) -> (IdNum, u16) {
    (key & ((1 << 48) - 1), (key >> 48) as u16)
}

/// An id as the CM's internals take it: its context and number (what a [`crate::cm::CmId`]
/// holds), so that the CM never depends on the public handle type.
#[derive(Clone, Copy)]
pub(crate) struct IdRef<'a> {
    pub inner: &'a Arc<Inner>,
    pub num: IdNum,
}

/// What the progress engine drives: the context's CM, held weakly, so that the engine never
/// keeps a context alive. A run holds the context (upgraded) under `running`; the last
/// application handle ([`Ctx`]'s drop) closes the source and waits for that run, so the
/// context is always torn down in the thread that dropped it.
pub(crate) struct CmSource {
    pub(crate) inner: Weak<Inner>,
    pub(crate) closed: AtomicBool,
    pub(crate) running: Mutex<()>,
}

impl CmSource {
    pub(crate) fn new(inner: &Arc<Inner>) -> CmSource {
        CmSource {
            inner: Arc::downgrade(inner),
            closed: AtomicBool::new(false),
            running: Mutex::new(()),
        }
    }
}

/// What the application's handles ([`crate::cm::Cma`], [`crate::cm::EventChannel`],
/// [`crate::cm::CmId`], [`crate::cm::Event`]) hold, shared: the context. When the last
/// goes, the engine's runs stop (one in progress is waited for) before the context is let
/// go, so its devices and sockets are closed when that drop returns.
pub(crate) struct Ctx(Arc<Inner>);

impl Ctx {
    pub(crate) fn new(inner: Arc<Inner>) -> Ctx {
        Ctx(inner)
    }
}

impl std::ops::Deref for Ctx {
    type Target = Arc<Inner>;
    fn deref(&self) -> &Arc<Inner> {
        &self.0
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        if let Some((src, _)) = self.0.engine.get() {
            src.closed.store(true, Ordering::Release);
            drop(src.running.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }
}
