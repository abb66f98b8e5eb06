//! Blocking waits on fds (completion channels, the GSI queue), as the device's errors. The
//! device itself is driven by the process's progress engine ([`crate::engine`]), so a
//! waiter only waits.

use std::os::fd::RawFd;
use std::time::Instant;

use crate::{Error, Result};

/// [`crate::fd::wait_readable`], its error as the device's.
pub(crate) fn wait_fds(fds: &[RawFd], until: Option<Instant>) -> Result<()> {
    crate::fd::wait_readable(fds, until)
        .map(|_| ())
        .map_err(|source| Error::Os {
            op: "poll",
            addr: None,
            source,
        })
}
