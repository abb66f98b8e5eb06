//! ACKs held back for one busy poll: a responder's ACK then leaves in the same `sendmmsg`
//! as the application's reply (posted right after the completion it polls), instead of in
//! a system call of its own ahead of it on the latency path.
//!
//! The bound: the held batch is flushed by the next post (`Runtime::after_post`), the next
//! busy poll (first thing), any flush of another path, or the engine, which the device
//! asks to run within [`ENGINE_WITHIN`] (`verbs/device.rs`, `drive_locked`; a poller that
//! stopped less than `ACTIVE` ago has it wait one more `HANDOFF`, 1 ms, and its sleep
//! rounds up to whole ms): a few ms at worst, which is why only the ACKs of QPs whose own
//! ACK timeout is at least [`MIN_TIMEOUT`] are held (a peer with a shorter one would
//! retransmit). The engine usually has an earlier wake time already (its hand-off
//! check), so asking costs no doorbell.

use std::time::Duration;

use rdma_wire::opcode::Opcode;
use rdma_wire::packet::PacketRepr;

/// The smallest local ACK timeout exponent (4.096 µs << 12, about 16.8 ms) whose QPs'
/// ACKs are held; 0 (infinite) qualifies too.
pub(super) const MIN_TIMEOUT: u8 = 12;

/// How soon the engine must run after a busy poll that left ACKs held.
pub const ENGINE_WITHIN: Duration = Duration::from_millis(2);

/// What the current busy poll's rounds put into the wire's batch.
#[derive(Default)]
pub(super) struct AckHold {
    /// The caller busy-polls: holding is allowed in this call.
    pub on: bool,
    /// The wire's batch holds unflushed ACKs.
    held: bool,
    /// This round emitted a packet that may be held.
    acks: bool,
    /// This round emitted something else (or to a host-local ring).
    other: bool,
}

impl AckHold {
    /// A packet left through the wire's UDP batch (`udp`) or a ring, for a QP whose local
    /// ACK timeout is `timeout`.
    pub fn emitted(&mut self, h: &PacketRepr, udp: bool, timeout: u8) {
        let ack = h.bth.opcode == Opcode::RcAcknowledge
            && udp
            && (timeout == 0 || timeout >= MIN_TIMEOUT);
        if ack {
            self.acks = true;
        } else {
            self.other = true;
        }
    }

    /// The caller flushes the wire's batch now (held ACKs included).
    pub fn flushed(&mut self) {
        *self = AckHold {
            on: self.on,
            ..AckHold::default()
        };
    }

    /// End of a round: true when the flush may be skipped (only ACKs went out, and the
    /// caller busy-polls); false when the caller flushes. Resets the round.
    pub fn hold_round(&mut self) -> bool {
        let hold = self.on && self.acks && !self.other;
        self.acks = false;
        self.other = false;
        self.held = hold;
        hold
    }

    /// Whether the wire's batch holds ACKs.
    pub fn held(&self) -> bool {
        self.held
    }

    /// The batch is about to be flushed: whether it held ACKs (then the caller flushes).
    pub fn take_held(&mut self) -> bool {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use rdma_proto::packet::header;

    fn ack() -> PacketRepr {
        header(Opcode::RcAcknowledge, 7, 1)
    }

    #[test]
    fn holds_only_acks_of_a_busy_poller() {
        let mut h = AckHold::default();
        h.emitted(&ack(), true, 14);
        assert!(!h.hold_round(), "not a busy poller");
        h.on = true;
        h.emitted(&ack(), true, 14);
        assert!(h.hold_round());
        assert!(h.held());
        assert!(h.take_held());
        h.emitted(&ack(), true, 14);
        h.emitted(&header(Opcode::RcSendOnly, 7, 2), true, 14);
        assert!(!h.hold_round(), "a request goes out at once, with the ACK");
        h.emitted(&ack(), false, 14);
        assert!(!h.hold_round(), "ring packets are published as written");
        h.emitted(&ack(), true, MIN_TIMEOUT - 1);
        assert!(!h.hold_round(), "a short ACK timeout");
        h.emitted(&ack(), true, 0);
        assert!(h.hold_round(), "infinite timeout");
        assert!(!h.hold_round(), "nothing emitted: nothing to hold");
    }
}
