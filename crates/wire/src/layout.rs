//! Declarative helpers for the fixed-layout management views (MAD header, CM messages).
//!
//! `view!` declares a zero-copy view struct with `new_unchecked`, `new_checked`,
//! `into_inner`, and one getter plus one setter per field. Field kinds:
//!
//! | kind | Rust type | meaning |
//! |---|---|---|
//! | `u8(at)`, `u16(at)`, `u32(at)`, `u64(at)` | same | big-endian integer at byte `at` |
//! | `u24(at)` | `u32` | 24-bit big-endian integer at `at..at+3` |
//! | `bits(at, shift, width)` | `u8` | `width` bits of byte `at`, `shift` bits up from its LSB |
//! | `flag(at, shift)` | `bool` | one bit of byte `at` |
//! | `word(at, shift, width)` | `u32` | `width` bits of the 32-bit word at `at`, `shift` up from its LSB |
//! | `time(at, shift)` | [`IbaTime`](crate::time::IbaTime) | a 5-bit IBA time value |
//! | `gid(at)` | [`Ipv6Addr`](std::net::Ipv6Addr) | a 16-byte GID |
//!
//! Setters store only the bits the field has (wider values are masked), as smoltcp's do;
//! the `Repr::emit` functions reject out-of-range values instead.

/// The Rust type a field kind reads as.
macro_rules! field_ty {
    (u8) => {
        u8
    };
    (u16) => {
        u16
    };
    (u24) => {
        u32
    };
    (u32) => {
        u32
    };
    (u64) => {
        u64
    };
    (bits) => {
        u8
    };
    (flag) => {
        bool
    };
    (word) => {
        u32
    };
    (time) => {
        $crate::time::IbaTime
    };
    (gid) => {
        ::std::net::Ipv6Addr
    };
}

/// Reads a field of the given kind from `$b: &[u8]`.
macro_rules! field_get {
    ($b:expr, u8($at:expr)) => {
        $b[$at]
    };
    ($b:expr, u16($at:expr)) => {
        $crate::field::get_u16($b, $at)
    };
    ($b:expr, u24($at:expr)) => {
        $crate::field::get_u24($b, $at)
    };
    ($b:expr, u32($at:expr)) => {
        $crate::field::get_u32($b, $at)
    };
    ($b:expr, u64($at:expr)) => {
        $crate::field::get_u64($b, $at)
    };
    ($b:expr, bits($at:expr, $shift:expr, $width:expr)) => {
        ($b[$at] >> $shift) & $crate::layout::mask8($width)
    };
    ($b:expr, flag($at:expr, $shift:expr)) => {
        ($b[$at] >> $shift) & 1 == 1
    };
    ($b:expr, word($at:expr, $shift:expr, $width:expr)) => {
        ($crate::field::get_u32($b, $at) >> $shift) & $crate::layout::mask32($width)
    };
    ($b:expr, time($at:expr, $shift:expr)) => {
        $crate::time::IbaTime::from_bits_truncate($b[$at] >> $shift)
    };
    ($b:expr, gid($at:expr)) => {
        $crate::layout::get_gid($b, $at)
    };
}

/// Writes `$v` into a field of the given kind of `$b: &mut [u8]`.
macro_rules! field_set {
    ($b:expr, u8($at:expr), $v:expr) => {
        $b[$at] = $v
    };
    ($b:expr, u16($at:expr), $v:expr) => {
        $crate::field::set_u16($b, $at, $v)
    };
    ($b:expr, u24($at:expr), $v:expr) => {
        $crate::field::set_u24($b, $at, $v)
    };
    ($b:expr, u32($at:expr), $v:expr) => {
        $crate::field::set_u32($b, $at, $v)
    };
    ($b:expr, u64($at:expr), $v:expr) => {
        $crate::field::set_u64($b, $at, $v)
    };
    ($b:expr, bits($at:expr, $shift:expr, $width:expr), $v:expr) => {
        $crate::layout::set_bits($b, $at, $shift, $width, $v)
    };
    ($b:expr, flag($at:expr, $shift:expr), $v:expr) => {
        $crate::layout::set_bits($b, $at, $shift, 1, u8::from($v))
    };
    ($b:expr, word($at:expr, $shift:expr, $width:expr), $v:expr) => {
        $crate::layout::set_word($b, $at, $shift, $width, $v)
    };
    ($b:expr, time($at:expr, $shift:expr), $v:expr) => {
        $crate::layout::set_bits($b, $at, $shift, 5, $v.value())
    };
    ($b:expr, gid($at:expr), $v:expr) => {
        $b[$at..$at + 16].copy_from_slice(&$v.octets())
    };
}

/// Declares a view struct over a fixed-length layout, with a getter and a setter per field.
macro_rules! view {
    (
        $(#[$sm:meta])*
        pub struct $name:ident, len = $len:expr;
        $( $(#[$fm:meta])* $get:ident / $set:ident : $kind:ident $args:tt; )*
    ) => {
        $(#[$sm])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Length of the layout in bytes.
            pub const LEN: usize = $len;

            /// Wraps a buffer without checking its length.
            ///
            /// The accessors panic if the buffer is shorter than [`Self::LEN`]; use
            /// [`Self::new_checked`] on untrusted input.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer, checking that it holds at least [`Self::LEN`] bytes.
            pub fn new_checked(buffer: T) -> $crate::Result<Self> {
                $crate::field::check_len(buffer.as_ref(), $len)?;
                Ok(Self { buffer })
            }

            /// Returns the wrapped buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            $(
                $(#[$fm])*
                #[inline]
                pub fn $get(&self) -> $crate::layout::field_ty!($kind) {
                    $crate::layout::field_get!(self.buffer.as_ref(), $kind $args)
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            $(
                #[doc = concat!("Sets the field read by [`", stringify!($get), "`](Self::",
                    stringify!($get), ").")]
                #[inline]
                pub fn $set(&mut self, value: $crate::layout::field_ty!($kind)) {
                    $crate::layout::field_set!(self.buffer.as_mut(), $kind $args, value)
                }
            )*
        }
    };
}

/// Declares a byte-range accessor pair (`&[u8]` and `&mut [u8]`) on a view.
macro_rules! bytes_field {
    ($name:ident, $(#[$fm:meta])* $get:ident / $get_mut:ident : $range:expr) => {
        impl<T: AsRef<[u8]>> $name<T> {
            $(#[$fm])*
            #[inline]
            pub fn $get(&self) -> &[u8] {
                &self.buffer.as_ref()[$range]
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            #[doc = concat!("The bytes of [`", stringify!($get), "`](Self::",
                stringify!($get), "), mutable.")]
            #[inline]
            pub fn $get_mut(&mut self) -> &mut [u8] {
                &mut self.buffer.as_mut()[$range]
            }
        }
    };
}

/// Declares an enum over an integer code, with one catch-all variant for every other value.
macro_rules! code_enum {
    (
        $(#[$em:meta])*
        pub enum $name:ident : $repr:ty {
            $( $(#[$vm:meta])* $variant:ident = $value:expr, )*
        }
        $(#[$om:meta])*
        other $other:ident
    ) => {
        $(#[$em])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vm])* $variant, )*
            $(#[$om])*
            $other($repr),
        }

        impl From<$repr> for $name {
            fn from(value: $repr) -> Self {
                match value {
                    $( $value => $name::$variant, )*
                    other => $name::$other(other),
                }
            }
        }

        impl From<$name> for $repr {
            fn from(value: $name) -> Self {
                match value {
                    $( $name::$variant => $value, )*
                    $name::$other(other) => other,
                }
            }
        }
    };
}

pub(crate) use {bytes_field, code_enum, field_get, field_set, field_ty, view};

/// A mask of the low `width` bits of a byte (`width` ≤ 8).
#[inline]
pub(crate) const fn mask8(width: u32) -> u8 {
    if width >= 8 {
        0xff
    } else {
        (1u8 << width) - 1
    }
}

/// Stores the low `width` bits of `v` at `shift` in byte `at`, keeping the other bits.
#[inline]
pub(crate) fn set_bits(b: &mut [u8], at: usize, shift: u32, width: u32, v: u8) {
    let m = mask8(width) << shift;
    b[at] = (b[at] & !m) | ((v << shift) & m);
}

/// A mask of the low `width` bits of a word (`width` ≤ 32).
#[inline]
pub(crate) const fn mask32(width: u32) -> u32 {
    if width >= 32 {
        u32::MAX
    } else {
        (1u32 << width) - 1
    }
}

/// Stores the low `width` bits of `v` at `shift` in the 32-bit word at `at`, keeping the
/// other bits.
#[inline]
pub(crate) fn set_word(b: &mut [u8], at: usize, shift: u32, width: u32, v: u32) {
    let m = mask32(width) << shift;
    let old = crate::field::get_u32(b, at);
    crate::field::set_u32(b, at, (old & !m) | ((v << shift) & m));
}

/// Reads a 16-byte GID.
#[inline]
pub(crate) fn get_gid(b: &[u8], at: usize) -> std::net::Ipv6Addr {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[at..at + 16]);
    std::net::Ipv6Addr::from(g)
}

/// Copies `N` bytes starting at `at` into an array.
#[inline]
pub(crate) fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[at..at + N]);
    out
}

/// Checks that `value` fits in `bits` bits, for the `Repr::emit` functions.
#[inline]
pub(crate) fn check_bits(value: u64, bits: u32, field: &'static str) -> crate::Result<()> {
    if bits < 64 && value >> bits != 0 {
        Err(crate::Error::BadField(field))
    } else {
        Ok(())
    }
}

/// Checks that `buf` can take `need` bytes of output.
#[inline]
pub(crate) fn check_out(buf: &[u8], need: usize) -> crate::Result<()> {
    if buf.len() < need {
        Err(crate::Error::BufferTooSmall {
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}
