//! Packet capture on a test host's netdev (AF_PACKET, needs root): what really went on the
//! wire, for tests that check header bytes (TOS, ports) and timing of retransmissions.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// A packet socket on one netdev of the namespace of the thread that opened it. It sees
/// every IP packet of both directions from the network header on.
///
/// ```no_run
/// use rdma_testhosts::{capture::Capture, topologies};
/// let t = topologies::two_hosts_one_link().unwrap();
/// let cap = t.host("b").run(|| Capture::open("eth0")).unwrap();
/// let rec = cap.record();
/// // ... traffic ...
/// let packets = rec.stop();
/// println!("{} packets", packets.len());
/// ```
#[derive(Debug)]
pub struct Capture {
    fd: OwnedFd,
}

impl Capture {
    /// Opens a capture on `dev` (in the calling thread's namespace), with a receive timeout
    /// of 100 ms so that [`Capture::next`] returns `None` when the wire is quiet.
    pub fn open(dev: &str) -> io::Result<Capture> {
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket(2); checked below.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                i32::from(proto),
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let name = std::ffi::CString::new(dev)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "netdev name"))?;
        // SAFETY: a NUL-terminated name.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no {dev}")));
        }
        // SAFETY: an all-zero sockaddr_ll is valid; filled below.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = index as i32;
        // SAFETY: `sll` is a valid sockaddr_ll of the given size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        // SAFETY: a valid timeval for SO_RCVTIMEO.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // A burst (a 192 KiB transfer without GSO is 50 datagrams each way) must not
        // overflow the default buffer while the recording thread waits for the CPU:
        // 16 MiB, past `rmem_max` as root (SO_RCVBUFFORCE), else as much as allowed.
        let size: libc::c_int = 16 << 20;
        for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
            // SAFETY: a live int option on our socket; a refusal leaves the default.
            let rc = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&size as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as u32,
                )
            };
            if rc == 0 {
                break;
            }
        }
        Ok(Capture { fd })
    }

    /// The next packet into `buf` with the kernel's receive time of it (ns), or `None`
    /// when none came within 100 ms.
    pub fn next(&self, buf: &mut [u8]) -> Option<(usize, u64)> {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n <= 0 {
            return None;
        }
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: SIOCGSTAMPNS writes a timespec: the kernel time of the last packet read.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), 0x8907, &mut ts) };
        let at = if rc == 0 {
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
        } else {
            0
        };
        Some((n as usize, at))
    }

    /// Records every packet in a thread until [`Recording::stop`].
    pub fn record(self) -> Recording {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut buf = vec![0u8; 70_000];
            loop {
                let stopping = flag.load(Ordering::Acquire);
                match self.next(&mut buf) {
                    Some((n, _)) => out.push(buf[..n].to_vec()),
                    None if stopping => return out,
                    None => {}
                }
            }
        });
        Recording { stop, thread }
    }
}

/// A capture running in its own thread.
#[derive(Debug)]
pub struct Recording {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Vec<u8>>>,
}

impl Recording {
    /// Stops after the wire has been quiet for 100 ms; the IP packets seen.
    pub fn stop(self) -> Vec<Vec<u8>> {
        std::thread::sleep(Duration::from_millis(50));
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap_or_default()
    }
}

/// One captured RoCEv2 datagram (UDP destination port 4791).
#[derive(Debug, Clone)]
pub struct Roce {
    /// IP source.
    pub src: IpAddr,
    /// IP destination.
    pub dst: IpAddr,
    /// IPv4 TOS / IPv6 traffic class.
    pub tclass: u8,
    /// UDP source port.
    pub udp_sport: u16,
    /// BTH opcode.
    pub opcode: u8,
    /// BTH destination QP.
    pub dest_qp: u32,
    /// The CM attribute id of a MAD to QP1.
    pub cm_attr: Option<u16>,
    /// The whole packet from the IP header on.
    pub ip: Vec<u8>,
    /// The IP header's length.
    pub ip_len: usize,
}

impl Roce {
    /// The RoCEv2 datagram in an IP packet, if it is one.
    ///
    /// ```
    /// use rdma_testhosts::capture::Roce;
    /// assert!(Roce::parse(&[0x45, 0, 0]).is_none());
    /// ```
    pub fn parse(ip: &[u8]) -> Option<Roce> {
        let (src, dst, tclass, ip_len) = match ip.first()? >> 4 {
            4 if ip.len() >= 20 && ip[9] == 17 => {
                let ihl = usize::from(ip[0] & 0xf) * 4;
                let s: [u8; 4] = ip[12..16].try_into().ok()?;
                let d: [u8; 4] = ip[16..20].try_into().ok()?;
                (IpAddr::from(s), IpAddr::from(d), ip[1], ihl)
            }
            6 if ip.len() >= 40 && ip[6] == 17 => {
                let s: [u8; 16] = ip[8..24].try_into().ok()?;
                let d: [u8; 16] = ip[24..40].try_into().ok()?;
                let tc = (ip[0] << 4) | (ip[1] >> 4);
                (IpAddr::from(s), IpAddr::from(d), tc, 40)
            }
            _ => return None,
        };
        let udp = ip.get(ip_len..ip_len + 8)?;
        if udp[2..4] != 4791u16.to_be_bytes() {
            return None;
        }
        let bth = ip.get(ip_len + 8..ip_len + 20)?;
        let dest_qp = u32::from_be_bytes([0, bth[5], bth[6], bth[7]]);
        let cm_attr = (dest_qp == 1)
            .then(|| ip.get(ip_len + 20 + 8 + 16..ip_len + 20 + 8 + 18))
            .flatten()
            .map(|a| u16::from_be_bytes([a[0], a[1]]));
        Some(Roce {
            src,
            dst,
            tclass,
            udp_sport: u16::from_be_bytes([udp[0], udp[1]]),
            opcode: bth[0],
            dest_qp,
            cm_attr,
            ip: ip.to_vec(),
            ip_len,
        })
    }
}
