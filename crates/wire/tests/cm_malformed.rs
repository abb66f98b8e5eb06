//! Malformed management inputs map to typed errors, never to panics.

use proptest::prelude::*;
use rdma_wire::cm::*;
use rdma_wire::ip_cm::{req_private_data, IpCmHeaderRepr};
use rdma_wire::mad::{method, Mad, MadHeaderRepr, MadRepr, MAD_LEN};
use rdma_wire::Error;

fn cm_mad(attr: u16) -> [u8; MAD_LEN] {
    let mut buf = [0u8; MAD_LEN];
    MadHeaderRepr::cm(method::SEND, 0x1234, attr)
        .emit(&mut buf)
        .unwrap();
    buf
}

#[test]
fn wrong_length_class_and_version() {
    let good = cm_mad(0x0014);
    assert!(CmMadRepr::parse(&good).is_ok());
    for len in [0, 1, 23, 24, 255] {
        assert_eq!(
            CmMadRepr::parse(&good[..len]),
            Err(Error::BadLength {
                expected: 256,
                found: len
            })
        );
    }
    let mut long = [0u8; 257];
    long[..256].copy_from_slice(&good);
    assert_eq!(
        CmMadRepr::parse(&long),
        Err(Error::BadLength {
            expected: 256,
            found: 257
        })
    );
    for (at, v) in [(0usize, 2u8), (1, 0x01), (1, 0x03), (2, 1), (2, 3)] {
        let mut b = good;
        b[at] = v;
        let e = CmMadRepr::parse(&b).unwrap_err();
        assert!(matches!(e, Error::BadMadClass { .. }), "{e:?}");
        assert_eq!(e, Mad::new_cm_checked(&b[..]).unwrap_err());
    }
}

#[test]
fn unknown_attributes() {
    for attr in [0x0000u16, 0x0002, 0x000f, 0x001b, 0x0020, 0xffff] {
        assert_eq!(
            CmMadRepr::parse(&cm_mad(attr)),
            Err(Error::UnknownAttribute(attr))
        );
    }
}

#[test]
fn truncated_messages() {
    let short = [0u8; CM_PAYLOAD_LEN - 1];
    let t = Err::<(), _>(Error::Truncated {
        need: 232,
        have: 231,
    });
    assert_eq!(ReqRepr::parse(&short).map(|_| ()), t);
    assert_eq!(MraRepr::parse(&short).map(|_| ()), t);
    assert_eq!(RejRepr::parse(&short).map(|_| ()), t);
    assert_eq!(RepRepr::parse(&short).map(|_| ()), t);
    assert_eq!(RtuRepr::parse(&short).map(|_| ()), t);
    assert_eq!(DreqRepr::parse(&short).map(|_| ()), t);
    assert_eq!(DrepRepr::parse(&short).map(|_| ()), t);
    assert_eq!(LapRepr::parse(&short).map(|_| ()), t);
    assert_eq!(AprRepr::parse(&short).map(|_| ()), t);
    assert_eq!(SidrReqRepr::parse(&short).map(|_| ()), t);
    assert_eq!(SidrRepRepr::parse(&short).map(|_| ()), t);
    assert_eq!(
        CmMessage::parse(CmAttributeId::CLASS_PORT_INFO, &short).map(|_| ()),
        t
    );
    assert_eq!(
        ClassPortInfoRepr::parse(&short[..71]).map(|_| ()),
        Err(Error::Truncated { need: 72, have: 71 })
    );
    assert!(Req::new_checked(&short[..]).is_err());
    assert_eq!(
        MadRepr::parse(&[0u8; 100]).map(|_| ()),
        Err(Error::Truncated {
            need: 256,
            have: 100
        })
    );
}

#[test]
fn emit_rejects_small_buffers_and_wide_values() {
    let mut req = ReqRepr::parse(&[0u8; CM_PAYLOAD_LEN]).unwrap();
    let mut small = [0u8; 100];
    assert_eq!(
        req.emit(&mut small),
        Err(Error::BufferTooSmall {
            need: 232,
            have: 100
        })
    );
    let mut buf = [0u8; CM_PAYLOAD_LEN];
    req.local_qpn = 1 << 24;
    assert_eq!(req.emit(&mut buf), Err(Error::BadField("req.local_qpn")));
    req.local_qpn = 0;
    req.primary_path.flow_label = 1 << 20;
    assert_eq!(req.emit(&mut buf), Err(Error::BadField("path.flow_label")));
    req.primary_path.flow_label = 0;
    req.rnr_retry_count = 8;
    assert_eq!(
        req.emit(&mut buf),
        Err(Error::BadField("req.rnr_retry_count"))
    );

    let mut rej = RejRepr::parse(&[0u8; CM_PAYLOAD_LEN]).unwrap();
    rej.message_rejected = MessageRef::Reserved(4);
    assert_eq!(
        rej.emit(&mut buf),
        Err(Error::BadField("rej.message_rejected"))
    );
    let mut mad = [0u8; MAD_LEN];
    let m = CmMadRepr {
        method: 0x83,
        ..CmMadRepr::send(1, CmMessage::Rej(RejRepr::parse(&[0u8; 232]).unwrap()))
    };
    assert_eq!(m.emit(&mut mad), Err(Error::BadField("mad.method")));
    assert!(matches!(
        CmMadRepr::send(1, m.message).emit(&mut mad[..255]),
        Err(Error::BufferTooSmall { .. })
    ));
}

#[test]
fn private_data_capacity() {
    let h = IpCmHeaderRepr::parse(&{
        let mut b = [0u8; 36];
        b[1] = 0x40;
        b
    })
    .unwrap();
    assert!(req_private_data(&h, &[1; 56]).is_ok());
    assert_eq!(
        req_private_data(&h, &[1; 57]),
        Err(Error::TooLong {
            field: "REQ private data",
            max: 56,
            len: 57
        })
    );
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = CmMadRepr::parse(&bytes);
        let _ = MadRepr::parse(&bytes);
        let _ = MadHeaderRepr::parse(&bytes);
        let _ = IpCmHeaderRepr::parse(&bytes);
        let _ = ClassPortInfoRepr::parse(&bytes);
        for attr in 0u16..0x20 {
            let _ = CmMessage::parse(CmAttributeId(attr), &bytes);
        }
    }

    #[test]
    fn cm_mads_with_random_contents(attr in 0x0010u16..=0x001a, body in prop::collection::vec(any::<u8>(), 232)) {
        let mut buf = cm_mad(attr);
        buf[24..].copy_from_slice(&body);
        let m = CmMadRepr::parse(&buf).unwrap();
        let mut out = [0u8; MAD_LEN];
        m.emit(&mut out).unwrap();
        prop_assert_eq!(CmMadRepr::parse(&out).unwrap(), m);
    }
}
