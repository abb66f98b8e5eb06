//! A connection's message window and largest message: each side's settings
//! ([`ConnectOptions::window`](super::ConnectOptions::window),
//! [`ListenerBuilder::window`](super::ListenerBuilder::window) and `max_message`), and the
//! smaller of both ends' that a connection uses.
//!
//! A side whose settings differ from the defaults ([`WINDOW`], [`MAX_MESSAGE`]) says so in
//! its REQ's or REP's private data: the last [`TRAILER_LEN`] bytes of the field (56 bytes
//! after the IP CM header in a REQ, 196 in a REP) are `RCMSZ1`, the window (u16) and the
//! largest message (u32), big-endian; the application's private data is what comes before.
//! A side with the defaults sends nothing of the kind (the private data is the application's
//! alone, as before), and one that finds no trailer takes the defaults for its peer.

use super::{MAX_MESSAGE, WINDOW};
use crate::error::{Error, Result};

/// Bytes the settings take at the end of the private data when they are not the defaults.
pub(super) const TRAILER_LEN: usize = 12;
const MAGIC: &[u8; 6] = b"RCMSZ1";
/// Smallest and largest window a side may set.
const WINDOWS: std::ops::RangeInclusive<u32> = 2..=4096;
/// Smallest and largest message size a side may set.
const MESSAGES: std::ops::RangeInclusive<usize> = 64..=(16 << 20);

/// One side's (or the agreed) window and largest message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MsgSizes {
    pub window: u32,
    pub max_message: usize,
}

impl Default for MsgSizes {
    fn default() -> Self {
        MsgSizes {
            window: WINDOW,
            max_message: MAX_MESSAGE,
        }
    }
}

impl MsgSizes {
    /// `EINVAL` outside 2..=4096 messages of 64 B..=16 MiB.
    pub fn check(self) -> Result<MsgSizes> {
        if WINDOWS.contains(&self.window) && MESSAGES.contains(&self.max_message) {
            Ok(self)
        } else {
            Err(Error::InvalidArgument(format!(
                "window {} (2 to 4096) or largest message {} (64 B to 16 MiB) out of range",
                self.window, self.max_message
            )))
        }
    }

    /// What both ends use: the smaller window and the smaller largest message.
    pub fn agree(self, peer: MsgSizes) -> MsgSizes {
        MsgSizes {
            window: self.window.min(peer.window),
            max_message: self.max_message.min(peer.max_message),
        }
    }

    /// The private data to send: `data` alone with the defaults; else `data` padded to
    /// `field - TRAILER_LEN` bytes and the trailer (`EINVAL` when `data` is longer).
    pub fn attach(self, mut data: Vec<u8>, field: usize) -> Result<Vec<u8>> {
        if self == MsgSizes::default() {
            return Ok(data);
        }
        let room = field - TRAILER_LEN;
        if data.len() > room {
            return Err(Error::InvalidArgument(format!(
                "private data of {} bytes: at most {room} with a window or message size \
                 other than the defaults",
                data.len()
            )));
        }
        data.resize(room, 0);
        data.extend_from_slice(MAGIC);
        data.extend_from_slice(&(self.window as u16).to_be_bytes());
        data.extend_from_slice(&(self.max_message as u32).to_be_bytes());
        Ok(data)
    }

    /// The peer's settings in received private data (the defaults without a valid
    /// trailer), and the application's part of the data.
    pub fn detach(data: &[u8]) -> (MsgSizes, &[u8]) {
        let Some(at) = data.len().checked_sub(TRAILER_LEN) else {
            return (MsgSizes::default(), data);
        };
        let t = &data[at..];
        if &t[..6] != MAGIC {
            return (MsgSizes::default(), data);
        }
        let peer = MsgSizes {
            window: u16::from_be_bytes([t[6], t[7]]) as u32,
            max_message: u32::from_be_bytes([t[8], t[9], t[10], t[11]]) as usize,
        };
        match peer.check() {
            Ok(p) => (p, &data[..at]),
            Err(_) => (MsgSizes::default(), data),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_send_the_data_alone_and_read_as_defaults() {
        let d = MsgSizes::default();
        assert_eq!(d.attach(b"hi".to_vec(), 56).unwrap(), b"hi");
        let mut field = b"hi".to_vec();
        field.resize(56, 0);
        assert_eq!(MsgSizes::detach(&field), (d, &field[..]));
    }

    #[test]
    fn other_settings_travel_at_the_end_of_the_field() {
        let s = MsgSizes {
            window: 4,
            max_message: 1024,
        };
        let sent = s.attach(b"hi".to_vec(), 56).unwrap();
        assert_eq!(sent.len(), 56);
        let (peer, data) = MsgSizes::detach(&sent);
        assert_eq!(peer, s);
        assert_eq!(&data[..2], b"hi");
        assert_eq!(data.len(), 56 - TRAILER_LEN);
        assert!(s.attach(vec![1; 45], 56).is_err());
        assert_eq!(s.agree(MsgSizes::default()), s);
    }

    #[test]
    fn a_trailer_out_of_range_is_data() {
        let mut f = vec![0u8; 44];
        f.extend_from_slice(MAGIC);
        f.extend_from_slice(&0u16.to_be_bytes());
        f.extend_from_slice(&1024u32.to_be_bytes());
        assert_eq!(MsgSizes::detach(&f).0, MsgSizes::default());
        assert_eq!(MsgSizes::detach(&f).1.len(), 56);
        assert!(MsgSizes {
            window: 1,
            max_message: 1024
        }
        .check()
        .is_err());
    }
}
