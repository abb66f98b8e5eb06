//! Parses arbitrary bytes as an IP CM service header, a service id and REQ private data;
//! whatever parses must re-emit to the same bytes (the reserved nibble excepted).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_wire::ip_cm::{
    req_private_data, IpCmHeaderRepr, ServiceId, IP_CM_HEADER_LEN, REQ_USER_PRIVATE_DATA_MAX,
};

fuzz_target!(|data: &[u8]| {
    if let Some(sid) = data.first_chunk::<8>() {
        let sid = ServiceId(u64::from_be_bytes(*sid));
        if let Ok((ps, port)) = sid.split() {
            assert_eq!(ServiceId::new(ps, port), sid);
        }
    }
    let Ok(h) = IpCmHeaderRepr::parse(data) else {
        return;
    };
    let mut out = [0u8; IP_CM_HEADER_LEN];
    h.emit(&mut out).expect("a parsed header emits");
    let mut expect = [0u8; IP_CM_HEADER_LEN];
    expect.copy_from_slice(&data[..IP_CM_HEADER_LEN]);
    expect[1] &= 0xf0;
    assert_eq!(out, expect);
    assert_eq!(IpCmHeaderRepr::parse(&out).unwrap(), h);

    let user = &data[IP_CM_HEADER_LEN..];
    match req_private_data(&h, user) {
        Ok(pd) => {
            assert!(user.len() <= REQ_USER_PRIVATE_DATA_MAX);
            assert_eq!(&pd[..IP_CM_HEADER_LEN], &out[..]);
            assert_eq!(&pd[IP_CM_HEADER_LEN..IP_CM_HEADER_LEN + user.len()], user);
            assert_eq!(IpCmHeaderRepr::parse(&pd).unwrap(), h);
        }
        Err(_) => assert!(user.len() > REQ_USER_PRIVATE_DATA_MAX),
    }
});
