//! The passive side of an id: listen, accept, reject.

use std::net::{IpAddr, SocketAddr};

use super::{bad_state, CmId};
use crate::context::id_entry::{IdState, ListenState};
use crate::context::Inner;
use crate::error::{Error, Result};
use crate::params::ConnParam;

impl CmId {
    /// The devices a listen on `binding` listens on (a device group's members share one),
    /// each with the local addresses to open: the slow look-ups of a listen (the host
    /// view, the devices' first opening).
    fn listen_targets(
        &self,
        binding: &crate::host::resolve::Binding,
    ) -> Result<Vec<(u32, Vec<IpAddr>)>> {
        // Devices to listen on, with the local addresses to open on each.
        let mut targets: Vec<(u32, Vec<IpAddr>)> = Vec::new();
        match &binding.netdev {
            Some(nd) => targets.push((nd.index, vec![binding.addr])),
            // A wildcard opens every address of both families, as the kernel hears on all
            // of them: a request the listener does not take (the other family, AFONLY) is
            // then refused with REJ 28 as Linux does, not left unanswered.
            None => {
                let (addrs, links) = self
                    .inner
                    .block(|r| async move {
                        Ok::<_, rdma_hostview::Error>((
                            r.view().addresses().await?,
                            r.view().links().await?,
                        ))
                    })
                    .map_err(Error::from)?;
                // As Linux, on the devices there are: a netdev the configuration gives no
                // device (RDMACM_DEVICES lists others) is left out, not an error.
                let config = &self.inner.config;
                let has_device = |link: u32| {
                    links
                        .iter()
                        .find(|l| l.index == link)
                        .is_some_and(|l| config.device_of(&l.name).is_some())
                };
                let mut by: std::collections::BTreeMap<u32, Vec<IpAddr>> = Default::default();
                for a in addrs.into_iter().filter(|a| has_device(a.link)) {
                    by.entry(a.link).or_default().push(a.addr);
                }
                targets.extend(by);
            }
        }
        // By device (a device group's members share one).
        let mut by_dev: Vec<(u32, Vec<IpAddr>)> = Vec::new();
        for (link, addrs) in targets {
            let key = self.inner.ensure_device(link)?;
            match by_dev.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.extend(addrs),
                None => by_dev.push((key, addrs)),
            }
        }
        Ok(by_dev)
    }

    /// Opens, ahead of a listen, what a listen on this bound id would open (its devices and
    /// their wire addresses), so that `rdma_listen` itself is quick. For a program that
    /// tells its peer to connect between its bind and its listen (Debian's qperf 0.4.11
    /// does): the C ABI calls it after a wildcard bind. Errors are the listen's to report.
    pub fn prepare_listen(&self) -> Result<()> {
        let binding = self
            .with(|s| s.binding.clone())?
            .ok_or_else(|| bad_state("listen", IdState::Idle))?;
        let targets = self.listen_targets(&binding)?;
        let mut st = self.inner.lock();
        let st = &mut *st;
        for (i, addrs) in targets {
            for a in addrs {
                // An address that cannot be opened is the listen's to report (or skip).
                if let Err(e) = Inner::open_gsi(st, i, a) {
                    tracing::debug!(target: "rdmacm", %a, error = %e, "not opened ahead of a listen");
                }
            }
        }
        Ok(())
    }

    /// `rdma_listen`: listens for requests (binding to 0.0.0.0 first if IDLE). A specific
    /// address listens on its device and only gets requests for that address; a wildcard
    /// listens on every device. `backlog` bounds the CONNECT_REQUEST events queued and not
    /// yet taken (0: 1024); requests beyond it are dropped without an answer, as Linux does
    /// (no REJ: the requester's CM retries its REQ after its timeout, and the retry is a new
    /// request once the application has taken queued ones).
    ///
    /// An address this process cannot open (another process, of another user, holds UDP
    /// 4791 there) fails a specific listen with `EADDRINUSE`; a wildcard listener skips it,
    /// logs a warning and queues [`EventType::AddrChange`](crate::cm::EventType::AddrChange)
    /// with status `-EADDRINUSE` naming it ([`Event::addr`](crate::cm::Event::addr)), before
    /// this returns. An address that appears later is reported the same way.
    pub fn listen(&self, backlog: usize) -> Result<()> {
        tracing::debug!(target: "rdmacm", id = self.num, "listen");
        if self.state() == IdState::Idle {
            let any = self.with(|s| match s.local {
                Some(SocketAddr::V6(_)) => "[::]:0",
                _ => "0.0.0.0:0",
            })?;
            self.do_bind(
                any.parse()
                    .map_err(|_| Error::InvalidArgument("any".into()))?,
            )?;
        }
        let (binding, ps, port) = {
            let mut st = self.inner.lock();
            let st = &mut *st;
            let s = st.ids.get_mut(&self.num).ok_or(Error::Shutdown)?;
            if s.state != IdState::AddrBound {
                return Err(bad_state("listen", s.state));
            }
            (
                s.binding.clone(),
                s.ps,
                s.local.map(|l| l.port()).unwrap_or(0),
            )
        };
        let binding = binding.ok_or_else(|| bad_state("listen", IdState::Idle))?;
        let targets = self.listen_targets(&binding)?;
        let sid = rdma_wire::ip_cm::ServiceId::new(ps, port).0;
        let mut st = self.inner.lock();
        let st = &mut *st;
        // The claim (other processes' REQs for the service come here from now on) and the
        // agent's listener under one lock: this process handles no REQ in between, so none
        // is refused for want of a listener that is on its way (the slow look-ups above
        // come first for that).
        let s = st.ids.get(&self.num).ok_or(Error::Shutdown)?;
        if s.state != IdState::AddrBound {
            return Err(bad_state("listen", s.state));
        }
        if let Some(h) = s.bind {
            st.ports.listen(h)?;
        }
        let mut regs = Vec::new();
        let specific = binding.netdev.is_some();
        for (i, addrs) in targets {
            for a in addrs {
                match Inner::open_gsi(st, i, a) {
                    Ok(()) => {}
                    // A specific listener has only this address: not being able to open it
                    // (e.g. another process holds UDP 4791 there) fails the listen.
                    Err(e) if specific => return Err(e),
                    // A wildcard listener skips such an address and works on the others,
                    // saying so (warn, and ADDR_CHANGE -EADDRINUSE naming it): another user
                    // may hold UDP 4791 there and get its traffic.
                    Err(e) => Inner::listen_addr_lost(st, self.num, a, &e),
                }
            }
            let Some(d) = st.devices.get_mut(&i) else {
                continue;
            };
            let l = d.listeners.entry(sid).or_default();
            if l.is_empty() {
                d.agent.listen(sid)?;
            }
            l.push(self.num);
            regs.push((i, sid));
        }
        let s = st.ids.get_mut(&self.num).ok_or(Error::Shutdown)?;
        s.listen = Some(ListenState {
            backlog: if backlog == 0 { 1024 } else { backlog },
            queued: 0,
            regs,
        });
        s.state = IdState::Listen;
        tracing::debug!(target: "rdmacm", id = self.num, service_id = sid, "listening");
        Ok(())
    }

    /// `rdma_accept` on a passive id: moves the QP to RTR and RTS and sends the REP (RC),
    /// or sends the SIDR_REP (UD, with `param.qp_num`). Private data over 196 bytes (136
    /// for UD) is `EINVAL`. ESTABLISHED follows when the RTU arrives.
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        crate::engine::accept::accept(self.r(), param)
    }

    /// `rdma_reject` on a passive id: REJ reason 28 (consumer defined) with up to 148
    /// bytes of private data (SIDR_REP "reject" for UD).
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        crate::engine::accept::reject(self.r(), private_data)
    }
}
