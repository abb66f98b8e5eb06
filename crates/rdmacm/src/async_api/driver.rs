//! Opt-in ([`crate::cm::CmaConfig::async_driver`], `RDMACM_ASYNC_DRIVER=on`): one tokio task per device that
//! drives the device when its wire is readable, so that a datagram wakes the runtime
//! directly instead of the progress engine first (see
//! `rdma_soft::verbs::WireWatch`: the engine leaves fresh datagrams to this task and
//! drives them itself only when the runtime does not get to them within
//! `rdma_soft::verbs::GRACE`, say while a worker is blocked).

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
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

/// The driver of `dev`, started on the current runtime if it has none. `None` when the
/// device has no wire fd or the fd cannot join the reactor: the engine drives it alone.
pub(super) fn for_device(dev: &Device) -> Option<Arc<WireDriver>> {
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
