//! The queue under a shared receive queue ([`SrqRing`]) and its attributes ([`SrqAttr`]).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use rdma_proto::verbs::RecvWr;

use super::mpmc::Ring;
use crate::{Error, Result};

struct SrqShared {
    ring: Ring<RecvWr>,
    max_wr: usize,
    max_sge: usize,
    limit: AtomicU32,
    limit_reached: AtomicBool,
}

/// What [`crate::verbs::SharedReceiveQueue::query`] reports (`ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// Receive work requests it holds.
    pub max_wr: usize,
    /// Scatter/gather elements per work request.
    pub max_sge: usize,
    /// Armed limit (0: not armed).
    pub srq_limit: u32,
}

/// The queue of a shared receive queue, shared by its verbs handle
/// ([`crate::verbs::SharedReceiveQueue`]) and the QPs attached to it: a lock-free ring of
/// receive work requests and the limit event.
#[derive(Clone)]
pub(crate) struct SrqRing {
    inner: Arc<SrqShared>,
}

impl SrqRing {
    pub(crate) fn new(max_wr: usize, max_sge: usize) -> SrqRing {
        let ring = Ring::new(max_wr);
        SrqRing {
            inner: Arc::new(SrqShared {
                max_wr: ring.capacity(),
                ring,
                max_sge,
                limit: AtomicU32::new(0),
                limit_reached: AtomicBool::new(false),
            }),
        }
    }

    /// Queues a receive. EINVAL with more than `max_sge` elements, ENOMEM when full.
    pub(crate) fn post_recv(&self, wr: RecvWr) -> Result<()> {
        if wr.sg.len() > self.inner.max_sge {
            return Err(Error::InvalidArgument(
                "more scatter/gather elements than max_sge",
            ));
        }
        self.inner
            .ring
            .push(wr)
            .map_err(|_| Error::QueueFull("shared receive queue"))
    }

    /// Arms the limit event: when fewer than `limit` receives remain, [`Self::limit_reached`]
    /// turns true once and the limit disarms (`IBV_EVENT_SRQ_LIMIT_REACHED`). 0 disarms.
    pub(crate) fn arm_limit(&self, limit: u32) -> Result<()> {
        if limit as usize > self.inner.max_wr {
            return Err(Error::InvalidArgument("srq_limit larger than max_wr"));
        }
        self.inner.limit.store(limit, Ordering::Release);
        Ok(())
    }

    /// Whether the armed limit was reached since the last call (clears it).
    pub(crate) fn limit_reached(&self) -> bool {
        self.inner.limit_reached.swap(false, Ordering::AcqRel)
    }

    /// Its attributes.
    pub(crate) fn query(&self) -> SrqAttr {
        SrqAttr {
            max_wr: self.inner.max_wr,
            max_sge: self.inner.max_sge,
            srq_limit: self.inner.limit.load(Ordering::Acquire),
        }
    }

    /// Receives queued.
    pub(crate) fn len(&self) -> usize {
        self.inner.ring.len()
    }

    /// Whether no receive is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Device side: takes the oldest receive, firing the limit event when it applies.
    pub(crate) fn take(&self) -> Option<RecvWr> {
        let wr = self.inner.ring.pop()?;
        let limit = self.inner.limit.load(Ordering::Acquire);
        if limit > 0
            && self.inner.ring.len() < limit as usize
            && self
                .inner
                .limit
                .compare_exchange(limit, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.inner.limit_reached.store(true, Ordering::Release);
        }
        Some(wr)
    }
}

#[cfg(test)]
mod tests {
    use crate::verbs::{Device, DeviceConfig};
    use rdma_proto::verbs::{RecvWr, Sge};

    #[test]
    fn fifo_bounds_and_limit_event() {
        let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let srq = dev.create_srq(&pd, 4, 2).unwrap();
        for i in 0..4 {
            srq.post_recv(RecvWr::new(i)).unwrap();
        }
        assert_eq!(
            srq.post_recv(RecvWr::new(9)).unwrap_err().errno(),
            libc::ENOMEM
        );
        let three = RecvWr::new(5)
            .with_sge(Sge::default())
            .with_sge(Sge::default())
            .with_sge(Sge::default());
        assert_eq!(srq.post_recv(three).unwrap_err().errno(), libc::EINVAL);
        srq.arm_limit(2).unwrap();
        assert_eq!(srq.ring().take().map(|w| w.wr_id), Some(0));
        assert!(!srq.limit_reached(), "3 left");
        assert_eq!(srq.ring().take().map(|w| w.wr_id), Some(1));
        assert!(!srq.limit_reached(), "2 left: not fewer than 2");
        assert_eq!(srq.ring().take().map(|w| w.wr_id), Some(2));
        assert!(srq.limit_reached());
        assert!(!srq.limit_reached(), "fires once");
        assert_eq!(srq.query().srq_limit, 0, "disarmed");
        assert_eq!(srq.arm_limit(100).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(
            dev.create_srq(&pd, 4, 99).unwrap_err().errno(),
            libc::EINVAL
        );
    }
}
