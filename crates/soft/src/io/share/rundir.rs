//! Choosing and pinning the per-user runtime directory ([`crate::io::share::choose_runtime_dir`]).
//!
//! Another user may have made our usual directory first (`/tmp` is shared): then the next
//! candidate is taken, and when none is ours, a fresh private directory (the same one for
//! every process of ours: the oldest such directory is reused). The one chosen is
//! opened once and used through `/proc/self/fd/N` from then on: a rename or replacement of
//! its path afterwards (by anyone) does not move us to another directory.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// A directory of ours, open.
#[derive(Debug)]
pub(crate) struct Pinned {
    /// The path it had when chosen (for messages).
    pub name: PathBuf,
    /// `/proc/self/fd/N` when `/proc` shows this very directory there, else `name`.
    via: PathBuf,
    /// Held open: what `via` names.
    _fd: OwnedFd,
}

impl Pinned {
    fn new(name: &Path, fd: OwnedFd, st: &libc::stat) -> Pinned {
        let via = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        let via = match std::fs::metadata(&via) {
            Ok(b) if same(st, &b) => via,
            _ => name.to_path_buf(),
        };
        Pinned {
            name: name.to_path_buf(),
            via,
            _fd: fd,
        }
    }

    /// The path that reaches this very directory (computed once: no system call).
    pub fn path(&self) -> PathBuf {
        self.via.clone()
    }
}

fn same(a: &libc::stat, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.st_dev == b.dev() && a.st_ino == b.ino()
}

fn fstat(fd: &OwnedFd) -> Option<libc::stat> {
    // SAFETY: fstat into a zeroed struct on a live descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0).then_some(st)
}

/// Opens `dir` (made 0700 when absent) if it is a directory of `uid` that nobody else may
/// write to; the reason otherwise.
pub(crate) fn open_private(dir: &Path, uid: u32) -> Result<Pinned, String> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    }
    open_existing(dir, uid)
}

/// [`open_private`] without making it.
fn open_existing(dir: &Path, uid: u32) -> Result<Pinned, String> {
    let shown = || dir.display().to_string();
    let c = CString::new(dir.as_os_str().as_bytes()).map_err(|e| format!("{}: {e}", shown()))?;
    // SAFETY: a C string path; the result is checked. O_NOFOLLOW: a symlink is refused.
    let raw = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if raw < 0 {
        return Err(format!("{}: {}", shown(), std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // checked on the open directory itself: no window between the check and its use
    let st = fstat(&fd).ok_or_else(|| format!("{}: fstat failed", shown()))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR || st.st_uid != uid || st.st_mode & 0o022 != 0 {
        return Err(format!(
            "{} is not a private directory of uid {uid}",
            shown()
        ));
    }
    Ok(Pinned::new(dir, fd, &st))
}

/// The oldest (birth time, then name) private directory of `uid` named
/// `rdma-soft-UID-*` in `tmp`: the fresh one a process of ours made before.
fn oldest_fresh(tmp: &Path, uid: u32) -> Option<Pinned> {
    let prefix = format!("rdma-soft-{uid}-");
    let mut found: Vec<(Option<std::time::SystemTime>, PathBuf)> = std::fs::read_dir(tmp)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().as_bytes().starts_with(prefix.as_bytes()))
        .map(|e| (e.metadata().and_then(|m| m.created()).ok(), e.path()))
        .collect();
    found.sort();
    found.iter().find_map(|(_, p)| open_existing(p, uid).ok())
}

/// The first of `candidates` that is a private directory of `uid`; when none is, the
/// oldest fresh one (`rdma-soft-UID-XXXXXX` under `tmp`, private and ours), made when there
/// is none (logged at warn). Processes of ours agree on it: two that make one each at once
/// both keep the older (by birth time) and the other's maker removes its own.
pub(crate) fn choose(candidates: &[PathBuf], uid: u32, tmp: &Path) -> Result<Pinned, String> {
    let mut why = Vec::new();
    for c in candidates {
        match open_private(c, uid) {
            Ok(p) => {
                if !why.is_empty() {
                    tracing::warn!(dir = %c.display(), refused = ?why, "rdma-soft runtime directory: fell back");
                }
                return Ok(p);
            }
            Err(e) => why.push(e),
        }
    }
    if let Some(p) = oldest_fresh(tmp, uid) {
        tracing::warn!(dir = %p.name.display(), refused = ?why, "rdma-soft runtime directory: none of the usual ones is ours, using our earlier private one");
        return Ok(p);
    }
    let mut template = tmp
        .join(format!("rdma-soft-{uid}-XXXXXX"))
        .into_os_string()
        .into_vec();
    template.push(0);
    // SAFETY: a NUL-terminated, writable template; mkdtemp makes the directory 0700.
    let made = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
    if made.is_null() {
        why.push(format!("mkdtemp: {}", std::io::Error::last_os_error()));
        return Err(why.join("; "));
    }
    template.pop();
    let dir = PathBuf::from(std::ffi::OsString::from_vec(template));
    // another process of ours may have made one at the same time: both take the older
    let p = match oldest_fresh(tmp, uid) {
        Some(p) => p,
        None => open_existing(&dir, uid)?,
    };
    if p.name != dir {
        let _ = std::fs::remove_dir(&dir);
    }
    tracing::warn!(dir = %p.name.display(), refused = ?why, "rdma-soft runtime directory: none of the usual ones is ours, using a fresh private one");
    Ok(p)
}

/// The usual candidates, in order: `$XDG_RUNTIME_DIR/rdma-soft`, `/run/user/$UID/rdma-soft`,
/// `/tmp/rdma-soft-$UID` (each only when its parent exists).
pub(crate) fn candidates(uid: u32, xdg_runtime_dir: Option<&Path>) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(x) = xdg_runtime_dir.filter(|x| !x.as_os_str().is_empty()) {
        if x.is_dir() {
            v.push(x.join("rdma-soft"));
        }
    }
    let run = PathBuf::from(format!("/run/user/{uid}"));
    if run.is_dir() && !v.contains(&run.join("rdma-soft")) {
        v.push(run.join("rdma-soft"));
    }
    v.push(PathBuf::from(format!("/tmp/rdma-soft-{uid}")));
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn require_root() -> bool {
        // SAFETY: no arguments.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root (setpriv to another user)");
            return false;
        }
        true
    }

    /// `dir` made by uid 65534 (nobody), as a squatter would: `setpriv --reuid=65534`.
    fn squat(dir: &Path) {
        let ok = std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "mkdir",
                "-m",
                "0777",
            ])
            .arg(dir)
            .status()
            .expect("setpriv (util-linux)")
            .success();
        assert!(ok, "setpriv mkdir {}", dir.display());
        assert_eq!(std::fs::metadata(dir).unwrap().uid(), 65534);
    }

    /// A world-searchable scratch directory for the test (nobody must be able to mkdir).
    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "rdma-soft-rundir-test-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::DirBuilder::new().mode(0o1777).create(&d).unwrap();
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
        d
    }

    #[test]
    fn the_usual_places_start_at_the_given_xdg_runtime_dir() {
        let xdg = std::env::temp_dir().join(format!("rdma-soft-xdg-{}", std::process::id()));
        std::fs::create_dir_all(&xdg).unwrap();
        let tmp = PathBuf::from("/tmp/rdma-soft-4242");
        let c = candidates(4242, Some(&xdg));
        assert_eq!(c.first(), Some(&xdg.join("rdma-soft")));
        assert_eq!(c.last(), Some(&tmp));
        // none given, or one that does not exist: not a candidate
        assert!(!candidates(4242, None).contains(&xdg.join("rdma-soft")));
        let gone = xdg.join("gone");
        assert!(!candidates(4242, Some(&gone)).contains(&gone.join("rdma-soft")));
        std::fs::remove_dir_all(&xdg).unwrap();
    }

    #[test]
    fn a_squatted_directory_is_refused_and_the_next_one_taken() {
        if !require_root() {
            return;
        }
        let base = scratch("next");
        let (theirs, ours) = (base.join("theirs"), base.join("ours"));
        squat(&theirs);
        let e = open_private(&theirs, 0).unwrap_err();
        assert!(e.contains("not a private directory"), "{e}");
        let p = choose(&[theirs.clone(), ours.clone()], 0, &base).unwrap();
        assert_eq!(p.name, ours);
        // nothing of ours went into the squatter's directory
        assert_eq!(std::fs::read_dir(&theirs).unwrap().count(), 0);
        // none of ours at all: a fresh private one
        let p = choose(std::slice::from_ref(&theirs), 0, &base).unwrap();
        assert_ne!(p.name, theirs);
        let md = std::fs::metadata(&p.name).unwrap();
        assert_eq!((md.uid(), md.mode() & 0o777), (0, 0o700));
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn processes_of_ours_agree_on_the_fresh_directory() {
        // SAFETY: no arguments.
        let uid = unsafe { libc::geteuid() };
        let base =
            std::env::temp_dir().join(format!("rdma-soft-rundir-fresh-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir(&base).unwrap();
        // the usual one is not a directory of ours (a file in its place)
        let theirs = base.join("theirs");
        std::fs::write(&theirs, b"").unwrap();
        let first = choose(std::slice::from_ref(&theirs), uid, &base).unwrap();
        assert!(first
            .name
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(&format!("rdma-soft-{uid}-")));
        // a second process of ours takes the same one
        let again = choose(std::slice::from_ref(&theirs), uid, &base).unwrap();
        assert_eq!(again.name, first.name);
        // a newer one (made by a process that raced us) is not taken
        std::thread::sleep(std::time::Duration::from_millis(20));
        let newer = base.join(format!("rdma-soft-{uid}-000000"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&newer)
            .unwrap();
        if std::fs::metadata(&newer).unwrap().created().is_ok() {
            let third = choose(std::slice::from_ref(&theirs), uid, &base).unwrap();
            assert_eq!(third.name, first.name, "the older one");
        }
        // one another user could write to is skipped
        std::fs::set_permissions(
            &first.name,
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let fourth = choose(std::slice::from_ref(&theirs), uid, &base).unwrap();
        assert_eq!(fourth.name, newer);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn the_chosen_directory_stays_the_same_after_a_rename() {
        if !require_root() {
            return;
        }
        let base = scratch("pin");
        let dir = base.join("d");
        let p = open_private(&dir, 0).unwrap();
        let path = p.path();
        assert!(path.starts_with("/proc/self/fd"), "{}", path.display());
        std::fs::write(path.join("mine"), b"1").unwrap();
        // someone renames it away and puts their own in its place
        std::fs::rename(&dir, base.join("moved")).unwrap();
        squat(&dir);
        std::fs::write(path.join("after"), b"2").unwrap();
        assert!(
            base.join("moved/after").exists(),
            "still the directory we chose"
        );
        assert!(!dir.join("after").exists(), "nothing in the squatter's");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
