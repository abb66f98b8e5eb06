//! Shared receive queues: the verbs handle ([`SharedReceiveQueue`]) over the queue the
//! runtime takes receives from ([`crate::queues::srq::SrqRing`]).

use rdma_proto::verbs::RecvWr;

use super::pd::ProtectionDomain;
use crate::queues::srq::SrqRing;
use crate::queues::SrqAttr;
use crate::Result;

/// A shared receive queue: receive work requests that any QP attached to it consumes, in
/// order. Posting takes no lock (a lock-free ring).
///
/// ```
/// use rdma_soft::verbs::{AccessFlags, Device, DeviceConfig, RecvWr};
/// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
/// let pd = dev.alloc_pd().unwrap();
/// let srq = dev.create_srq(&pd, 4, 1).unwrap();
/// let mr = pd.register(vec![0u8; 256], AccessFlags::LOCAL_WRITE).unwrap();
/// srq.post_recv(RecvWr::new(1).with_sge(mr.sge(0, 256).unwrap())).unwrap();
/// srq.arm_limit(2).unwrap();
/// assert_eq!(srq.query().srq_limit, 2);
/// ```
#[derive(Clone)]
pub struct SharedReceiveQueue {
    pd: ProtectionDomain,
    ring: SrqRing,
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("attr", &self.query())
            .finish()
    }
}

impl SharedReceiveQueue {
    pub(crate) fn new(pd: &ProtectionDomain, max_wr: usize, max_sge: usize) -> SharedReceiveQueue {
        SharedReceiveQueue {
            pd: pd.clone(),
            ring: SrqRing::new(max_wr, max_sge),
        }
    }

    /// The queue the runtime takes receives from.
    pub(crate) fn ring(&self) -> &SrqRing {
        &self.ring
    }

    /// The protection domain of its receive buffers.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// Queues a receive. EINVAL with more than `max_sge` elements, ENOMEM when full.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        self.ring.post_recv(wr)
    }

    /// Arms the limit event: when fewer than `limit` receives remain, [`Self::limit_reached`]
    /// turns true once and the limit disarms (`IBV_EVENT_SRQ_LIMIT_REACHED`). 0 disarms.
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        self.ring.arm_limit(limit)
    }

    /// Whether the armed limit was reached since the last call (clears it).
    pub fn limit_reached(&self) -> bool {
        self.ring.limit_reached()
    }

    /// Its attributes.
    pub fn query(&self) -> SrqAttr {
        self.ring.query()
    }

    /// Receives queued.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// Whether no receive is queued.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }
}
