//! The process's inspection socket: one thread that sleeps in `poll` on a listening unix
//! socket and answers each connection with the snapshot.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::client;

/// How long a client may take to read a snapshot before the server gives up on it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// A running inspection socket. Dropping it removes the socket file at once and tells the
/// thread to end.
pub(crate) struct Server {
    path: PathBuf,
    stop: Option<std::sync::Arc<OwnedFd>>,
}

impl Server {
    /// Binds `<dir>/<pid>.sock` and starts the thread; `None` (with a debug event) when the
    /// directory or the socket cannot be made: the process then simply is not inspectable.
    pub(crate) fn start() -> Option<Server> {
        match Server::try_start() {
            Ok(s) => {
                tracing::debug!(path = %s.path.display(), "inspection socket serving");
                Some(s)
            }
            Err(e) => {
                tracing::debug!(error = %e, "no inspection socket");
                None
            }
        }
    }

    fn try_start() -> std::io::Result<Server> {
        let dir = client::ensure_dir()?;
        client::sweep_stale(&dir);
        let path = dir.join(format!("{}.sock", std::process::id()));
        // a file of this pid is from an earlier server of this process (or a dead process
        // whose pid we got): nobody else answers there
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        // SAFETY: plain eventfd; checked, then owned.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        // SAFETY: fresh descriptor.
        let stop = std::sync::Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let thread_stop = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("rdma-inspect".into())
            .spawn(move || serve(listener, thread_stop));
        if let Err(e) = spawned {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        at_exit(Some(path.clone()));
        Ok(Server {
            path,
            stop: Some(stop),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// The socket to remove when the process exits with its server still up (a provider in a
/// static, such as the global CM context, is never dropped).
static AT_EXIT: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

extern "C" fn remove_at_exit() {
    if let Ok(mut p) = AT_EXIT.try_lock() {
        if let Some(p) = p.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn at_exit(path: Option<PathBuf>) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain function; failure only leaves a stale socket behind.
        unsafe { libc::atexit(remove_at_exit) };
    });
    *AT_EXIT.lock().unwrap_or_else(|e| e.into_inner()) = path;
}

impl Drop for Server {
    fn drop(&mut self) {
        at_exit(None);
        let _ = std::fs::remove_file(&self.path);
        if let Some(stop) = self.stop.take() {
            let one = 1u64;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd.
            unsafe { libc::write(stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }
}

fn serve(listener: UnixListener, stop: std::sync::Arc<OwnedFd>) {
    let mut fds = [
        libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: stop.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: a live array of two pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            tracing::debug!("inspection socket: poll failed, serving stops");
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        if fds[0].revents == 0 {
            continue;
        }
        let Ok((conn, _)) = listener.accept() else {
            continue;
        };
        let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
        let mut body = super::snapshot().to_string();
        body.push('\n');
        if let Err(e) = send_all(&conn, body.as_bytes()) {
            tracing::debug!(error = %e, "inspection client went away");
        }
    }
}

/// Writes all of `buf` with `MSG_NOSIGNAL`: a client that hangs up must not raise SIGPIPE in
/// an application that does not ignore it.
fn send_all(conn: &std::os::unix::net::UnixStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: sends from a live slice on our connected socket.
        let n = unsafe {
            libc::send(
                conn.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = buf.get(n as usize..).unwrap_or(&[]);
    }
    Ok(())
}
