//! Blocking waits on the device's fds and the optional progress thread.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::verbs::DeviceShared;
use crate::{Error, Result};

/// Longest single sleep of the progress thread, so that a stop request is seen promptly.
const MAX_SLEEP: Duration = Duration::from_millis(20);

/// Blocks in `poll(2)` until one of `fds` is readable or `until` passes (`None`: forever).
/// EINTR counts as a wake-up.
pub(crate) fn wait_fds(fds: &[RawFd], until: Option<Instant>) -> Result<()> {
    let mut pfds = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; 8];
    let n = fds.len().min(pfds.len());
    for (p, &fd) in pfds.iter_mut().zip(fds) {
        p.fd = fd;
    }
    let ms = match until {
        None => -1,
        Some(t) => {
            let left = t.saturating_duration_since(Instant::now());
            // round up, so that a deadline 0.3 ms away does not spin with timeout 0
            left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
        }
    };
    // SAFETY: `pfds[..n]` is a valid array of pollfd for the duration of the call.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), n as libc::nfds_t, ms) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(Error::Os {
                op: "poll",
                addr: None,
                source: e,
            });
        }
    }
    Ok(())
}

/// A thread driving one device (see [`crate::verbs::Device::spawn_progress`]). Dropping it
/// stops the thread and joins it.
#[derive(Debug)]
pub struct ProgressThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl ProgressThread {
    pub(crate) fn spawn(dev: Arc<DeviceShared>) -> Result<ProgressThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name(format!("rdma-soft-{}", dev.cfg().name))
            .spawn(move || run(&dev, &flag))
            .map_err(|e| Error::Os {
                op: "spawn progress thread",
                addr: None,
                source: e,
            })?;
        Ok(ProgressThread {
            stop,
            handle: Some(handle),
        })
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn run(dev: &DeviceShared, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        let _ = dev.progress();
        let cap = Instant::now() + MAX_SLEEP;
        let until = dev.next_deadline().map_or(cap, |d| d.min(cap));
        match dev.wait_fd() {
            Some(fd) => {
                let _ = wait_fds(&[fd], Some(until));
            }
            None => std::thread::sleep(until.saturating_duration_since(Instant::now())),
        }
    }
}
