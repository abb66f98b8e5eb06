//! Parses arbitrary bytes as a MAD (generic and CM); whatever parses must re-emit to the same
//! bytes (the reserved header bytes 18..20 and reserved CM bits excepted, which emit zeroes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_wire::cm::CmMadRepr;
use rdma_wire::mad::{Mad, MadHeaderRepr, MadRepr, MAD_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = MadHeaderRepr::parse(data) {
        let mut out = [0u8; 24];
        h.emit(&mut out).expect("a parsed header emits");
        let mut expect = [0u8; 24];
        expect.copy_from_slice(&data[..24]);
        expect[18..20].fill(0);
        assert_eq!(out, expect);
    }
    if let Ok(m) = MadRepr::parse(data) {
        let mut out = [0u8; MAD_LEN];
        m.emit(&mut out).expect("a parsed MAD emits");
        let mut expect = [0u8; MAD_LEN];
        expect.copy_from_slice(&data[..MAD_LEN]);
        expect[18..20].fill(0);
        assert_eq!(out, expect);
        assert_eq!(MadRepr::parse(&out).unwrap(), m);
    }
    let cm = CmMadRepr::parse(data);
    assert_eq!(
        cm.is_ok(),
        Mad::new_cm_checked(data).is_ok()
            && cm
                != Err(rdma_wire::Error::UnknownAttribute(u16::from_be_bytes([
                    data[16], data[17]
                ])))
    );
    if let Ok(m) = cm {
        let mut out = [0u8; MAD_LEN];
        m.emit(&mut out).expect("a parsed CM MAD emits");
        // Emit writes only bits that were set in the input (reserved ones become 0) ...
        for (o, i) in out.iter().zip(data) {
            assert_eq!(o & !i, 0);
        }
        // ... and what it writes parses back to the same value.
        assert_eq!(CmMadRepr::parse(&out).unwrap(), m);
    }
});
