//! The pollable fds an application gets (`rdma_event_channel.fd`, `comp_channel->fd`) follow
//! rdma-core's rules: blocking until the application sets `O_NONBLOCK`, then `EAGAIN` when
//! nothing is pending; readable exactly while an event is pending.

use std::ptr::null_mut;

use rdma_cabi::cm::event::{rdma_ack_cm_event, rdma_get_cm_event};
use rdma_cabi::cm::{
    rdma_create_event_channel, rdma_create_id, rdma_destroy_event_channel, rdma_destroy_id,
    rdma_resolve_addr,
};
use rdma_cabi::cm_types::{rdma_cm_event, rdma_cm_id};

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

fn readable(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

#[test]
fn cm_channel_fd_blocks_until_the_application_sets_o_nonblock() {
    // SAFETY: the C API, used as a C program would.
    unsafe {
        let ch = rdma_create_event_channel();
        assert!(!ch.is_null());
        let fd = (*ch).fd;
        assert_eq!(
            libc::fcntl(fd, libc::F_GETFL) & libc::O_NONBLOCK,
            0,
            "starts blocking"
        );
        assert!(!readable(fd));
        libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK);
        let mut ev: *mut rdma_cm_event = null_mut();
        assert_eq!(rdma_get_cm_event(ch, &mut ev), -1);
        assert_eq!(errno(), libc::EAGAIN, "non-blocking and empty: EAGAIN");

        let mut id: *mut rdma_cm_id = null_mut();
        assert_eq!(rdma_create_id(ch, &mut id, null_mut(), 0x0106), 0);
        let mut dst: libc::sockaddr_in = std::mem::zeroed();
        dst.sin_family = libc::AF_INET as u16;
        dst.sin_port = 7999u16.to_be();
        dst.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        assert_eq!(
            rdma_resolve_addr(
                id,
                null_mut(),
                (&mut dst as *mut libc::sockaddr_in).cast(),
                2000
            ),
            0
        );
        // The event makes the fd readable; taking it makes it quiet again.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !readable(fd) {
            assert!(std::time::Instant::now() < end, "no ADDR_RESOLVED");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(rdma_get_cm_event(ch, &mut ev), 0);
        assert_eq!((*ev).event, 0, "RDMA_CM_EVENT_ADDR_RESOLVED");
        assert_eq!((*ev).id, id);
        assert_eq!(rdma_ack_cm_event(ev), 0);
        assert!(!readable(fd));
        assert_eq!(rdma_get_cm_event(ch, &mut ev), -1);
        assert_eq!(errno(), libc::EAGAIN);
        assert_eq!(rdma_destroy_id(id), 0);
        rdma_destroy_event_channel(ch);
    }
}
