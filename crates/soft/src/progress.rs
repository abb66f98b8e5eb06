//! Blocking waits on fds (completion channels, the GSI queue). The device itself is driven
//! by the process's progress engine ([`crate::engine`]), so a waiter only waits.

use std::os::fd::RawFd;
use std::time::Instant;

use crate::{Error, Result};

/// Blocks in `poll(2)` until one of `fds` is readable or `until` passes (`None`: forever).
/// EINTR counts as a wake-up.
pub(crate) fn wait_fds(fds: &[RawFd], until: Option<Instant>) -> Result<()> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = match until {
        None => -1,
        Some(t) => {
            let left = t.saturating_duration_since(Instant::now());
            // round up, so that a deadline 0.3 ms away does not spin with timeout 0
            left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
        }
    };
    // SAFETY: `pfds` is a valid array of pollfd for the duration of the call.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
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
