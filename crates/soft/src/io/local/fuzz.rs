//! Fuzzing entry point for the bell (feature `fuzzing`): datagrams from a same-user
//! process, each with a descriptor of some kind, read by [`HostLocal::drain_bell`].

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

use super::bell::Bell;
use super::ring::{Ring, MIN_CAPACITY};
use super::HostLocal;
use crate::io::share::Slot;

/// One wire and a sender for the whole fuzzing run (a slot and a bell per input would
/// exhaust the slots).
static WIRE: Mutex<Option<(HostLocal, Slot, Bell)>> = Mutex::new(None);

/// A descriptor of kind `k`: none, an eventfd, a ring, a region file, a pipe, a socket.
fn descriptor(k: u8) -> Option<OwnedFd> {
    match k % 6 {
        1 => crate::fd::EventFd::new()
            .ok()
            .and_then(|e| e.as_fd().try_clone_to_owned().ok()),
        2 => Ring::create(MIN_CAPACITY)
            .ok()
            .and_then(|r| r.fd().try_clone_to_owned().ok()),
        3 => crate::memfd::sealed(c"fuzz-region", 4096 + 8192).ok(),
        4 => {
            let mut p = [0i32; 2];
            // SAFETY: a live two-int array; on success both ends are ours.
            if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                return None;
            }
            // SAFETY: fresh descriptors owned here (the read end closes at once).
            drop(unsafe { OwnedFd::from_raw_fd(p[0]) });
            Some(unsafe { OwnedFd::from_raw_fd(p[1]) })
        }
        5 => std::net::UdpSocket::bind("127.0.0.1:0")
            .ok()
            .map(OwnedFd::from),
        _ => None,
    }
}

/// `input` as bell messages: each `[length, descriptor kind, bytes...]`, sent to the wire's
/// bell, which then reads them all.
pub(crate) fn drain_bell(input: &[u8]) {
    let mut g = WIRE.lock().unwrap_or_else(|p| p.into_inner());
    if g.is_none() {
        let Ok(slot) = Slot::claim(&Default::default()) else {
            return;
        };
        let Ok(wire) = HostLocal::new(slot.get(), 1, MIN_CAPACITY) else {
            return;
        };
        let path = wire.dir.join(format!("fuzz-sender-{}", std::process::id()));
        let Ok(sender) = Bell::bind(path.clone()) else {
            return;
        };
        // it only sends: no file left behind (this static is never dropped)
        let _ = std::fs::remove_file(path);
        *g = Some((wire, slot, sender));
    }
    let Some((wire, _, sender)) = g.as_mut() else {
        return;
    };
    let to = wire.dir.join(wire.me.bell_name());
    let mut rest = input;
    while let [len, kind, more @ ..] = rest {
        let n = usize::from(*len).min(more.len()).min(64);
        let fd = descriptor(*kind);
        let _ = sender.send(&to, &more[..n], fd.as_ref().map(|f| f.as_fd()));
        rest = &more[n..];
    }
    wire.drain_bell();
    // the rings it attached, read as a consumer would (their producers wrote nothing)
    let mut got = 0usize;
    wire.recv(&mut |_, _| got += 1);
    assert_eq!(got, 0, "nothing was published");
}
