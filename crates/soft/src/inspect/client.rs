//! Finding and querying the inspection sockets of every live process of this user.

use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

/// How long a query waits for one process's answer.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The per-user directory of the inspection sockets: the process's [`crate::SoftConfig::inspect_dir`]
/// (`$RDMA_SOFT_INSPECT_DIR`), else the
/// runtime directory the sharing wires use ([`crate::config::runtime_dir`]:
/// `$RDMA_SOFT_RUNDIR`, else the first private one of ours among
/// `$XDG_RUNTIME_DIR/rdma-soft`, `/run/user/$UID/rdma-soft`, `/tmp/rdma-soft-$UID`, else
/// the private `/tmp/rdma-soft-$UID-XXXXXX` all our processes share), else `/tmp/rdma-soft-<uid>`.
///
/// ```
/// let d = rdma_soft::inspect::runtime_dir();
/// assert!(d.is_absolute() || rdma_soft::SoftConfig::from_env().unwrap().inspect_dir.is_some());
/// ```
pub fn runtime_dir() -> PathBuf {
    if let Some(d) = &crate::config::process().inspect_dir {
        return d.clone();
    }
    if let Ok(d) = crate::config::runtime_dir() {
        return d;
    }
    let uid = crate::fd::euid();
    PathBuf::from(format!("/tmp/rdma-soft-{uid}"))
}

/// Makes the directory (mode 0700) and checks it is ours: a directory of another user (or
/// a symlink) in /tmp is refused rather than used. The shared runtime directory was made
/// and checked when chosen.
pub(super) fn ensure_dir() -> std::io::Result<PathBuf> {
    if crate::config::process().inspect_dir.is_none() {
        return crate::config::runtime_dir().map_err(std::io::Error::other);
    }
    let dir = runtime_dir();
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let md = std::fs::symlink_metadata(&dir)?;
    let uid = crate::fd::euid();
    if !md.is_dir() || md.uid() != uid {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{} is not a directory of this user", dir.display()),
        ));
    }
    if md.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(dir)
}

/// The pid a socket file name stands for (`<pid>.sock`).
fn pid_of(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    name.strip_suffix(".sock")?.parse().ok()
}

fn sockets(dir: &Path) -> Vec<(u32, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<(u32, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter_map(|p| pid_of(&p).map(|pid| (pid, p)))
        .collect();
    v.sort();
    v
}

/// Whether connecting failed because nobody listens there any more (a dead process).
fn is_stale(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNREFUSED) | Some(libc::ENOENT)
    )
}

/// Removes the sockets of processes that are gone (no `/proc/<pid>`; a live process is not
/// connected to, so a starting server costs the others nothing; a socket whose pid was
/// reused is removed by the next query, which finds it refusing connections).
pub(super) fn sweep_stale(dir: &Path) {
    for (pid, path) in sockets(dir) {
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// One process's answer to [`query_all`].
#[derive(Debug)]
pub struct Answer {
    /// The pid its socket is named after.
    pub pid: u32,
    /// Its snapshot (see [`crate::inspect::snapshot`]), or why it could not be had.
    pub snapshot: std::io::Result<Value>,
}

/// Queries every live process's inspection socket in [`runtime_dir`], in pid order.
/// Sockets of dead processes (refusing connections) are removed and not listed; a process
/// that answers garbage or too slowly is listed with its error.
pub fn query_all() -> Vec<Answer> {
    let dir = runtime_dir();
    let mut out = Vec::new();
    for (pid, path) in sockets(&dir) {
        match query(&path) {
            Err(e) if is_stale(&e) => {
                let _ = std::fs::remove_file(&path);
            }
            snapshot => out.push(Answer { pid, snapshot }),
        }
    }
    out
}

fn query(path: &Path) -> std::io::Result<Value> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(READ_TIMEOUT))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    serde_json::from_slice(&buf)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}
