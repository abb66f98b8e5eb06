//! The InfiniBand Communication Manager (IBA vol1 chapter 12) as a sans-IO state machine.
//!
//! One [`CmAgent`] per device port owns every CM connection of that port. It owns no socket,
//! clock, thread or random source: the runtime feeds it received MADs ([`CmAgent::handle_mad`]),
//! the current time ([`CmAgent::handle_timeout`]) and API calls, and drains what it wants to
//! send ([`CmAgent::poll_transmit`]), what it has to report ([`CmAgent::poll_event`]) and when it
//! next wants to be woken ([`CmAgent::poll_timeout`]). Time is monotonic nanoseconds as a `u64`
//! (the crate-wide convention, see [`Nanos`]); random values (communication ids, transaction
//! ids, [`CmAgent::random_psn`]) come from a PRNG seeded by [`AgentConfig::seed`].
//!
//! The behaviour follows Linux's `ib_cm` as `rdma_cm` drives it (see `reference/` in the shared
//! docs): REQ/REP/DREQ retransmission with `max_cm_retries`, MRA "send only on duplicate"
//! ([`AgentConfig::delayed_mra`]), REJ 8 with local comm id 0 when nobody listens, REJ 10 for
//! stale connections, timewait, DREP for a DREQ that matches nothing, crossed DREQs, SIDR,
//! [`CmAgent::destroy`] with `cm_destroy_id`'s side effects and
//! [`CmAgent::destroy_silently`] for a REQ left unanswered (a full backlog: the peer retries).
//! Every received message must match a connection by its communication ids, its state and the
//! peer's GID; anything else changes nothing.
//!
//! Alternate paths for automatic path migration (a REQ's alternate path, LAP, APR and MRA for
//! a LAP) are described in [`ApEvent`]'s module: [`CmAgent::send_lap`],
//! [`CmAgent::send_apr`], [`CmAgent::poll_ap_event`] (see also `docs/HA.md`).
//!
//! ```
//! use rdma_proto::cm::*;
//!
//! let (ga, gb) = ("::ffff:192.0.2.2".parse().unwrap(), "::ffff:192.0.2.3".parse().unwrap());
//! // Each side's path to the other (tag 2: the runtime's name for the netdev).
//! let a_to_b = CmPath::new(ga, gb, 2);
//! let b_to_a = CmPath::new(gb, ga, 2);
//! let mut a = CmAgent::new(AgentConfig { ca_guid: 0xa, seed: 1, ..AgentConfig::default() });
//! let mut b = CmAgent::new(AgentConfig { ca_guid: 0xb, seed: 2, ..AgentConfig::default() });
//! let sid = 0x0000_0000_0106_1b58;
//! b.listen(sid).unwrap();
//!
//! let params = ReqParams::new(sid, a_to_b, 0x11, a.random_psn());
//! let conn = a.send_req(0, params).unwrap();
//! let CmTransmit { path, mad } = a.poll_transmit().unwrap();
//! assert_eq!(path, a_to_b);
//! b.handle_mad(0, b_to_a, &mad); // it arrived on B's path to A
//! let Some(CmEvent::ReqReceived(req)) = b.poll_event() else { panic!() };
//! let psn = b.random_psn();
//! b.send_rep(0, req.conn, RepParams::new(0x12, psn)).unwrap();
//! let rep = b.poll_transmit().unwrap();
//! assert_eq!(rep.path, b_to_a); // answered on the arrival path
//! a.handle_mad(1, a_to_b, &rep.mad);
//! assert!(matches!(a.poll_event(), Some(CmEvent::RepReceived(r)) if r.conn == conn));
//! a.send_rtu(1, conn).unwrap();
//! assert_eq!(a.poll_event(), Some(CmEvent::Established { conn }));
//! let rtu = a.poll_transmit().unwrap().mad;
//! b.handle_mad(2, b_to_a, &rtu);
//! assert_eq!(b.poll_event(), Some(CmEvent::Established { conn: req.conn }));
//! assert_eq!(a.state(conn), Some(CmState::Established));
//! ```

mod agent;
mod conn;
mod error;
mod event;
mod gone;
mod heard;
mod lap;
mod pace;
mod params;
mod recv;
mod rng;
mod sidr;
mod state;
mod timers;

#[cfg(test)]
mod tests;

pub use agent::{CmAgent, CmStats};
pub use error::CmError;
pub use event::{CmEvent, RejReceived, RepReceived, ReqReceived, SidrRepReceived, SidrReqReceived};
pub use lap::{ApEvent, LapState};
pub use params::{
    AgentConfig, CmPath, CmTransmit, ConnHandle, OverloadPolicy, PathParams, RepParams, ReqParams,
    SidrRepParams, SidrReqParams,
};
pub use state::CmState;
pub use timers::{EARLY_MIN_NS, PEER_MRA_BOUNDS, PEER_RESPONSE_BOUNDS, PEER_TIMEWAIT_MAX};

/// Monotonic time in nanoseconds, as everywhere in this crate.
pub type Nanos = u64;

/// The UDP port of RoCEv2, where CM MADs are sent.
pub const ROCE_UDP_PORT: u16 = 4791;
