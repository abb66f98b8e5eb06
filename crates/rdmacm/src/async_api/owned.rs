//! Owned buffers in the style of tokio-uring: a [`Buf`] moves into an operation
//! ([`Connection::send_buf`], [`Connection::write_buf`], [`Connection::read_buf`]) and comes
//! back with its result, so the device reads and writes the application's own bytes with
//! no copy in user space.
//!
//! While the application holds a `Buf` it is plain memory (`&[u8]` / `&mut [u8]`); an
//! operation registers it for its duration (local access only: no peer can reach it) and
//! deregisters it before handing it back, so Rust's aliasing rules hold without copies.
//! [`BufPool`] recycles the allocations.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use rdma_soft::verbs::{AccessFlags, MemoryRegion, SendOp, SendWr};

use super::connection::Connection;
use super::messages::too_long;
use super::remote::{check_remote, RemoteBuf};
use crate::error::{Error, Result};

struct PoolInner {
    size: usize,
    max_free: usize,
    free: Mutex<Vec<Box<[u8]>>>,
}

/// A pool of equal [`Buf`]s: [`BufPool::get`] takes one (allocating only when the pool is
/// empty) and a dropped `Buf` goes back. Cheap to clone (shared).
///
/// ```
/// let pool = rdmacm::BufPool::new(4096, 8);
/// let mut b = pool.get();
/// assert_eq!(b.len(), 4096);
/// b[..5].copy_from_slice(b"hello");
/// b.set_len(5).unwrap();
/// assert_eq!(&b[..], b"hello");
/// assert!(b.set_len(4097).is_err());
/// drop(b);
/// assert_eq!(pool.idle(), 1);
/// ```
#[derive(Clone)]
pub struct BufPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for BufPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufPool")
            .field("size", &self.inner.size)
            .field("idle", &self.idle())
            .finish()
    }
}

impl BufPool {
    /// Buffers of `size` bytes (at least 1); at most `max_idle` are kept when returned.
    pub fn new(size: usize, max_idle: usize) -> BufPool {
        BufPool {
            inner: Arc::new(PoolInner {
                size: size.max(1),
                max_free: max_idle,
                free: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A buffer of the pool's size (its length is the whole size; contents are whatever
    /// its last user left).
    pub fn get(&self) -> Buf {
        let data = self
            .inner
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_else(|| vec![0u8; self.inner.size].into_boxed_slice());
        Buf {
            len: data.len(),
            data: Some(data),
            pool: Some(self.inner.clone()),
        }
    }

    /// Buffers waiting in the pool.
    pub fn idle(&self) -> usize {
        self.inner
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

/// An owned byte buffer for the zero-copy operations: a capacity, and a length (the bytes
/// an operation sends, writes or reads). Derefs to its first `len()` bytes.
///
/// ```
/// let mut b = rdmacm::Buf::from(vec![1u8, 2, 3]);
/// b[0] = 9;
/// assert_eq!(&b[..], &[9, 2, 3]);
/// assert_eq!(b.capacity(), 3);
/// ```
pub struct Buf {
    /// `None` only while an operation holds the bytes (never seen by the application).
    data: Option<Box<[u8]>>,
    len: usize,
    pool: Option<Arc<PoolInner>>,
}

impl std::fmt::Debug for Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buf")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl From<Vec<u8>> for Buf {
    fn from(v: Vec<u8>) -> Buf {
        Buf {
            len: v.len(),
            data: Some(v.into_boxed_slice()),
            pool: None,
        }
    }
}

impl Buf {
    /// A zeroed buffer of `len` bytes, in no pool.
    pub fn zeroed(len: usize) -> Buf {
        Buf::from(vec![0u8; len])
    }

    /// Bytes the buffer holds at most.
    pub fn capacity(&self) -> usize {
        self.data.as_ref().map_or(0, |d| d.len())
    }

    /// Sets the length (`EINVAL` beyond the capacity).
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        if len > self.capacity() {
            return Err(Error::InvalidArgument(format!(
                "length {len} beyond the buffer's capacity {}",
                self.capacity()
            )));
        }
        self.len = len;
        Ok(())
    }

    /// Registers the bytes in `c`'s PD for an operation (local access only).
    fn register(&mut self, c: &Connection) -> Result<MemoryRegion> {
        let cap = self.capacity();
        let data = self.data.take().unwrap_or_default();
        match c.pd().register(data, AccessFlags::LOCAL_WRITE) {
            Ok(mr) => Ok(mr),
            Err(e) => {
                // The device dropped the bytes it refused: keep the buffer usable.
                self.data = Some(vec![0u8; cap].into_boxed_slice());
                Err(e.into())
            }
        }
    }

    /// Takes the bytes back from an operation's region.
    fn restore(&mut self, mr: MemoryRegion) {
        self.data = Some(match mr.deregister() {
            Ok(b) => b,
            // Never in practice (the operation completed); copy rather than lose them.
            Err(e) => e.mr.to_vec().into_boxed_slice(),
        });
    }
}

impl Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.data.as_deref().map_or(&[], |d| &d[..self.len])
    }
}

impl DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        self.data.as_deref_mut().map_or(&mut [], |d| &mut d[..len])
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let (Some(pool), Some(data)) = (self.pool.take(), self.data.take()) {
            let mut free = pool.free.lock().unwrap_or_else(|e| e.into_inner());
            if free.len() < pool.max_free && data.len() == pool.size {
                free.push(data);
            }
        }
    }
}

impl Connection {
    /// Sends `buf`'s bytes as one message without copying them (the device reads them from
    /// `buf` itself), and hands `buf` back once the SEND completed: the bytes are in the
    /// peer's receive buffer. Same credits and errors as [`Connection::send`] (`EINVAL` over
    /// [`Connection::max_message`]). If the future is dropped while the SEND is out, the buffer is kept
    /// until its completion and then freed.
    ///
    /// ```no_run
    /// # async fn f(c: &rdmacm::Connection) -> rdmacm::Result<()> {
    /// let pool = rdmacm::BufPool::new(4096, 16);
    /// let mut buf = pool.get();
    /// buf.fill(7);
    /// let (r, buf) = c.send_buf(buf).await;
    /// r?;
    /// drop(buf); // back to the pool
    /// # Ok(()) }
    /// ```
    pub async fn send_buf(&self, mut buf: Buf) -> (Result<()>, Buf) {
        let len = buf.len();
        if len > self.sh.max_message {
            return (Err(too_long(len, self.sh.max_message)), buf);
        }
        if len == 0 {
            return (self.send(&[]).await, buf);
        }
        let mr = match buf.register(self) {
            Ok(mr) => mr,
            Err(e) => return (Err(e), buf),
        };
        let sge = match mr.sge(0, len as u32) {
            Ok(s) => s,
            Err(e) => {
                buf.restore(mr);
                return (Err(e.into()), buf);
            }
        };
        let posted = self
            .post_op(mr, true, |id, imm| {
                Ok(SendWr::new(id, SendOp::SendWithImm { imm })
                    .with_sge(sge)
                    .signaled())
            })
            .await;
        let mut g = match posted {
            Ok(g) => g,
            Err((e, mr)) => {
                buf.restore(mr);
                return (Err(e), buf);
            }
        };
        let r = self.wait_op(&g).await;
        buf.restore(g.mr.take().expect("held until here"));
        (r, buf)
    }

    /// RDMA WRITE of `buf`'s bytes to the start of `remote` without a copy; `buf` comes
    /// back when the peer's device acknowledged the WRITE. Errors as [`Connection::write`].
    ///
    /// ```no_run
    /// # async fn f(c: &rdmacm::Connection, remote: rdmacm::RemoteBuf) -> rdmacm::Result<()> {
    /// let buf = rdmacm::Buf::from(vec![1u8; 1 << 20]);
    /// let (r, _buf) = c.write_buf(&remote, buf).await;
    /// r?;
    /// # Ok(()) }
    /// ```
    pub async fn write_buf(&self, remote: &RemoteBuf, buf: Buf) -> (Result<()>, Buf) {
        let op = SendOp::RdmaWrite {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        };
        self.one_sided(remote, op, buf).await
    }

    /// RDMA READ of `buf.len()` bytes from the start of `remote` straight into `buf`.
    /// Errors as [`Connection::write`].
    ///
    /// ```no_run
    /// # async fn f(c: &rdmacm::Connection, remote: rdmacm::RemoteBuf) -> rdmacm::Result<()> {
    /// let (r, buf) = c.read_buf(&remote, rdmacm::Buf::zeroed(remote.len as usize)).await;
    /// r?;
    /// println!("{:?}", &buf[..16]);
    /// # Ok(()) }
    /// ```
    pub async fn read_buf(&self, remote: &RemoteBuf, buf: Buf) -> (Result<()>, Buf) {
        let op = SendOp::RdmaRead {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        };
        self.one_sided(remote, op, buf).await
    }

    async fn one_sided(&self, remote: &RemoteBuf, op: SendOp, mut buf: Buf) -> (Result<()>, Buf) {
        let len = buf.len();
        if let Err(e) = check_remote(remote, len) {
            return (Err(e), buf);
        }
        if len == 0 {
            return (self.check_open(), buf);
        }
        let mr = match buf.register(self) {
            Ok(mr) => mr,
            Err(e) => return (Err(e), buf),
        };
        let (r, mr) = self.rdma(op, mr, len).await;
        buf.restore(mr);
        (r, buf)
    }
}
