//! Request/response exchanges with the kernel's rtnetlink, on one socket per [`HostView`].
//!
//! The kernel answers an rtnetlink request inside the `send` that carries it
//! (`netlink_unicast` → `rtnetlink_rcv_msg` runs in the sender's context and queues the reply
//! on our socket before `send` returns; a dump's further parts are produced by the `recv`
//! calls that read it). So an exchange is a `send` and `recv`s that find their data already
//! queued: it needs no runtime task, no wake-up of another thread and no waiting, and the
//! `async` functions built on it complete when first polled. Should a `recv` ever find nothing
//! (it should not), it waits in `poll(2)` for at most [`STALL_LIMIT`] before failing with
//! `EIO`.
//!
//! [`HostView`]: crate::HostView

use std::sync::Mutex;
use std::time::Duration;

use netlink_packet_core::{
    NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP,
    NLMSG_OVERRUN, NLM_F_ACK, NLM_F_DUMP, NLM_F_MULTIPART, NLM_F_REQUEST,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use crate::error::{Error, Result};

/// Longest wait for an answer the kernel should already have queued.
pub(crate) const STALL_LIMIT: Duration = Duration::from_secs(5);

/// Receive buffer: larger than any datagram the kernel builds for us (a dump part is at most
/// 32 KiB unless the reader offers more).
const RECV_BUF: usize = 64 * 1024;

/// One NETLINK_ROUTE socket for request/response exchanges, used by one exchange at a time
/// (the mutex is held for a send and its answers: a few µs).
#[derive(Debug)]
pub(crate) struct Requester {
    inner: Mutex<State>,
}

#[derive(Debug)]
struct State {
    sock: Socket,
    seq: u32,
    port: u32,
    buf: Vec<u8>,
    out: Vec<u8>,
    /// Dump requests sent (link, address, route, neighbour lists).
    dumps: u64,
}

impl Requester {
    /// Opens the socket in the calling thread's network namespace.
    pub(crate) fn new() -> Result<Requester> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        let addr = sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        sock.set_non_blocking(true)?;
        // Extended ACKs are not parsed; strict checking would change what old dumps accept.
        Ok(Requester {
            inner: Mutex::new(State {
                sock,
                seq: 0,
                port: addr.port_number(),
                buf: vec![0; RECV_BUF],
                out: Vec::with_capacity(256),
                dumps: 0,
            }),
        })
    }

    /// Dump requests sent on this socket so far.
    pub(crate) fn dumps(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).dumps
    }

    /// Sends `msg` with `NLM_F_REQUEST | flags` and collects the answers (a dump's parts, the
    /// single reply of a get, nothing for a bare ACK). A NACK becomes [`Error::from_errno`].
    pub(crate) fn request(
        &self,
        op: &'static str,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        let mut answers = Vec::new();
        self.exchange(op, msg, flags, |header, payload| {
            let m = RouteNetlinkMessage::deserialize(header, payload)
                .map_err(|e| Error::Netlink(format!("{op}: {e}")))?;
            answers.push(m);
            Ok(())
        })?;
        Ok(answers)
    }

    /// The exchange behind [`Requester::request`], handing each answer's header and raw
    /// payload to `each` instead of parsing it (for callers that read a few attributes).
    /// Every part of the answer is read from the socket even after `each` fails.
    pub(crate) fn exchange(
        &self,
        op: &'static str,
        msg: RouteNetlinkMessage,
        flags: u16,
        mut each: impl FnMut(&NetlinkHeader, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut r = self.exchange_many(op, vec![(msg, flags)], |_, h, p| each(h, p))?;
        r.pop()
            .unwrap_or_else(|| Err(Error::Netlink(format!("{op}: no answer"))))
    }

    /// Several requests in one datagram: the kernel handles the messages of a datagram one
    /// after the other within the `send` (at most one may be a dump), and the answers come
    /// back in that order, matched here by sequence number. `each` gets the index of the
    /// request an answer belongs to. The outer error is a socket failure; the inner results
    /// are the requests' own (a NACK, or the first error `each` returned for it).
    pub(crate) fn exchange_many(
        &self,
        op: &'static str,
        msgs: Vec<(RouteNetlinkMessage, u16)>,
        mut each: impl FnMut(usize, &NetlinkHeader, &[u8]) -> Result<()>,
    ) -> Result<Vec<Result<()>>> {
        let n = msgs.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut st = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *st;
        let base = st.seq.wrapping_add(1);
        st.out.clear();
        let mut kinds = Vec::with_capacity(n);
        for (msg, flags) in msgs {
            st.seq = st.seq.wrapping_add(1);
            let mut req = NetlinkMessage::from(msg);
            req.header.flags = NLM_F_REQUEST | flags;
            req.header.sequence_number = st.seq;
            req.header.port_number = st.port;
            req.finalize();
            let at = st.out.len();
            st.out.resize(at + ((req.buffer_len() + 3) & !3), 0);
            req.serialize(&mut st.out[at..]);
            kinds.push((flags & NLM_F_DUMP == NLM_F_DUMP, flags & NLM_F_ACK != 0));
        }
        let sent = st.sock.send(&st.out, 0).map_err(Error::Io)?;
        st.dumps += kinds.iter().filter(|(dump, _)| *dump).count() as u64;
        if sent != st.out.len() {
            return Err(Error::Netlink(format!("{op}: short send")));
        }
        let mut done: Vec<Option<Result<()>>> = (0..n).map(|_| None).collect();
        let mut failed: Vec<Option<Error>> = (0..n).map(|_| None).collect();
        let mut open = n;
        while open > 0 {
            let got = recv(&st.sock, &mut st.buf, op)?;
            let mut off = 0;
            while off < got {
                let part = st.buf.get(off..got).unwrap_or_default();
                let (header, payload) =
                    split(part).ok_or_else(|| Error::Netlink(format!("{op}: malformed answer")))?;
                // Messages are 4-byte aligned; split guarantees length >= 16.
                off += (header.length as usize + 3) & !3;
                let i = header.sequence_number.wrapping_sub(base) as usize;
                let (Some((dump, ack)), Some(None)) = (kinds.get(i).copied(), done.get(i)) else {
                    continue; // the rest of an abandoned earlier exchange
                };
                let finished = match header.message_type {
                    NLMSG_DONE => Some(Ok(())),
                    NLMSG_ERROR => {
                        let code = payload
                            .get(..4)
                            .and_then(|b| b.try_into().ok())
                            .map(i32::from_ne_bytes)
                            .ok_or_else(|| Error::Netlink(format!("{op}: short NLMSG_ERROR")))?;
                        Some(match code {
                            0 => Ok(()),
                            c => Err(Error::from_errno(op, c)),
                        })
                    }
                    NLMSG_NOOP | NLMSG_OVERRUN => None,
                    _ => {
                        if failed[i].is_none() {
                            failed[i] = each(i, &header, payload).err();
                        }
                        let multi = header.flags & NLM_F_MULTIPART != 0;
                        (!multi && !dump && !ack).then_some(Ok(()))
                    }
                };
                if let Some(r) = finished {
                    done[i] = Some(match (r, failed[i].take()) {
                        (Ok(()), Some(e)) => Err(e),
                        (r, _) => r,
                    });
                    open -= 1;
                }
            }
        }
        Ok(done
            .into_iter()
            .map(|d| d.unwrap_or_else(|| Err(Error::Netlink(format!("{op}: no answer")))))
            .collect())
    }
}

/// The header and payload of the first message in `b`; `None` if it is cut short.
fn split(b: &[u8]) -> Option<(NetlinkHeader, &[u8])> {
    let u32_at = |i: usize| b.get(i..i + 4)?.try_into().ok().map(u32::from_ne_bytes);
    let u16_at = |i: usize| b.get(i..i + 2)?.try_into().ok().map(u16::from_ne_bytes);
    let length = u32_at(0)?;
    let len = length as usize;
    if len < 16 {
        return None;
    }
    let mut h = NetlinkHeader::default();
    h.length = length;
    h.message_type = u16_at(4)?;
    h.flags = u16_at(6)?;
    h.sequence_number = u32_at(8)?;
    h.port_number = u32_at(12)?;
    Some((h, b.get(16..len)?))
}

/// The attributes (type without the nested/byte-order bits, value) of a payload after its
/// fixed header of `fixed` bytes.
pub(crate) fn attrs(payload: &[u8], fixed: usize) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = payload.get(fixed..).unwrap_or_default();
    std::iter::from_fn(move || {
        let len = usize::from(u16::from_ne_bytes(rest.get(..2)?.try_into().ok()?));
        let kind = u16::from_ne_bytes(rest.get(2..4)?.try_into().ok()?) & 0x3fff;
        let value = rest.get(4..len)?;
        rest = rest.get((len + 3) & !3..).unwrap_or_default();
        Some((kind, value))
    })
}

/// One datagram; waits (bounded) only if the kernel has not queued it yet.
fn recv(sock: &Socket, buf: &mut [u8], op: &'static str) -> Result<usize> {
    let mut waited = false;
    loop {
        let mut b: &mut [u8] = &mut buf[..];
        match sock.recv(&mut b, libc::MSG_TRUNC) {
            Ok(n) if n > buf.len() => {
                return Err(Error::Netlink(format!(
                    "{op}: answer of {n} bytes truncated"
                )))
            }
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && !waited => {
                waited = true;
                wait_readable(sock, STALL_LIMIT)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(Error::Netlink(format!("{op}: no answer")))
            }
            Err(e) => return Err(Error::Io(e)),
        }
    }
}

fn wait_readable(sock: &Socket, limit: Duration) -> Result<()> {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(limit.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid pollfd for the duration of the call.
    let r = unsafe { libc::poll(&mut pfd, 1, ms) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(Error::Io(e));
        }
    }
    Ok(())
}
