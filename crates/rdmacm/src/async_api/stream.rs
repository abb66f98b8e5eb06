//! [`RdmaStream`]: a byte stream (`tokio::io::AsyncRead` + `AsyncWrite`) over a
//! connection's messages.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::connection::Connection;
use crate::error::{CloseReason, Error};

fn io_error(e: Error) -> io::Error {
    e.into()
}

/// An [`Error`] as an I/O error of its errno's kind, with its text (so `?` works in
/// functions returning `std::io::Result`, as `AsyncRead` / `AsyncWrite` code does).
///
/// ```
/// let e: std::io::Error = rdmacm::Error::NotConnected.into();
/// assert_eq!(e.kind(), std::io::ErrorKind::NotConnected);
/// ```
impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        match e {
            Error::Io(e) => e,
            e => io::Error::new(io::Error::from_raw_os_error(e.errno()).kind(), e),
        }
    }
}

/// A [`Connection`] as a byte stream, for `tokio::io::copy`, codecs and anything else
/// written for `AsyncRead` / `AsyncWrite`.
///
/// Framing: each `poll_write` sends up to [`Connection::max_message`](super::Connection::max_message) bytes as one message; reads
/// return the messages' bytes in order, a message across several reads if the caller's
/// buffer is smaller, so the stream carries bytes exactly as TCP does (boundaries are not
/// kept). `poll_flush` waits until every message sent so far is in the peer's receive
/// buffers. `poll_shutdown` flushes, then disconnects (RDMA has no half close: both
/// directions end) and waits for the peer's answer. A read returns end of file (0 bytes)
/// once the peer disconnected and every message it sent before was read; a connection
/// that failed gives the error instead (e.g. `ConnectionReset` after a retry timeout).
///
/// ```no_run
/// # async fn f(c: rdmacm::Connection) -> std::io::Result<()> {
/// use tokio::io::AsyncWriteExt;
/// let mut s = c.into_stream();
/// let mut file = &b"a file's bytes"[..];
/// tokio::io::copy(&mut file, &mut s).await?;
/// s.shutdown().await?; // every byte landed, then DREQ
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RdmaStream {
    conn: Connection,
    /// `poll_shutdown` disconnected already.
    shut: bool,
}

impl Connection {
    /// This connection as a byte stream ([`RdmaStream`]).
    pub fn into_stream(self) -> RdmaStream {
        RdmaStream {
            conn: self,
            shut: false,
        }
    }
}

impl RdmaStream {
    /// The connection (for its addresses, [`Connection::closed`], one-sided operations).
    pub fn get_ref(&self) -> &Connection {
        &self.conn
    }

    /// The connection back.
    pub fn into_inner(self) -> Connection {
        self.conn
    }

    fn poll_flushed(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let sh = &self.conn.sh;
        loop {
            {
                let mut st = sh.lock();
                if st.sends_idle() {
                    return Poll::Ready(Ok(()));
                }
                if let Some(why) = &st.closed {
                    return Poll::Ready(Err(io_error(Error::Closed(why.clone()))));
                }
                sh.fence(&mut st);
                st.register(cx.waker());
            }
            if sh.poll_completions(cx, self.conn.id()).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl AsyncRead for RdmaStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let sh = &self.conn.sh;
        loop {
            {
                let mut st = sh.lock();
                let dst = buf.initialize_unfilled();
                match sh.take_front(&mut st, dst, false) {
                    Some(Ok((0, _))) => continue, // an empty message: no bytes, not EOF
                    Some(Ok((n, _))) => {
                        buf.advance(n);
                        return Poll::Ready(Ok(()));
                    }
                    Some(Err(e)) => return Poll::Ready(Err(io_error(e))),
                    None => {}
                }
                match &st.closed {
                    Some(CloseReason::PeerDisconnected | CloseReason::LocalDisconnect) => {
                        return Poll::Ready(Ok(()))
                    }
                    Some(why) => return Poll::Ready(Err(io_error(Error::Closed(why.clone())))),
                    None => st.register(cx.waker()),
                }
            }
            if sh.poll_completions(cx, self.conn.id()).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl AsyncWrite for RdmaStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = data.len().min(self.conn.sh.max_message);
        let sh = &self.conn.sh;
        loop {
            {
                let mut st = sh.lock();
                if st.closed.is_some() {
                    return Poll::Ready(Err(io_error(Error::NotConnected)));
                }
                if st.data_credits > 0 && !st.free_send.is_empty() {
                    return Poll::Ready(
                        sh.post_message(&mut st, &data[..n])
                            .map(|()| n)
                            .map_err(io_error),
                    );
                }
                st.register(cx.waker());
            }
            if sh.poll_completions(cx, self.conn.id()).is_pending() {
                return Poll::Pending;
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flushed(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if !me.shut {
            match me.poll_flushed(cx) {
                Poll::Pending => return Poll::Pending,
                // Closed already: nothing left to flush; disconnect all the same.
                Poll::Ready(_) => {}
            }
            me.shut = true;
            let sh = &me.conn.sh;
            {
                let mut st = sh.lock();
                sh.close(&mut st, CloseReason::LocalDisconnect);
            }
            if let Some(id) = me.conn.id() {
                sh.disconnect_id(id);
            }
        }
        // DISCONNECTED comes with the peer's DREP or the DREQ's last retry.
        let mut st = me.conn.sh.lock();
        if st.disconnected {
            return Poll::Ready(Ok(()));
        }
        st.register(cx.waker());
        Poll::Pending
    }
}
