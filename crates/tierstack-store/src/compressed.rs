//! The compressed tier: pages the DRAM tier evicts are kept in process memory compressed, as
//! the kernel's zswap keeps swapped pages, when they compress 1.5:1 or better ([`keeps`]: the
//! arena span they take is at most two thirds of the page); a page that does not goes
//! straight to the tier below. A page that leaves DRAM and is read again is then
//! decompressed (a microsecond or a few) instead of read from the drives. Zero-filled and
//! sparse memory, and freshly allocated buffers, compress 10 to 100 times; smooth fields of
//! doubles about 2.4 times with the smooth transform ([`smooth`]); random bytes do not
//! compress at all.
//!
//! - Compressed pages live in one arena of the tier's capacity, packed by size class into
//!   slabs ([`crate::clock::slab`]: a page takes its compressed bytes rounded up to 64; the
//!   lowest slab and slot first, so the pages in use stay near the arena's start). The arena
//!   is reserved untouched (the kernel gives it memory as it is written): the process's
//!   memory grows with the part of the arena written so far, which is what the tier charges,
//!   never the capacity it may reach. When no span is free, or the index limit
//!   ([`Tier::limit_index`]) is reached, pages leave in clock order: dirty ones are
//!   decompressed and written below, clean ones (written below by `settle`) dropped.
//! - A read leaves the page here (the kernel's zswap frees it instead): a page the program
//!   did not change since is dropped from DRAM for free and found here again.
//! - [`Tier::index_bytes`] includes the arena's extent and the map: a paging process charges
//!   them to its DRAM budget like the array's index, so the tier grows only as far as its
//!   pages shrink resident memory, and an incompressible working set leaves it empty. What is
//!   charged is the arena's 4 KiB pages that hold memory: when the pages in use fall under
//!   half of those (a working set that stopped compressing), the 4 KiB pages only free space
//!   covers are given back to the kernel (`MADV_DONTNEED`) and no longer charged, so a phase that
//!   compressed does not keep the budget after it.
//! - After a run of [`GIVE_UP_AFTER`] pages that did not compress, only one page in
//!   [`GIVE_UP_AFTER`] is tried, the rest go below as they are: a working set that does not
//!   compress does not pay an attempt (1 to 6 µs of CPU per 4 KiB) per page.
//! - Pages read from below are not admitted: a program that reads them keeps them resident,
//!   and they come here when evicted.
//! - Nothing here is durable: `flush` writes every dirty page down first.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};

use parking_lot::RwLock;

use crate::clock::slab::Slabs;

/// Spans in the arena are multiples of this many bytes.
const GRAIN: usize = crate::clock::slab::GRAIN as usize;
use crate::clock::{Block, Blocks};
use crate::{PageKey, Result, Tier, TierCounters, TierStatus};

/// A page is kept only when the arena span it takes is at most this share of its size (two
/// thirds: 1.5:1 or better). See [`keeps`] for why.
pub const KEEP_RATIO: (usize, usize) = (2, 3);

/// Whether a page of `len` bytes that a codec shrank to `compressed` bytes is kept here: when
/// its arena span (the bytes rounded up to 64) is at most [`KEEP_RATIO`] of the page.
///
/// Why 1.5:1: the arena is charged to the same DRAM budget as resident pages, so a page kept
/// at ratio `r` costs `1/r` of a page of budget and a hit on it costs `d` (a decompression
/// and a fault, 3 to 8 us here), where the memory it takes would otherwise hold `1/r` of a
/// resident page whose hits cost nothing. While the working set overflows the budget,
/// moving memory from resident pages to compressed ones turns drive reads (`m`, 30 to 50 us
/// on this machine's disk, 80 us or more on NAND flash) into hits: it pays when
/// `r * d < (r - 1) * m`, which at `r = 1.5` is `d < m / 3`, true of every drive here. The
/// arena's spans waste less than 64 bytes a page ([`Buddy::alloc_span`]), so every ratio
/// counts as it is (with power-of-two blocks, a page shrunk to 1.7 KiB took 2 KiB and one
/// shrunk to 2.2 KiB saved nothing). zswap keeps every page that shrinks at all. A working
/// set that fits the budget evicts nothing and leaves the tier empty, whatever the rule.
pub fn keeps(compressed: usize, len: usize) -> bool {
    span(compressed) * KEEP_RATIO.1 <= len * KEEP_RATIO.0
}

/// The arena bytes `compressed` bytes take ([`crate::clock::slab::span`]).
fn span(compressed: usize) -> usize {
    crate::clock::slab::span(compressed as u64) as usize
}

/// A codec's result good enough to stop trying the others: half the page or less (a cheaper
/// codec that reaches it beats a denser one tried after it).
fn good_enough(compressed: usize, len: usize) -> bool {
    span(compressed) * 2 <= len
}

/// When the arena is full, one page in this many takes the place of an older one; the others
/// go below (see [`admits_when_full`]).
pub const ADMIT_WHEN_FULL: u64 = 8;

/// Whether the `n`th page that finds the arena full takes an older page's place (one in
/// [`ADMIT_WHEN_FULL`]) rather than going below. A program that sweeps a state larger than
/// the arena in a loop (a simulation's time steps, a state vector's gates) evicts, in clock
/// order, each page before the sweep comes back to it: every read of it then goes to the
/// drives. Letting only some newcomers in keeps most of the arena's pages there across sweeps,
/// so each sweep finds that share of the state here (the hit rate of a fixed subset, the arena
/// over the state, instead of none). A working set that fits the arena never fills it and is
/// not affected; one that moves on replaces the arena's pages at an eighth of the rate, the
/// pages it reads again first (the clock's second chance).
pub fn admits_when_full(n: u64) -> bool {
    n.is_multiple_of(ADMIT_WHEN_FULL)
}

/// Pages shorter than this are not tried (LZ4's own framing would leave them no shorter).
pub const MIN_LEN: usize = 256;

/// After this many pages in a row that did not compress, one page in this many is tried.
pub const GIVE_UP_AFTER: u64 = 64;

/// The arena's memory: an anonymous private mapping, reserved without backing (the kernel
/// gives it pages as they are first written, and only those count in the process's RSS) and
/// kept out of transparent huge pages (a 64-byte write must not make 2 MiB resident).
struct Arena {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the Arena owns its mapping; its bytes are reached only through `&self` (shared
// reads) and `&mut self` (exclusive writes), so moving or sharing it between threads is as
// safe as for a `Vec<u8>`.
unsafe impl Send for Arena {}
// SAFETY: as above: `&Arena` gives only read access.
unsafe impl Sync for Arena {}

impl Arena {
    /// A mapping of `len` bytes; an empty arena when `len` is 0 or the mapping fails (the
    /// tier then keeps nothing and every page goes below).
    fn new(len: usize) -> Arena {
        let empty = Arena {
            ptr: std::ptr::NonNull::dangling(),
            len: 0,
        };
        if len == 0 {
            return empty;
        }
        use rustix::mm::{MapFlags, ProtFlags};
        // SAFETY: a fresh anonymous mapping at an address the kernel chooses: it overlaps
        // nothing, and nothing else refers to it.
        let mapped = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        };
        let Some(ptr) = mapped
            .ok()
            .and_then(|p| std::ptr::NonNull::new(p.cast::<u8>()))
        else {
            return empty;
        };
        // `[anon:tierstack-compressed]` in smaps (tierstack's share of a paged process).
        tierstack_common::process::name_mapping(
            ptr.as_ptr() as usize,
            len,
            tierstack_common::process::mapping_names::COMPRESSED,
        );
        // SAFETY: advice on the mapping just made, over its whole length; advice changes no
        // contents. Failure (a kernel without THP) is harmless.
        let _ = unsafe {
            rustix::mm::madvise(
                ptr.as_ptr().cast(),
                len,
                rustix::mm::Advice::LinuxNoHugepage,
            )
        };
        Arena { ptr, len }
    }

    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr..ptr + len` is this arena's readable mapping, alive while `self` is;
        // writes happen only through `&mut self`, so none can overlap this borrow.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Gives the memory of `at..at + len` back to the kernel (page-aligned, inside the arena,
    /// holding no block in use); those bytes read as zeros afterwards.
    fn discard_range(&mut self, at: usize, len: usize) {
        if at.is_multiple_of(4096) && len.is_multiple_of(4096) && at + len <= self.len {
            // SAFETY: a page-aligned range inside the arena's own mapping; `&mut self` means
            // no borrow of its bytes is alive, and the caller gives only free blocks, which
            // no slot reads.
            let _ = unsafe {
                rustix::mm::madvise(
                    self.ptr.as_ptr().add(at).cast(),
                    len,
                    rustix::mm::Advice::LinuxDontNeed,
                )
            };
        }
    }

    /// Gives the arena's memory back to the kernel; its bytes read as zeros afterwards.
    fn discard(&mut self) {
        if self.len > 0 {
            // SAFETY: the arena's own mapping; `&mut self` means no borrow of its bytes is
            // alive, and the caller holds no slot that it still means to read.
            let _ = unsafe {
                rustix::mm::madvise(
                    self.ptr.as_ptr().cast(),
                    self.len,
                    rustix::mm::Advice::LinuxDontNeed,
                )
            };
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmaps the mapping this arena made and owns; no borrow of it outlives
            // `self`.
            let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

struct State {
    arena: Arena,
    /// The compressed pages' blocks of the arena.
    blocks: Blocks<Slabs>,
    /// The end of the furthest block ever taken.
    extent: u64,
    /// The arena's 4 KiB pages written since they were last given back, one bit each.
    touched: Vec<u64>,
    /// How many bits of `touched` are set: the arena's memory, which the tier charges.
    touched_pages: u64,
    /// Forgotten blocks since the last look at whether to give memory back.
    forgets: u32,
    next_seq: u64,
}

impl State {
    /// Marks the arena's pages under `at..end` as holding memory.
    fn touch(&mut self, at: u64, end: u64) {
        for p in at / 4096..end.div_ceil(4096) {
            let (w, b) = ((p / 64) as usize, p % 64);
            if w >= self.touched.len() {
                self.touched.resize(w + 1, 0);
            }
            if self.touched[w] & (1 << b) == 0 {
                self.touched[w] |= 1 << b;
                self.touched_pages += 1;
            }
        }
    }

    /// The offset of the lowest of the arena's `pages` highest pages that hold memory (all
    /// of them when fewer); None when none does.
    fn top_pages_from(&self, pages: u64) -> Option<u64> {
        let mut seen = 0;
        let mut low = None;
        for (w, &bits) in self.touched.iter().enumerate().rev() {
            let mut bits = bits;
            while bits != 0 && seen < pages {
                let b = 63 - bits.leading_zeros() as u64;
                bits &= !(1u64 << b);
                low = Some((w as u64 * 64 + b) * 4096);
                seen += 1;
            }
            if seen >= pages {
                break;
            }
        }
        low
    }

    /// Forgets `key`'s block; now and then, when the blocks in use take less than half of the
    /// arena's memory, gives the free blocks of 4 KiB or more back to the kernel.
    fn forget(&mut self, key: PageKey) -> Option<Block> {
        let b = self.blocks.forget(key)?;
        self.forgets += 1;
        if self.forgets >= TRIM_EVERY && self.blocks.used < self.touched_pages * 4096 / 2 {
            self.forgets = 0;
            self.trim();
        }
        Some(b)
    }

    /// Gives every free block of 4 KiB or more that holds memory back to the kernel.
    fn trim(&mut self) {
        for (at, len) in self.blocks.region.free_pages() {
            let (first, end) = (at / 4096, (at + len) / 4096);
            let mut held = false;
            for p in first..end {
                let (w, b) = ((p / 64) as usize, p % 64);
                if self.touched.get(w).is_some_and(|x| x & (1 << b) != 0) {
                    self.touched[w] &= !(1 << b);
                    self.touched_pages -= 1;
                    held = true;
                }
            }
            if held {
                self.arena.discard_range(at as usize, len as usize);
            }
        }
    }

    fn bytes(&self, s: &Block) -> &[u8] {
        &self.arena.bytes()[s.at as usize..s.at as usize + s.stored as usize]
    }
}

/// Compressed pages in process memory in front of another tier (see the module's
/// documentation).
pub struct CompressedTier {
    below: Box<dyn Tier>,
    state: RwLock<State>,
    counters: TierCounters,
    /// Pages in a row that did not compress.
    poor_streak: AtomicU64,
    /// Pages not tried since such a run began.
    skipped: AtomicU64,
    /// Compression attempts that failed.
    rejected: AtomicU64,
    /// Pages compressed (attempts, kept or not).
    attempts: AtomicU64,
    /// The last page entered found the arena full (its size class had no free span).
    found_full: AtomicBool,
    /// Pages that found the arena full.
    full_arrivals: AtomicU64,
    /// The codec of the last page kept, tried first ([`Block::packed`]'s code, 0 for none).
    last_codec: AtomicU8,
    /// The most bytes of arena memory the tier may hold ([`Tier::limit_index`]): past it the
    /// arena counts as full.
    limit: AtomicU64,
}

/// Rounds of evictions and trims [`Tier::limit_index`] takes at most to bring the arena
/// under its limit (the next call goes on).
const LIMIT_ROUNDS: usize = 8;

/// Forgotten blocks between two looks at whether to give arena memory back.
const TRIM_EVERY: u32 = 256;

/// The largest LZ4 bound (output for a page) for which the encoder keeps its per-thread
/// buffers: three outputs and the smooth planes, about 17 KiB for a 4 KiB page.
const SCRATCH_MAX: usize = 17 << 10;

/// How a kept page is encoded ([`Block::packed`]), tried in this order:
/// - LZ4 where that reaches 2:1 by the block (decoding 4 KiB takes about a microsecond);
/// - else [`Codec::Lz4Smooth`]: LZ4 of the page's 64-bit words as second differences, byte
///   planes apart ([`smooth`]). A field of doubles that varies smoothly from one element to
///   the next (a simulation's grid, a time series) has nearly equal neighbours: their sign,
///   exponent and high mantissa bytes repeat and their differences are small, but LZ4 finds no
///   repeated byte strings in the raw page (`bench mem --fill floats`: LZ4 1.00:1, zstd
///   1.09:1, this 2.4:1). The transform costs well under a microsecond per 4 KiB;
/// - else zstd at [`ZSTD_LEVEL`] (3 to 4 us to decode), whose entropy coding shrinks what
///   LZ4's byte matching cannot: arrays of floating-point numbers with few distinct values (a
///   quantum state vector after a Fourier transform: LZ4 1.8:1, no page kept; zstd 2.8:1,
///   every page kept; the transform does not help those).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Codec {
    Lz4 = 1,
    Zstd = 2,
    Lz4Smooth = 3,
}

impl Codec {
    fn of(packed: u8) -> Option<Codec> {
        match packed {
            1 => Some(Codec::Lz4),
            2 => Some(Codec::Zstd),
            3 => Some(Codec::Lz4Smooth),
            _ => None,
        }
    }
}

/// The transform of [`Codec::Lz4Smooth`]: a page of little-endian 64-bit words (its length a
/// multiple of 8) as the zigzag-coded second differences of the words read as integers,
/// byte `b` of every word in plane `b` (the shuffle filter of Blosc and HDF5). Pure functions,
/// each the other's inverse.
pub mod smooth {
    /// Word size the transform works on.
    pub const WORD: usize = 8;

    fn zigzag(v: i64) -> u64 {
        ((v << 1) ^ (v >> 63)) as u64
    }

    fn unzigzag(z: u64) -> i64 {
        ((z >> 1) as i64) ^ -((z & 1) as i64)
    }

    /// Writes the transform of `page` into `out` (the same length). False, with `out`
    /// untouched, when the length is not a multiple of [`WORD`].
    pub fn encode(page: &[u8], out: &mut [u8]) -> bool {
        let n = page.len() / WORD;
        if !page.len().is_multiple_of(WORD) || out.len() != page.len() {
            return false;
        }
        let (mut prev, mut prev_d) = (0i64, 0i64);
        for (i, w) in page.chunks_exact(WORD).enumerate() {
            let mut b = [0u8; WORD];
            b.copy_from_slice(w);
            let x = i64::from_le_bytes(b);
            let d = x.wrapping_sub(prev);
            let z = zigzag(d.wrapping_sub(prev_d)).to_le_bytes();
            (prev, prev_d) = (x, d);
            for (plane, byte) in z.iter().enumerate() {
                out[plane * n + i] = *byte;
            }
        }
        true
    }

    /// The inverse of [`encode`]: `planes` back into the page, in `out` (the same length).
    /// False when the length is not a multiple of [`WORD`].
    pub fn decode(planes: &[u8], out: &mut [u8]) -> bool {
        let n = planes.len() / WORD;
        if !planes.len().is_multiple_of(WORD) || out.len() != planes.len() {
            return false;
        }
        let (mut prev, mut prev_d) = (0i64, 0i64);
        for (i, w) in out.chunks_exact_mut(WORD).enumerate() {
            let mut z = [0u8; WORD];
            for (plane, byte) in z.iter_mut().enumerate() {
                *byte = planes[plane * n + i];
            }
            let d = prev_d.wrapping_add(unzigzag(u64::from_le_bytes(z)));
            let x = prev.wrapping_add(d);
            (prev, prev_d) = (x, d);
            w.copy_from_slice(&x.to_le_bytes());
        }
        true
    }
}

/// zstd's level for pages LZ4 does not shrink 2:1: its fastest (about 10 us per 4 KiB here).
pub const ZSTD_LEVEL: i32 = 1;

/// The most bytes a kept page of `len` bytes may compress to: the largest span [`keeps`]
/// allows.
fn keep_limit(len: usize) -> usize {
    let max = len * KEEP_RATIO.0 / KEEP_RATIO.1;
    let mut limit = max / GRAIN * GRAIN;
    while limit > 0 && !keeps(limit, len) {
        limit = (limit - 1) / GRAIN * GRAIN;
    }
    limit
}

/// Compresses `data` into per-thread buffers (pages up to 16 KiB; larger ones into buffers of
/// their own) with each [`Codec`] in turn, `first` first (the codec that kept the last page:
/// the pages of one working set tend to take the same one), until one reaches half the page
/// ([`good_enough`]), and hands the smallest result that [`keeps`] and its codec to `f`; None
/// (without calling `f`) when none shrinks it enough to be kept.
fn with_compressed<T>(
    data: &[u8],
    first: Option<Codec>,
    f: impl FnOnce(&[u8], Codec) -> T,
) -> Option<T> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        static ZSTD: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    let len = data.len();
    let max = lz4_flex::block::get_maximum_output_size(len);
    let run = |buf: &mut [u8]| {
        // Three outputs and the smooth transform's planes.
        let (lz, rest) = buf.split_at_mut(max);
        let (sm, rest) = rest.split_at_mut(max);
        let (zs, planes) = rest.split_at_mut(max);
        let mut order = [Codec::Lz4, Codec::Lz4Smooth, Codec::Zstd];
        if let Some(c) = first {
            order.sort_by_key(|&o| o != c);
        }
        let mut best: Option<(usize, Codec)> = None;
        for codec in order {
            let n = match codec {
                Codec::Lz4 => lz4_flex::block::compress_into(data, lz).ok(),
                Codec::Lz4Smooth => smooth::encode(data, &mut planes[..len])
                    .then(|| lz4_flex::block::compress_into(&planes[..len], sm).ok())
                    .flatten(),
                Codec::Zstd => {
                    // Into at most the largest span kept: zstd stops with an error when it
                    // would not fit.
                    let limit = keep_limit(len).min(zs.len());
                    ZSTD.with(|z| {
                        let mut z = z.borrow_mut();
                        if z.is_none() {
                            *z = zstd::bulk::Compressor::new(ZSTD_LEVEL).ok();
                        }
                        z.as_mut()?.compress_to_buffer(data, &mut zs[..limit]).ok()
                    })
                }
            };
            let Some(n) = n else { continue };
            if keeps(n, len) && best.is_none_or(|(b, _)| n < b) {
                best = Some((n, codec));
            }
            if good_enough(n, len) {
                break;
            }
        }
        let (n, codec) = best?;
        let out: &[u8] = match codec {
            Codec::Lz4 => lz,
            Codec::Lz4Smooth => sm,
            Codec::Zstd => zs,
        };
        Some(f(&out[..n], codec))
    };
    let need = 3 * max + len;
    // Buffers for pages above 16 KiB are not kept (a thread would hold one for its life).
    if max > SCRATCH_MAX {
        return run(&mut vec![0u8; need]);
    }
    SCRATCH.with(|s| {
        let mut buf = s.borrow_mut();
        if buf.len() < need {
            buf.resize(need, 0);
        }
        run(&mut buf[..need])
    })
}

fn decompress(st: &State, s: &Block) -> Result<Vec<u8>> {
    thread_local! {
        static UNZSTD: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    let bad = |what: String| crate::StoreError::Config(format!("compressed page {what}"));
    let mut v = vec![0u8; s.len as usize];
    let n = match Codec::of(s.packed) {
        Some(Codec::Lz4) => lz4_flex::block::decompress_into(st.bytes(s), &mut v)
            .map_err(|e| bad(format!("does not decode (LZ4): {e}")))?,
        Some(Codec::Lz4Smooth) => {
            let mut planes = vec![0u8; v.len()];
            let n = lz4_flex::block::decompress_into(st.bytes(s), &mut planes)
                .map_err(|e| bad(format!("does not decode (LZ4, smooth): {e}")))?;
            if n != planes.len() || !smooth::decode(&planes, &mut v) {
                return Err(bad(format!("decoded to {n} bytes instead of {}", v.len())));
            }
            n
        }
        Some(Codec::Zstd) => UNZSTD.with(|z| {
            let mut z = z.borrow_mut();
            if z.is_none() {
                *z = Some(
                    zstd::bulk::Decompressor::new()
                        .map_err(|e| bad(format!("cannot be decoded (zstd context: {e})")))?,
                );
            }
            match z.as_mut() {
                Some(d) => d
                    .decompress_to_buffer(st.bytes(s), &mut v[..])
                    .map_err(|e| bad(format!("does not decode (zstd): {e}"))),
                None => Err(bad("has no zstd context".into())),
            }
        })?,
        None => return Err(bad(format!("has an unknown codec {}", s.packed))),
    };
    if n != v.len() {
        return Err(bad(format!("decoded to {n} bytes instead of {}", v.len())));
    }
    Ok(v)
}

impl CompressedTier {
    /// A tier whose arena holds `capacity` bytes (rounded down to 4 KiB) of compressed pages,
    /// in front of `below`. The arena's memory is taken as it is written.
    pub fn new(capacity: u64, below: Box<dyn Tier>) -> CompressedTier {
        let arena = Arena::new(usize::try_from(capacity & !4095).unwrap_or(0));
        let slabs = Slabs::new(arena.len as u64);
        CompressedTier {
            below,
            state: RwLock::new(State {
                arena,
                blocks: Blocks::new(slabs),
                extent: 0,
                touched: Vec::new(),
                touched_pages: 0,
                forgets: 0,
                next_seq: 0,
            }),
            counters: TierCounters::default(),
            poor_streak: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            found_full: AtomicBool::new(false),
            full_arrivals: AtomicU64::new(0),
            last_codec: AtomicU8::new(0),
            limit: AtomicU64::new(u64::MAX),
        }
    }

    /// The tier below.
    pub fn below(&self) -> &dyn Tier {
        self.below.as_ref()
    }

    /// Compression attempts that failed.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Relaxed)
    }

    /// Pages compressed so far (kept or not).
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Relaxed)
    }

    /// Compresses `data` and hands the result to `f`, keeping count of the pages that do not
    /// compress; after a run of [`GIVE_UP_AFTER`] of them, tries one page in [`GIVE_UP_AFTER`]
    /// only (None for the rest, as for a page that does not compress).
    fn try_compress<T>(&self, data: &[u8], f: impl FnOnce(&[u8], Codec) -> T) -> Option<T> {
        if data.len() < MIN_LEN || self.skips() {
            return None;
        }
        self.compress_counted(data, f)
    }

    /// Whether this page is not tried: after a run of [`GIVE_UP_AFTER`] pages that did not
    /// compress, all but one in [`GIVE_UP_AFTER`].
    fn skips(&self) -> bool {
        self.poor_streak.load(Relaxed) >= GIVE_UP_AFTER
            && !self
                .skipped
                .fetch_add(1, Relaxed)
                .is_multiple_of(GIVE_UP_AFTER)
    }

    /// Compresses `data` (see [`with_compressed`]), keeping the streak of pages that did not.
    fn compress_counted<T>(&self, data: &[u8], f: impl FnOnce(&[u8], Codec) -> T) -> Option<T> {
        self.attempts.fetch_add(1, Relaxed);
        let first = Codec::of(self.last_codec.load(Relaxed));
        let r = with_compressed(data, first, |c, codec| {
            self.last_codec.store(codec as u8, Relaxed);
            f(c, codec)
        });
        if r.is_some() {
            self.poor_streak.store(0, Relaxed);
        } else {
            self.poor_streak.fetch_add(1, Relaxed);
            self.rejected.fetch_add(1, Relaxed);
        }
        r
    }

    /// Evicts one page in clock order, writing it below first when dirty (a page whose write
    /// fails stays: nothing acknowledged is lost). False when the tier holds nothing.
    fn evict_one(&self, st: &mut State) -> Result<bool> {
        let Some(key) = st.blocks.next_victim() else {
            return Ok(false);
        };
        if let Err(e) = self.leave(st, key) {
            st.blocks.put_back(key, false);
            return Err(e);
        }
        Ok(true)
    }

    /// Takes `key`'s block out of the arena, writing it below first when dirty (on failure
    /// it stays: nothing acknowledged is lost).
    fn leave(&self, st: &mut State, key: PageKey) -> Result<()> {
        if let Some(s) = st.blocks.map.get(&key).filter(|s| s.dirty) {
            decompress(st, s).and_then(|v| self.below.put(key, &v))?;
        }
        st.blocks.forget(key);
        self.counters.evictions.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Evicts every block on the arena's highest `pages` pages that hold memory (dirty ones
    /// written below first; one whose write fails stays, and so does the rest). False when
    /// nothing left.
    fn shed_top(&self, st: &mut State, pages: u64) -> bool {
        let Some(cut) = st.top_pages_from(pages) else {
            return false;
        };
        let keys: Vec<PageKey> = st
            .blocks
            .map
            .iter()
            .filter(|(_, b)| b.at + b.span > cut)
            .map(|(k, _)| *k)
            .collect();
        let mut left = false;
        for key in keys {
            if self.leave(st, key).is_err() {
                break;
            }
            left = true;
        }
        left
    }

    /// Enters a compressed dirty page in place of whatever version was here, evicting until a
    /// block is free. False (nothing entered, the old version gone) when even an empty arena
    /// has no block that large.
    fn enter(
        &self,
        key: PageKey,
        data: &[u8],
        codec: Codec,
        len: usize,
        drawn: bool,
    ) -> Result<bool> {
        self.enter_as(key, data, codec, len, true, drawn)
    }

    /// Keeps a dirty page here when the arena lets it in and it compresses (straight from
    /// the encoder's buffer into the arena); false when it must go below.
    fn keep(&self, key: PageKey, data: &[u8]) -> Result<bool> {
        let Some(drawn) = self.let_in(data.len()) else {
            return Ok(false);
        };
        let Some(entered) = self.try_compress(data, |c, codec| {
            self.enter(key, c, codec, data.len(), drawn)
        }) else {
            return Ok(false);
        };
        if entered? {
            self.counters.puts.fetch_add(1, Relaxed);
            self.counters.bytes_in.fetch_add(data.len() as u64, Relaxed);
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether a page of `len` bytes arriving now may be compressed and entered: None when
    /// the arena is full ([`CompressedTier::full_for`]) and the page is not among the
    /// newcomers let in ([`admits_when_full`], drawn here); otherwise whether that draw was
    /// made (`enter_as`'s `drawn`). The draw comes before the page is compressed, so that the
    /// pages refused are not compressed for nothing (seven in eight of them when full: a
    /// third of the evictor's CPU in a simulator's run at `--dram 48M`); a page that finds
    /// the arena full only once compressed is drawn for by [`CompressedTier::enter_as`].
    fn let_in(&self, len: usize) -> Option<bool> {
        if !self.full_for(len) {
            return Some(false);
        }
        admits_when_full(self.full_arrivals.fetch_add(1, Relaxed)).then_some(true)
    }

    /// Whether the arena counts as full for a page of `len` bytes compressed to half: the
    /// last page entered found no free span of its size, or the blocks in use would pass the
    /// index limit less a sixteenth (as [`CompressedTier::enter_as`] counts it) or the
    /// arena's size.
    fn full_for(&self, len: usize) -> bool {
        if self.found_full.load(Relaxed) {
            return true;
        }
        let limit = self.limit.load(Relaxed);
        let st = self.state.read();
        let room = (limit - limit / 16).min(st.blocks.region.capacity());
        st.blocks.used + span(len / 2) as u64 > room
    }

    /// [`CompressedTier::enter`], dirty or clean (a copy of what the tier below holds).
    /// `drawn`: the page was let in by [`CompressedTier::let_in`] already.
    fn enter_as(
        &self,
        key: PageKey,
        data: &[u8],
        codec: Codec,
        len: usize,
        dirty: bool,
        drawn: bool,
    ) -> Result<bool> {
        let mut guard = self.state.write();
        let st = &mut *guard;
        st.forget(key);
        let span = st.blocks.region.span_of(data.len() as u64);
        let mut asked = drawn;
        // Past the limit less a sixteenth (the free space between blocks), full as well.
        let limit = self.limit.load(Relaxed);
        let soft = limit - limit / 16;
        let mut first = true;
        let at = loop {
            if st.blocks.used + span <= soft {
                if let Some(at) = st.blocks.region.alloc_span(span) {
                    break at;
                }
            }
            // Full: only one newcomer in [`ADMIT_WHEN_FULL`] takes an older page's place.
            if first {
                first = false;
                self.found_full.store(true, Relaxed);
            }
            if !asked && !admits_when_full(self.full_arrivals.fetch_add(1, Relaxed)) {
                return Ok(false);
            }
            asked = true;
            if !self.evict_one(st)? {
                return Ok(false);
            }
        };
        if first {
            self.found_full.store(false, Relaxed);
        }
        st.arena.bytes_mut()[at as usize..at as usize + data.len()].copy_from_slice(data);
        st.extent = st.extent.max(at + data.len() as u64);
        st.touch(at, at + data.len() as u64);
        st.next_seq += 1;
        let seq = st.next_seq;
        st.blocks.insert(
            key,
            Block {
                at,
                span,
                stored: data.len() as u32,
                len: len as u32,
                packed: codec as u8,
                dirty,
                referenced: AtomicBool::new(false),
                seq,
            },
        );
        Ok(true)
    }

    fn hit(&self, st: &State, s: &Block) -> Result<Vec<u8>> {
        s.referenced.store(true, Relaxed);
        let v = decompress(st, s)?;
        self.counters.hits.fetch_add(1, Relaxed);
        self.counters.bytes_out.fetch_add(v.len() as u64, Relaxed);
        Ok(v)
    }
}

impl Tier for CompressedTier {
    fn name(&self) -> &str {
        "compressed"
    }

    fn put(&self, key: PageKey, data: &[u8]) -> Result<()> {
        if self.keep(key, data)? {
            return Ok(());
        }
        // The older version here must not be read any more.
        self.state.write().forget(key);
        self.below.put(key, data)
    }

    /// Keeps the pages that compress; the others go below in one batch, so that a tier
    /// there that copies batches (the VRAM tier: one copy to the GPU per batch instead of one
    /// synchronous copy per page) gets them together.
    fn put_many(&self, pages: &[(PageKey, &[u8])]) -> Result<()> {
        let mut down: Vec<(PageKey, &[u8])> = Vec::new();
        for &(key, data) in pages {
            if self.keep(key, data)? {
                continue;
            }
            // Forgotten here before the batch goes below: a later page of the batch with the
            // same key may still enter the arena, and reads look here first.
            self.state.write().forget(key);
            down.push((key, data));
        }
        if down.is_empty() {
            return Ok(());
        }
        self.below.put_many(&down)
    }

    fn get(&self, key: PageKey) -> Result<Option<Vec<u8>>> {
        {
            let st = self.state.read();
            if let Some(s) = st.blocks.map.get(&key) {
                return self.hit(&st, s).map(Some);
            }
        }
        self.counters.misses.fetch_add(1, Relaxed);
        self.below.get(key)
    }

    fn get_many(&self, keys: &[PageKey]) -> Result<Vec<Option<Vec<u8>>>> {
        let mut out: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        let mut missing = Vec::new();
        {
            let st = self.state.read();
            for (i, k) in keys.iter().enumerate() {
                match st.blocks.map.get(k) {
                    Some(s) => out[i] = Some(self.hit(&st, s)?),
                    None => missing.push(i),
                }
            }
        }
        if missing.is_empty() {
            return Ok(out);
        }
        self.counters
            .misses
            .fetch_add(missing.len() as u64, Relaxed);
        let ks: Vec<PageKey> = missing.iter().map(|&i| keys[i]).collect();
        for (&i, v) in missing.iter().zip(self.below.get_many(&ks)?) {
            out[i] = v;
        }
        Ok(out)
    }

    fn remove(&self, key: PageKey) -> Result<bool> {
        // Below first: if that fails, the copy here (newer than the one below) stays.
        let below = self.below.remove(key)?;
        let here = self.state.write().forget(key).is_some();
        Ok(below || here)
    }

    fn flush(&self) -> Result<()> {
        self.settle()?;
        self.below.flush()
    }

    fn settle(&self) -> Result<()> {
        let mut guard = self.state.write();
        let st = &mut *guard;
        for key in st.blocks.dirty_keys() {
            let Some(s) = st.blocks.map.get(&key) else {
                continue;
            };
            self.below.put(key, &decompress(st, s)?)?;
            st.blocks.mark_clean(key);
        }
        drop(guard);
        self.below.settle()
    }

    /// Drops every page and gives the arena's memory back, when none is dirty and nobody
    /// holds the tier (a forked child's copy of its parent's store, settled before the fork).
    fn release_memory(&self) {
        let Some(mut st) = self.state.try_write() else {
            return;
        };
        if st.blocks.dirty > 0 {
            return;
        }
        st.blocks = Blocks::new(Slabs::new(st.arena.len as u64));
        st.arena.discard();
        st.extent = 0;
        st.touched.clear();
        st.touched_pages = 0;
        drop(st);
        self.below.release_memory();
    }

    fn status(&self) -> TierStatus {
        self.state
            .read()
            .blocks
            .status("compressed", &self.counters)
    }

    fn statuses(&self) -> Vec<TierStatus> {
        let mut v = vec![self.status()];
        v.extend(self.below.statuses());
        v
    }

    /// The arena's pages that hold memory, the tier's tables and the indexes of the tiers
    /// below: DRAM of the process that a paging budget must cover.
    fn index_bytes(&self) -> u64 {
        let st = self.state.read();
        st.touched_pages * 4096 + st.blocks.table_bytes() + self.below.index_bytes()
    }

    /// The arena may hold what `bytes` leaves after the map and the tiers below; when it
    /// holds more already (the index below grew), it gives back its excess at once: clean
    /// pages dropped, dirty ones written below, emptied memory returned to the kernel.
    fn limit_index(&self, bytes: u64) {
        let (others, held) = {
            let st = self.state.read();
            (st.blocks.table_bytes(), st.touched_pages * 4096)
        };
        let limit = bytes.saturating_sub(others + self.below.index_bytes());
        self.limit.store(limit, Relaxed);
        self.below.limit_index(bytes);
        // Called at every evictor round: the write lock (which a compressed hit waits for) only
        // when over.
        if held <= limit {
            return;
        }
        let mut st = self.state.write();
        // Pages leave from the top of the arena, not in clock order: the clock's victims lie
        // anywhere, so evicting the excess that way frees slots all over the slabs and
        // hardly a whole 4 KiB page (a floats run evicted 195 MiB of pages to give back
        // 20 MiB). New blocks take the lowest free slot, so the top holds the fewest.
        // Down to a thirty-second under the limit, so that the index's next growth does not
        // call for this again at once.
        for _ in 0..LIMIT_ROUNDS {
            let held = st.touched_pages * 4096;
            if held <= limit || st.blocks.used == 0 {
                break;
            }
            let excess = held - limit + limit / 32;
            if !self.shed_top(&mut st, excess.div_ceil(4096)) {
                break;
            }
            st.trim();
        }
    }

    /// A copy is wanted of a page not here, unless the working set stopped compressing (then
    /// one in [`GIVE_UP_AFTER`] is tried, as for puts).
    fn wants_copy(&self, key: PageKey) -> bool {
        !self.state.read().blocks.map.contains_key(&key) && !self.skips()
    }

    /// Keeps a clean copy when it compresses (a page read from below and dropped unchanged:
    /// the next read of it is a decompression, not a drive read). A copy that does not fit
    /// without writing dirty pages below first still goes in: the clock decides, as for puts.
    fn admit(&self, key: PageKey, data: &[u8]) -> Result<()> {
        if data.len() < MIN_LEN {
            return Ok(());
        }
        let Some(drawn) = self.let_in(data.len()) else {
            return Ok(());
        };
        if let Some(entered) = self.compress_counted(data, |c, codec| {
            self.enter_as(key, c, codec, data.len(), false, drawn)
        }) {
            if entered? {
                self.counters.bytes_in.fetch_add(data.len() as u64, Relaxed);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap as Model;
    use std::sync::Arc;

    /// A tier below that keeps pages in a map and counts puts.
    #[derive(Default)]
    struct Below {
        map: parking_lot::Mutex<std::collections::HashMap<PageKey, Vec<u8>>>,
        puts: AtomicU64,
        /// `put_many` calls.
        batches: AtomicU64,
        flushes: AtomicU64,
    }

    struct Shared(Arc<Below>);

    impl Tier for Shared {
        fn name(&self) -> &str {
            "below"
        }
        fn put(&self, key: PageKey, data: &[u8]) -> Result<()> {
            self.0.puts.fetch_add(1, Relaxed);
            self.0.map.lock().insert(key, data.to_vec());
            Ok(())
        }
        fn put_many(&self, pages: &[(PageKey, &[u8])]) -> Result<()> {
            self.0.batches.fetch_add(1, Relaxed);
            let mut m = self.0.map.lock();
            for (k, d) in pages {
                m.insert(*k, d.to_vec());
            }
            Ok(())
        }
        fn get(&self, key: PageKey) -> Result<Option<Vec<u8>>> {
            Ok(self.0.map.lock().get(&key).cloned())
        }
        fn remove(&self, key: PageKey) -> Result<bool> {
            Ok(self.0.map.lock().remove(&key).is_some())
        }
        fn flush(&self) -> Result<()> {
            self.0.flushes.fetch_add(1, Relaxed);
            Ok(())
        }
        fn status(&self) -> TierStatus {
            TierCounters::default().snapshot("below", 0, 0, 0)
        }
    }

    fn tier(capacity: u64) -> (CompressedTier, Arc<Below>) {
        let b = Arc::new(Below::default());
        (
            CompressedTier::new(capacity, Box::new(Shared(b.clone()))),
            b,
        )
    }

    /// A 4 KiB page of one repeated word: compresses well.
    fn word_page(w: u64) -> Vec<u8> {
        w.to_le_bytes().repeat(512)
    }

    /// A 4 KiB page of pseudo-random bytes: does not compress.
    fn random_page(seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn compressible_pages_stay_here_and_random_ones_go_below() {
        let (t, b) = tier(1 << 20);
        t.put((1, 0), &word_page(7)).expect("put");
        t.put((1, 1), &random_page(3)).expect("put");
        assert_eq!(b.puts.load(Relaxed), 1, "only the random page went below");
        assert_eq!(t.get((1, 0)).expect("get"), Some(word_page(7)));
        assert_eq!(t.get((1, 1)).expect("get"), Some(random_page(3)));
        assert_eq!(t.rejected(), 1);
        // The word page takes one 64-byte block of the arena.
        assert_eq!(t.state.read().blocks.used, 64);
        // The arena's written part is charged as index bytes, not its capacity.
        assert!(
            t.index_bytes() >= 4096 && t.index_bytes() < 64 << 10,
            "{}",
            t.index_bytes()
        );
    }

    /// A batch (the store's eviction) keeps what compresses and hands the rest below in one
    /// batch, not page by page: the VRAM tier below copies a batch to the GPU at once, and
    /// page-by-page synchronous copies made `run --vram` slower than no VRAM tier at all.
    #[test]
    fn a_batch_goes_below_as_one_batch() {
        let (t, b) = tier(1 << 20);
        let pages: Vec<(PageKey, Vec<u8>)> = (0..16u64)
            .map(|i| {
                let d = if i % 4 == 0 {
                    word_page(i)
                } else {
                    random_page(i)
                };
                ((1, i), d)
            })
            .collect();
        let refs: Vec<(PageKey, &[u8])> = pages.iter().map(|(k, d)| (*k, d.as_slice())).collect();
        t.put_many(&refs).expect("put_many");
        assert_eq!(b.batches.load(Relaxed), 1, "one batch below");
        assert_eq!(b.puts.load(Relaxed), 0, "no page-by-page puts below");
        assert_eq!(b.map.lock().len(), 12, "the 12 random pages went below");
        for (k, d) in &pages {
            assert_eq!(t.get(*k).expect("get").as_deref(), Some(d.as_slice()));
        }
        // A newer version that does not compress hides the compressed one here, and one that
        // compresses hides the one below, whichever way the versions alternate in a batch.
        let (w, r) = (word_page(99), random_page(99));
        t.put_many(&[((1, 0), r.as_slice()), ((1, 1), w.as_slice())])
            .expect("put_many");
        assert_eq!(t.get((1, 0)).expect("get"), Some(r));
        assert_eq!(t.get((1, 1)).expect("get"), Some(w));
    }

    /// A page of `bench mem --fill floats` (a smooth field of doubles): the same formula.
    /// Puts the smooth pages `range` under object `obj`.
    fn put_smooth(t: &CompressedTier, obj: u64, range: impl Iterator<Item = u64>) {
        for i in range {
            t.put((obj, i), &smooth_page(i as usize)).expect("put");
        }
    }

    /// Every smooth page `0..n` of object `obj` reads back whole.
    fn assert_smooth_back(t: &CompressedTier, obj: u64, n: u64) {
        for i in 0..n {
            assert_eq!(
                t.get((obj, i)).expect("get"),
                Some(smooth_page(i as usize)),
                "page {i}"
            );
        }
    }

    fn smooth_page(p: usize) -> Vec<u8> {
        (0..512)
            .flat_map(|i| {
                let t = (p * 512 + i) as f64 * 1e-4;
                (t.sin() * 0.5 + (3.0 * t).cos()).to_le_bytes()
            })
            .collect()
    }

    /// A smooth field of doubles: neither LZ4 nor zstd halves its pages, the smooth transform
    /// does; every page is kept encoded that way and read back whole, and the tier below sees
    /// none of them.
    #[test]
    fn smooth_fields_of_doubles_are_kept_with_the_smooth_transform() {
        let p = smooth_page(1000);
        assert!(
            !keeps(lz4_flex::block::compress(&p).len(), 4096),
            "LZ4 halves it"
        );
        let z = zstd::bulk::compress(&p, ZSTD_LEVEL).expect("zstd");
        assert!(!keeps(z.len(), 4096), "zstd halves it");
        let (t, b) = tier(1 << 20);
        let pages = [0usize, 1, 1000, 100_000, 300_000, 393_215];
        for (k, &n) in pages.iter().enumerate() {
            t.put((6, k as u64), &smooth_page(n)).expect("put");
        }
        assert_eq!(b.puts.load(Relaxed), 0, "all kept");
        let st = t.state.read();
        for k in 0..pages.len() {
            let s = st.blocks.map.get(&(6, k as u64)).expect("kept");
            assert_eq!(Codec::of(s.packed), Some(Codec::Lz4Smooth), "page {k}");
            assert!(s.stored <= 2048, "{}", s.stored);
        }
        drop(st);
        for (k, &n) in pages.iter().enumerate() {
            assert_eq!(t.get((6, k as u64)).expect("get"), Some(smooth_page(n)));
        }
    }

    proptest::proptest! {
        /// The smooth transform is undone exactly, whatever the words (wrapping differences),
        /// and refuses lengths that are not whole words.
        #[test]
        fn the_smooth_transform_is_undone_exactly(words in proptest::collection::vec(proptest::prelude::any::<u64>(), 0..600), odd in 1usize..8) {
            let page: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            let mut planes = vec![0u8; page.len()];
            proptest::prop_assert!(smooth::encode(&page, &mut planes));
            let mut back = vec![0u8; page.len()];
            proptest::prop_assert!(smooth::decode(&planes, &mut back));
            proptest::prop_assert_eq!(&back, &page);
            let ragged = vec![0u8; page.len() + odd];
            let mut out = vec![0u8; ragged.len()];
            proptest::prop_assert!(!smooth::encode(&ragged, &mut out));
            proptest::prop_assert!(!smooth::decode(&ragged, &mut out));
        }
    }

    /// The keep rule is by the arena span (the bytes rounded up to 64): 1.5:1 or better, for
    /// any page size.
    #[test]
    fn pages_are_kept_when_their_span_is_at_most_two_thirds_of_the_page() {
        assert!(keeps(20, 4096), "a zero page");
        assert!(keeps(2048, 4096));
        assert!(keeps(2688, 4096), "2,688 bytes of arena: 1.52:1");
        assert!(!keeps(2689, 4096), "2,752 bytes of arena: 1.49:1");
        assert!(!keeps(3000, 4096));
        assert!(keeps(8 << 10, 12 << 10));
        assert!(!keeps((8 << 10) + 1, 12 << 10));
        assert!(good_enough(2048, 4096) && !good_enough(2049, 4096));
    }

    /// A page that shrinks a little over 1.5:1 stays in the arena; one that shrinks a little
    /// under it goes below.
    #[test]
    fn a_page_at_three_to_two_is_kept_and_one_under_it_goes_below() {
        let (t, b) = tier(1 << 20);
        // `n` bytes that do not compress, then zeros.
        let page = |n: usize| -> Vec<u8> {
            let mut v = random_page(7);
            v[n..].fill(0);
            v
        };
        t.put((1, 0), &page(2600)).expect("put");
        assert_eq!(b.puts.load(Relaxed), 0, "kept");
        t.put((1, 1), &page(2900)).expect("put");
        assert_eq!(b.puts.load(Relaxed), 1, "went below");
        assert_eq!(t.get((1, 0)).expect("get"), Some(page(2600)));
        assert_eq!(t.get((1, 1)).expect("get"), Some(page(2900)));
        // The arena holds the kept page's bytes rounded to 64, not a power of two.
        let st = t.state.read();
        let s = st.blocks.map.get(&(1, 0)).expect("kept");
        assert_eq!(s.span, span(s.stored as usize) as u64);
        assert_eq!(st.blocks.used, s.span);
    }

    /// A page of a state vector after a Fourier transform (Qrack's, 18 qubits, basis state
    /// 0x25A5A, complex amplitudes as 32-bit floats: `tests/fixtures/qft_state_page.bin`):
    /// LZ4 does not shrink it 2:1 (2,251 bytes), zstd does (1,413); it is kept, encoded with
    /// zstd (the smaller), and read back whole.
    #[test]
    fn floats_lz4_cannot_halve_are_kept_with_zstd() {
        let state: &[u8] = include_bytes!("../tests/fixtures/qft_state_page.bin");
        // Sixteen pages told apart by their first word.
        let page = |k: u32| -> Vec<u8> {
            let mut v = state.to_vec();
            v[..4].copy_from_slice(&k.to_le_bytes());
            v
        };
        let p = page(3);
        assert!(
            !good_enough(lz4_flex::block::compress(&p).len(), 4096),
            "LZ4 halves it"
        );
        let (t, b) = tier(1 << 20);
        for k in 0..16 {
            t.put((5, k as u64), &page(k)).expect("put");
        }
        assert_eq!(b.puts.load(Relaxed), 0, "all kept");
        let st = t.state.read();
        let s = st.blocks.map.get(&(5, 3)).expect("kept");
        assert_eq!(Codec::of(s.packed), Some(Codec::Zstd));
        assert!(s.stored <= 2048, "{}", s.stored);
        drop(st);
        for k in 0..16 {
            assert_eq!(
                t.get((5, k as u64)).expect("get"),
                Some(page(k)),
                "page {k}"
            );
        }
        // Evicted dirty, it is decoded and written below whole.
        t.flush().expect("flush");
        assert_eq!(b.puts.load(Relaxed), 16);
    }

    /// A clean copy handed over (a page the memory front dropped unchanged) is served from
    /// here and never written below: the tier below has it already.
    #[test]
    fn an_admitted_copy_is_served_here_and_not_written_below() {
        let (t, b) = tier(1 << 20);
        b.map.lock().insert((6, 1), word_page(1));
        let before = b.puts.load(Relaxed);
        assert!(t.wants_copy((6, 1)));
        t.admit((6, 1), &word_page(1)).expect("admit");
        assert!(!t.wants_copy((6, 1)), "held now");
        let misses = t.counters.misses.load(Relaxed);
        assert_eq!(t.get((6, 1)).expect("get"), Some(word_page(1)));
        assert_eq!(t.counters.misses.load(Relaxed), misses, "a hit here");
        t.flush().expect("flush");
        assert_eq!(b.puts.load(Relaxed), before, "clean: nothing written below");
        // A put after it replaces it (dirty again) and reaches below on flush.
        t.put((6, 1), &word_page(2)).expect("put");
        t.flush().expect("flush");
        assert_eq!(b.puts.load(Relaxed), before + 1);
        assert_eq!(t.get((6, 1)).expect("get"), Some(word_page(2)));
        // A copy that does not compress is not kept.
        t.admit((6, 2), &random_page(2)).expect("admit");
        assert!(!t.state.read().blocks.map.contains_key(&(6, 2)));
    }

    /// A loop that sweeps twice as many pages as the arena holds, reading each page and
    /// writing it back changed: with every newcomer evicting the oldest page, no read would
    /// ever find its page here; letting one newcomer in [`ADMIT_WHEN_FULL`] in keeps most of
    /// the arena across sweeps, and each later sweep finds a good share of its pages here.
    #[test]
    fn a_sweep_larger_than_the_arena_still_finds_pages_here() {
        // Each page takes a 64-byte block: the arena holds 256 of them.
        let (t, _b) = tier(256 * 64);
        let n = 512u64;
        for i in 0..n {
            t.put((7, i), &word_page(i)).expect("put");
        }
        let hits0 = t.counters.hits.load(Relaxed);
        for round in 1..4u64 {
            for i in 0..n {
                let v = t.get((7, i)).expect("get").expect("page");
                assert_eq!(v, word_page(i + (round - 1) * 1000), "page {i}");
                t.put((7, i), &word_page(i + round * 1000)).expect("put");
            }
        }
        let hits = t.counters.hits.load(Relaxed) - hits0;
        assert!(hits >= 3 * n / 4, "{hits} hits of {} reads", 3 * n);
        assert!(admits_when_full(0) && !admits_when_full(1) && admits_when_full(ADMIT_WHEN_FULL));
    }

    #[test]
    fn the_keep_limit_is_the_largest_span_kept() {
        assert_eq!(keep_limit(4096), 2688);
        assert_eq!(keep_limit(12 << 10), 8 << 10);
        assert_eq!(keep_limit(64), 0);
        for len in [4096usize, 8192, 12 << 10, 1 << 20] {
            assert!(keeps(keep_limit(len), len));
            assert!(!keeps(keep_limit(len) + 1, len));
        }
    }

    #[test]
    fn a_full_tier_writes_dirty_pages_below_and_loses_nothing() {
        let (t, b) = tier(4 * 1024);
        for i in 0..200u64 {
            t.put((2, i), &word_page(i)).expect("put");
        }
        assert!(t.state.read().blocks.used <= 4 * 1024);
        assert!(t.state.read().extent <= 4 * 1024);
        assert!(
            b.puts.load(Relaxed) > 100,
            "evicted pages were written below"
        );
        for i in 0..200u64 {
            assert_eq!(t.get((2, i)).expect("get"), Some(word_page(i)), "page {i}");
        }
    }

    /// A limit on the index (what the paging process's budget leaves it) holds: a tier over
    /// it gives back its excess at once, writing dirty pages below, and stops growing there;
    /// nothing is lost.
    #[test]
    fn the_arena_stays_under_the_index_limit_and_loses_nothing() {
        let (t, b) = tier(8 << 20);
        put_smooth(&t, 4, 0..2048);
        let full = t.index_bytes();
        assert!(full > 3 << 20, "{full}");
        let limit = full / 3;
        t.limit_index(limit);
        assert!(t.index_bytes() <= limit, "{} > {limit}", t.index_bytes());
        assert!(b.puts.load(Relaxed) > 0, "dirty pages went below");
        // Between two looks of the pager, the arena keeps its blocks in use under the limit
        // (the free space between them may take it past by a little); at each look it is
        // under it again.
        for round in 0..4u64 {
            put_smooth(&t, 4, 2048 + round * 512..2048 + (round + 1) * 512);
            assert!(t.state.read().blocks.used <= limit);
            assert!(
                t.index_bytes() <= limit + limit / 4,
                "{} > {limit}",
                t.index_bytes()
            );
            t.limit_index(limit);
            assert!(t.index_bytes() <= limit, "{} > {limit}", t.index_bytes());
        }
        assert_smooth_back(&t, 4, 4096);
    }

    /// A limit under what the arena holds is met by evicting about the excess: pages leave
    /// from the arena's top. In clock order they would leave from all over it here (the
    /// oldest pages lie between the newest, which filled the holes), freeing slots but hardly
    /// a whole 4 KiB page, and far more would be evicted for the same memory.
    #[test]
    fn a_lower_limit_evicts_about_the_excess_from_the_top() {
        let (t, _b) = tier(16 << 20);
        put_smooth(&t, 4, 0..4096);
        // Every third page goes below (it no longer compresses), then comes back into the
        // holes it left: the newest pages lie between the oldest.
        for i in (0..4096u64).step_by(3) {
            t.put((4, i), &random_page(i)).expect("put");
        }
        put_smooth(&t, 4, (0..4096u64).step_by(3));
        let (held, used) = {
            let st = t.state.read();
            (st.touched_pages * 4096, st.blocks.used)
        };
        let excess = held / 4;
        let limit = t.index_bytes() - excess;
        t.limit_index(limit);
        assert!(t.index_bytes() <= limit, "{} > {limit}", t.index_bytes());
        let evicted = used - t.state.read().blocks.used;
        // The excess, the thirty-second kept under the limit, and the slabs' ends.
        assert!(
            evicted <= excess + excess / 2,
            "evicted {evicted} bytes of blocks to give back {excess}"
        );
        assert_smooth_back(&t, 4, 4096);
    }

    /// When the arena is full, only one newcomer in [`ADMIT_WHEN_FULL`] takes an older page's
    /// place, and the others go below without being compressed first (their compression
    /// would be thrown away); every page reads back whole.
    #[test]
    fn pages_refused_by_a_full_arena_are_not_compressed() {
        let (t, b) = tier(1 << 20);
        // The pager sets the limit at each look.
        t.limit_index(640 << 10);
        let mut i = 0u64;
        while !t.full_for(4096) {
            t.put((5, i), &smooth_page(i as usize)).expect("put");
            i += 1;
        }
        let (before, kept_before) = (t.attempts(), t.counters.puts.load(Relaxed));
        let n = 800u64;
        put_smooth(&t, 5, i..i + n);
        let compressed = t.attempts() - before;
        let kept = t.counters.puts.load(Relaxed) - kept_before;
        // Each page kept made room for it and perhaps a few more (older pages of other
        // sizes left); the pages that then found it full were refused before compressing.
        assert!(kept >= n / ADMIT_WHEN_FULL, "{kept} kept");
        assert!(kept < n / 2, "{kept} kept: the arena was not full");
        assert!(
            compressed - kept <= n / 16,
            "{compressed} of {n} pages compressed, {kept} kept"
        );
        assert!(b.puts.load(Relaxed) > 0);
        assert_smooth_back(&t, 5, i + n);
    }

    /// A phase that compressed, then the same pages rewritten with data that does not: the
    /// arena's memory goes back to the kernel and is no longer charged; pages that compress
    /// later are kept again and read back whole.
    #[test]
    fn memory_of_a_phase_that_compressed_is_given_back() {
        let (t, _b) = tier(8 << 20);
        // Pages of varied words: each takes a 2 KiB block or less.
        let page = |i: u64| -> Vec<u8> {
            (0..512u64)
                .flat_map(|j| (i * 7 + j % 16).to_le_bytes())
                .collect()
        };
        for i in 0..2048u64 {
            t.put((3, i), &page(i)).expect("put");
        }
        let arena = |t: &CompressedTier| t.state.read().touched_pages * 4096;
        let full = arena(&t);
        assert!(full >= 200 << 10, "{full}");
        for i in 0..2048u64 {
            t.put((3, i), &random_page(i)).expect("put");
        }
        let after = arena(&t);
        assert!(after < full / 4, "{full} -> {after}");
        // What is charged is what holds memory.
        assert_eq!(t.index_bytes(), after + t.state.read().blocks.table_bytes());
        for i in 0..2048u64 {
            assert_eq!(
                t.get((3, i)).expect("get"),
                Some(random_page(i)),
                "page {i}"
            );
        }
        for i in 0..64u64 {
            t.put((4, i), &page(i)).expect("put");
        }
        for i in 0..64u64 {
            assert_eq!(t.get((4, i)).expect("get"), Some(page(i)), "page {i}");
        }
        assert!(arena(&t) > after);
    }

    #[test]
    fn release_memory_drops_clean_pages_only() {
        let (t, b) = tier(1 << 20);
        t.put((7, 0), &word_page(1)).expect("put");
        t.release_memory();
        assert_eq!(
            t.get((7, 0)).expect("get"),
            Some(word_page(1)),
            "dirty: kept"
        );
        t.flush().expect("flush");
        t.release_memory();
        assert_eq!(t.state.read().extent, 0);
        assert!(t.state.read().blocks.map.is_empty());
        assert_eq!(
            t.get((7, 0)).expect("get"),
            Some(word_page(1)),
            "from below"
        );
        assert_eq!(b.map.lock().len(), 1);
        // The arena works again afterwards, and tiny pages go below without counting.
        t.put((7, 1), &word_page(2)).expect("put");
        assert!(t.state.read().blocks.map.contains_key(&(7, 1)));
        t.put((7, 2), &[0u8; 16]).expect("put");
        assert_eq!(t.get((7, 2)).expect("get"), Some(vec![0u8; 16]));
        assert_eq!(t.rejected(), 0);
    }

    #[test]
    fn flush_writes_every_dirty_page_below() {
        let (t, b) = tier(1 << 20);
        for i in 0..10u64 {
            t.put((3, i), &word_page(i)).expect("put");
        }
        t.flush().expect("flush");
        assert_eq!(b.map.lock().len(), 10);
        assert_eq!(b.flushes.load(Relaxed), 1);
        assert_eq!(t.state.read().blocks.dirty, 0);
        // A second flush writes nothing again.
        t.flush().expect("flush");
        assert_eq!(b.puts.load(Relaxed), 10);
    }

    #[test]
    fn a_read_leaves_the_page_here_and_a_removal_reaches_below() {
        let (t, b) = tier(1 << 20);
        t.put((4, 0), &word_page(9)).expect("put");
        t.flush().expect("flush");
        assert_eq!(t.get((4, 0)).expect("get"), Some(word_page(9)));
        assert!(
            t.state.read().blocks.map.contains_key(&(4, 0)),
            "still here after a read"
        );
        // A page read from below is not admitted.
        b.map.lock().insert((4, 1), word_page(2));
        assert_eq!(t.get((4, 1)).expect("get"), Some(word_page(2)));
        assert!(!t.state.read().blocks.map.contains_key(&(4, 1)));
        assert!(t.remove((4, 0)).expect("remove"));
        assert_eq!(t.get((4, 0)).expect("get"), None, "gone here and below");
        // A random page replacing a kept one is read as the random one.
        t.put((4, 2), &word_page(3)).expect("put");
        t.put((4, 2), &random_page(3)).expect("put");
        assert_eq!(t.get((4, 2)).expect("get"), Some(random_page(3)));
    }

    #[test]
    fn a_random_working_set_stops_paying_for_attempts() {
        let (t, b) = tier(1 << 20);
        for i in 0..1000u64 {
            t.put((5, i), &random_page(i)).expect("put");
        }
        assert_eq!(b.puts.load(Relaxed), 1000, "every random page went below");
        for i in 0..1000u64 {
            assert_eq!(t.get((5, i)).expect("get"), Some(random_page(i)));
        }
        // GIVE_UP_AFTER attempts, then one in GIVE_UP_AFTER.
        let tried = t.rejected();
        assert!(tried < GIVE_UP_AFTER + 1000 / GIVE_UP_AFTER + 2, "{tried}");
        // Compressible pages written later are kept again after at most GIVE_UP_AFTER.
        for i in 0..GIVE_UP_AFTER {
            t.put((5, i), &word_page(i)).expect("put");
        }
        assert!(t
            .state
            .read()
            .blocks
            .map
            .contains_key(&(5, GIVE_UP_AFTER - 1)));
        for i in 0..GIVE_UP_AFTER {
            assert_eq!(t.get((5, i)).expect("get"), Some(word_page(i)));
        }
    }

    proptest::proptest! {
        /// Against a map: every read returns the last write, across puts of compressible and
        /// random pages, removes, flushes and a tier small enough to evict.
        #[test]
        fn reads_return_the_last_write(ops in proptest::collection::vec((0u8..6, 0u64..24, 0u64..1000), 1..300)) {
            let (t, _b) = tier(4096);
            let mut model: Model<PageKey, Vec<u8>> = Model::new();
            for (op, k, v) in ops {
                let key = (6, k);
                match op {
                    0 | 1 => {
                        let page = if op == 0 { word_page(v) } else { random_page(v) };
                        t.put(key, &page).expect("put");
                        model.insert(key, page);
                    }
                    2 => {
                        t.remove(key).expect("remove");
                        model.remove(&key);
                    }
                    3 => t.flush().expect("flush"),
                    4 => {
                        // A batch with a neighbour and the same key again (the last wins).
                        let ks = [key, (6, (k + 1) % 24), key];
                        let ps = [word_page(v), random_page(v + 1), if v % 2 == 0 { random_page(v + 2) } else { word_page(v + 2) }];
                        let batch: Vec<(PageKey, &[u8])> = ks.iter().copied().zip(ps.iter().map(|p| p.as_slice())).collect();
                        t.put_many(&batch).expect("put_many");
                        for (k, p) in ks.iter().zip(&ps) {
                            model.insert(*k, p.clone());
                        }
                    }
                    _ => {
                        proptest::prop_assert_eq!(t.get(key).expect("get"), model.get(&key).cloned());
                    }
                }
            }
            for (k, v) in &model {
                proptest::prop_assert_eq!(t.get(*k).expect("get"), Some(v.clone()));
            }
        }
    }
}
