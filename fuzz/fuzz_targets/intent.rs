//! Fuzzes the mount's intent log decoders (`tierstack_fs::intent`): `decode_header` and
//! `decode_records` may not panic on any bytes; the records accepted must re-encode to
//! exactly the bytes they were decoded from (a prefix of the input).
//!
//! Random bytes almost never carry a valid crc32c, so the input is also decoded with the
//! record magic, its generation and its checksum patched in, so the payload checks get
//! exercised.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tierstack_fs::intent::{decode_header, decode_records};

const GEN: u64 = 5;

fn check(b: &[u8]) {
    let _ = decode_header(b);
    let recs = decode_records(b, GEN);
    let mut enc = Vec::new();
    for r in &recs {
        enc.extend_from_slice(&r.encode(GEN));
    }
    assert_eq!(&b[..enc.len()], &enc[..], "records re-encode to other bytes");
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= 20 {
        let mut b = data.to_vec();
        b[0..4].copy_from_slice(b"TSIR");
        b[8..16].copy_from_slice(&GEN.to_le_bytes());
        let len = (u32::from_le_bytes([b[4], b[5], b[6], b[7]]) as usize).min(b.len() - 20);
        b[4..8].copy_from_slice(&(len as u32).to_le_bytes());
        let mut crc = crc32c::crc32c(&b[4..16]);
        crc = crc32c::crc32c_append(crc, &b[20..20 + len]);
        b[16..20].copy_from_slice(&crc.to_le_bytes());
        check(&b);
    }
});
