//! Protection domains.

use std::sync::Arc;

use rdma_proto::verbs::{AccessFlags, PdId};

use super::device::DeviceArc;
use super::mr::MemoryRegion;
use super::qp::{QpInitAttr, QueuePair};
use crate::quota::QuotaSlot;
use crate::Result;

struct PdInner {
    id: PdId,
    dev: DeviceArc,
    /// Its place among the device's live PDs.
    _slot: QuotaSlot,
}

/// A protection domain: memory regions and QPs of one PD can reach each other, no others.
/// Every region keeps its PD (and so its device) alive.
///
/// ```
/// use rdma_soft::verbs::{AccessFlags, Device, DeviceConfig};
/// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
/// let (a, b) = (dev.alloc_pd().unwrap(), dev.alloc_pd().unwrap());
/// assert_ne!(a.id(), b.id());
/// let mr = a.register(vec![1u8; 64], AccessFlags::REMOTE_READ).unwrap();
/// assert_eq!(mr.pd().id(), a.id());
/// ```
#[derive(Clone)]
pub struct ProtectionDomain {
    inner: Arc<PdInner>,
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ProtectionDomain")
            .field(&self.inner.id.0)
            .finish()
    }
}

impl ProtectionDomain {
    pub(crate) fn new(id: PdId, slot: QuotaSlot, dev: DeviceArc) -> ProtectionDomain {
        ProtectionDomain {
            inner: Arc::new(PdInner {
                id,
                dev,
                _slot: slot,
            }),
        }
    }

    /// The PD's number.
    pub fn id(&self) -> PdId {
        self.inner.id
    }

    /// Registers `buf` (any `Vec<u8>` or `Box<[u8]>`; the region owns it until deregistered)
    /// with `access`. Remote write and atomic rights need [`AccessFlags::LOCAL_WRITE`] (EINVAL
    /// otherwise, as in verbs); an empty buffer is EINVAL; past the device's `max_mr`, ENOMEM.
    /// The buffer is moved in, never copied; WRITEs from it to a peer process on this host
    /// carry their data through the host-local ring. Memory from [`ProtectionDomain::alloc`]
    /// is copied once instead ([`crate::PULL_ENV`]).
    pub fn register(&self, buf: impl Into<Box<[u8]>>, access: AccessFlags) -> Result<MemoryRegion> {
        MemoryRegion::register(self, &self.inner.dev.mrs, buf.into(), access)
    }

    /// Registers `len` bytes at `addr` that the caller owns (the C ABI's `ibv_reg_mr`): the
    /// device reads and writes them in place, atomically per byte or aligned word, as for
    /// [`ProtectionDomain::register`]. Dropping the region deregisters it and leaves the
    /// memory to the caller; [`MemoryRegion::deregister`] gives back an empty buffer.
    /// Errors as [`ProtectionDomain::register`], and EINVAL for a NULL `addr`.
    ///
    /// While the host-local wire pulls WRITEs ([`crate::PULL_ENV`],
    /// [`crate::PULL_IN_PLACE_ENV`]), a range of at least the pull minimum that is
    /// page-aligned private anonymous memory is moved onto a region file at the same
    /// addresses, with the same bytes, so that peer processes on this host pull WRITEs and SENDs
    /// from it; deregistered, it is private anonymous memory again with its bytes (and
    /// `MADV_DONTFORK` meanwhile). The bytes are copied at both ends: a write to the range
    /// by another thread during this call or the deregistration may be lost.
    ///
    /// # Safety
    /// `addr` must be valid for reads and writes of `len` bytes for as long as the region is
    /// registered (until the [`MemoryRegion`] and every work request using it are gone), and
    /// the caller must not rely on the bytes staying unchanged while a peer may write them.
    /// Nothing else may unmap or remap the range while it is registered.
    ///
    /// ```
    /// use rdma_soft::verbs::{AccessFlags, Device, DeviceConfig};
    /// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
    /// let pd = dev.alloc_pd().unwrap();
    /// let mut buf = vec![0u8; 64];
    /// // SAFETY: `buf` outlives the region.
    /// let mr = unsafe { pd.register_raw(buf.as_mut_ptr(), buf.len(), AccessFlags::LOCAL_WRITE) }.unwrap();
    /// assert_eq!(mr.addr(), buf.as_ptr() as u64);
    /// mr.write(0, b"in place").unwrap();
    /// drop(mr);
    /// assert_eq!(&buf[..8], b"in place");
    /// ```
    #[allow(unsafe_code)]
    pub unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        // SAFETY: forwarded from the caller.
        unsafe { MemoryRegion::register_raw(self, &self.inner.dev.mrs, addr, len, access) }
    }

    /// Registers `len` zero bytes that the region allocates itself: the usual way to get
    /// registered memory. Of 16 KiB or more it lives in shared memory while the host-local
    /// wire is on (no copy, whatever its size; 256 such regions per process at most, then
    /// private memory), so that WRITEs from it to a peer process on this host are copied
    /// once ([`crate::PULL_ENV`]). Errors as
    /// [`ProtectionDomain::register`]; [`MemoryRegion::deregister`] gives the bytes back as a
    /// buffer.
    ///
    /// ```
    /// use rdma_soft::verbs::{AccessFlags, Device, DeviceConfig};
    /// let dev = Device::open(DeviceConfig::for_netdev("lo").unwrap()).unwrap();
    /// let pd = dev.alloc_pd().unwrap();
    /// let mr = pd.alloc(1 << 20, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
    /// mr.write(5, b"hi").unwrap();
    /// let back = mr.deregister().unwrap();
    /// assert_eq!((back.len(), &back[4..8]), (1 << 20, &[0, b'h', b'i', 0][..]));
    /// assert!(pd.alloc(0, AccessFlags::LOCAL_WRITE).is_err());
    /// ```
    pub fn alloc(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion> {
        MemoryRegion::alloc(self, &self.inner.dev.mrs, len, access)
    }

    /// `ibv_create_qp`: a QP in this PD, in the Reset state, with a fresh QP number. Its CQs
    /// must be of this device and its SRQ of this PD (EINVAL otherwise); RC or UD (UD without
    /// SRQ).
    /// See [`QueuePair`] for an example.
    pub fn create_qp(&self, init: &QpInitAttr<'_>) -> Result<QueuePair> {
        QueuePair::create(self, init)
    }

    /// `ibv_create_ah`: an address handle from the GID at `attr.sgid_index` of the device to
    /// `attr.dgid` (same IP family; EINVAL otherwise or beyond the GID table). It opens UDP
    /// 4791 on the source address. `traffic_class` is sent as the IPv4 TOS / IPv6 traffic
    /// class of every datagram; `hop_limit` and `flow_label` are not applied yet (the
    /// kernel's defaults are sent). See [`super::AddressHandle`].
    pub fn create_ah(&self, attr: &rdma_proto::verbs::PathAttr) -> Result<super::AddressHandle> {
        super::ud::AddressHandle::create(self, 1, attr)
    }

    /// [`ProtectionDomain::create_ah`] from the GID table of port `port` (`ah_attr.port_num`;
    /// EINVAL for a port the device lacks).
    pub fn create_ah_on(
        &self,
        port: u8,
        attr: &rdma_proto::verbs::PathAttr,
    ) -> Result<super::AddressHandle> {
        super::ud::AddressHandle::create(self, port, attr)
    }

    pub(crate) fn device(&self) -> &DeviceArc {
        &self.inner.dev
    }
}
