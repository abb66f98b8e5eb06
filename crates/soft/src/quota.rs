//! Bounded counts of live objects of one kind (a device's PDs, CQs): the limit
//! `query_device` reports applies to the objects alive, not to the ones ever made, so a
//! long-lived process that creates and destroys them never runs out.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::{Error, Result};

/// The live objects of one kind and their limit, with the numbers handed out.
#[derive(Debug)]
pub(crate) struct Quota {
    live: AtomicU32,
    next: AtomicU32,
    max: u32,
    what: &'static str,
}

/// One live object's place in its [`Quota`], given back when dropped.
#[derive(Debug)]
pub(crate) struct QuotaSlot(Arc<Quota>);

impl Quota {
    /// A quota of `max` live objects, called `what` in errors.
    pub(crate) fn new(max: u32, what: &'static str) -> Arc<Quota> {
        Arc::new(Quota {
            live: AtomicU32::new(0),
            next: AtomicU32::new(1),
            max,
            what,
        })
    }

    /// A number for a new object (unique among the last 2^32 - 1, never 0) and its slot;
    /// [`Error::Exhausted`] when `max` are alive.
    pub(crate) fn take(self: &Arc<Self>) -> Result<(u32, QuotaSlot)> {
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .map_err(|_| Error::Exhausted {
                what: self.what,
                max: self.max as usize,
            })?;
        let slot = QuotaSlot(self.clone());
        let mut id = self.next.fetch_add(1, Ordering::Relaxed);
        if id == 0 {
            id = self.next.fetch_add(1, Ordering::Relaxed);
        }
        Ok((id, slot))
    }

    /// Objects alive now.
    #[cfg(test)]
    pub(crate) fn live(&self) -> u32 {
        self.live.load(Ordering::Acquire)
    }
}

impl Drop for QuotaSlot {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_counts_live_objects_and_numbers_stay_unique() {
        let q = Quota::new(2, "things");
        let (a, sa) = q.take().unwrap();
        let (b, _sb) = q.take().unwrap();
        assert_ne!(a, b);
        assert!(matches!(q.take(), Err(Error::Exhausted { max: 2, .. })));
        drop(sa);
        assert_eq!(q.live(), 1);
        let (c, sc) = q.take().unwrap();
        assert!(c != a && c != b && c != 0);
        drop(sc);
        for _ in 0..10_000 {
            let (_, s) = q.take().unwrap();
            drop(s);
        }
        assert_eq!(q.live(), 1);
    }
}
