//! The kernel's default IPv4 hop limit (`net.ipv4.ip_default_ttl`) of the resolver's
//! namespace, kept between resolutions.
//!
//! The sysctl has no change notification, so the value is read again when it is older than
//! [`REREAD`] (the bound `rdma-hostview` keeps route answers for, for the same reason): a
//! burst of resolutions reads the file once, not once per connection.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The sysctl file.
pub(super) const IPV4_TTL: &str = "/proc/sys/net/ipv4/ip_default_ttl";

/// How long a read value is used.
pub(super) const REREAD: Duration = Duration::from_secs(1);

/// The file (opened once, in the resolver's namespace) and the last value read from it.
#[derive(Debug)]
pub(super) struct DefaultTtl {
    file: Option<File>,
    kept: Mutex<Option<(Option<u8>, Instant)>>,
}

impl DefaultTtl {
    /// Opens the sysctl in the calling thread's namespace (`None` inside: read by path).
    pub(super) fn open() -> DefaultTtl {
        DefaultTtl {
            file: File::open(IPV4_TTL).ok(),
            kept: Mutex::new(None),
        }
    }

    /// The value, read at most every [`REREAD`] (`None` if unreadable).
    pub(super) fn get(&self, now: Instant) -> Option<u8> {
        let mut k = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((v, at)) = *k {
            if now.saturating_duration_since(at) < REREAD {
                return v;
            }
        }
        let v = self.read();
        *k = Some((v, now));
        v
    }

    /// Reads the kernel's current value (`pread` at 0: the kernel formats it anew).
    fn read(&self) -> Option<u8> {
        let parse = |t: &str| t.trim().parse().ok();
        match &self.file {
            Some(f) => {
                let mut buf = [0u8; 16];
                let n = f.read_at(&mut buf, 0).ok()?;
                std::str::from_utf8(buf.get(..n)?).ok().and_then(parse)
            }
            None => std::fs::read_to_string(IPV4_TTL)
                .ok()
                .and_then(|t| parse(&t)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One read serves every resolution within `REREAD`; a later one reads again.
    #[test]
    fn kept_then_read_again() {
        let t = DefaultTtl::open();
        let now = Instant::now();
        let v = t.get(now);
        assert_eq!(v, t.read(), "the first call reads the kernel's value");
        // a kept value: a poisoned file would not be read again within REREAD
        *t.kept.lock().unwrap() = Some((Some(7), now));
        assert_eq!(t.get(now + REREAD / 2), Some(7));
        assert_eq!(
            t.get(now + REREAD),
            t.read(),
            "older than REREAD: read again"
        );
    }
}
