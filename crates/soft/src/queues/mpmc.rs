//! A bounded lock-free multi-producer multi-consumer ring of `Copy` values (per-slot sequence
//! numbers): the storage of completion queues and shared receive queues. Pushing and popping
//! take no lock and make no system call; values are published with release/acquire, so memory
//! written before a push is visible to whoever pops the value.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};

struct Cell<T> {
    seq: AtomicUsize,
    value: UnsafeCell<MaybeUninit<T>>,
}

pub(crate) struct Ring<T> {
    cells: Box<[Cell<T>]>,
    mask: usize,
    head: AtomicUsize,
    tail: AtomicUsize,
}

// SAFETY: a slot's value is written only by the producer that claimed it (by CAS on `tail`) and
// read only by the consumer that claimed it (by CAS on `head`); the per-slot sequence number
// orders the two with release/acquire.
unsafe impl<T: Send> Send for Ring<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Ring<T> {}

impl<T: Copy> Ring<T> {
    /// A ring holding at least `min_capacity` values (rounded up to a power of two, at least 2).
    pub fn new(min_capacity: usize) -> Ring<T> {
        let cap = min_capacity.max(2).next_power_of_two();
        Ring {
            cells: (0..cap)
                .map(|i| Cell {
                    seq: AtomicUsize::new(i),
                    value: UnsafeCell::new(MaybeUninit::uninit()),
                })
                .collect(),
            mask: cap - 1,
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
        }
    }

    pub fn capacity(&self) -> usize {
        self.cells.len()
    }

    /// Values queued (a snapshot).
    pub fn len(&self) -> usize {
        let tail = self.tail.load(Ordering::Acquire);
        let head = self.head.load(Ordering::Acquire);
        tail.wrapping_sub(head).min(self.capacity())
    }

    /// Appends `v`; gives it back when the ring is full.
    pub fn push(&self, v: T) -> Result<(), T> {
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let cell = &self.cells[pos & self.mask];
            let seq = cell.seq.load(Ordering::Acquire);
            let diff = seq as isize - pos as isize;
            if diff == 0 {
                match self.tail.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: this producer owns the slot until it bumps `seq`.
                        unsafe { (*cell.value.get()).write(v) };
                        cell.seq.store(pos.wrapping_add(1), Ordering::Release);
                        return Ok(());
                    }
                    Err(p) => pos = p,
                }
            } else if diff < 0 {
                return Err(v);
            } else {
                pos = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Removes the oldest value.
    pub fn pop(&self) -> Option<T> {
        let mut pos = self.head.load(Ordering::Relaxed);
        loop {
            let cell = &self.cells[pos & self.mask];
            let seq = cell.seq.load(Ordering::Acquire);
            let diff = seq as isize - pos.wrapping_add(1) as isize;
            if diff == 0 {
                match self.head.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: the producer initialised the slot (seq == pos + 1) and this
                        // consumer owns it until it bumps `seq`.
                        let v = unsafe { (*cell.value.get()).assume_init_read() };
                        cell.seq
                            .store(pos.wrapping_add(self.mask + 1), Ordering::Release);
                        return Some(v);
                    }
                    Err(p) => pos = p,
                }
            } else if diff < 0 {
                return None;
            } else {
                pos = self.head.load(Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn fifo_and_bounded() {
        let r = Ring::new(3);
        assert_eq!(r.capacity(), 4);
        for i in 0..4 {
            r.push(i).unwrap();
        }
        assert_eq!(r.push(9), Err(9));
        assert_eq!(r.len(), 4);
        for i in 0..4 {
            assert_eq!(r.pop(), Some(i));
        }
        assert_eq!(r.pop(), None);
    }

    #[test]
    fn threads_lose_nothing() {
        let r = Arc::new(Ring::new(64));
        let producers: Vec<_> = (0..2u64)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        while r.push(t << 32 | i).is_err() {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut last = [None::<u64>; 2];
        let mut n = 0;
        while n < 40_000 {
            if let Some(v) = r.pop() {
                let t = (v >> 32) as usize;
                let i = v & 0xffff_ffff;
                assert!(last[t].map_or(true, |l| l + 1 == i), "per-producer order");
                last[t] = Some(i);
                n += 1;
            }
        }
        for p in producers {
            p.join().unwrap();
        }
        assert_eq!(r.pop(), None);
    }
}
