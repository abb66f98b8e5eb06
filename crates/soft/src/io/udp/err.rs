//! ICMP errors for the GSI's MADs: "port unreachable" for a MAD we sent says that no
//! RoCEv2 stack listens at that address any more (our peer process ended, and no other
//! process of its user shares the address). The socket MADs leave from (QP1's source port,
//! as Linux rxe's) asks for such errors (`IP_RECVERR` / `IPV6_RECVERR`) and sits in the
//! wire's epoll set for its error event only; a receive round that found nothing drains its
//! error queue (reading it also clears the socket's pending error, which a send would
//! otherwise fail with), and each port unreachable for port 4791 is kept here until the
//! runtime hands it to the GSI ([`crate::verbs::Device::gsi_unreachable`]): the connection
//! manager ends a disconnect that waits for a DREP from nobody (Linux's kernel CM would
//! have answered, whether or not the application was still there). A receive on a 4791
//! socket that fails with an ICMP-made error drains that socket's queue the same way.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::io::sys::{self, CmsgBuf};
use crate::io::WireAddr;

/// Unreachable notices kept at most (older ones are dropped: the CM's retries cover them).
const KEPT: usize = 64;

/// Entries read from one socket's error queue per receive error, at most.
const DRAIN: usize = 64;

/// The ICMP "port unreachable" notices of a wire, oldest first, and the sockets whose
/// error queues are looked at for them besides the 4791 sockets: those the GSI's MADs
/// leave from (their source port is QP1's, as Linux rxe's: the host answers there).
#[derive(Debug, Default)]
pub(crate) struct Unreachable {
    queue: VecDeque<(WireAddr, WireAddr)>,
    /// The GSI's source-port sockets: (fd, its address).
    watched: Vec<(i32, WireAddr)>,
}

impl Unreachable {
    /// Watches `fd`, a GSI source-port socket of `local`, for ICMP errors: asks for them
    /// (`IP_RECVERR`) and adds it to the wire's `epoll` edge-triggered with no event but the
    /// error one, so that an error wakes the wire's sleeper once ([`Unreachable::check`]
    /// reads it; the kernel drops the entry when the socket closes).
    pub fn watch(&mut self, epoll: BorrowedFd<'_>, fd: BorrowedFd<'_>, local: WireAddr) {
        let raw = fd.as_raw_fd();
        let (level, name) = if local.ip().is_ipv6() {
            (libc::IPPROTO_IPV6, libc::IPV6_RECVERR)
        } else {
            (libc::IPPROTO_IP, libc::IP_RECVERR)
        };
        let added = sys::setsockopt_int(raw, level, name, 1).is_ok()
            && crate::fd::epoll_ctl(
                epoll,
                libc::EPOLL_CTL_ADD,
                raw,
                libc::EPOLLET as u32,
                raw as u64,
            )
            .is_ok();
        self.watched.retain(|&(f, _)| f != raw);
        if added {
            self.watched.push((raw, local));
        } else {
            tracing::debug!(%local, "GSI source-port socket not watched for ICMP errors");
        }
    }

    /// Reads the watched sockets' error queues (a receive round that found nothing: the
    /// wake-up may have been an error). One system call per watched socket, none without.
    /// A watched socket closed since (evicted from its port table) fails the read, or its
    /// number now names another socket, whose queue holds nothing or the same kind of
    /// notices.
    pub fn check(&mut self, port: u16) {
        for k in 0..self.watched.len() {
            let (fd, local) = self.watched[k];
            for _ in 0..DRAIN {
                match recv_icmp_error(fd) {
                    Some(e) => self.note(local, port, &e),
                    None => break,
                }
            }
        }
    }

    fn note(&mut self, local: WireAddr, port: u16, e: &IcmpError) {
        if e.port_unreachable && e.dest.1 == port {
            tracing::debug!(%local, remote = %e.dest.0, "ICMP port unreachable");
            self.push(local, e.dest.0);
        }
    }

    /// The next notice: (our address, the peer address no one listens on).
    pub fn pop(&mut self) -> Option<(WireAddr, WireAddr)> {
        self.queue.pop_front()
    }

    fn push(&mut self, local: WireAddr, remote: WireAddr) {
        if self.queue.iter().any(|&n| n == (local, remote)) {
            return;
        }
        if self.queue.len() >= KEPT {
            self.queue.pop_front();
        }
        self.queue.push_back((local, remote));
    }

    /// After a receive on `fd` (bound to `local`, port `port`) failed with `err`: drains
    /// the socket's error queue, keeping port unreachables for `port`. Returns whether the
    /// error was an ICMP error (the receive goes on), else it is the caller's to report.
    pub fn on_recv_error(
        &mut self,
        fd: BorrowedFd<'_>,
        local: WireAddr,
        port: u16,
        err: &std::io::Error,
    ) -> bool {
        let mut any = false;
        for _ in 0..DRAIN {
            match recv_icmp_error(fd.as_raw_fd()) {
                Some(e) => {
                    any = true;
                    self.note(local, port, &e);
                }
                None => break,
            }
        }
        any || matches!(
            err.raw_os_error(),
            Some(
                libc::ECONNREFUSED
                    | libc::EHOSTUNREACH
                    | libc::ENETUNREACH
                    | libc::EHOSTDOWN
                    | libc::EMSGSIZE
                    | libc::EPROTO
                    | libc::ENOPROTOOPT
            )
        )
    }
}

/// One entry of a socket's error queue.
struct IcmpError {
    /// The destination of the datagram the error is about.
    dest: (WireAddr, u16),
    /// ICMP destination unreachable, port unreachable (v4 type 3 code 3, v6 type 1 code 4).
    port_unreachable: bool,
}

/// Reads one entry of `fd`'s error queue (`MSG_ERRQUEUE`, not blocking); `None` when empty.
fn recv_icmp_error(fd: i32) -> Option<IcmpError> {
    let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut ctrl = CmsgBuf::<256>::new();
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: byte.len(),
    };
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl.as_mut_ptr();
    msg.msg_controllen = CmsgBuf::<256>::LEN as _;
    // SAFETY: `msg` points to live buffers of the sizes it states.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
    if n < 0 {
        return None;
    }
    let dest =
        sys::from_sockaddr(&name).unwrap_or((WireAddr::from(std::net::Ipv4Addr::UNSPECIFIED), 0));
    let mut port_unreachable = false;
    for c in ctrl.messages(msg.msg_controllen) {
        let recverr = (c.level == libc::SOL_IP && c.kind == libc::IP_RECVERR)
            || (c.level == libc::SOL_IPV6 && c.kind == libc::IPV6_RECVERR);
        if !recverr || c.data.len() < std::mem::size_of::<libc::sock_extended_err>() {
            continue;
        }
        // struct sock_extended_err: origin, ICMP type and code are bytes
        let at = |off: usize| c.data[off];
        use std::mem::offset_of;
        let origin = at(offset_of!(libc::sock_extended_err, ee_origin));
        let (ty, code) = (
            at(offset_of!(libc::sock_extended_err, ee_type)),
            at(offset_of!(libc::sock_extended_err, ee_code)),
        );
        port_unreachable |= match origin {
            libc::SO_EE_ORIGIN_ICMP => ty == 3 && code == 3,
            libc::SO_EE_ORIGIN_ICMP6 => ty == 1 && code == 4,
            _ => false,
        };
    }
    Some(IcmpError {
        dest,
        port_unreachable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;

    /// A datagram from a watched socket to a loopback port nobody binds comes back as a
    /// port unreachable, which wakes the epoll once and which `check` keeps (loopback ICMP
    /// is not rate limited).
    #[test]
    fn a_port_unreachable_is_kept() {
        let local: WireAddr = "127.0.0.1".parse().unwrap();
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_nonblocking(true).unwrap();
        let epoll = crate::fd::epoll_create().unwrap();
        let mut u = Unreachable::default();
        u.watch(epoll.as_fd(), sock.as_fd(), local);
        // a port nobody uses: bind one and close it
        let port = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        u.check(port);
        assert_eq!(u.pop(), None, "nothing yet");
        sock.send_to(b"x", ("127.0.0.1", port)).unwrap();
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
        let n = crate::fd::epoll_wait(epoll.as_fd(), &mut ev, 5000).unwrap();
        assert_eq!(n, 1, "the error wakes the epoll");
        assert_ne!(ev[0].events & libc::EPOLLERR as u32, 0);
        u.check(port);
        assert_eq!(u.pop(), Some((local, local)));
        assert_eq!(u.pop(), None);
        // drained, and edge-triggered: no second wake-up
        let n = crate::fd::epoll_wait(epoll.as_fd(), &mut ev, 0).unwrap();
        assert_eq!(n, 0);
    }

    /// A connected socket whose earlier datagram drew ICMP port unreachable: the next send
    /// reports that error and sends nothing; `send_all` sends it again, so no datagram of
    /// its own is lost to an answer meant for another.
    #[test]
    fn an_earlier_port_unreachable_costs_no_datagram() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        sock.connect(("127.0.0.1", port)).unwrap();
        sock.send(b"first").unwrap();
        // the ICMP answer is queued on the socket (loopback: at once); wait until it is
        let mut pfd = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: 0,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, 5000) };
        assert_ne!(pfd.revents & libc::POLLERR, 0, "no ICMP error pending");
        let mut headers = crate::io::sys::mmsg::SendHeaders::new(1, 1);
        let mut run = headers.load();
        assert!(run.message(None, b"second"));
        let out = crate::io::send_batch::send_all(sock.as_fd(), &mut run, &[1]);
        assert_eq!((out.sent, out.failed), (1, 0), "{:?}", out.last_error);
    }
}
