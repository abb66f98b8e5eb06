//! Port claims across processes: rdma_cm's port space, shared by every process of the host
//! (one per network namespace, as the kernel's).
//!
//! A claim is a file `claim-NS-PS-PORT-PID-SEQ` in the [runtime directory](crate::io::share::runtime_dir)
//! holding the address, `flock`ed by its owner: a dead process's claims are free at once.
//! Checks and new claims of one (namespace, port space, port) are serialized by the `flock` of
//! `port-NS-PS-PORT.lock`. The steering program reads the live claims to send a REQ to the
//! process that listens on its service id.

use std::fs::File;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::io::share::{
    self, choose_runtime_dir, current_netns, held, lock, lock_path, open_rw, runtime_dir,
    try_lock_existing, RuntimeDirChoice,
};
use crate::{Error, Result};

/// A port held across processes; released on drop (or when the process dies).
///
/// ```
/// use rdma_soft::io::PortClaim;
/// let a = PortClaim::acquire(&Default::default(), 0x0106, "127.0.9.1".parse().unwrap(), 47990, true).unwrap();
/// let again = PortClaim::acquire(&Default::default(), 0x0106, "127.0.9.1".parse().unwrap(), 47990, true);
/// assert_eq!(again.unwrap_err().errno(), libc::EADDRINUSE);
/// // another address on the same port is fine; a wildcard is not
/// let b = PortClaim::acquire(&Default::default(), 0x0106, "127.0.9.2".parse().unwrap(), 47990, true).unwrap();
/// let any = PortClaim::acquire(&Default::default(), 0x0106, "0.0.0.0".parse().unwrap(), 47990, true);
/// assert_eq!(any.unwrap_err().errno(), libc::EADDRNOTAVAIL);
/// drop((a, b));
/// assert!(PortClaim::acquire(&Default::default(), 0x0106, "0.0.0.0".parse().unwrap(), 47990, true).is_ok());
/// ```
#[derive(Debug)]
pub struct PortClaim {
    path: PathBuf,
    _file: File,
    ns: u64,
    addr: IpAddr,
    serial: PathBuf,
    ps: u16,
    port: u16,
}

/// This process's live claims, so that a REQ for one of them is known to be ours without
/// reading the runtime directory.
static OWN: Mutex<Vec<(u64, IpAddr, bool, u64)>> = Mutex::new(Vec::new());

/// Whether a claim on `c` (with `afonly`) covers local address `addr`.
fn covers(c: IpAddr, afonly: bool, addr: IpAddr) -> bool {
    c == addr || (c.is_unspecified() && (c.is_ipv4() == addr.is_ipv4() || (!afonly && c.is_ipv6())))
}

fn service_id(ps: u16, port: u16) -> u64 {
    (u64::from(ps) << 16) | u64::from(port)
}

struct ClaimInfo {
    ps: u16,
    port: u16,
    pid: u32,
    addr: IpAddr,
    afonly: bool,
}

/// Parses `claim-NS-PS-PORT-PID-SEQ` (of namespace `ns`) and its content `ADDR AFONLY`.
fn parse(ns: u64, name: &str, content: &str) -> Option<ClaimInfo> {
    let rest = name.strip_prefix(&format!("claim-{ns}-"))?;
    let mut it = rest.split('-');
    let ps = u16::from_str_radix(it.next()?, 16).ok()?;
    let port = it.next()?.parse().ok()?;
    let pid = it.next()?.parse().ok()?;
    let mut c = content.split_whitespace();
    let addr = c.next()?.parse().ok()?;
    let afonly = c.next()? == "1";
    Some(ClaimInfo {
        ps,
        port,
        pid,
        addr,
        afonly,
    })
}

/// Reads of the runtime directory for the live claims, by this process.
static SCANS: AtomicU64 = AtomicU64::new(0);

/// How many times this process has read the runtime directory for the other processes'
/// claims. The receive path asks only for verified datagrams, and then at most every
/// [`CLAIMS_FRESH`] or when the directory changed: a flood of requests costs no file-system
/// work in proportion to it.
pub fn claim_scans() -> u64 {
    SCANS.load(Ordering::Relaxed)
}

#[cfg(test)]
thread_local! {
    /// [`SCANS`] of the calling thread (unit tests run in parallel).
    static THREAD_SCANS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The calling thread's reads of the runtime directory for the claims.
#[cfg(test)]
pub(crate) fn thread_scans() -> u64 {
    THREAD_SCANS.with(|n| n.get())
}

/// How long the receive path trusts what it read of the claims while the runtime
/// directory is unchanged (a claim's owner may die without changing the directory).
pub const CLAIMS_FRESH: Duration = Duration::from_millis(100);

/// The live claims of namespace `ns`, with their file names.
fn live_claims(ns: u64) -> Vec<(PathBuf, ClaimInfo)> {
    match runtime_dir() {
        Ok(dir) => live_claims_in(&dir, ns),
        Err(_) => Vec::new(),
    }
}

/// [`live_claims`] in `dir`.
fn live_claims_in(dir: &Path, ns: u64) -> Vec<(PathBuf, ClaimInfo)> {
    SCANS.fetch_add(1, Ordering::Relaxed);
    #[cfg(test)]
    THREAD_SCANS.with(|n| n.set(n.get() + 1));
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let prefix = format!("claim-{ns}-");
    rd.filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            if !name.starts_with(&prefix) {
                return None;
            }
            let path = e.path();
            let content = std::fs::read_to_string(&path).ok()?;
            let info = parse(ns, &name, &content)?;
            if held(&path) {
                return Some((path, info));
            }
            // A dead process's claim: free, and its name is never taken again (pid and
            // sequence), so it can go.
            let _ = std::fs::remove_file(&path);
            None
        })
        .collect()
}

/// Removes the lock file of every port without a live claim (its last claimant killed, or
/// its namespace gone), with the dead claims found on the way. A port whose lock someone
/// holds is left alone. Returns how many ports' lock files went.
pub(crate) fn sweep_dead_ports(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let names: Vec<String> = rd
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    let mut gone = 0;
    for name in &names {
        let Some(key) = name
            .strip_prefix("port-")
            .and_then(|n| n.strip_suffix(".lock"))
        else {
            continue;
        };
        let path = dir.join(name);
        let Some(_lock) = try_lock_existing(&path) else {
            continue;
        };
        // claims are made and dropped under this lock: what is there now stays as it is
        let prefix = format!("claim-{key}-");
        let mut live = false;
        for c in names.iter().filter(|c| c.starts_with(&prefix)) {
            let claim = dir.join(c);
            if held(&claim) {
                live = true;
            } else {
                let _ = std::fs::remove_file(&claim);
            }
        }
        if !live {
            let _ = std::fs::remove_file(&path);
            gone += 1;
        }
    }
    gone
}

/// rdma_cm's `cma_check_port` between two listeners of one port.
fn conflict(a: IpAddr, a_afonly: bool, b: IpAddr, b_afonly: bool, port: u16) -> Result<()> {
    if a_afonly && b_afonly && a.is_ipv4() != b.is_ipv4() {
        return Ok(());
    }
    if a.is_unspecified() || b.is_unspecified() {
        return Err(Error::PortWildcard { port });
    }
    if a == b {
        return Err(Error::PortInUse { addr: a, port });
    }
    Ok(())
}

impl PortClaim {
    /// Claims `port` of port space `ps` (rdma_cm's `RDMA_PS_*` value) on `addr` (a
    /// wildcard claims it on every address) for this process. Another live claim on the
    /// same address: `EADDRINUSE`; a wildcard against any address of its family:
    /// `EADDRNOTAVAIL` (rdma_cm's rules; `afonly` as `RDMA_OPTION_ID_AFONLY`). The
    /// steering programs of this process's groups on `addr` learn the new listener. `dirs`:
    /// where the runtime directory is chosen from if nothing chose it yet
    /// ([`crate::io::share::choose_runtime_dir`]).
    pub fn acquire(
        dirs: &RuntimeDirChoice,
        ps: u16,
        addr: IpAddr,
        port: u16,
        afonly: bool,
    ) -> Result<PortClaim> {
        let dir = choose_runtime_dir(dirs)?;
        let ns = current_netns();
        let serial_path = dir.join(format!("port-{ns}-{ps:04x}-{port}.lock"));
        let serial = lock_path(&serial_path).map_err(|source| Error::Os {
            op: "port lock",
            addr: None,
            source,
        })?;
        for (_, c) in live_claims_in(&dir, ns) {
            if c.ps == ps && c.port == port {
                conflict(addr, afonly, c.addr, c.afonly, port)?;
            }
        }
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let path = dir.join(format!("claim-{ns}-{ps:04x}-{port}-{pid}-{seq}"));
        let io = |source| Error::Os {
            op: "port claim",
            addr: None,
            source,
        };
        // A leftover of a dead process with our pid and sequence is free: replace it. The
        // lock blocks: the only other holder can be a scan testing it for an instant.
        let mut f = open_rw(&path).map_err(io)?;
        lock(&f, true, true).map_err(io)?;
        f.set_len(0).map_err(io)?;
        // One write (a formatted write to a file makes one per piece).
        f.write_all(format!("{addr} {}\n", u8::from(afonly)).as_bytes())
            .map_err(io)?;
        drop(serial);
        tracing::debug!(%addr, ps, port, "port claimed");
        OWN.lock().unwrap_or_else(|e| e.into_inner()).push((
            ns,
            addr,
            afonly,
            service_id(ps, port),
        ));
        let claim = PortClaim {
            path,
            _file: f,
            ns,
            addr,
            serial: serial_path,
            ps,
            port,
        };
        share::refresh(ns, addr)?;
        tracing::debug!(%addr, ps, port, "steering refreshed for the claim");
        Ok(claim)
    }
}

impl Drop for PortClaim {
    fn drop(&mut self) {
        {
            let mut own = OWN.lock().unwrap_or_else(|e| e.into_inner());
            let me = (self.ns, self.addr, self.ps, self.port);
            if let Some(i) = own
                .iter()
                .position(|&(ns, a, _, sid)| (ns, a, sid) == (me.0, me.1, service_id(me.2, me.3)))
            {
                own.swap_remove(i);
            }
        }
        let _ = std::fs::remove_file(&self.path);
        // The port's lock file goes with its last claim (waiters re-check, `lock_path`).
        if let Ok(serial) = lock_path(&self.serial) {
            let prefix = format!("claim-{}-{:04x}-{}-", self.ns, self.ps, self.port);
            let others = std::fs::read_dir(self.serial.parent().unwrap_or(Path::new(".")))
                .map(|rd| {
                    rd.filter_map(|e| e.ok())
                        .any(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                })
                .unwrap_or(true);
            if !others {
                let _ = std::fs::remove_file(&self.serial);
            }
            drop(serial);
        }
        let _ = share::refresh(self.ns, self.addr);
    }
}

/// The service ids listened on at `addr` (or on a wildcard covering it) in namespace `ns`,
/// with the listener's pid: `(port space << 16) | port`, as rdma_cm's.
pub(crate) fn services(ns: u64, addr: IpAddr) -> Vec<(u64, u32)> {
    Claims::read(ns).services(addr)
}

/// One namespace's live claims, read once (one directory scan) for several groups: a
/// wildcard listener's steering refresh rebuilds every group of the process.
pub(crate) struct Claims(Vec<ClaimInfo>);

impl Claims {
    /// Reads the live claims of namespace `ns`.
    pub(crate) fn read(ns: u64) -> Claims {
        Claims(live_claims(ns).into_iter().map(|(_, c)| c).collect())
    }

    /// [`services`] of `addr` among them.
    pub(crate) fn services(&self, addr: IpAddr) -> Vec<(u64, u32)> {
        self.0
            .iter()
            .filter(|c| covers(c.addr, c.afonly, addr))
            .map(|c| (service_id(c.ps, c.port), c.pid))
            .collect()
    }
}

/// What the receive path last read of one namespace's claims.
struct Seen {
    ns: u64,
    dir_mtime: Option<SystemTime>,
    at: Instant,
    /// `(file, address, afonly, service id, pid)` of every claim live when read.
    claims: Vec<(PathBuf, IpAddr, bool, u64, u32)>,
}

static SEEN: Mutex<Vec<Seen>> = Mutex::new(Vec::new());

/// [`services`] as last read, read again when older than [`CLAIMS_FRESH`] or when the
/// runtime directory changed (a claim made or removed), each with its file: a claim's owner
/// may have died since (its file stays until a read removes it), which [`held`] tells.
pub(crate) fn recent_services(ns: u64, addr: IpAddr) -> Vec<(PathBuf, u64, u32)> {
    let mtime = || {
        runtime_dir()
            .ok()
            .and_then(|d| std::fs::metadata(d).ok())
            .and_then(|m| m.modified().ok())
    };
    let now_mtime = mtime();
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    let fresh = seen
        .iter()
        .position(|s| s.ns == ns)
        .filter(|&k| seen[k].dir_mtime == now_mtime && seen[k].at.elapsed() < CLAIMS_FRESH);
    let k = match fresh {
        Some(k) => k,
        None => {
            let claims = live_claims(ns)
                .into_iter()
                .map(|(f, c)| (f, c.addr, c.afonly, service_id(c.ps, c.port), c.pid))
                .collect();
            // The directory's time from before the read: a claim made while it ran changes
            // the directory after that time, so the next call reads again (a read that
            // removed dead claims costs one more read, which removes nothing).
            let entry = Seen {
                ns,
                dir_mtime: now_mtime,
                at: Instant::now(),
                claims,
            };
            seen.retain(|s| s.ns != ns);
            seen.push(entry);
            seen.len() - 1
        }
    };
    seen[k]
        .claims
        .iter()
        .filter(|c| covers(c.1, c.2, addr))
        .map(|c| (c.0.clone(), c.3, c.4))
        .collect()
}

/// The shortest time between two reads of the claims that [`listener_elsewhere`] forces
/// before a REQ is refused: a flood of valid REQs for a port being claimed costs at most
/// one directory read per this time.
const FORCED_EVERY: Duration = Duration::from_millis(2);

/// Forgets what was read of namespace `ns`'s claims, so that the next [`recent_services`]
/// reads them again; false (nothing forgotten) within [`FORCED_EVERY`] of the last time.
fn forget_seen(ns: u64) -> bool {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if last.is_some_and(|t| t.elapsed() < FORCED_EVERY) {
        return false;
    }
    *last = Some(Instant::now());
    drop(last);
    SEEN.lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|s| s.ns != ns);
    true
}

/// Whether service `sid` on `addr` (namespace `ns`) is listened on by another live process
/// and not by this one: a REQ for it that reached this process was misdelivered (its
/// sender retransmits), and answering it REJ 8 would end a connection that has a listener.
/// Reads the runtime directory only when this process has no claim covering it, and then
/// as [`recent_services`] does. Before it says no, when the port's lock file exists (a
/// claim on the port is there or being made): the claims are read again (at most every
/// [`FORCED_EVERY`]), as a listener may have claimed it since the last read; and a port
/// whose lock is held right now (a claim being made) counts as listened on elsewhere, so
/// the REQ is dropped, not refused: its sender retransmits it to the new listener.
pub(crate) fn listener_elsewhere(ns: u64, addr: IpAddr, sid: u64) -> bool {
    let own = OWN.lock().unwrap_or_else(|e| e.into_inner());
    if own
        .iter()
        .any(|&(n, a, afonly, s)| n == ns && s == sid && covers(a, afonly, addr))
    {
        return false;
    }
    drop(own);
    let pid = std::process::id();
    let elsewhere = |v: Vec<(PathBuf, u64, u32)>| {
        v.into_iter()
            .any(|(f, s, p)| s == sid && p != pid && held(&f))
    };
    if elsewhere(recent_services(ns, addr)) {
        return true;
    }
    let Ok(dir) = runtime_dir() else {
        return false;
    };
    let (ps, port) = ((sid >> 16) as u16, sid as u16);
    let lock = dir.join(format!("port-{ns}-{ps:04x}-{port}.lock"));
    if !lock.exists() {
        return false;
    }
    if forget_seen(ns) && elsewhere(recent_services(ns, addr)) {
        tracing::debug!(%addr, sid, "REQ for a listener the claims read again found");
        return true;
    }
    let claiming = held(&lock);
    if claiming {
        tracing::debug!(%addr, sid, "REQ for a port being claimed: dropped, not refused");
    }
    claiming
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_removes_ports_without_a_live_claim() {
        let dir = std::env::temp_dir().join(format!("rdma-soft-ports-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let touch = |n: &str| std::fs::write(dir.join(n), "").unwrap();
        // A live claim (held, as its owner holds it) keeps its port.
        touch("port-1-0106-7471.lock");
        let live = open_rw(&dir.join("claim-1-0106-7471-10-0")).unwrap();
        assert!(lock(&live, true, false).unwrap());
        // A dead claim (nobody holds it): it and its port go.
        touch("port-1-0106-7472.lock");
        touch("claim-1-0106-7472-11-0");
        // No claim at all; and a port whose number the live one's starts with.
        touch("port-1-0106-747.lock");
        // Someone at work on the port (its lock held): left alone.
        touch("port-2-0106-7471.lock");
        touch("claim-2-0106-7471-12-0");
        let busy = open_rw(&dir.join("port-2-0106-7471.lock")).unwrap();
        assert!(lock(&busy, true, false).unwrap());

        assert_eq!(sweep_dead_ports(&dir), 2);
        assert_eq!(
            share::names_in(&dir),
            [
                "claim-1-0106-7471-10-0",
                "claim-2-0106-7471-12-0",
                "port-1-0106-7471.lock",
                "port-2-0106-7471.lock",
            ]
        );
        drop(busy);
        assert_eq!(sweep_dead_ports(&dir), 1);
        drop(live);
        assert_eq!(sweep_dead_ports(&dir), 1);
        assert!(share::names_in(&dir).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names_parse_and_garbage_does_not() {
        let c = parse(7, "claim-7-0106-7471-99-0", "127.0.0.1 1\n").unwrap();
        assert_eq!((c.ps, c.port, c.pid), (0x0106, 7471, 99));
        assert!(c.afonly);
        assert!(parse(8, "claim-7-0106-7471-99-0", "127.0.0.1 1").is_none());
        assert!(parse(7, "claim-7-zz-7471-99-0", "127.0.0.1 1").is_none());
        assert!(parse(7, "claim-7-0106-7471-99-0", "nonsense 1").is_none());
        assert!(parse(7, "claim-7-0106-7471-99-0", "").is_none());
    }

    #[test]
    fn listeners_become_services() {
        let a: IpAddr = "127.0.9.11".parse().unwrap();
        let c = PortClaim::acquire(&Default::default(), 0x0106, a, 47991, true).unwrap();
        let ns = current_netns();
        let me = std::process::id();
        assert!(services(ns, a).contains(&(0x0106_0000 | 47991, me)));
        assert!(!services(ns, "127.0.9.12".parse().unwrap())
            .iter()
            .any(|s| s.0 == 0x0106_0000 | 47991));
        drop(c);
        assert!(!services(ns, a).iter().any(|s| s.0 == 0x0106_0000 | 47991));
    }

    #[test]
    fn a_service_listened_on_elsewhere_is_told_from_ours_and_from_none() {
        let a: IpAddr = "127.0.9.13".parse().unwrap();
        let ns = current_netns();
        let sid = |port: u16| service_id(0x0106, port);
        // Nobody listens: a REQ for it is this process's to refuse.
        assert!(!listener_elsewhere(ns, a, sid(47992)));
        // Ours (a wildcard covers the address too).
        let mine = PortClaim::acquire(
            &Default::default(),
            0x0106,
            "0.0.0.0".parse().unwrap(),
            47993,
            true,
        )
        .unwrap();
        assert!(!listener_elsewhere(ns, a, sid(47993)));
        drop(mine);
        // Another live process's: a claim file named for pid 1, its flock held (as the
        // owner would hold it).
        let dir = choose_runtime_dir(&Default::default()).unwrap();
        let path = dir.join(format!("claim-{ns}-0106-47994-1-0"));
        let mut f = open_rw(&path).unwrap();
        assert!(lock(&f, true, false).unwrap());
        writeln!(f, "{a} 1").unwrap();
        assert!(listener_elsewhere(ns, a, sid(47994)));
        assert!(!listener_elsewhere(
            ns,
            "127.0.9.14".parse().unwrap(),
            sid(47994)
        ));
        // Dead (its lock released): nobody's again.
        drop(f);
        assert!(!listener_elsewhere(ns, a, sid(47994)));
        // The claims are read again once the kept view is older than CLAIMS_FRESH: that
        // read finds the dead claim and removes it.
        std::thread::sleep(CLAIMS_FRESH);
        assert!(!listener_elsewhere(ns, a, sid(47994)));
        assert!(!path.exists(), "a dead claim is removed when found");
    }

    #[test]
    fn a_claim_missed_by_the_kept_view_is_found_before_a_refusal() {
        let a: IpAddr = "127.0.9.15".parse().unwrap();
        let ns = current_netns();
        let sid = service_id(0x0106, 47995);
        let dir = choose_runtime_dir(&Default::default()).unwrap();
        // Another live process's claim on the port, with the port's lock file, as
        // `acquire` leaves them.
        let lock_file = dir.join(format!("port-{ns}-0106-47995.lock"));
        std::fs::write(&lock_file, "").unwrap();
        let path = dir.join(format!("claim-{ns}-0106-47995-1-0"));
        let mut f = open_rw(&path).unwrap();
        assert!(lock(&f, true, false).unwrap());
        writeln!(f, "{a} 1").unwrap();
        // The kept view predates the claim but carries the directory's current time (a
        // claim made while the last read ran): trusted for CLAIMS_FRESH.
        let mtime = std::fs::metadata(&dir).and_then(|m| m.modified()).ok();
        {
            let mut seen = SEEN.lock().unwrap();
            seen.retain(|s| s.ns != ns);
            seen.push(Seen {
                ns,
                dir_mtime: mtime,
                at: Instant::now(),
                claims: Vec::new(),
            });
        }
        std::thread::sleep(FORCED_EVERY);
        assert!(
            listener_elsewhere(ns, a, sid),
            "the claims are read again before a REQ for a claimed port is refused"
        );
        drop(f);
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(&lock_file).unwrap();
    }

    #[test]
    fn a_port_being_claimed_drops_its_reqs_rather_than_refusing_them() {
        let a: IpAddr = "127.0.9.16".parse().unwrap();
        let ns = current_netns();
        let sid = service_id(0x0106, 47996);
        let dir = choose_runtime_dir(&Default::default()).unwrap();
        let lock_file = dir.join(format!("port-{ns}-0106-47996.lock"));
        // No lock file: nobody's, refused.
        assert!(!listener_elsewhere(ns, a, sid));
        // Its lock held (a listen taking the claim): the REQ is not refused.
        let held_lock = lock_path(&lock_file).unwrap();
        std::thread::sleep(FORCED_EVERY);
        assert!(listener_elsewhere(ns, a, sid));
        // Released without a claim (the listen failed): refused again.
        drop(held_lock);
        std::thread::sleep(FORCED_EVERY);
        assert!(!listener_elsewhere(ns, a, sid));
        std::fs::remove_file(&lock_file).unwrap();
    }
}
