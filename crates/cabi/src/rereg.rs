//! `ibv_rereg_mr`: a region moved to new memory, a new PD or new access rights, by
//! registering the new one and then dropping the old (whose keys stop working): on failure
//! the old registration stays, as with a kernel device.
#![allow(missing_docs)]

use libc::{c_int, c_void};

use crate::objects::{access_of, obj, Mr, Pd};
use crate::types::*;
use crate::util::*;

/// `IBV_REREG_MR_CHANGE_TRANSLATION`, `_CHANGE_PD`, `_CHANGE_ACCESS`.
const TRANSLATION: c_int = 1;
const CHANGE_PD: c_int = 2;
const CHANGE_ACCESS: c_int = 4;
/// `IBV_REREG_MR_ERR_INPUT` and `IBV_REREG_MR_ERR_CMD` (errno set).
const ERR_INPUT: c_int = -1;
const ERR_CMD: c_int = -4;

#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let fail = |e, code| {
        set_errno(e);
        code
    };
    // SAFETY: the caller's MR (not in use by another call meanwhile, as verbs requires).
    let Some(m) = (unsafe { mr.cast::<Mr>().as_mut() }) else {
        return fail(libc::EINVAL, ERR_INPUT);
    };
    if flags & !(TRANSLATION | CHANGE_PD | CHANGE_ACCESS) != 0
        || (flags & TRANSLATION != 0 && (length == 0 || addr.is_null()))
        || (access != 0 && flags & CHANGE_ACCESS == 0)
    {
        return fail(libc::EINVAL, ERR_INPUT);
    }
    if flags == 0 {
        return 0;
    }
    let new_pd = if flags & CHANGE_PD != 0 { pd } else { m.c.pd };
    // SAFETY: the caller's PD, or the MR's own.
    let Some(p) = (unsafe { obj::<_, Pd>(new_pd) }) else {
        return fail(libc::EINVAL, ERR_CMD);
    };
    let (a, len) = if flags & TRANSLATION != 0 {
        (addr, length)
    } else {
        (m.c.addr, m.c.length)
    };
    let acc = if flags & CHANGE_ACCESS != 0 {
        match access_of(access) {
            Ok(x) => x,
            Err(e) => return fail(e, ERR_CMD),
        }
    } else {
        m.mr.access()
    };
    // SAFETY: the application keeps the new buffer while registered, as verbs requires.
    match unsafe { p.pd.register_raw(a.cast(), len, acc) } {
        Ok(new) => {
            m.c.pd = new_pd;
            m.c.addr = a;
            m.c.length = len;
            m.c.lkey = new.lkey();
            m.c.rkey = new.rkey();
            m.c.handle = new.lkey();
            m.mr = new; // the old registration ends here
            0
        }
        Err(e) => fail(soft_errno(&e), ERR_CMD),
    }
}
