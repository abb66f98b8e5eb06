//! [`UdpConfig`]: the settings of a [`crate::io::UdpWire`].

use crate::io::fault::FaultSpec;

/// The IANA port of RoCEv2.
pub const ROCE_PORT: u16 = 4791;

/// Settings of a [`crate::io::UdpWire`].
///
/// ```
/// let cfg = rdma_soft::io::UdpConfig::default();
/// assert_eq!(cfg.port, 4791);
/// assert!(cfg.faults.is_none());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct UdpConfig {
    /// UDP port to bind and to send to (4791; tests may pick another to run beside a real
    /// RoCEv2 stack).
    pub port: u16,
    /// Datagrams per `sendmmsg`/`recvmmsg`.
    pub batch: usize,
    /// Largest datagram: a 4096-byte payload with every transport header and the ICRC fits.
    pub max_packet: usize,
    /// Requested `SO_RCVBUF`/`SO_SNDBUF` (the kernel caps it at `rmem_max`/`wmem_max`).
    pub socket_buffer: usize,
    /// Fault injection, off when `None`.
    pub faults: Option<FaultSpec>,
    /// UDP GSO on send (`UDP_SEGMENT`): consecutive packets to one peer that have the same
    /// size (the last may be shorter) go as one message the kernel segments, each segment
    /// sealed with the ICRC of the IPv4 Identification it gets. Used where the kernel has it
    /// and no send faults are injected; off after the kernel refuses a GSO message.
    pub gso: bool,
    /// UDP GRO on receive (`UDP_GRO`): the kernel hands over up to 64 KiB of one flow's
    /// datagrams in one receive, which the wire splits (segment k checked for IPv4
    /// Identification k, as a GSO sender seals it). The receive buffers then take 64 KiB each
    /// (2 MiB for a batch of 32). `RDMA_SOFT_GRO=off` turns it off.
    pub gro: bool,
    /// Share each address with the other processes of this user (`SO_REUSEPORT` group,
    /// steered by QPN and CM fields: [`crate::io::share`]). Off: the wire holds UDP `port`
    /// on its addresses alone, and a second wire gets [`crate::Error::AddrInUse`].
    pub share: bool,
    /// The host-local wire ([`crate::io::local`]) for QPs whose peer is one of our processes on
    /// this host; needs `share`, and is not used while faults are injected (they apply to
    /// UDP only). `RDMA_SOFT_LOCAL_WIRE=off` turns it off.
    pub host_local: bool,
    /// Bytes per host-local ring (`RDMA_SOFT_LOCAL_RING`).
    pub local_ring: usize,
    /// The shortest WRITE pulled from the peer's region over the host-local wire, and the
    /// smallest region `ProtectionDomain::alloc` shares (`RDMA_SOFT_LOCAL_PULL`; `None`:
    /// pulls off). See `pull.rs`.
    pub local_pull: Option<u32>,
    /// Move a buffer the application registers in place
    /// (`ProtectionDomain::register_raw`, the C ABI's `ibv_reg_mr`) onto a region file
    /// when pulls are on and it is page-aligned private anonymous memory of at least the
    /// pull minimum, so that its WRITEs and SENDs are pulled too (`RDMA_SOFT_PULL_IN_PLACE`; default
    /// on). See `verbs/in_place.rs`.
    pub pull_in_place: bool,
    /// Where the process's runtime directory (slots, groups, claims, bells) is chosen from
    /// when this wire is the first to need it (`RDMA_SOFT_RUNDIR`, `$XDG_RUNTIME_DIR`: set
    /// by [`crate::SoftConfig::from_env`]; the default: the usual places without
    /// `$XDG_RUNTIME_DIR`). The process has one: [`crate::io::share::choose_runtime_dir`].
    pub runtime_dir: crate::io::RuntimeDirChoice,
}

impl Default for UdpConfig {
    fn default() -> UdpConfig {
        UdpConfig {
            port: ROCE_PORT,
            batch: 32,
            max_packet: 4096 + 128,
            socket_buffer: 4 << 20,
            faults: None,
            gso: true,
            gro: true,
            share: true,
            host_local: true,
            local_ring: crate::io::local::DEFAULT_RING,
            local_pull: Some(crate::PULL_DEFAULT_MIN),
            pull_in_place: true,
            runtime_dir: Default::default(),
        }
    }
}

impl UdpConfig {
    /// The shortest WRITE this wire's host-local QPs pull, and the smallest region a PD
    /// allocates shared; `None` when pulls are off or the host-local wire is.
    pub fn pull_min(&self) -> Option<u32> {
        self.local_pull.filter(|_| self.host_local)
    }

    /// The smallest buffer the application registers that is moved onto a region file
    /// in place ([`UdpConfig::pull_in_place`]); `None` when none is.
    pub fn in_place_min(&self) -> Option<u32> {
        self.pull_min().filter(|_| self.pull_in_place)
    }
}
