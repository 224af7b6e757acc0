//! Property tests for the on-disk decoders in `tierstack_array::format` (the stable-toolchain
//! counterpart of the cargo-fuzz targets in `fuzz/`): no decoder may panic on any input, valid
//! encodings round-trip exactly, and corruption is either rejected or decoded to some value.

use proptest::collection::vec;
use proptest::prelude::*;
use tierstack_array::format::{
    decode_summary, encode_summary, summary_bytes, DriveState, Entry, Footer, FormatError,
    Superblock, ENTRY_SIZE, ENTRY_TOMBSTONE, FOOTER_SIZE, SB_MAGIC, SB_SIZE,
};
use tierstack_array::layout::{BLOCK, MAX_DRIVES};
use tierstack_array::MAX_VALUE;

/// Offsets of fields inside the footer (see `Footer::encode`).
const NENTRIES_AT: usize = 48;
const SUMMARY_CRC_AT: usize = 56;

const LEVELS: [u32; 7] = [0, 1, 10, 5, 6, 50, 60];

fn drive_state() -> impl Strategy<Value = DriveState> {
    prop_oneof![
        Just(DriveState::Online),
        Just(DriveState::Failed),
        Just(DriveState::Rebuilding),
    ]
}

/// Superblocks whose every field is within the ranges `Superblock::decode` accepts.
fn superblock() -> impl Strategy<Value = Superblock> {
    (1..=MAX_DRIVES).prop_flat_map(|ndrives| {
        (
            (
                any::<[u8; 16]>(),
                0..ndrives as u32,
                prop::sample::select(&LEVELS[..]),
                12u32..=20,
                1..=u32::MAX,
                1..=u32::MAX,
                1..=u32::MAX,
                1..=u32::MAX,
            ),
            (any::<u64>(), any::<u64>(), any::<u64>()),
            vec(drive_state(), ndrives),
        )
            .prop_map(
                move |(
                    (
                        uuid,
                        drive_index,
                        level,
                        chunk_shift,
                        groups,
                        stripe_rows,
                        seg_stripes,
                        nsegs,
                    ),
                    (rows, generation, created),
                    states,
                )| Superblock {
                    uuid,
                    drive_index,
                    ndrives: ndrives as u32,
                    level,
                    chunk: 1 << chunk_shift,
                    groups,
                    stripe_rows,
                    seg_stripes,
                    nsegs,
                    rows,
                    generation,
                    created,
                    states,
                },
            )
    })
}

/// Largest `max_blocks` the summary tests use.
const MAX_BLOCKS: u32 = 2048;

/// Entries valid for a stripe of `MAX_BLOCKS` payload blocks: tombstones (any range) or values
/// whose block range fits.
fn entry() -> impl Strategy<Value = Entry> {
    let value = (0..=MAX_VALUE as u32).prop_flat_map(|len| {
        let blocks = (len as usize).div_ceil(BLOCK) as u32;
        (
            any::<(u64, u64, u64, u32)>(),
            0..=MAX_BLOCKS - blocks,
            any::<u32>(),
        )
            .prop_map(move |((obj, page, version, crc), block, flags)| Entry {
                obj,
                page,
                version,
                block,
                len,
                crc,
                flags: flags & !ENTRY_TOMBSTONE,
            })
    });
    let tombstone = (any::<(u64, u64, u64)>(), any::<(u32, u32, u32, u32)>()).prop_map(
        |((obj, page, version), (block, len, crc, flags))| Entry {
            obj,
            page,
            version,
            block,
            len,
            crc,
            flags: flags | ENTRY_TOMBSTONE,
        },
    );
    prop_oneof![3 => value, 1 => tombstone]
}

fn footer() -> impl Strategy<Value = Footer> {
    (
        any::<[u8; 16]>(),
        any::<(u32, u32, u64, u64, u32)>(),
        any::<(u32, u32)>(),
    )
        .prop_map(
            |(uuid, (seg, stripe, seg_seq, stripe_seq, flags), (nentries, summary_crc))| Footer {
                uuid,
                seg,
                stripe,
                seg_seq,
                stripe_seq,
                // Overwritten by encode_summary.
                nentries,
                flags,
                summary_crc,
            },
        )
}

/// A stripe tail: `pad` bytes of junk, then the encoded summary of `entries` under `footer`.
/// Returns the tail, the footer as filled in by `encode_summary`, and the summary length.
fn build_tail(entries: &[Entry], mut footer: Footer, pad: &[u8]) -> (Vec<u8>, Footer, usize) {
    let s = encode_summary(entries, &mut footer);
    assert_eq!(s.len(), summary_bytes(entries.len()));
    let mut tail = pad.to_vec();
    tail.extend_from_slice(&s);
    (tail, footer, s.len())
}

/// Patches the magic and the crc of a superblock image so that decoding gets past them.
fn fix_superblock(b: &mut [u8]) {
    b[..8].copy_from_slice(SB_MAGIC);
    let crc = crc32c::crc32c(&b[..SB_SIZE - 4]);
    b[SB_SIZE - 4..SB_SIZE].copy_from_slice(&crc.to_le_bytes());
}

/// Recomputes the summary crc (when the entries fit) and the footer crc at the end of `tail`.
fn fix_summary(tail: &mut [u8]) {
    let fo = tail.len() - FOOTER_SIZE;
    let mut n = [0u8; 4];
    n.copy_from_slice(&tail[fo + NENTRIES_AT..fo + NENTRIES_AT + 4]);
    let ents = (u32::from_le_bytes(n) as usize).saturating_mul(ENTRY_SIZE);
    if ents <= fo {
        let crc = crc32c::crc32c(&tail[fo - ents..fo]);
        tail[fo + SUMMARY_CRC_AT..fo + SUMMARY_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    }
    let crc = crc32c::crc32c(&tail[fo..tail.len() - 4]);
    let end = tail.len();
    tail[end - 4..].copy_from_slice(&crc.to_le_bytes());
}

/// Whatever `Superblock::decode` accepts must re-encode to something that decodes to itself.
fn check_superblock(b: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(sb) = Superblock::decode(b) {
        prop_assert_eq!(sb.states.len(), sb.ndrives as usize);
        prop_assert_eq!(Superblock::decode(&sb.encode()), Ok(sb));
    }
    Ok(())
}

/// Whatever `decode_summary` accepts must re-encode to exactly its source bytes.
fn check_summary(tail: &[u8], max_blocks: u32) -> Result<(), TestCaseError> {
    if tail.len() >= FOOTER_SIZE {
        let _ = Footer::decode(&tail[tail.len() - FOOTER_SIZE..]);
    }
    let _ = Footer::decode(tail);
    if let Ok((footer, entries)) = decode_summary(tail, max_blocks) {
        prop_assert_eq!(footer.nentries as usize, entries.len());
        let mut f = footer.clone();
        let enc = encode_summary(&entries, &mut f);
        prop_assert_eq!(&f, &footer);
        prop_assert!(enc.len() <= tail.len());
        prop_assert_eq!(&enc[..], &tail[tail.len() - enc.len()..]);
        prop_assert_eq!(decode_summary(&enc, max_blocks), Ok((footer, entries)));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// (a) Arbitrary bytes: no decoder panics; anything accepted round-trips. Each input is also
    /// decoded with its checksums patched in, to reach the field checks behind them.
    #[test]
    fn random_bytes_never_panic(
        mut data in vec(any::<u8>(), 0..9000),
        max_blocks in prop_oneof![Just(0u32), Just(u32::MAX), 0..4096u32, any::<u32>()],
    ) {
        check_superblock(&data)?;
        check_summary(&data, max_blocks)?;
        if data.len() >= SB_SIZE {
            let mut fixed = data[..SB_SIZE].to_vec();
            fix_superblock(&mut fixed);
            check_superblock(&fixed)?;
        }
        if data.len() >= FOOTER_SIZE {
            fix_summary(&mut data);
            check_summary(&data, max_blocks)?;
        }
    }

    /// (b) Valid superblocks round-trip exactly, also with trailing bytes.
    #[test]
    fn superblock_roundtrip(sb in superblock(), extra in vec(any::<u8>(), 0..64)) {
        let enc = sb.encode();
        prop_assert_eq!(Superblock::decode(&enc), Ok(sb.clone()));
        let mut long = enc.to_vec();
        long.extend_from_slice(&extra);
        prop_assert_eq!(Superblock::decode(&long), Ok(sb.clone()));
        prop_assert_eq!(Superblock::decode(&sb.encode()).map(|s| s.encode()), Ok(enc));
    }

    /// (b) Corrupted superblocks: any byte damage is caught by the checksum (or magic); with
    /// the checksum patched the decoder may accept or reject but never panics; truncation is
    /// always `Truncated`.
    #[test]
    fn superblock_corruption(
        sb in superblock(),
        flips in vec((0..SB_SIZE, 1..=255u8), 1..8),
        cut in 0..SB_SIZE,
    ) {
        let enc = sb.encode();
        let mut bad = enc;
        for &(i, x) in &flips {
            bad[i] ^= x;
        }
        if bad != enc {
            let r = Superblock::decode(&bad);
            prop_assert!(
                matches!(r, Err(FormatError::Magic | FormatError::Checksum)),
                "corrupted superblock decoded as {:?}", r
            );
        }
        fix_superblock(&mut bad);
        check_superblock(&bad)?;
        prop_assert_eq!(Superblock::decode(&enc[..cut]), Err(FormatError::Truncated));
    }

    /// (b) Valid summaries round-trip exactly, whatever precedes them in the tail.
    #[test]
    fn summary_roundtrip(
        entries in vec(entry(), 0..64),
        footer in footer(),
        pad in vec(any::<u8>(), 0..512),
    ) {
        let (tail, footer, _) = build_tail(&entries, footer, &pad);
        prop_assert_eq!(
            decode_summary(&tail, MAX_BLOCKS),
            Ok((footer.clone(), entries.clone()))
        );
        prop_assert_eq!(Footer::decode(&tail[tail.len() - FOOTER_SIZE..]), Ok(footer));
        check_summary(&tail, MAX_BLOCKS)?;
    }

    /// (b) Corrupted summaries: damage inside the summary is rejected, damage in the padding
    /// before it is ignored; with checksums patched the decoders never panic; truncating into
    /// the summary never yields a value.
    #[test]
    fn summary_corruption(
        entries in vec(entry(), 0..64),
        footer in footer(),
        pad in vec(any::<u8>(), 0..512),
        flips in vec((any::<prop::sample::Index>(), 1..=255u8), 1..8),
        cut in any::<prop::sample::Index>(),
        max_blocks in prop_oneof![Just(MAX_BLOCKS), 0..=MAX_BLOCKS, any::<u32>()],
    ) {
        let (tail, footer, slen) = build_tail(&entries, footer, &pad);
        let start = tail.len() - slen;
        let mut bad = tail.clone();
        for (i, x) in &flips {
            let i = i.index(bad.len());
            bad[i] ^= x;
        }
        let r = decode_summary(&bad, MAX_BLOCKS);
        if bad[start..] != tail[start..] {
            prop_assert!(r.is_err(), "corrupted summary decoded as {:?}", r);
        } else {
            prop_assert_eq!(r, Ok((footer, entries.clone())));
        }
        check_summary(&bad, max_blocks)?;
        fix_summary(&mut bad);
        check_summary(&bad, max_blocks)?;

        // Truncation from the front: fine while the summary is intact, an error once cut into.
        let c = cut.index(tail.len() + 1);
        let r = decode_summary(&tail[c..], MAX_BLOCKS);
        if c <= start {
            prop_assert!(r.is_ok(), "intact summary rejected after dropping padding: {:?}", r);
        } else {
            prop_assert!(r.is_err(), "summary cut at {} decoded as {:?}", c, r);
        }
        // Truncation from the back moves the footer: must not panic.
        let c = cut.index(tail.len() + 1);
        check_summary(&tail[..c], max_blocks)?;
        let _ = Footer::decode(&tail[..c]);
    }
}
