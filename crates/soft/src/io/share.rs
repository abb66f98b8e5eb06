//! Many processes on one address: slots, the reuseport group's membership, its program.
//!
//! - A **slot** (1..=255) names one sharing wire on the host, for one user: it is an
//!   `flock`ed file `slot-N` in the [runtime directory](runtime_dir), held for the wire's
//!   life, so the kernel frees it when the process dies (SIGKILL included). The wire's
//!   device puts the slot in the top byte of every QPN, its CM agent in the top byte of
//!   every comm id: that is what the [steering program](super::steer) reads.
//! - A **group** is every socket on one `ADDR:port` of one network namespace
//!   (`SO_REUSEPORT`). The kernel numbers them in join order and fills a leaving socket's
//!   hole with the last one, so the table `grp-NS-ADDR-PORT.tab` mirrors that order, and
//!   every change happens under the `flock` of `grp-NS-ADDR-PORT.lock`: join (bind, append,
//!   attach), leave (remove as the kernel does, attach, close), and on either, entries whose
//!   slot is free (a dead process: its socket is already gone) are removed the same way.
//!   Each change attaches a new program built from the table and the listeners' claims.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Instant, SystemTime};

pub(crate) mod claim;
#[allow(unsafe_code)] // openat/mkdirat relative to the pinned directory fd
pub(crate) mod rundir;

use super::steer::{self, Table};
use super::WireAddr;
use crate::{Error, Result};

/// Environment variable naming the runtime directory (read by [`crate::SoftConfig::from_env`]).
pub const RUNDIR_ENV: &str = "RDMA_SOFT_RUNDIR";

/// Where the process's runtime directory is chosen from: a value of the configuration
/// ([`crate::io::UdpConfig::runtime_dir`]), carried down; this layer reads no settings.
///
/// ```
/// let c = rdma_soft::io::RuntimeDirChoice::default();
/// assert!(c.given.is_none() && c.xdg_runtime_dir.is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuntimeDirChoice {
    /// A directory to use (`RDMA_SOFT_RUNDIR`): refused when not a private directory of
    /// ours, with no fallback.
    pub given: Option<PathBuf>,
    /// The system's per-user directory (`$XDG_RUNTIME_DIR`): its `rdma-soft` is the first
    /// of the usual places.
    pub xdg_runtime_dir: Option<PathBuf>,
}

static DIR: OnceLock<std::result::Result<rundir::Pinned, String>> = OnceLock::new();

/// The per-user directory of slots, groups and port claims, chosen once per process by the
/// first call (later choices get the same directory): `choice.given` (refused when not a
/// private directory of ours), else the first private directory of ours among
/// `$XDG_RUNTIME_DIR/rdma-soft`, `/run/user/$UID/rdma-soft` and `/tmp/rdma-soft-$UID`
/// (made 0700), else a fresh private one in `/tmp` (another user may have made ours first).
/// Opened, and reached through `/proc/self/fd/N` from then on: renaming or replacing the
/// path later moves nothing of ours. `crate::config::runtime_dir` chooses with the
/// process's settings.
pub fn choose_runtime_dir(choice: &RuntimeDirChoice) -> Result<PathBuf> {
    let r = DIR.get_or_init(|| {
        let uid = crate::fd::uid();
        let r = match &choice.given {
            Some(d) => rundir::open_private(d, uid),
            None => {
                let usual = rundir::candidates(uid, choice.xdg_runtime_dir.as_deref());
                rundir::choose(&usual, uid, Path::new("/tmp"))
            }
        };
        if let Ok(p) = &r {
            tracing::debug!(dir = %p.name.display(), via = %p.path().display(), "rdma-soft runtime directory");
        }
        r
    });
    pinned(r)
}

/// The runtime directory [`choose_runtime_dir`] chose (a sharing wire, a port claim or the
/// configuration layer did); `ENOENT` before any did.
pub fn runtime_dir() -> Result<PathBuf> {
    match DIR.get() {
        Some(r) => pinned(r),
        None => Err(Error::Os {
            op: "rdma-soft runtime directory",
            addr: None,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not chosen yet"),
        }),
    }
}

fn pinned(r: &std::result::Result<rundir::Pinned, String>) -> Result<PathBuf> {
    match r {
        Ok(p) => Ok(p.path()),
        Err(reason) => Err(Error::Os {
            op: "rdma-soft runtime directory",
            addr: None,
            source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, reason.clone()),
        }),
    }
}

/// `flock` without blocking (`LOCK_NB`) or blocking; false when another holds it.
pub(crate) fn lock(f: &File, exclusive: bool, block: bool) -> std::io::Result<bool> {
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    let op = if block { op } else { op | libc::LOCK_NB };
    loop {
        let Err(e) = crate::fd::flock(f.as_fd(), op) else {
            return Ok(true);
        };
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(false),
            _ => return Err(e),
        }
    }
}

pub(crate) fn open_rw(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

/// Opens and `flock`s (exclusive, blocking) the lock file `path`, making it if needed. A
/// holder may unlink the file when what it guards is gone ([`Member::leave`]), so the lock
/// counts only if `path` still names the locked file; else this tries again.
pub(crate) fn lock_path(path: &Path) -> std::io::Result<File> {
    loop {
        let f = open_rw(path)?;
        lock(&f, true, true)?;
        if still_named(&f, path) {
            return Ok(f);
        }
    }
}

/// Whether `path` still names the file `f` has open (a holder may have unlinked it, and
/// someone made it again).
fn still_named(f: &File, path: &Path) -> bool {
    match (f.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
        _ => false,
    }
}

/// Whether someone holds the `flock` of `path` (a missing file: nobody).
pub(crate) fn held(path: &Path) -> bool {
    let Ok(f) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
    else {
        return false;
    };
    // Taking it shared for an instant is the test (owners hold it exclusive); testers do
    // not block each other, so a test never makes another tester, or an owner taking a
    // fresh file with a blocking lock, see a lock that is not there. The file closes (and
    // unlocks) on return.
    !matches!(lock(&f, false, false), Ok(true))
}

fn os(op: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Os {
        op,
        addr: None,
        source,
    }
}

/// The inode of the calling thread's network namespace.
pub(crate) fn current_netns() -> u64 {
    std::fs::metadata("/proc/thread-self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// A slot held for a wire's life.
#[derive(Debug)]
pub(crate) struct Slot {
    n: u8,
    _file: File,
}

impl Slot {
    /// Takes a free slot, searching from a start that depends on the pid (so that a slot
    /// just freed by a dead process is seldom the next one taken).
    pub(crate) fn claim(dirs: &RuntimeDirChoice) -> Result<Slot> {
        let dir = choose_runtime_dir(dirs)?;
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| {
            let groups = sweep_dead_groups(&dir);
            let ports = claim::sweep_dead_ports(&dir);
            if groups + ports > 0 {
                tracing::debug!(groups, ports, dir = %dir.display(), "files of the dead removed");
            }
        });
        let start = (std::process::id() as usize).wrapping_mul(37) % 255;
        for k in 0..255 {
            let n = ((start + k) % 255 + 1) as u8;
            let mut f = open_rw(&dir.join(format!("slot-{n}"))).map_err(os("slot file"))?;
            if lock(&f, true, false).map_err(os("flock slot"))? {
                // The owner's pid: a table entry of an earlier owner of this slot (a dead
                // process's, not yet pruned) is told from ours by it.
                f.set_len(0).map_err(os("slot file"))?;
                writeln!(f, "{}", std::process::id()).map_err(os("slot file"))?;
                return Ok(Slot { n, _file: f });
            }
        }
        Err(Error::Exhausted {
            what: "rdma-soft slots (sharing wires on this host)",
            max: 255,
        })
    }

    pub(crate) fn get(&self) -> u8 {
        self.n
    }
}

fn slot_alive(dir: &Path, n: u8) -> bool {
    held(&dir.join(format!("slot-{n}")))
}

/// Whether a table entry is a live member: its slot is held, by the entry's process (a
/// slot freed by a dead process may have been taken by a new one meanwhile). A slot file
/// without a readable pid counts as its entry's.
fn entry_alive(dir: &Path, e: &Entry) -> bool {
    let path = dir.join(format!("slot-{}", e.slot));
    if !held(&path) {
        return false;
    }
    match std::fs::read_to_string(&path)
        .ok()
        .and_then(|c| c.trim().parse::<u32>().ok())
    {
        Some(pid) => pid == e.pid,
        None => true,
    }
}

/// A reuseport group: one `ADDR:port` in one network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupKey {
    pub ns: u64,
    pub addr: WireAddr,
    pub port: u16,
}

impl GroupKey {
    fn stem(&self) -> String {
        format!("grp-{}-{}-{}", self.ns, self.addr, self.port)
    }
}

/// One entry of a group's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    slot: u8,
    pid: u32,
}

fn read_table(path: &Path) -> Vec<Entry> {
    let Ok(s) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    s.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let slot = it.next()?.parse().ok()?;
            let pid = it.next()?.parse().ok()?;
            Some(Entry { slot, pid })
        })
        .collect()
}

fn write_table(path: &Path, t: &[Entry]) -> Result<()> {
    let mut s = String::with_capacity(t.len() * 12);
    for e in t {
        s.push_str(&format!("{} {}\n", e.slot, e.pid));
    }
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).map_err(os("group table"))?;
    f.write_all(s.as_bytes()).map_err(os("group table"))?;
    std::fs::rename(&tmp, path).map_err(os("group table"))
}

/// Removes entry `i` as the kernel removes a socket: the last one takes its place.
fn remove_at(t: &mut Vec<Entry>, i: usize) {
    t.swap_remove(i);
}

/// Removes the entries of dead slots (their sockets are gone already).
fn prune(dir: &Path, t: &mut Vec<Entry>) {
    let mut i = 0;
    while i < t.len() {
        if entry_alive(dir, &t[i]) {
            i += 1;
        } else {
            remove_at(t, i);
        }
    }
}

/// Removes the files of every group in `dir` whose members are all dead: a group's last
/// process killed before it could leave, or its network namespace gone, leaves them for
/// good (a namespace's inode is seldom used again). A group whose lock someone holds is
/// left alone; a live member's entry keeps its group. Returns how many groups went.
pub(crate) fn sweep_dead_groups(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut gone = 0;
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(stem) = name
            .to_str()
            .filter(|n| n.starts_with("grp-"))
            .and_then(|n| n.strip_suffix(".lock"))
        else {
            continue;
        };
        let path = e.path();
        // a holder is at work on the group (joining, leaving): not ours to judge
        let Some(_lock) = try_lock_existing(&path) else {
            continue;
        };
        let tab = dir.join(format!("{stem}.tab"));
        let mut t = read_table(&tab);
        prune(dir, &mut t);
        if t.is_empty() {
            // as `Member::leave` does: the table, a table half written, then the lock file
            let _ = std::fs::remove_file(&tab);
            let _ = std::fs::remove_file(tab.with_extension("tmp"));
            let _ = std::fs::remove_file(&path);
            gone += 1;
        }
    }
    gone
}

/// Takes the `flock` of the existing lock file `path` without waiting; `None` when another
/// holds it, or when `path` no longer names the file locked (unlinked and made again).
pub(crate) fn try_lock_existing(path: &Path) -> Option<File> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let locked = matches!(lock(&f, true, false), Ok(true));
    (locked && still_named(&f, path)).then_some(f)
}

/// How old the table must be before a misdelivered datagram counts as evidence.
pub(crate) const SETTLE: std::time::Duration = std::time::Duration::from_millis(100);

/// This process's member socket in a group, for rebuilding the program.
#[derive(Debug)]
pub(crate) struct Member {
    key: GroupKey,
    slot: u8,
    /// A duplicate of the wire's socket, to attach programs with (`None` once left).
    sock: Mutex<Option<OwnedFd>>,
    /// The live slots of the group's table as last read, and when ([`Member::has_member`]).
    seen: Mutex<Option<SeenSlots>>,
}

/// When a member last read its group's table, the table file's mtime then, and the live
/// slots it held.
type SeenSlots = (Instant, Option<SystemTime>, Vec<u8>);

fn members() -> &'static Mutex<Vec<Weak<Member>>> {
    static M: OnceLock<Mutex<Vec<Weak<Member>>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(Vec::new()))
}

/// The group's lock, taken (blocking) until the guard drops.
struct GroupLock {
    _file: File,
    dir: PathBuf,
    tab: PathBuf,
    path: PathBuf,
}

impl GroupLock {
    fn take(key: &GroupKey) -> Result<GroupLock> {
        let dir = runtime_dir()?;
        let stem = key.stem();
        let path = dir.join(format!("{stem}.lock"));
        let f = lock_path(&path).map_err(os("group lock"))?;
        Ok(GroupLock {
            _file: f,
            tab: dir.join(format!("{stem}.tab")),
            path,
            dir,
        })
    }
}

/// The program's table for a group: its members and the listeners on its address.
fn table_of(key: &GroupKey, t: &[Entry]) -> Table {
    table_with(t, claim::services(key.ns, key.addr.ip()))
}

/// The program's table for entries `t` and the claimed `(service, pid)` of their address.
fn table_with(t: &[Entry], services: Vec<(u64, u32)>) -> Table {
    let slots: Vec<u8> = t.iter().map(|e| e.slot).collect();
    let services = services
        .into_iter()
        .filter_map(|(sid, pid)| {
            let idx = t.iter().position(|e| e.pid == pid)?;
            Some((sid, idx as u32))
        })
        .collect();
    Table { slots, services }
}

/// Binds a socket into the group of `key` (`open` binds it with `SO_REUSEPORT`) under the
/// group's lock, records it and attaches the new program.
pub(crate) fn join(
    key: GroupKey,
    slot: u8,
    open: impl FnOnce() -> Result<OwnedFd>,
) -> Result<(OwnedFd, Arc<Member>)> {
    let g = GroupLock::take(&key)?;
    let mut t = read_table(&g.tab);
    prune(&g.dir, &mut t);
    let fd = open()?;
    t.push(Entry {
        slot,
        pid: std::process::id(),
    });
    steer::attach(fd.as_raw_fd(), &table_of(&key, &t)).map_err(|source| Error::Os {
        op: "SO_ATTACH_REUSEPORT_CBPF",
        addr: Some(key.addr),
        source,
    })?;
    write_table(&g.tab, &t)?;
    let dup = fd.try_clone().map_err(os("dup"))?;
    let m = Arc::new(Member {
        key,
        slot,
        sock: Mutex::new(Some(dup)),
        seen: Mutex::new(None),
    });
    let mut all = members().lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|w| w.strong_count() > 0);
    all.push(Arc::downgrade(&m));
    Ok((fd, m))
}

impl Member {
    fn my_index(&self, t: &[Entry]) -> Option<usize> {
        let pid = std::process::id();
        t.iter().position(|e| e.slot == self.slot && e.pid == pid)
    }

    /// Leaves the group: removes this entry as the kernel will, attaches the program for
    /// the rest, then closes `fd` (the wire's socket) and the duplicate, all under the lock.
    pub(crate) fn leave(&self, fd: OwnedFd) {
        let mut sock = self.sock.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(g) = GroupLock::take(&self.key) else {
            return; // the sockets close on return: the others see a dead-free table later
        };
        let mut t = read_table(&g.tab);
        if let Some(i) = self.my_index(&t) {
            remove_at(&mut t, i);
        }
        prune(&g.dir, &mut t);
        if !t.is_empty() {
            // Still a member until `fd` closes: the program is the group's, it stays.
            let _ = steer::attach(fd.as_raw_fd(), &table_of(&self.key, &t));
        }
        drop(fd);
        sock.take();
        if t.is_empty() {
            // The group is gone: its files go too (waiters re-check the path, `lock_path`).
            let _ = std::fs::remove_file(&g.tab);
            let _ = std::fs::remove_file(&g.path);
        } else {
            let _ = write_table(&g.tab, &t);
        }
    }

    /// Whether `slot` is a live member of this group (its table, read without the lock: it
    /// is replaced whole). Off the fast path: only for a verified CM message naming another
    /// slot, and read again at most every [`claim::CLAIMS_FRESH`].
    pub(crate) fn has_member(&self, slot: u8) -> bool {
        let Ok(dir) = runtime_dir() else {
            return true;
        };
        let tab = dir.join(format!("{}.tab", self.key.stem()));
        let mtime = std::fs::metadata(&tab).and_then(|m| m.modified()).ok();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let stale = !seen
            .as_ref()
            .is_some_and(|(at, m, _)| *m == mtime && at.elapsed() < claim::CLAIMS_FRESH);
        if stale {
            let live = read_table(&tab)
                .iter()
                .map(|e| e.slot)
                .filter(|&s| slot_alive(&dir, s))
                .collect();
            *seen = Some((Instant::now(), mtime, live));
        }
        seen.as_ref()
            .is_some_and(|(_, _, live)| live.contains(&slot))
    }

    /// Repairs the table from evidence: this member received a datagram the program sent to
    /// the index of `seen` (another live or dead slot), so the kernel has this socket at
    /// that index (after deaths the table's guess at the kernel's order can be wrong: see
    /// `docs/SHARING.md`). Ignored while the table is younger than [`SETTLE`] (the datagram
    /// may have been steered by the program before the last change).
    pub(crate) fn evidence(&self, seen: u8) -> Result<()> {
        self.swap_with(|t| t.iter().position(|e| e.slot == seen), false, None)
            .map(drop)
    }

    /// [`Member::evidence`] for a REQ or SIDR_REQ for service `sid` that reached this
    /// member while another live process listens on it: the program sent it to the index
    /// of that process's entry, so the kernel has this socket there. A young table (the
    /// program may predate the last change), or a listener not in the table yet, only
    /// rebuilds the program from the table and the claims.
    pub(crate) fn service_evidence(&self, sid: u64) -> Result<()> {
        let me = std::process::id();
        let owner = claim::recent_services(self.key.ns, self.key.addr.ip())
            .into_iter()
            .find(|(f, s, pid)| *s == sid && *pid != me && held(f))
            .map(|(_, _, pid)| pid);
        self.swap_with(
            |t| owner.and_then(|pid| t.iter().position(|e| e.pid == pid)),
            true,
            None,
        )
        .map(drop)
    }

    /// Prunes the dead members; swaps this member's entry with the one `other` finds (when
    /// the table has settled and had no dead members), else (after a prune, or with
    /// `rebuild`, when nothing is to swap) re-attaches the program, built with
    /// `claims` when given (else read now). Returns whether it attached a program.
    fn swap_with(
        &self,
        other: impl FnOnce(&[Entry]) -> Option<usize>,
        rebuild: bool,
        claims: Option<&claim::Claims>,
    ) -> Result<bool> {
        let sock = self.sock.lock().unwrap_or_else(|e| e.into_inner());
        let Some(fd) = sock.as_ref() else {
            return Ok(false);
        };
        let g = GroupLock::take(&self.key)?;
        let young = std::fs::metadata(&g.tab)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .map_or(true, |age| age < SETTLE);
        let mut t = read_table(&g.tab);
        let before = t.len();
        prune(&g.dir, &mut t);
        // A dead member explains a misdelivery by itself: the kernel moved the last socket
        // into its place and steers by hash what the program still sends past the end.
        // Pruning models that; a swap on top would undo it. Only a table of live members
        // is wrong in its order.
        let pruned = t.len() < before;
        let pair = (!young && !pruned)
            .then(|| Some((other(&t)?, self.my_index(&t)?)))
            .flatten()
            .filter(|(k, j)| k != j);
        match pair {
            Some((k, j)) => t.swap(k, j),
            None if !rebuild && !pruned => return Ok(false),
            None => {}
        }
        if pair.is_none() && t.len() <= 1 {
            // Alone in the group: the kernel has no other socket to steer to, and a process
            // that joins attaches a program built from the table and the claims then.
            return Ok(false);
        }
        let services = match claims {
            Some(c) => c.services(self.key.addr.ip()),
            None => claim::services(self.key.ns, self.key.addr.ip()),
        };
        steer::attach(fd.as_raw_fd(), &table_with(&t, services)).map_err(os("attach"))?;
        write_table(&g.tab, &t)?;
        Ok(true)
    }

    /// The slot of this group's member in the other process that listens on `sid` here
    /// (the member the program would send its REQs to), for handing it a REQ the program
    /// sent to this one.
    pub(crate) fn listener_slot(&self, sid: u64) -> Option<u8> {
        let me = std::process::id();
        let pid = claim::recent_services(self.key.ns, self.key.addr.ip())
            .into_iter()
            .find(|(f, s, pid)| *s == sid && *pid != me && held(f))
            .map(|(_, _, pid)| pid)?;
        let tab = runtime_dir().ok()?.join(format!("{}.tab", self.key.stem()));
        read_table(&tab)
            .into_iter()
            .find(|e| e.pid == pid)
            .map(|e| e.slot)
    }

    /// Whether another live process, and not this one, listens on service `sid` at this
    /// group's address.
    pub(crate) fn listener_elsewhere(&self, sid: u64) -> bool {
        claim::listener_elsewhere(self.key.ns, self.key.addr.ip(), sid)
    }

    /// Attaches a program rebuilt from the table and `claims` (after a listen).
    fn rebuild(&self, claims: &claim::Claims) -> Result<bool> {
        self.swap_with(|_| None, true, Some(claims))
    }
}

/// Rebuilds the program of this process's groups on `addr` (every address for a wildcard)
/// in namespace `ns`: a listener came or went. The claims are read once for all of them,
/// and a group this process is alone in keeps its program (nothing to steer between).
/// Returns how many programs were attached.
pub(crate) fn refresh(ns: u64, addr: std::net::IpAddr) -> Result<usize> {
    let live: Vec<Arc<Member>> = {
        let all = members().lock().unwrap_or_else(|e| e.into_inner());
        all.iter()
            .filter_map(Weak::upgrade)
            .filter(|m| m.key.ns == ns && (addr.is_unspecified() || m.key.addr.ip() == addr))
            .collect()
    };
    if live.is_empty() {
        return Ok(0);
    }
    let claims = claim::Claims::read(ns);
    let mut attached = 0;
    for m in live {
        attached += usize::from(m.rebuild(&claims)?);
    }
    Ok(attached)
}

/// The names of the files in `dir`, sorted (for tests of what a sweep leaves).
#[cfg(test)]
pub(crate) fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wildcard listener's refresh reads the claims once for all of the process's groups
    /// and attaches programs only where there is another socket to steer to.
    #[test]
    fn a_refresh_reads_the_claims_once_and_leaves_lone_groups() {
        // A namespace id no real one has: only this test's groups are in it.
        let ns = u64::MAX - u64::from(std::process::id());
        let lo: WireAddr = std::net::Ipv4Addr::LOCALHOST.into();
        let free = || {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            s.local_addr().unwrap().port()
        };
        let (p1, p2, p3) = (free(), free(), free());
        let key = |port| GroupKey { ns, addr: lo, port };
        let open = |port| move || super::super::sys::open_udp(lo, port, 1 << 16, true, false);
        let slots: Vec<Slot> = (0..4)
            .map(|_| Slot::claim(&Default::default()).unwrap())
            .collect();
        let mut held = Vec::new();
        for (k, port) in [p1, p2, p3].into_iter().enumerate() {
            held.push(join(key(port), slots[k].get(), open(port)).unwrap());
        }
        let any = "0.0.0.0".parse().unwrap();
        let scans = super::claim::thread_scans();
        assert_eq!(refresh(ns, any).unwrap(), 0, "three lone groups");
        assert_eq!(super::claim::thread_scans() - scans, 1);
        // A second socket in p1's group: both of its members attach the new program.
        held.push(join(key(p1), slots[3].get(), open(p1)).unwrap());
        let scans = super::claim::thread_scans();
        assert_eq!(refresh(ns, any).unwrap(), 2);
        assert_eq!(super::claim::thread_scans() - scans, 1);
        for (fd, m) in held.into_iter().rev() {
            m.leave(fd);
        }
    }

    #[test]
    fn removal_follows_the_kernel() {
        let e = |slot| Entry { slot, pid: 1 };
        let mut t = vec![e(1), e(2), e(3), e(4)];
        remove_at(&mut t, 1);
        assert_eq!(t, vec![e(1), e(4), e(3)]);
        remove_at(&mut t, 2);
        assert_eq!(t, vec![e(1), e(4)]);
    }

    #[test]
    fn table_round_trips_and_skips_garbage() {
        let dir = choose_runtime_dir(&Default::default()).unwrap();
        let p = dir.join(format!("test-tab-{}", std::process::id()));
        let t = vec![Entry { slot: 3, pid: 10 }, Entry { slot: 255, pid: 4 }];
        write_table(&p, &t).unwrap();
        assert_eq!(read_table(&p), t);
        std::fs::write(&p, "3 10\nbogus\n300 1\n7 8\n").unwrap();
        assert_eq!(read_table(&p), vec![t[0], Entry { slot: 7, pid: 8 }]);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn slots_are_exclusive_and_freed_on_drop() {
        let a = Slot::claim(&Default::default()).unwrap();
        let b = Slot::claim(&Default::default()).unwrap();
        assert_ne!(a.get(), b.get());
        let dir = choose_runtime_dir(&Default::default()).unwrap();
        assert!(slot_alive(&dir, a.get()));
        let n = a.get();
        drop(a);
        assert!(!slot_alive(&dir, n));
    }

    #[test]
    fn the_sweep_removes_dead_groups_only() {
        let dir = std::env::temp_dir().join(format!("rdma-soft-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let me = std::process::id();
        let group = |stem: &str, tab: &str| {
            std::fs::write(dir.join(format!("{stem}.lock")), "").unwrap();
            std::fs::write(dir.join(format!("{stem}.tab")), tab).unwrap();
        };
        // A live member: slot 7 held by this process, its entry names us.
        let slot7 = open_rw(&dir.join("slot-7")).unwrap();
        assert!(lock(&slot7, true, false).unwrap());
        std::fs::write(dir.join("slot-7"), format!("{me}\n")).unwrap();
        group("grp-1-192.0.2.1-4791", &format!("7 {me}\n"));
        // Dead members only: slot 9 held by nobody; slot 7's earlier owner.
        group("grp-2-192.0.2.2-4791", "9 4000000\n");
        group(
            "grp-3-2001:db8::1-4791",
            &format!("7 {}\n", me.wrapping_add(1)),
        );
        std::fs::write(dir.join("grp-3-2001:db8::1-4791.tmp"), "").unwrap();
        // No table at all (made, never written): nobody.
        std::fs::write(dir.join("grp-4-192.0.2.4-4791.lock"), "").unwrap();
        // Dead entries, but someone holds the lock: left alone.
        group("grp-5-192.0.2.5-4791", "9 4000000\n");
        let held = open_rw(&dir.join("grp-5-192.0.2.5-4791.lock")).unwrap();
        assert!(lock(&held, true, false).unwrap());
        // Not a group's.
        std::fs::write(dir.join("claim-1-x"), "keep").unwrap();

        assert_eq!(sweep_dead_groups(&dir), 3);
        assert_eq!(
            names_in(&dir),
            [
                "claim-1-x",
                "grp-1-192.0.2.1-4791.lock",
                "grp-1-192.0.2.1-4791.tab",
                "grp-5-192.0.2.5-4791.lock",
                "grp-5-192.0.2.5-4791.tab",
                "slot-7",
            ]
        );
        // The live group's table is as it was (the sweep does not write).
        assert_eq!(
            read_table(&dir.join("grp-1-192.0.2.1-4791.tab")),
            vec![Entry { slot: 7, pid: me }]
        );
        drop(held);
        assert_eq!(sweep_dead_groups(&dir), 1);
        drop(slot7);
        assert_eq!(sweep_dead_groups(&dir), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_entry_of_a_slots_earlier_owner_is_dead() {
        let a = Slot::claim(&Default::default()).unwrap();
        let dir = choose_runtime_dir(&Default::default()).unwrap();
        let me = std::process::id();
        let mine = Entry {
            slot: a.get(),
            pid: me,
        };
        // The slot held by us now: an entry a dead process left with it is not alive.
        let earlier = Entry {
            slot: a.get(),
            pid: me.wrapping_add(1),
        };
        assert!(entry_alive(&dir, &mine));
        assert!(!entry_alive(&dir, &earlier));
        let mut t = vec![earlier, mine];
        prune(&dir, &mut t);
        assert_eq!(t, vec![mine]);
        drop(a);
        assert!(!entry_alive(&dir, &mine));
    }
}
