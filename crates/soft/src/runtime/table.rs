//! The QP table: QP numbers (slot and generation), inserting, finding and removing a QP's
//! context, and closing the wire addresses no QP uses any more.

use rdma_proto::rc::RcStats;

use super::{QpCtx, Runtime, SLOTS};
use crate::io::WireAddr;
use crate::{Error, Result};

impl Runtime {
    /// Allocates a QP number: slot index in the low 16 bits (never 0 or 1), a generation
    /// that changes on reuse in the high 8 bits (a sharing wire's slot instead: see
    /// `io::steer`). Slots are handed out cyclically, as Linux
    /// allocates QPNs: the next free slot after the last one handed out (a fresh one while
    /// the table has room), wrapping to the lowest free slot at the end. A QPN therefore
    /// comes back only after every other slot was used (or 256 reuses of a slot when few are
    /// free), not at the next create after a destroy: a peer still in timewait for the old
    /// connection would take the new one for a stale one (REJ 10). Not on the data path
    /// (one scan of the free list per QP created).
    pub fn alloc_qpn(&mut self, max_qp: usize) -> Result<u32> {
        let limit = SLOTS.min(max_qp + 2);
        let after = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, &i)| i as usize > self.last_slot)
            .min_by_key(|(_, &i)| i)
            .map(|(pos, _)| pos);
        let idx = if let Some(pos) = after {
            self.free.swap_remove(pos) as usize
        } else if self.next_slot < limit {
            self.next_slot += 1;
            self.next_slot - 1
        } else if let Some(pos) = self
            .free
            .iter()
            .enumerate()
            .min_by_key(|(_, &i)| i)
            .map(|(pos, _)| pos)
        {
            self.free.swap_remove(pos) as usize
        } else {
            return Err(Error::Exhausted {
                what: "queue pairs",
                max: max_qp,
            });
        };
        self.last_slot = idx;
        if self.slots.len() <= idx {
            self.slots.resize_with(idx + 1, || None);
            self.generation.resize(idx + 1, 0);
        }
        self.generation[idx] = self.generation[idx].wrapping_add(1);
        // A sharing wire's slot takes the generation's place: the steering reads it there.
        let high = match self.wire.share_slot()? {
            Some(slot) => slot,
            None => self.generation[idx],
        };
        Ok((u32::from(high) << 16) | idx as u32)
    }

    pub(super) fn insert(&mut self, mut ctx: QpCtx) {
        let idx = (ctx.qpn & 0xFFFF) as usize;
        if let Some(slot) = self.slots.get_mut(idx) {
            ctx.live_pos = self.live.len();
            *slot = Some(Box::new(ctx));
            self.live.push(idx as u16);
        }
    }

    pub fn remove(&mut self, qpn: u32) -> Option<Box<QpCtx>> {
        let idx = (qpn & 0xFFFF) as usize;
        let ctx = self.slots.get_mut(idx)?.take_if(|c| c.qpn == qpn)?;
        // O(1): the last live QP takes its place
        self.live.swap_remove(ctx.live_pos);
        if let Some(&moved) = self.live.get(ctx.live_pos) {
            if let Some(m) = self.slots[moved as usize].as_deref_mut() {
                m.live_pos = ctx.live_pos;
            }
        }
        self.free.push(idx as u16);
        add_rc(&mut self.retired, &ctx.rc.stats());
        for local in ctx.paths.locals() {
            self.close_if_unused(local);
        }
        Some(ctx)
    }

    /// Closes the wire address `local` if no QP uses it any more.
    pub(crate) fn close_if_unused(&mut self, local: WireAddr) {
        let used = self.gsi.is_open(local)
            || self.ud.uses(local)
            || self.live.iter().any(|&i| {
                self.slots[i as usize]
                    .as_ref()
                    .is_some_and(|c| c.paths.uses(local))
            });
        if !used {
            self.wire.close(local);
        }
    }

    /// The live RC QPs and the counters of those destroyed, for inspection.
    pub(super) fn qps(&self) -> (impl Iterator<Item = &QpCtx> + '_, rdma_proto::rc::RcStats) {
        let live = self.live.iter();
        (
            live.filter_map(|&i| self.slots.get(i as usize)?.as_deref()),
            self.retired,
        )
    }

    pub(super) fn get(&mut self, qpn: u32) -> Option<&mut QpCtx> {
        self.slots
            .get_mut((qpn & 0xFFFF) as usize)?
            .as_deref_mut()
            .filter(|c| c.qpn == qpn)
    }
}

/// Adds `b`'s transport counters to `a` (the totals of destroyed QPs).
pub(crate) fn add_rc(a: &mut RcStats, b: &RcStats) {
    a.req_packets_sent += b.req_packets_sent;
    a.retransmitted += b.retransmitted;
    a.timeouts += b.timeouts;
    a.tail_probes += b.tail_probes;
    a.early_retransmits += b.early_retransmits;
    a.spurious_probes += b.spurious_probes;
    a.rnr_naks_received += b.rnr_naks_received;
    a.seq_naks_received += b.seq_naks_received;
    a.responses_sent += b.responses_sent;
    a.duplicates += b.duplicates;
    a.dropped += b.dropped;
    a.naks_sent += b.naks_sent;
    a.ack_probes += b.ack_probes;
    a.pulls_sent += b.pulls_sent;
    a.pulls_done += b.pulls_done;
    a.pull_failures += b.pull_failures;
    a.credit_waits += b.credit_waits;
    a.credit_updates_sent += b.credit_updates_sent;
    a.rnr_waits_cut += b.rnr_waits_cut;
}
