//! Parses arbitrary bytes as a CM message of any attribute id (the first two bytes pick it,
//! the rest is the 232-byte message); whatever parses must re-emit to the input's defined
//! bits (reserved bits become 0) and parse back to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_wire::cm::{CmAttributeId, CmMessage, CM_PAYLOAD_LEN};
use rdma_wire::Error;

fuzz_target!(|data: &[u8]| {
    let Some((attr, body)) = data.split_first_chunk::<2>() else {
        return;
    };
    let attr = CmAttributeId(u16::from_be_bytes(*attr) & 0x001f);
    let msg = match CmMessage::parse(attr, body) {
        Ok(m) => m,
        Err(Error::UnknownAttribute(a)) => {
            assert_eq!(a, attr.0);
            assert!(attr.name().is_none());
            return;
        }
        Err(Error::Truncated { need, have }) => {
            assert_eq!((need, have), (CM_PAYLOAD_LEN, body.len()));
            return;
        }
        Err(e) => panic!("unexpected error {e:?}"),
    };
    assert_eq!(msg.attribute_id(), attr);
    let mut out = [0u8; CM_PAYLOAD_LEN];
    msg.emit(&mut out).expect("a parsed message emits");
    for (o, i) in out.iter().zip(body) {
        assert_eq!(o & !i, 0, "emit set a bit the input did not have");
    }
    assert_eq!(CmMessage::parse(attr, &out).unwrap(), msg);
    let mut again = [0u8; CM_PAYLOAD_LEN];
    msg.emit(&mut again).unwrap();
    assert_eq!(out, again);
});
