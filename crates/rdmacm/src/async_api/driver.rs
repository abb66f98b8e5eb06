//! Opt-in ([`set_runtime_driver`], `RDMACM_ASYNC_DRIVER=1`): one tokio task per device that
//! drives the device when its wire is readable, so that a datagram wakes the runtime
//! directly instead of the progress engine first (see
//! `rdma_soft::verbs::WireWatch`: the engine leaves fresh datagrams to this task and
//! drives them itself only when the runtime does not get to them within
//! `rdma_soft::verbs::GRACE`, say while a worker is blocked).

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rdma_soft::verbs::{Device, WireWatch};
use tokio::io::unix::AsyncFd;

/// The driver of one device; its task ends when the last connection using it lets go.
pub(super) struct WireDriver {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WireDriver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Live drivers by their device's wire fd (unique while the device, which a driver keeps
/// alive, is open).
static DRIVERS: Mutex<Vec<(RawFd, Weak<WireDriver>)>> = Mutex::new(Vec::new());

/// `RDMACM_ASYNC_DRIVER=1` turns the runtime's driver on for a process (default: off).
pub const DRIVER_ENV: &str = "RDMACM_ASYNC_DRIVER";

/// 0: as [`DRIVER_ENV`] says; 1: on; 2: off.
static SETTING: AtomicU8 = AtomicU8::new(0);

/// Turns the runtime's device driver on or off for connections made from now on,
/// whatever `RDMACM_ASYNC_DRIVER` says. Off (the default), the progress engine drives every
/// device and wakes a waiting connection future directly; on, one tokio task per device
/// drives it when its wire fd is readable and the engine leaves the device to it (taking it
/// back within 2 ms from a blocked runtime). On a quiet 2-core machine the engine alone is
/// a little faster (docs/BENCHMARKS.md, "async wake-ups"); the driver helps when the cores
/// are busy.
///
/// ```
/// rdmacm::set_runtime_driver(false);
/// ```
pub fn set_runtime_driver(on: bool) {
    SETTING.store(if on { 1 } else { 2 }, Ordering::Relaxed);
}

fn enabled() -> bool {
    match SETTING.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => std::env::var_os(DRIVER_ENV).is_some_and(|v| v == "1"),
    }
}

/// The driver of `dev`, started on the current runtime if it has none. `None` when the
/// driver is off ([`set_runtime_driver`]), the device has no wire fd or the fd cannot join
/// the reactor: the engine drives it alone.
pub(super) fn for_device(dev: &Device) -> Option<Arc<WireDriver>> {
    if !enabled() {
        return None;
    }
    let fd = dev.wire_fd()?;
    let raw = fd.as_raw_fd();
    let mut all = DRIVERS.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|(_, w)| w.strong_count() > 0);
    if let Some(d) = all
        .iter()
        .find(|(f, _)| *f == raw)
        .and_then(|(_, w)| w.upgrade())
    {
        return Some(d);
    }
    let owned: OwnedFd = fd.as_fd().try_clone_to_owned().ok()?;
    // SAFETY: the AsyncFd owns the duplicated fd, so it stays open while registered.
    let afd = match unsafe { AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE) }
    {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(device = dev.name(), error = %e, "wire fd not watched by tokio");
            return None;
        }
    };
    let watch = dev.watch_wire();
    let task = tokio::spawn(drive(afd, dev.clone(), watch));
    let d = Arc::new(WireDriver { task });
    all.push((raw, Arc::downgrade(&d)));
    Some(d)
}

async fn drive(afd: AsyncFd<OwnedFd>, dev: Device, _watch: WireWatch) {
    loop {
        let Ok(mut g) = afd.readable().await else {
            return;
        };
        // Cleared first: a datagram arriving while we drive makes the fd ready again.
        g.clear_ready();
        loop {
            match dev.drive_inline() {
                // Drained (or the engine is driving right now).
                Ok(0) => break,
                // More may be queued beyond one round: look again after other tasks ran.
                Ok(_) => tokio::task::yield_now().await,
                Err(e) => {
                    tracing::debug!(device = dev.name(), error = %e, "inline drive failed");
                    break;
                }
            }
        }
    }
}
