//! The GSI (QP1) verbs of a device: sending and receiving MADs through the runtime's
//! [`crate::gsi`] queue.

use std::time::{Duration, Instant};

use super::Device;
use crate::gsi::{GsiLimits, GsiMad, GsiStats, GsiWaitFds, MAD_LEN};
use crate::io::{TxMeta, WireAddr};
use crate::runtime::Runtime;
use crate::{Error, Result};

impl Device {
    /// Opens the GSI (QP1) on `local`: opens UDP 4791 on that address if it is not open yet
    /// and delivers the MADs arriving there to [`Device::gsi_recv`]. Reference-counted: each
    /// call needs one [`Device::gsi_close`]; the address itself stays open while a QP of this
    /// device uses it.
    ///
    /// Errors: those of opening the address ([`Error::AddrInUse`] when another process, e.g.
    /// the kernel's rdma_rxe, holds UDP 4791 there; [`Error::AddrNotAvailable`],
    /// [`Error::ScopeRequired`]).
    pub fn gsi_open(&self, local: WireAddr) -> Result<()> {
        self.shared().runtime().gsi_open(local)
    }

    /// Undoes one [`Device::gsi_open`] of `local`; returns whether it was open. MADs already
    /// queued from that address stay queued.
    pub fn gsi_close(&self, local: WireAddr) -> bool {
        self.shared().runtime().gsi_close(local)
    }

    /// Sends `mad` from QP1 on `local` (opened with [`Device::gsi_open`], else
    /// [`Error::NotOpen`]) to QP1 at `remote`, UDP port 4791, from source port
    /// [`crate::io::flow::GSI_UDP_SPORT`] as rxe's QP1: BTH (UD SEND_ONLY, P_Key
    /// 0xFFFF, destination QP 1, AckReq, PSN from a per-device counter), DETH (Q_Key
    /// [`GSI_QKEY`](crate::gsi::GSI_QKEY), source QP 1), the MAD, ICRC. Flushed at once. A datagram the network
    /// refuses is an error here (the CM's retries cover loss in the network). IPv4 TOS /
    /// IPv6 traffic class 0: see [`Device::gsi_send_with`].
    pub fn gsi_send(&self, local: &WireAddr, remote: &WireAddr, mad: &[u8; MAD_LEN]) -> Result<()> {
        self.gsi_send_with(local, remote, TxMeta::default(), mad)
    }

    /// [`Device::gsi_send`] with the datagram's IPv4 TOS / IPv6 traffic class from `meta`
    /// (Linux's CM sends a connection's MADs with its path's traffic class, the rdma_cm id's
    /// TOS).
    pub fn gsi_send_with(
        &self,
        local: &WireAddr,
        remote: &WireAddr,
        meta: TxMeta,
        mad: &[u8; MAD_LEN],
    ) -> Result<()> {
        self.gsi_send_flushed(local, remote, meta, mad, true)
    }

    /// [`Device::gsi_send_with`] without the flush: the MAD waits in the wire's send batch
    /// for [`Device::gsi_flush`] (or for a full batch, or the device's next flush), so that
    /// the MADs of one round leave in one system call.
    ///
    /// ```no_run
    /// # fn f(d: &rdma_soft::verbs::Device, la: rdma_soft::io::WireAddr,
    /// #      lb: rdma_soft::io::WireAddr, mads: &[[u8; 256]]) -> rdma_soft::Result<()> {
    /// for m in mads {
    ///     d.gsi_queue_with(&la, &lb, rdma_soft::io::TxMeta::default(), m)?;
    /// }
    /// d.gsi_flush()?;
    /// # Ok(()) }
    /// ```
    pub fn gsi_queue_with(
        &self,
        local: &WireAddr,
        remote: &WireAddr,
        meta: TxMeta,
        mad: &[u8; MAD_LEN],
    ) -> Result<()> {
        self.gsi_send_flushed(local, remote, meta, mad, false)
    }

    /// Sends the MADs [`Device::gsi_queue_with`] queued (with anything else the wire holds).
    pub fn gsi_flush(&self) -> Result<()> {
        self.gsi_locked(|rt| rt.gsi_flush())
    }

    fn gsi_send_flushed(
        &self,
        local: &WireAddr,
        remote: &WireAddr,
        meta: TxMeta,
        mad: &[u8; MAD_LEN],
        flush: bool,
    ) -> Result<()> {
        self.gsi_locked(|rt| {
            rt.gsi_queue(*local, *remote, meta.tclass, mad)?;
            if flush {
                rt.gsi_flush()?;
            }
            Ok(())
        })
    }

    /// Runs `f` on the locked runtime; a MAD the fault injector holds back meanwhile is
    /// released by the engine, woken for it.
    fn gsi_locked(&self, f: impl FnOnce(&mut Runtime) -> Result<()>) -> Result<()> {
        let shared = self.shared();
        let mut rt = shared.runtime();
        let r = f(&mut rt);
        if let Some(t) = rt.post_deadline(0) {
            shared.wake_by(t);
        }
        r
    }

    /// The next received MAD, if any. When none is queued it drives the device once (receives
    /// what the wire has, like [`Device::progress`]) and looks again. `Ok(None)`: nothing
    /// arrived; wait with [`Device::gsi_wait`] or on [`Device::gsi_wait_fds`].
    pub fn gsi_recv(&self) -> Result<Option<GsiMad>> {
        let shared = self.shared();
        let mut rt = shared.runtime();
        if let Some(m) = rt.gsi_mut().pop() {
            return Ok(Some(m));
        }
        shared.progress_locked(&mut rt)?;
        Ok(rt.gsi_mut().pop())
    }

    /// The next peer address no one listens at any more: (our GSI address, the peer's), when
    /// a MAD sent there came back as ICMP port unreachable (its process ended and no other
    /// process of its user shares the address). Linux's CM lives in the kernel and always
    /// answers; here, the peer's CM went with its process, so the connection manager ends
    /// what waits for that peer's answer (a DREQ's DREP) instead of retrying. Queued with
    /// the MADs: the GSI eventfd is readable while one waits; [`Device::gsi_recv`] receives
    /// them too.
    pub fn gsi_unreachable(&self) -> Option<(WireAddr, WireAddr)> {
        self.shared().runtime().gsi_mut().pop_unreachable()
    }

    /// The fds that become readable when [`Device::gsi_recv`] may have something: the GSI
    /// eventfd (MADs are queued: the one to wait on) and the wire's (datagrams arrived that
    /// the engine has not processed yet). Valid as long as the device lives.
    pub fn gsi_wait_fds(&self) -> GsiWaitFds {
        GsiWaitFds {
            wire: self.shared().wait_fd(),
            event: self.shared().gsi_event_fd(),
        }
    }

    /// Blocks until a MAD is queued (the progress engine receives it) or `timeout` passes
    /// (`None`: no limit); returns at once when MADs are queued. Then call
    /// [`Device::gsi_recv`] (a wake-up does not promise a MAD).
    pub fn gsi_wait(&self, timeout: Option<Duration>) -> Result<()> {
        let shared = self.shared();
        if !shared.runtime().gsi_mut().is_empty() {
            return Ok(());
        }
        let until = timeout.and_then(|t| Instant::now().checked_add(t));
        crate::wait::wait_fds(&[self.gsi_wait_fds().event], until)
    }

    /// Sets the bounds of the GSI receive queue (both at least 1, else
    /// [`Error::InvalidArgument`]). MADs already queued stay.
    pub fn gsi_set_limits(&self, limits: GsiLimits) -> Result<()> {
        if limits.queue_len == 0 || limits.per_peer == 0 || limits.queue_len > 1 << 16 {
            return Err(Error::InvalidArgument(
                "GSI limits: queue_len 1..=65536, per_peer at least 1",
            ));
        }
        self.shared().runtime().gsi_mut().set_limits(limits);
        Ok(())
    }

    /// Counters of the GSI.
    pub fn gsi_stats(&self) -> GsiStats {
        self.shared().runtime().gsi_mut().stats()
    }
}
