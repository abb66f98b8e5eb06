//! One-sided operations: [`RemoteBuf`], [`Connection::write`], [`Connection::read`], and
//! the tracking of operations (also used by owned sends).

use rdma_soft::verbs::{AccessFlags, MemoryRegion, SendOp, SendWr, WcStatus};

use super::connection::Connection;
use super::shared::Shared;
use super::MAX_RDMA_OPS;
use crate::error::{CloseReason, Error, Result};

/// A region of the peer's memory that [`Connection::write`] and [`Connection::read`]
/// reach: its address, rkey and length, as the peer's [`RemoteBuf::of`] gave them. It
/// travels as 16 bytes ([`RemoteBuf::to_bytes`], network byte order), in a message or in
/// the private data of a REQ or REP.
///
/// ```
/// use rdmacm::RemoteBuf;
/// let rb = RemoteBuf { addr: 0x1000, rkey: 0xabcd, len: 4096 };
/// let mut private_data = rb.to_bytes().to_vec();
/// private_data.resize(56, 0); // zero padded, as a REP's private data arrives
/// assert_eq!(RemoteBuf::from_bytes(&private_data), Some(rb));
/// assert_eq!(rb.slice(1024, 512), Some(RemoteBuf { addr: 0x1400, rkey: 0xabcd, len: 512 }));
/// assert_eq!(rb.slice(4000, 512), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteBuf {
    /// The region's address (in the peer's region address space).
    pub addr: u64,
    /// Its remote key.
    pub rkey: u32,
    /// Its length in bytes.
    pub len: u32,
}

impl RemoteBuf {
    /// Bytes of [`RemoteBuf::to_bytes`].
    pub const ENCODED_LEN: usize = 16;

    /// The whole of `mr` (at most 4 GiB - 1 of it), for the peer.
    ///
    /// ```no_run
    /// # async fn f(c: &rdmacm::Connection) -> rdmacm::Result<()> {
    /// let mr = c.register_remote(1 << 20)?;
    /// c.send(&rdmacm::RemoteBuf::of(&mr).to_bytes()).await?; // the peer may now write and read it
    /// # Ok(()) }
    /// ```
    pub fn of(mr: &MemoryRegion) -> RemoteBuf {
        RemoteBuf {
            addr: mr.addr(),
            rkey: mr.rkey(),
            len: mr.len().min(u32::MAX as usize) as u32,
        }
    }

    /// `addr`, `rkey`, `len`, big-endian.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// From the first 16 bytes of `b` (`None` if shorter); private data's zero padding
    /// after them is ignored.
    pub fn from_bytes(b: &[u8]) -> Option<RemoteBuf> {
        let b = b.get(..Self::ENCODED_LEN)?;
        Some(RemoteBuf {
            addr: u64::from_be_bytes(b[..8].try_into().ok()?),
            rkey: u32::from_be_bytes(b[8..12].try_into().ok()?),
            len: u32::from_be_bytes(b[12..16].try_into().ok()?),
        })
    }

    /// `len` bytes from `offset`, if inside.
    pub fn slice(&self, offset: u32, len: u32) -> Option<RemoteBuf> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then_some(RemoteBuf {
            addr: self.addr + offset as u64,
            rkey: self.rkey,
            len,
        })
    }
}

pub(super) fn check_remote(remote: &RemoteBuf, len: usize) -> Result<()> {
    if len > remote.len as usize {
        return Err(Error::InvalidArgument(format!(
            "{len} bytes do not fit the remote buffer of {} bytes (rkey {:#x})",
            remote.len, remote.rkey
        )));
    }
    Ok(())
}

/// An outstanding operation of a future. Dropped before its completion (the future was
/// cancelled), it leaves its region to the shared state until the completion comes.
pub(super) struct OpGuard<'a> {
    sh: &'a Shared,
    id: u64,
    pub mr: Option<MemoryRegion>,
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        let mut st = self.sh.lock();
        match (st.ops.get(&self.id), self.mr.take()) {
            (Some(None), Some(mr)) if st.closed.is_none() => {
                st.orphans.insert(self.id, mr);
            }
            _ => {
                st.ops.remove(&self.id);
                self.sh.wake(&mut st);
            }
        }
    }
}

impl Connection {
    /// Posts `make(wr_id, imm)` once fewer than [`MAX_RDMA_OPS`] operations are out (and,
    /// with `message`, a data credit is free: the WR is a SEND carrying `imm`).
    pub(super) async fn post_op(
        &self,
        mr: MemoryRegion,
        message: bool,
        make: impl Fn(u64, u32) -> Result<SendWr>,
    ) -> std::result::Result<OpGuard<'_>, (Error, MemoryRegion)> {
        let mut first = true;
        loop {
            let n = self.sh.changed.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            {
                let mut st = self.sh.lock();
                if let Some(why) = &st.closed {
                    let e = if first {
                        Error::NotConnected
                    } else {
                        Error::Closed(why.clone())
                    };
                    return Err((e, mr));
                }
                if st.ops.len() < MAX_RDMA_OPS && (!message || st.data_credits > 0) {
                    let id = st.new_op();
                    let imm = st.ret_data | (st.ret_ctrl << 16);
                    match make(id, imm).and_then(|wr| Ok(self.sh.parts.qp.post_send(&wr)?)) {
                        Ok(()) => {
                            st.posted(id, None);
                            if message {
                                st.take_returns();
                                st.data_credits -= 1;
                            }
                            return Ok(OpGuard {
                                sh: &self.sh,
                                id,
                                mr: Some(mr),
                            });
                        }
                        Err(e) => {
                            st.ops.remove(&id);
                            return Err((e, mr));
                        }
                    }
                }
            }
            first = false;
            self.wait(n).await;
        }
    }

    /// Waits for the completion of `op`.
    pub(super) async fn wait_op(&self, op: &OpGuard<'_>) -> Result<()> {
        loop {
            let n = self.sh.changed.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            {
                let st = self.sh.lock();
                match st.ops.get(&op.id) {
                    Some(Some(WcStatus::Success)) => return Ok(()),
                    Some(Some(status)) => {
                        return Err(Error::Closed(
                            st.closed.clone().unwrap_or(CloseReason::Failed(*status)),
                        ))
                    }
                    _ => {}
                }
                if let Some(why) = &st.closed {
                    return Err(Error::Closed(why.clone()));
                }
            }
            self.wait(n).await;
        }
    }

    /// Posts a one-sided `op` over `len` bytes of `mr` and waits for its completion;
    /// gives the region back.
    pub(super) async fn rdma(
        &self,
        op: SendOp,
        mr: MemoryRegion,
        len: usize,
    ) -> (Result<()>, MemoryRegion) {
        self.rdma_at(op, mr, 0, len).await
    }

    async fn rdma_at(
        &self,
        op: SendOp,
        mr: MemoryRegion,
        offset: usize,
        len: usize,
    ) -> (Result<()>, MemoryRegion) {
        let sge = match mr.sge(offset, len as u32) {
            Ok(s) => s,
            Err(e) => return (Err(e.into()), mr),
        };
        let posted = self
            .post_op(mr, false, |id, _| {
                Ok(SendWr::new(id, op).with_sge(sge).signaled())
            })
            .await;
        let mut g = match posted {
            Ok(g) => g,
            Err((e, mr)) => return (Err(e), mr),
        };
        let r = self.wait_op(&g).await;
        let mr = g.mr.take().expect("held until here");
        (r, mr)
    }

    /// Registers a zeroed region of `len` bytes in the connection's PD that the peer may
    /// write and read (give it [`RemoteBuf::of`]). The region is read and written locally
    /// by copy ([`MemoryRegion::read`], [`MemoryRegion::write`]), which stays sound while
    /// the peer writes into it.
    ///
    /// ```no_run
    /// # fn f(c: &rdmacm::Connection) -> rdmacm::Result<()> {
    /// let mr = c.register_remote(4096)?;
    /// let rb = rdmacm::RemoteBuf::of(&mr);
    /// assert_eq!(rb.len, 4096);
    /// # Ok(()) }
    /// ```
    pub fn register_remote(&self, len: usize) -> Result<MemoryRegion> {
        Ok(self.pd().alloc(
            len,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )?)
    }

    /// RDMA WRITE of `data` to the start of `remote`, completed when the peer's device
    /// acknowledged it (the bytes are in the peer's memory; the peer's application gets no
    /// completion). `data` is copied into a registered staging buffer first; see
    /// [`Connection::write_buf`] for the form without a copy.
    ///
    /// Errors: `EINVAL` when `data` is longer than `remote`; [`Error::Closed`] with
    /// [`CloseReason::Failed`] (e.g. `RemAccessErr`: wrong rkey or bounds) when the WRITE
    /// fails, which also closes the connection (an RC QP goes to Err on a failed request);
    /// [`Error::NotConnected`] after the close.
    ///
    /// ```no_run
    /// # async fn f(c: &rdmacm::Connection, remote: rdmacm::RemoteBuf) -> rdmacm::Result<()> {
    /// c.write(&remote, b"into the peer's memory").await?;
    /// # Ok(()) }
    /// ```
    pub async fn write(&self, remote: &RemoteBuf, data: &[u8]) -> Result<()> {
        check_remote(remote, data.len())?;
        if data.is_empty() {
            return self.check_open();
        }
        let mr = self
            .pd()
            .register(data.to_vec(), AccessFlags::LOCAL_WRITE)?;
        let op = SendOp::RdmaWrite {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        };
        self.rdma(op, mr, data.len()).await.0
    }

    /// RDMA WRITE of `len` bytes at `offset` of `mr`, a region of this connection's
    /// protection domain (from [`Connection::register_remote`], say, filled with
    /// [`MemoryRegion::write`]), to the start of `remote`, with no copy in this process; the
    /// region comes back with the result. To a peer process on this host, a WRITE of 16 KiB
    /// or more from such a region is copied once, by the peer, from this process's memory.
    /// Errors as [`Connection::write`], and `EINVAL` for a region of another protection
    /// domain or a range outside it.
    ///
    /// ```no_run
    /// # async fn f(c: &rdmacm::Connection, remote: rdmacm::RemoteBuf) -> rdmacm::Result<()> {
    /// let src = c.register_remote(1 << 20)?;
    /// src.write(0, b"payload")?;
    /// let (r, _src) = c.write_from(&remote, src, 0, 7).await;
    /// r?;
    /// # Ok(()) }
    /// ```
    pub async fn write_from(
        &self,
        remote: &RemoteBuf,
        mr: MemoryRegion,
        offset: usize,
        len: usize,
    ) -> (Result<()>, MemoryRegion) {
        if let Err(e) = check_remote(remote, len) {
            return (Err(e), mr);
        }
        if mr.pd().id() != self.pd().id() {
            let e = Error::InvalidArgument("a region of another protection domain".into());
            return (Err(e), mr);
        }
        if offset.checked_add(len).is_none_or(|end| end > mr.len()) {
            let e = Error::InvalidArgument(format!(
                "{len} bytes at {offset} outside the region's {}",
                mr.len()
            ));
            return (Err(e), mr);
        }
        if len == 0 {
            return (self.check_open(), mr);
        }
        let op = SendOp::RdmaWrite {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        };
        self.rdma_at(op, mr, offset, len).await
    }

    /// RDMA READ of `buf.len()` bytes from the start of `remote` into `buf`, through a
    /// registered staging buffer ([`Connection::read_buf`]: without). Errors as
    /// [`Connection::write`].
    ///
    /// ```no_run
    /// # async fn f(c: &rdmacm::Connection, remote: rdmacm::RemoteBuf) -> rdmacm::Result<()> {
    /// let mut buf = vec![0u8; remote.len as usize];
    /// c.read(&remote, &mut buf).await?;
    /// # Ok(()) }
    /// ```
    pub async fn read(&self, remote: &RemoteBuf, buf: &mut [u8]) -> Result<()> {
        check_remote(remote, buf.len())?;
        if buf.is_empty() {
            return self.check_open();
        }
        let mr = self
            .pd()
            .register(vec![0u8; buf.len()], AccessFlags::LOCAL_WRITE)?;
        let op = SendOp::RdmaRead {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        };
        let (r, mr) = self.rdma(op, mr, buf.len()).await;
        r?;
        mr.read(0, buf)?;
        Ok(())
    }
}
