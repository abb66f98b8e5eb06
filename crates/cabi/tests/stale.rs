//! Ids and channels used after their destruction give `EINVAL`, never a crash: Debian's
//! perftest 4.5 retries a rejected rdma_cm connection on the ids (and the channel) it has
//! just destroyed. One test in this binary, so that no other thread makes an id at a freed
//! one's address meanwhile.

use std::net::SocketAddrV4;
use std::ptr::null_mut;

use rdma_cabi::cm::event::rdma_get_cm_event;
use rdma_cabi::cm::{
    rdma_bind_addr, rdma_create_event_channel, rdma_create_id, rdma_destroy_event_channel,
    rdma_destroy_id, rdma_listen, rdma_resolve_addr,
};
use rdma_cabi::cm_types::{rdma_cm_event, rdma_cm_id};

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

fn sin(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

#[test]
fn destroyed_ids_and_channels_are_einval() {
    // SAFETY: the C API, used (and misused) as perftest does.
    unsafe {
        let ch = rdma_create_event_channel();
        assert!(!ch.is_null());
        let mut id: *mut rdma_cm_id = null_mut();
        assert_eq!(rdma_create_id(ch, &mut id, null_mut(), 0x0106), 0);
        let mut dst = sin("127.0.0.1:17590".parse().unwrap());
        let dst = (&mut dst as *mut libc::sockaddr_in).cast();
        assert_eq!(rdma_destroy_id(id), 0);

        assert_eq!(rdma_resolve_addr(id, null_mut(), dst, 2000), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_listen(id, 1), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(rdma_destroy_id(id), -1, "a second destroy");
        assert_eq!(errno(), libc::EINVAL);
        // Not an id at all.
        let bogus = 0x1000 as *mut rdma_cm_id;
        assert_eq!(rdma_bind_addr(bogus, dst), -1);
        assert_eq!(errno(), libc::EINVAL);

        // A live id on the channel still works after the stale calls.
        let mut live: *mut rdma_cm_id = null_mut();
        assert_eq!(rdma_create_id(ch, &mut live, null_mut(), 0x0106), 0);
        let mut any = sin("127.0.0.1:0".parse().unwrap());
        assert_eq!(
            rdma_bind_addr(live, (&mut any as *mut libc::sockaddr_in).cast()),
            0
        );
        assert_eq!(rdma_destroy_id(live), 0);

        rdma_destroy_event_channel(ch);
        let mut ev: *mut rdma_cm_event = null_mut();
        assert_eq!(rdma_get_cm_event(ch, &mut ev), -1);
        assert_eq!(errno(), libc::EINVAL);
        let mut again: *mut rdma_cm_id = null_mut();
        assert_eq!(rdma_create_id(ch, &mut again, null_mut(), 0x0106), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert!(again.is_null());
        rdma_destroy_event_channel(ch); // a second destroy: ignored
    }
}
