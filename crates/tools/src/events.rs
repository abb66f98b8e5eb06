//! CM event printing and waiting, shared by the tools (`rping`, `ucmatose`, `udaddy`,
//! `cmtime`, `rdma-perf`, ...).
//!
//! * [`describe`]: `RDMA_CM_EVENT_REJECTED, error 8`: the `rdma_event_str` name and status,
//!   as rdma-core's tools print a failing event (`cma event %s, error %d`).
//! * [`EventLog`]: prints every event by name when verbose/debug output is on
//!   (`cma_event type RDMA_CM_EVENT_ESTABLISHED cma_id 3 status 0`).
//! * [`expect_event`]: waits for one event of a given type with a timeout; anything else is
//!   an `Err` holding the one-line reason to hand to [`crate::cli::Tool::fail`].

use std::time::Duration;

use rdmacm::cm::{Event, EventChannel, EventType};

/// `NAME, error STATUS`: how rdma-core's tools report an unexpected or failing event.
pub fn describe(ev: &Event) -> String {
    format!("{}, error {}", ev.kind().name(), ev.status())
}

/// Prints CM events by their `rdma_event_str` name when enabled (`-v`/`-d` of a tool).
#[derive(Debug, Clone, Copy)]
pub struct EventLog {
    enabled: bool,
}

impl EventLog {
    /// A log that prints when `enabled`.
    pub fn new(enabled: bool) -> EventLog {
        EventLog { enabled }
    }

    /// Whether events are printed.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Prints `cma_event type NAME cma_id N status S` on stdout (when enabled).
    pub fn show(&self, ev: &Event) {
        if self.enabled {
            println!(
                "cma_event type {} cma_id {} status {}",
                ev.kind().name(),
                ev.id_num(),
                ev.status()
            );
        }
    }
}

/// Waits up to `timeout` for the next event on `ch`, logs it, and returns it. Errors are
/// one-line reasons: `timed out waiting for NAME` (`want` names what was awaited),
/// `get_event: ...`.
pub fn next_event(
    ch: &EventChannel,
    timeout: Duration,
    log: &EventLog,
    want: EventType,
) -> Result<Event, String> {
    match ch.get_event_timeout(timeout) {
        Ok(Some(ev)) => {
            log.show(&ev);
            Ok(ev)
        }
        Ok(None) => Err(format!("timed out waiting for {}", want.name())),
        Err(e) => Err(format!("get_event: {e}")),
    }
}

/// Waits for the next event and requires it to be `want`; another event gives
/// `Err("cma event NAME, error STATUS")` (rping's wording for a failing event).
pub fn expect_event(
    ch: &EventChannel,
    want: EventType,
    timeout: Duration,
    log: &EventLog,
) -> Result<Event, String> {
    let ev = next_event(ch, timeout, log, want)?;
    if ev.kind() == want {
        Ok(ev)
    } else {
        Err(format!("cma event {}", describe(&ev)))
    }
}
