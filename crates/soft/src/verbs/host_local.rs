//! The verbs side of the host-local wire ([`crate::io::local`]): a device's identity, and
//! the per-QP choice its connection manager makes.

use super::device::Device;
use super::qp::QueuePair;
use crate::io::HostPeer;
use crate::{Error, Result};

impl Device {
    /// The device's host-local identity ([`crate::io::local`]), set up now if not yet: what
    /// its CM announces as its CA GUID ([`HostPeer::guid`]). `None` when the wire has no
    /// host-local channel (`RDMA_SOFT_LOCAL_WIRE=0`, fault injection on, not sharing).
    ///
    /// ```
    /// use rdma_soft::verbs::{Device, DeviceConfig};
    /// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
    /// let me = dev.host_local().expect("on by default");
    /// assert_eq!(Some(me), rdma_soft::io::HostPeer::from_guid(me.guid()));
    /// assert_eq!(dev.host_local(), Some(me), "one identity per device");
    /// ```
    pub fn host_local(&self) -> Option<HostPeer> {
        self.shared().runtime().host_local()
    }
}

impl QueuePair {
    /// From now on, this RC QP's packets go to `peer` (the wire of the process at the
    /// other end, on this host) through shared memory instead of UDP: what a CM calls before
    /// RTR when the peer announced itself host-local and the route is local. Both ends
    /// choose for their own direction; the receiving end takes packets from either path.
    /// An error (the peer's wire is gone, or this device has none) leaves the QP on UDP.
    ///
    /// ```
    /// use rdma_soft::io::HostPeer;
    /// use rdma_soft::verbs::{Device, DeviceConfig, QpInitAttr};
    /// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
    /// let (pd, cq) = (dev.alloc_pd().unwrap(), dev.create_cq(16, None).unwrap());
    /// let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    /// let nobody = HostPeer { nonce: 1, ..dev.host_local().unwrap() };
    /// assert!(qp.use_host_local(nobody).is_err()); // no wire answers at that name
    /// assert_eq!(qp.host_peer(), None);
    /// ```
    pub fn use_host_local(&self, peer: HostPeer) -> Result<()> {
        if self.is_ud() {
            return Err(Error::InvalidArgument(
                "the host-local wire carries RC QPs only",
            ));
        }
        self.device().runtime().set_host_peer(self.qpn(), peer)
    }

    /// The host-local peer this QP sends to, if it uses the host-local wire.
    pub fn host_peer(&self) -> Option<HostPeer> {
        let mut rt = self.device().runtime();
        rt.host_peer(self.qpn())
    }
}
