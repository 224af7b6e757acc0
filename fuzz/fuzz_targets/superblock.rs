//! Fuzzes `Superblock::decode`: it must never panic, and whatever it accepts must survive an
//! encode/decode round trip unchanged.
//!
//! Random bytes almost never carry a valid crc32c, so each input is decoded twice: as given,
//! and zero-padded to SB_SIZE with the magic and the trailing checksum patched in, so the field
//! checks behind the checksum get exercised too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tierstack_array::format::{Superblock, SB_MAGIC, SB_SIZE};

fn check(b: &[u8]) {
    if let Ok(sb) = Superblock::decode(b) {
        let enc = sb.encode();
        let again = Superblock::decode(&enc).expect("re-encoded superblock must decode");
        assert_eq!(again, sb, "superblock round trip changed the value");
        assert_eq!(again.encode(), enc, "superblock encoding is not stable");
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // Short inputs are zero-padded so the fuzzer need not grow them to SB_SIZE first.
    let mut fixed = vec![0u8; SB_SIZE];
    let n = data.len().min(SB_SIZE);
    fixed[..n].copy_from_slice(&data[..n]);
    fixed[..8].copy_from_slice(SB_MAGIC);
    let crc = crc32c::crc32c(&fixed[..SB_SIZE - 4]);
    fixed[SB_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
    check(&fixed);
});
