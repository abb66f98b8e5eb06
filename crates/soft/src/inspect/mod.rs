//! Inspection: what a process's soft devices, QPs (and, through providers, CM ids) look like
//! now, for tools in another process (`ibv_devices`, `ibv_devinfo`, `rdma-soft resource`).
//!
//! Every part of a process that has something to show registers a *provider* under a kind
//! (`"devices"`, `"cm_ids"` ...): a function that returns a JSON value on demand. While a
//! process has providers, it serves one unix stream socket, `<dir>/<pid>.sock` in the
//! per-user directory [`runtime_dir`]; a client that connects gets the process's
//! [`snapshot`] as one JSON document and end of file. The socket is removed when the last
//! provider goes (a device closed); one left by a killed process refuses connections, and
//! [`query_all`] (and the next server that starts) removes it.
//!
//! Nothing here is on the data path: counters are the plain integers the device's owner
//! updates anyway, read under the device's lock once per query.
//!
//! ```
//! use rdma_soft::inspect;
//! let p = inspect::register("example", Box::new(|| serde_json::json!({ "answer": 42 })));
//! let snap = inspect::snapshot();
//! assert_eq!(snap["pid"], std::process::id());
//! assert!(snap["example"].as_array().unwrap().iter().any(|v| v["answer"] == 42));
//! drop(p);
//! assert!(inspect::snapshot().get("example").is_none());
//! ```

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use serde_json::{Map, Value};

mod client;
#[allow(unsafe_code)] // the server thread's poll on its socket and stop eventfd
mod server;

pub use crate::config::{INSPECT_DIR_ENV as DIR_ENV, INSPECT_ENV as ENABLE_ENV};
pub use client::{query_all, runtime_dir, Answer};

type Snap = Box<dyn Fn() -> Value + Send + Sync>;

struct Entry {
    id: u64,
    kind: &'static str,
    f: Snap,
    alive: AtomicBool,
    /// Held while `f` runs: unregistering waits for a call in progress.
    running: Mutex<()>,
}

struct Registry {
    entries: Vec<Arc<Entry>>,
    next_id: u64,
    server: Option<server::Server>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    entries: Vec::new(),
    next_id: 1,
    server: None,
});

thread_local! {
    /// The provider this thread is calling (0: none).
    static CALLING: Cell<u64> = const { Cell::new(0) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A registered provider (see [`register`]); dropping it unregisters it, waiting for a
/// call in progress in another thread, so its function is never called after the drop.
pub struct Provider {
    entry: Arc<Entry>,
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("kind", &self.entry.kind)
            .finish_non_exhaustive()
    }
}

/// Registers `f` under `kind`: each [`snapshot`] calls it and lists what it returns under
/// `kind` (an array is spliced in, so a provider may answer several items). The first
/// provider of a process starts its inspection socket, unless the process's configuration
/// turned inspection off ([`crate::SoftConfig::inspect`], `RDMA_SOFT_INSPECT=off`).
///
/// `f` runs in the inspection thread: it may take the locks the application takes, briefly,
/// and must not block on anything else.
pub fn register(kind: &'static str, f: Box<dyn Fn() -> Value + Send + Sync>) -> Provider {
    let mut r = lock(&REGISTRY);
    let id = r.next_id;
    r.next_id += 1;
    let entry = Arc::new(Entry {
        id,
        kind,
        f,
        alive: AtomicBool::new(true),
        running: Mutex::new(()),
    });
    r.entries.push(entry.clone());
    if r.server.is_none() && crate::config::process().inspect {
        r.server = server::Server::start();
    }
    Provider { entry }
}

/// Registers a provider that reads `owner` by reference, without keeping it alive: the
/// inspection thread never ends up owning (and dropping) it, so `T` is always torn down in
/// its owner's thread.
///
/// # Safety
///
/// The returned provider must be stored in `T`, and `T`'s `Drop` must drop it before
/// anything else (as the progress engine's registrations are): `f` is only called while the
/// provider is registered, and its drop waits for a call in progress, so `T`'s fields are
/// intact whenever `f` runs.
#[allow(unsafe_code)]
pub unsafe fn register_borrowed<T: Send + Sync + 'static>(
    kind: &'static str,
    owner: Weak<T>,
    f: fn(&T) -> Value,
) -> Provider {
    register(
        kind,
        Box::new(move || {
            let p = owner.as_ptr();
            // SAFETY: the allocation lives while `owner` does; by the contract above this
            // runs only before `T`'s drop has dropped the provider (which waits for this
            // call), so the value is intact.
            f(unsafe { &*p })
        }),
    )
}

impl Drop for Provider {
    fn drop(&mut self) {
        let server = {
            let mut r = lock(&REGISTRY);
            r.entries.retain(|e| e.id != self.entry.id);
            if r.entries.is_empty() {
                r.server.take()
            } else {
                None
            }
        };
        self.entry.alive.store(false, Ordering::Release);
        if CALLING.with(|c| c.get()) != self.entry.id {
            drop(lock(&self.entry.running));
        }
        // removes the socket file now; its thread ends by itself
        drop(server);
    }
}

/// This process's inspection snapshot: `pid`, `comm` (the process name) and, for each
/// kind, an array of what its providers answered.
pub fn snapshot() -> Value {
    let entries: Vec<Arc<Entry>> = lock(&REGISTRY).entries.clone();
    let mut out = Map::new();
    out.insert("pid".into(), Value::from(std::process::id()));
    out.insert("comm".into(), Value::from(comm()));
    for e in entries {
        let v = {
            let _running = lock(&e.running);
            if !e.alive.load(Ordering::Acquire) {
                continue;
            }
            CALLING.with(|c| c.set(e.id));
            let v = (e.f)();
            CALLING.with(|c| c.set(0));
            v
        };
        let slot = out
            .entry(e.kind.to_owned())
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(list) = slot {
            match v {
                Value::Array(items) => list.extend(items),
                item => list.push(item),
            }
        }
    }
    Value::Object(out)
}

fn comm() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim_end().to_owned())
        .unwrap_or_default()
}

/// Whether this process serves an inspection socket now (it has providers and the socket
/// could be made).
pub fn serving() -> Option<std::path::PathBuf> {
    lock(&REGISTRY).server.as_ref().map(|s| s.path().to_owned())
}
