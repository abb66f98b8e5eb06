//! Two-sided messages: [`Connection::send`], [`Connection::recv`], [`Connection::recv_into`].

use rdma_soft::verbs::{SendOp, SendWr};

use super::connection::Connection;
use super::shared::{Shared, State};
use super::{tag, TAG_SEND};
use crate::error::{CloseReason, Error, Result};

pub(super) fn too_long(len: usize, max: usize) -> Error {
    Error::InvalidArgument(format!("message of {len} bytes: at most {max} per send"))
}

impl Shared {
    /// Copies `msg` into a free send buffer and posts it; the caller checked that a credit
    /// and a buffer are free.
    pub(super) fn post_message(&self, st: &mut State, msg: &[u8]) -> Result<()> {
        let p = &self.parts;
        let signaled = st.signal_next_send();
        let slot = st.free_send.pop().expect("checked by the caller");
        let off = slot as usize * p.bufs.stride;
        let r = p.bufs.send_mr.write(off, msg).and_then(|()| {
            let mut wr = SendWr::new(
                tag(TAG_SEND, slot),
                SendOp::SendWithImm {
                    imm: st.ret_data | (st.ret_ctrl << 16),
                },
            );
            if signaled {
                wr = wr.signaled();
            }
            if !msg.is_empty() {
                wr = wr.with_sge(p.bufs.send_mr.sge(off, msg.len() as u32)?);
            }
            p.qp.post_send(&wr)
        });
        match r {
            Ok(()) => {
                st.posted(tag(TAG_SEND, slot), (!signaled).then_some(slot));
                st.send_len[slot as usize] = msg.len() as u32;
                st.take_returns();
                st.data_credits -= 1;
                Ok(())
            }
            Err(e) => {
                st.free_send.push(slot);
                Err(e.into())
            }
        }
    }

    /// Copies up to `out.len()` bytes of the front message from `st.read_off` into `out`;
    /// reposts its buffer (and returns the credit) once it is taken whole. With `whole`,
    /// the message is taken whole whatever fits. Returns the bytes copied and the
    /// message's length.
    pub(super) fn take_front(
        &self,
        st: &mut State,
        out: &mut [u8],
        whole: bool,
    ) -> Option<Result<(usize, usize)>> {
        let &(slot, len) = st.received.front()?;
        let (len, off) = (len as usize, st.read_off);
        let n = out.len().min(len - off);
        let p = &self.parts;
        if let Err(e) = p
            .bufs
            .recv_mr
            .read(slot as usize * p.bufs.stride + off, &mut out[..n])
        {
            return Some(Err(e.into()));
        }
        if !whole && off + n < len {
            st.read_off += n;
            return Some(Ok((n, len)));
        }
        st.received.pop_front();
        st.read_off = 0;
        if st.closed.is_none() {
            match p.post_recv(slot) {
                Ok(()) => {
                    st.ret_data += 1;
                    self.maybe_return_credits(st);
                }
                Err(e) => self.close(st, CloseReason::PostFailed(e.to_string())),
            }
        }
        Some(Ok((n, len)))
    }
}

impl Connection {
    /// Sends `msg` as one message (at most [`Connection::max_message`] bytes): waits for a credit and
    /// a free send buffer, copies `msg` into it and posts the SEND. Returns once posted
    /// (like a TCP write returning once the bytes are in the socket buffer); a later
    /// failure closes the connection. Cancel safe (nothing is sent unless it returns `Ok`).
    ///
    /// Errors: [`Error::NotConnected`] if the connection was already closed,
    /// [`Error::Closed`] if it closed while waiting, `EMSGSIZE` ([`Error::InvalidArgument`])
    /// for a message over [`Connection::max_message`].
    ///
    /// ```no_run
    /// # async fn f(c: &rdmacm::Connection) -> rdmacm::Result<()> {
    /// c.send(b"hello").await?;
    /// # Ok(()) }
    /// ```
    pub async fn send(&self, msg: &[u8]) -> Result<()> {
        if msg.len() > self.sh.max_message {
            return Err(too_long(msg.len(), self.sh.max_message));
        }
        let mut first = true;
        loop {
            let n = self.sh.changed.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            {
                let mut st = self.sh.lock();
                if let Some(why) = &st.closed {
                    return Err(if first {
                        Error::NotConnected
                    } else {
                        Error::Closed(why.clone())
                    });
                }
                if st.data_credits > 0 && !st.free_send.is_empty() {
                    return self.sh.post_message(&mut st, msg);
                }
            }
            first = false;
            self.wait(n).await;
        }
    }

    /// The next message. Messages that arrived before the connection closed are still
    /// delivered; after them, [`Error::Closed`] with the reason. Cancel safe.
    ///
    /// ```no_run
    /// # async fn f(c: &rdmacm::Connection) -> rdmacm::Result<()> {
    /// while let Ok(msg) = c.recv().await {
    ///     c.send(&msg).await?; // echo
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn recv(&self) -> Result<Vec<u8>> {
        let mut st = self.next_message().await?;
        let len = st.received.front().map_or(0, |m| m.1 as usize) - st.read_off;
        let mut out = vec![0u8; len];
        self.sh
            .take_front(&mut st, &mut out, true)
            .expect("a message is there")?;
        Ok(out)
    }

    /// The next message into `buf` (no allocation): returns its length. A message longer
    /// than `buf` is truncated to it and the rest dropped, as a datagram socket does;
    /// give [`Connection::max_message`] bytes to never lose any. Cancel safe.
    ///
    /// ```no_run
    /// # async fn f(c: &rdmacm::Connection) -> rdmacm::Result<()> {
    /// let mut buf = vec![0u8; c.max_message()];
    /// let n = c.recv_into(&mut buf).await?;
    /// println!("{:?}", &buf[..n]);
    /// # Ok(()) }
    /// ```
    pub async fn recv_into(&self, buf: &mut [u8]) -> Result<usize> {
        let mut st = self.next_message().await?;
        let (n, _) = self
            .sh
            .take_front(&mut st, buf, true)
            .expect("a message is there")?;
        Ok(n)
    }

    /// Waits until a message is there (and returns the locked state) or the connection is
    /// closed with nothing left to deliver.
    async fn next_message(&self) -> Result<std::sync::MutexGuard<'_, State>> {
        loop {
            let n = self.sh.changed.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            {
                let st = self.sh.lock();
                if !st.received.is_empty() {
                    return Ok(st);
                }
                if let Some(why) = &st.closed {
                    return Err(Error::Closed(why.clone()));
                }
            }
            self.wait_recv(n).await;
        }
    }
}
