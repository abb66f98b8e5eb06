//! A dead peer seen from a busy-polling loop: no completion for [`IDLE`].

use std::time::{Duration, Instant};

/// No progress for this long: the peer is gone.
pub(crate) const IDLE: Duration = Duration::from_secs(10);

/// When a CQ poller last saw progress. The clock is read every 1024 empty polls only: a
/// read per completion would sit inside the measured round trip.
pub(crate) struct IdleCheck {
    pub(crate) last: Instant,
    spins: u32,
    progressed: bool,
}

impl IdleCheck {
    pub(crate) fn new() -> IdleCheck {
        IdleCheck {
            last: Instant::now(),
            spins: 0,
            progressed: false,
        }
    }

    /// Something arrived (a completion, a written byte).
    pub(crate) fn progressed(&mut self) {
        self.progressed = true;
    }

    /// After an empty poll: an error once nothing arrived for [`IDLE`].
    pub(crate) fn empty_poll(&mut self) -> Result<(), String> {
        self.spins = self.spins.wrapping_add(1);
        if !self.spins.is_multiple_of(1024) {
            return Ok(());
        }
        if std::mem::take(&mut self.progressed) {
            self.last = Instant::now();
        } else if self.last.elapsed() > IDLE {
            return Err(format!(
                "the peer stopped answering (nothing for {} s)",
                IDLE.as_secs()
            ));
        }
        Ok(())
    }
}
