//! The CM's behaviour under the context's lock: opening devices, the active and passive
//! sides, the agent's events turned into id events, MADs out, the change watcher's task, and
//! the run the progress engine makes for a context (`run`).

pub(crate) mod accept;
pub(crate) mod connect;
pub(crate) mod device_open;
pub(crate) mod dispatch;
pub(crate) mod listen;
pub(crate) mod local_wire;
pub(crate) mod mad_out;
pub(crate) mod mcast_events;
pub(crate) mod run;
pub(crate) mod watch_task;
