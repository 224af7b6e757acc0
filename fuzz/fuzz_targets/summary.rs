//! Fuzzes `decode_summary` and `Footer::decode`. The first 4 bytes (LE) choose `max_blocks`,
//! the rest is the stripe tail. Neither decoder may panic; an accepted summary must re-encode
//! (with `encode_summary`) to exactly the bytes it was decoded from and decode back to the same
//! footer and entries.
//!
//! Random bytes almost never carry valid crc32cs, so each tail is also decoded with the footer
//! magic, the summary crc and the footer crc patched in, so the entry checks get exercised.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tierstack_array::format::{
    decode_summary, encode_summary, summary_bytes, Footer, ENTRY_SIZE, FOOTER_MAGIC, FOOTER_SIZE,
};

/// Offsets inside the footer (see `Footer::encode`).
const NENTRIES_AT: usize = 48;
const SUMMARY_CRC_AT: usize = 56;

fn check(tail: &[u8], max_blocks: u32) {
    if tail.len() >= FOOTER_SIZE {
        let _ = Footer::decode(&tail[tail.len() - FOOTER_SIZE..]);
    }
    let _ = Footer::decode(tail);
    if let Ok((footer, entries)) = decode_summary(tail, max_blocks) {
        assert_eq!(footer.nentries as usize, entries.len());
        let need = summary_bytes(entries.len());
        assert!(need <= tail.len());
        let mut f = footer.clone();
        let enc = encode_summary(&entries, &mut f);
        assert_eq!(f, footer, "encode_summary changed nentries/summary_crc");
        assert_eq!(
            &enc[..],
            &tail[tail.len() - need..],
            "re-encoded summary differs from its source bytes"
        );
        let (f2, e2) = decode_summary(&enc, max_blocks).expect("re-encoded summary must decode");
        assert_eq!(f2, footer);
        assert_eq!(e2, entries);
        assert_eq!(Footer::decode(&enc[enc.len() - FOOTER_SIZE..]), Ok(footer));
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let max_blocks = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    let tail = &data[4..];
    check(tail, max_blocks);

    if tail.len() >= FOOTER_SIZE {
        let mut fixed = tail.to_vec();
        let fo = fixed.len() - FOOTER_SIZE;
        fixed[fo..fo + 8].copy_from_slice(FOOTER_MAGIC);
        let n = u32::from_le_bytes(
            fixed[fo + NENTRIES_AT..fo + NENTRIES_AT + 4]
                .try_into()
                .unwrap(),
        );
        let ents = (n as usize).saturating_mul(ENTRY_SIZE);
        if ents <= fo {
            let crc = crc32c::crc32c(&fixed[fo - ents..fo]);
            fixed[fo + SUMMARY_CRC_AT..fo + SUMMARY_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        }
        let crc = crc32c::crc32c(&fixed[fo..fo + FOOTER_SIZE - 4]);
        fixed[fo + FOOTER_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
        check(&fixed, max_blocks);
    }
});
