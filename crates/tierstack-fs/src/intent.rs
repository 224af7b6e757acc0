//! The intent log: a small `fsync` in sync mode made durable on its own.
//!
//! Without it, every `fsync` writes all dirty pages of the store (1 MiB pages: a 4 KiB write
//! dirties a whole one) as padded full stripes to the array, syncs every drive and then the
//! SQLite journal. With it, an `fsync` whose file changed by at most [`MAX_RECORD`] bytes
//! since the last full flush appends one record (the file's changed byte ranges, read from
//! the store, and its size) to this log and syncs that alone: one sequential write and one
//! `fdatasync` of a preallocated file, as ZFS's ZIL does. Concurrent `fsync`s share one write
//! and one sync (group commit). The records are folded into the array by the next full flush
//! (a large `fsync`, `sync`, unmount, or the log filling up), which then starts a new
//! generation of the log: records of older generations are void.
//!
//! On-disk format (all integers little endian):
//! - header (offset 0, [`HEADER`] bytes): magic `TSINTENT`, version u32, generation u64,
//!   crc32c of the preceding 20 bytes;
//! - records from offset [`HEADER`]: magic u32 `TSIR`, payload length u32, generation u64,
//!   crc32c u32 of (length, generation, payload), then the payload: ino u64, obj u64,
//!   size u64, extent count u32, and per extent offset u64, length u32, bytes.
//!
//! Replay reads records while the magic, generation and checksum hold; the first that does
//! not (a torn or stale tail) ends the log.
//!
//! Opening never writes over a byte it has not read: a file shorter than [`LOG_BYTES`] (a
//! crash while it was being made, a copy) is extended with zeros past its end only, so the
//! records it returns are still there for the next open until the caller's
//! [`IntentLog::reset`] voids them.
//!
//! **A damaged header.** A header that fails its checksum does not say which generation is
//! current, and the records still on disk may be of the current one (acknowledged `fsync`s
//! not yet in the array) or of older ones (already folded in: replaying them would roll their
//! files back). Open then decodes every record that passes its checksum, at any offset of the
//! log, and:
//! - recovers the records at the start of the log (those a valid header of their generation
//!   G would replay) only when the damaged header itself shows that it named G: its checksum
//!   field is that of a header of G (the damage hit magic, version or generation), or its
//!   magic, version and generation read G (the damage hit the checksum alone); and no record
//!   anywhere in the log has a newer generation. It rewrites the header of G, syncs it and
//!   returns the records as a valid header would have (logged as a warning);
//! - otherwise replays nothing, logs an error that names the file and every record dropped
//!   (generation, inode, size: the admin knows which files may miss their last `fsync`ed
//!   writes), and writes a header of a generation above every one found, so that neither a
//!   stale record nor a torn batch's record can become valid again. The records are left in
//!   place (void), not zeroed.
//!
//! [`IntentLog::damaged`] tells the caller what was found. Before the new header, open writes
//! nothing but zeros past the file's end; the header (rewritten or new) is one sector-sized
//! write, synced before open returns. A crash at any step leaves either the damaged header,
//! and the next open decides the same again, or the new one. (Only a generation from a crafted
//! record near `u64::MAX` makes open zero the records first, synced, then write generation 1.)
//! A header with the magic and a valid checksum but a version this code does not know was
//! written by a newer tierstack: open refuses it ([`io::ErrorKind::InvalidData`]) rather than
//! start over on top of records it cannot read.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use parking_lot::Mutex;

/// Bytes of the log file (preallocated and written once, so appends never change its size
/// and `fdatasync` writes data only).
pub const LOG_BYTES: u64 = 64 << 20;
/// Largest change of one file an `fsync` logs; more goes through a full flush.
pub const MAX_RECORD: u64 = 1 << 20;
/// Bytes of the log's header; records start at this offset.
pub const HEADER: u64 = 4096;
const MAGIC: &[u8; 8] = b"TSINTENT";
const VERSION: u32 = 1;
const REC_MAGIC: u32 = u32::from_le_bytes(*b"TSIR");
/// magic, length, generation, crc.
const REC_HEAD: usize = 4 + 4 + 8 + 4;

/// One `fsync`'s worth: a file's changed byte ranges and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The file's inode number.
    pub ino: u64,
    /// The file's object id in the store (its pages are keyed by it).
    pub obj: u64,
    /// The file's size in bytes at the `fsync`.
    pub size: u64,
    /// The changed byte ranges: offset in the file and the bytes written there.
    pub extents: Vec<(u64, Vec<u8>)>,
}

impl Record {
    fn payload(&self) -> Vec<u8> {
        let n: usize = self.extents.iter().map(|(_, b)| 12 + b.len()).sum();
        let mut p = Vec::with_capacity(28 + n);
        p.extend_from_slice(&self.ino.to_le_bytes());
        p.extend_from_slice(&self.obj.to_le_bytes());
        p.extend_from_slice(&self.size.to_le_bytes());
        p.extend_from_slice(&(self.extents.len() as u32).to_le_bytes());
        for (off, b) in &self.extents {
            p.extend_from_slice(&off.to_le_bytes());
            p.extend_from_slice(&(b.len() as u32).to_le_bytes());
            p.extend_from_slice(b);
        }
        p
    }

    /// The record as stored, for generation `gen`.
    pub fn encode(&self, gen: u64) -> Vec<u8> {
        let p = self.payload();
        let mut out = Vec::with_capacity(REC_HEAD + p.len());
        out.extend_from_slice(&REC_MAGIC.to_le_bytes());
        out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        out.extend_from_slice(&gen.to_le_bytes());
        let mut crc = crc32c::crc32c(&out[4..16]);
        crc = crc32c::crc32c_append(crc, &p);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&p);
        out
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn decode_payload(p: &[u8]) -> Option<Record> {
    let ino = u64_at(p, 0)?;
    let obj = u64_at(p, 8)?;
    let size = u64_at(p, 16)?;
    let n = u32_at(p, 24)? as usize;
    let mut at = 28;
    let mut extents = Vec::new();
    for _ in 0..n {
        let off = u64_at(p, at)?;
        let len = u32_at(p, at + 8)? as usize;
        let b = p.get(at + 12..(at + 12).checked_add(len)?)?;
        extents.push((off, b.to_vec()));
        at += 12 + len;
    }
    (at == p.len()).then_some(Record {
        ino,
        obj,
        size,
        extents,
    })
}

/// The record at `at` of `b` (the log after its header), of whatever generation, if it is
/// whole and passes its checksum: its generation, the record, and where the next one starts.
fn decode_at(b: &[u8], at: usize) -> Option<(u64, Record, usize)> {
    if u32_at(b, at)? != REC_MAGIC {
        return None;
    }
    let len = u32_at(b, at + 4)? as usize;
    let gen = u64_at(b, at + 8)?;
    let crc = u32_at(b, at + 16)?;
    let start = at + REC_HEAD;
    let end = start.checked_add(len)?;
    let p = b.get(start..end)?;
    let c = crc32c::crc32c_append(crc32c::crc32c(&b[at + 4..at + 16]), p);
    if c != crc {
        return None;
    }
    Some((gen, decode_payload(p)?, end))
}

/// The records of generation `gen` at the start of `b` (the log after its header), in
/// order; stops at the first that is torn, stale or corrupt. Never panics on any input.
pub fn decode_records(b: &[u8], gen: u64) -> Vec<Record> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while let Some((g, r, next)) = decode_at(b, at) {
        if g != gen {
            break;
        }
        out.push(r);
        at = next;
    }
    out
}

/// The highest generation of any record in `b` (the log after its header) that passes its
/// checksum, at any offset (inside another record's payload too). Never panics.
fn newest_generation(b: &[u8]) -> Option<u64> {
    let magic = REC_MAGIC.to_le_bytes();
    b.windows(4)
        .enumerate()
        .filter(|(_, w)| *w == magic)
        .filter_map(|(at, _)| decode_at(b, at).map(|(g, _, _)| g))
        .max()
}

fn header(gen: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER as usize);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&VERSION.to_le_bytes());
    h.extend_from_slice(&gen.to_le_bytes());
    let crc = crc32c::crc32c(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h.resize(HEADER as usize, 0);
    h
}

/// The generation a header names; None if it is not a valid header.
pub fn decode_header(b: &[u8]) -> Option<u64> {
    if b.get(..8)? != MAGIC || u32_at(b, 8)? != VERSION {
        return None;
    }
    let crc = u32_at(b, 20)?;
    (crc32c::crc32c(b.get(..20)?) == crc)
        .then(|| u64_at(b, 12))
        .flatten()
}

/// The version of a header that has the magic and passes its checksum, whatever it is (a
/// header of a version this code reads is decoded by [`decode_header`]).
fn header_version(b: &[u8]) -> Option<u32> {
    (b.get(..8)? == MAGIC && crc32c::crc32c(b.get(..20)?) == u32_at(b, 20)?)
        .then(|| u32_at(b, 8))
        .flatten()
}

/// Whether the damaged header `b` shows that it was the header of generation `gen`: its
/// checksum field is the one of that header (the damage is in the fields before it), or its
/// magic, version and generation are that header's (the damage is in the checksum).
fn damaged_header_names(b: &[u8], gen: u64) -> bool {
    let want = header(gen);
    b.get(20..24) == want.get(20..24) || b.get(..20) == want.get(..20)
}

/// Generations at and above this are never started (the log restarts at 1, see the module
/// docs): `reset` can always add one.
const GEN_LIMIT: u64 = u64::MAX / 2;

/// What [`IntentLog::open`] found when the log's header failed its checksum (see the module
/// docs). The daemon's log has the same, as a warning (recovered) or an error (dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damaged {
    /// The generation the log went on with.
    pub gen: u64,
    /// Records returned for replay: the damaged header showed their generation.
    pub recovered: usize,
    /// Records that pass their checksum at the start of the log but were not replayed (their
    /// generation could not be established): (generation, inode, size).
    pub dropped: Vec<(u64, u64, u64)>,
}

impl std::fmt::Display for Damaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.recovered > 0 {
            return write!(
                f,
                "the header failed its checksum; it still shows that it named generation {}: \
                 rewritten, and the {} record(s) of that generation are replayed",
                self.gen, self.recovered
            );
        }
        if self.dropped.is_empty() {
            return write!(
                f,
                "the header failed its checksum; no record at the start of the log passes \
                 its checksum, nothing is lost; the log starts over at generation {}",
                self.gen
            );
        }
        write!(
            f,
            "the header failed its checksum and does not show which generation is current: \
             {} record(s) at the start of the log pass their checksum but may be stale \
             (already in the array) or acknowledged fsyncs not yet in it, and are NOT \
             replayed; the last fsynced writes of these files may be lost \
             (generation, inode, size):",
            self.dropped.len()
        )?;
        for (g, ino, size) in &self.dropped {
            write!(f, " ({g}, {ino}, {size})")?;
        }
        write!(
            f,
            "; the log goes on at generation {}, above every record found",
            self.gen
        )
    }
}

struct Tail {
    /// Where the next record goes.
    end: u64,
    gen: u64,
}

/// The log of one mount's fast tier.
pub struct IntentLog {
    file: File,
    path: PathBuf,
    tail: Mutex<Tail>,
    /// Records waiting for the next write, with their tickets.
    pending: Mutex<Vec<(u64, Record)>>,
    arrived: AtomicU64,
    /// Highest ticket made durable, and highest ticket refused (log full, or an error): its
    /// caller falls back.
    covered: AtomicU64,
    refused: AtomicU64,
    /// What open found if the header was damaged.
    damaged: Option<Damaged>,
}

fn io_ctx(p: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("intent log {}: {what}: {e}", p.display()))
}

impl IntentLog {
    /// Opens (or makes, preallocated with zeros) the log at `path` and returns it with the
    /// records of its current generation, to be replayed by the caller and then voided with
    /// [`IntentLog::reset`]. Until then they stay in the file, and a second open returns them
    /// again. A damaged header is dealt with as the module docs say; a header of a newer
    /// version is an error of kind [`io::ErrorKind::InvalidData`].
    pub fn open(path: &Path) -> io::Result<(IntentLog, Vec<Record>)> {
        let file =
            tierstack_common::file::open_or_create(path).map_err(|e| io_ctx(path, "open", e))?;
        let len = file.metadata().map_err(|e| io_ctx(path, "stat", e))?.len();
        let mut b = vec![0u8; len.min(LOG_BYTES) as usize];
        file.read_exact_at(&mut b, 0)
            .map_err(|e| io_ctx(path, "read", e))?;
        let (head, body) = b.split_at(b.len().min(HEADER as usize));
        let mut records = Vec::new();
        // The generation the log goes on with, and the header to write before returning.
        let gen;
        let mut new_header = None;
        let mut damaged = None;
        let mut zero_body = false;
        if let Some(g) = decode_header(head) {
            gen = g;
            records = decode_records(body, gen);
        } else if let Some(v) = header_version(head).filter(|&v| v > VERSION) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "intent log {}: version {v}, written by a newer tierstack (this one reads \
                     version {VERSION}): upgrade tierstack to mount this fast tier",
                    path.display()
                ),
            ));
        } else {
            let chain = decode_at(body, 0).map(|(g, _, _)| (g, decode_records(body, g)));
            let newest = newest_generation(body);
            match chain {
                Some((g, chain)) if newest == Some(g) && damaged_header_names(head, g) => {
                    gen = g;
                    new_header = Some(g);
                    damaged = Some(Damaged {
                        gen: g,
                        recovered: chain.len(),
                        dropped: Vec::new(),
                    });
                    records = chain;
                }
                chain => {
                    let dropped: Vec<(u64, u64, u64)> = chain
                        .map(|(g, c)| c.iter().map(|r| (g, r.ino, r.size)).collect())
                        .unwrap_or_default();
                    let next = newest.map_or(1, |g| g.saturating_add(1));
                    zero_body = next >= GEN_LIMIT;
                    gen = if zero_body { 1 } else { next };
                    new_header = Some(gen);
                    // A header never written (a new file) is no damage.
                    if newest.is_some() || head.iter().any(|&x| x != 0) {
                        damaged = Some(Damaged {
                            gen,
                            recovered: 0,
                            dropped,
                        });
                    }
                }
            }
        }
        // Said before anything is written: if a write fails, the next open says it again.
        if let Some(d) = &damaged {
            if d.dropped.is_empty() {
                tracing::warn!("intent log {}: {d}", path.display());
            } else {
                tracing::error!("intent log {}: {d}", path.display());
            }
        }
        if zero_body && !body.is_empty() {
            // Only for a generation from a crafted record: the records go before the header
            // that could make them valid again is written.
            let zeros = vec![0u8; body.len()];
            file.write_all_at(&zeros, HEADER)
                .and_then(|()| file.sync_data())
                .map_err(|e| io_ctx(path, "zero the records", e))?;
        }
        if len < LOG_BYTES {
            // Written once with zeros: later appends land in allocated, written blocks. Only
            // past the old end: what is there was read above and may be returned.
            let chunk = 1u64 << 20;
            let zeros = vec![0u8; chunk as usize];
            let mut at = len;
            while at < LOG_BYTES {
                let n = (chunk - at % chunk).min(LOG_BYTES - at);
                file.write_all_at(&zeros[..n as usize], at)
                    .map_err(|e| io_ctx(path, "preallocate", e))?;
                at += n;
            }
        }
        let log = IntentLog {
            file,
            path: path.to_path_buf(),
            tail: Mutex::new(Tail { end: HEADER, gen }),
            pending: Mutex::new(Vec::new()),
            arrived: AtomicU64::new(0),
            covered: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            damaged,
        };
        if let Some(g) = new_header {
            log.write_header(g)?;
        } else if records.is_empty() {
            log.reset()?;
        }
        Ok((log, records))
    }

    /// What open found if the header was damaged (see the module docs); None if it was valid
    /// (or never written).
    pub fn damaged(&self) -> Option<&Damaged> {
        self.damaged.as_ref()
    }

    /// Writes and syncs the header of generation `gen` (the tail's).
    fn write_header(&self, gen: u64) -> io::Result<()> {
        self.file
            .write_all_at(&header(gen), 0)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| io_ctx(&self.path, "write header", e))
    }

    /// Bytes of records in the current generation.
    pub fn used(&self) -> u64 {
        self.tail.lock().end - HEADER
    }

    /// Voids every record so far (after a full flush made them redundant): a new generation.
    pub fn reset(&self) -> io::Result<()> {
        let mut t = self.tail.lock();
        t.gen += 1;
        t.end = HEADER;
        self.write_header(t.gen)
    }

    /// Makes `rec` durable. Concurrent callers share one write and one sync. Ok(false): the
    /// log is full (the caller makes its data durable another way, and resets the log).
    pub fn commit(&self, rec: Record) -> io::Result<bool> {
        // Tickets are handed out and queued under one lock, so a batch taken holds every
        // ticket up to its highest that no earlier batch took.
        let ticket = {
            let mut p = self.pending.lock();
            let t = self.arrived.fetch_add(1, SeqCst) + 1;
            p.push((t, rec));
            t
        };
        let mut t = self.tail.lock();
        if self.covered.load(SeqCst) >= ticket {
            return Ok(true);
        }
        if self.refused.load(SeqCst) >= ticket {
            return Ok(false);
        }
        let batch: Vec<(u64, Record)> = std::mem::take(&mut *self.pending.lock());
        let Some(last) = batch.iter().map(|(k, _)| *k).max() else {
            // Taken by a batch whose outcome is recorded above; not reached.
            return Ok(false);
        };
        let mut buf = Vec::new();
        for (_, r) in &batch {
            buf.extend_from_slice(&r.encode(t.gen));
        }
        if t.end + buf.len() as u64 > LOG_BYTES {
            // Nobody in this batch is durable: each falls back (see the caller).
            self.refused.fetch_max(last, SeqCst);
            return Ok(false);
        }
        if let Err(e) = self
            .file
            .write_all_at(&buf, t.end)
            .and_then(|()| self.file.sync_data())
        {
            self.refused.fetch_max(last, SeqCst);
            return Err(io_ctx(&self.path, "write", e));
        }
        t.end += buf.len() as u64;
        self.covered.fetch_max(last, SeqCst);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rec(ino: u64, n: usize) -> Record {
        Record {
            ino,
            obj: ino + 100,
            size: 1 << 20,
            extents: (0..n)
                .map(|i| ((i * 8192) as u64, vec![i as u8; 100 + i]))
                .collect(),
        }
    }

    #[test]
    fn records_survive_reopen_and_reset_voids_them() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("intent");
        let (log, old) = IntentLog::open(&p).expect("open");
        assert!(old.is_empty());
        assert_eq!(std::fs::metadata(&p).expect("stat").len(), LOG_BYTES);
        assert!(log.commit(rec(1, 3)).expect("commit"));
        assert!(log.commit(rec(2, 1)).expect("commit"));
        drop(log);
        let (log, got) = IntentLog::open(&p).expect("reopen");
        assert_eq!(got, vec![rec(1, 3), rec(2, 1)]);
        log.reset().expect("reset");
        drop(log);
        let (_, got) = IntentLog::open(&p).expect("reopen");
        assert!(got.is_empty(), "a reset log replays nothing");
    }

    #[test]
    fn a_torn_tail_ends_the_log() {
        let gen = 7;
        let mut b = rec(1, 2).encode(gen);
        let second = rec(2, 2).encode(gen);
        b.extend_from_slice(&second[..second.len() - 5]);
        assert_eq!(decode_records(&b, gen), vec![rec(1, 2)]);
        // A stale generation is not replayed.
        assert!(decode_records(&b, gen + 1).is_empty());
        // A flipped byte in a payload stops the log there.
        let mut c = rec(1, 2).encode(gen);
        let last = c.len() - 1;
        c[last] ^= 1;
        assert!(decode_records(&c, gen).is_empty());
    }

    #[test]
    fn a_full_log_refuses() {
        let d = tempfile::tempdir().expect("tempdir");
        let (log, _) = IntentLog::open(&d.path().join("intent")).expect("open");
        let big = Record {
            ino: 1,
            obj: 1,
            size: 0,
            extents: vec![(0, vec![1u8; MAX_RECORD as usize])],
        };
        let mut n = 0;
        while log.commit(big.clone()).expect("commit") {
            n += 1;
            assert!(n < 64, "never full");
        }
        assert!(n >= 30, "{n}");
        log.reset().expect("reset");
        assert!(log.commit(big).expect("commit after reset"));
    }

    /// A log of generation 4 with two records, and its path.
    fn log_of_gen4(d: &Path) -> PathBuf {
        let p = d.join("intent");
        let (log, _) = IntentLog::open(&p).expect("open");
        for _ in 0..3 {
            log.reset().expect("reset");
        }
        assert!(log.commit(rec(1, 3)).expect("commit"));
        assert!(log.commit(rec(2, 1)).expect("commit"));
        p
    }

    fn flip(p: &Path, at: &[u64]) {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .expect("open");
        for &i in at {
            let mut b = [0u8];
            f.read_exact_at(&mut b, i).expect("read");
            f.write_all_at(&[b[0] ^ 0x24], i).expect("write");
        }
    }

    fn header_gen(p: &Path) -> Option<u64> {
        decode_header(&std::fs::read(p).expect("read")[..HEADER as usize])
    }

    #[test]
    fn a_short_file_keeps_its_records() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("intent");
        let (log, _) = IntentLog::open(&p).expect("open");
        let big = Record {
            ino: 9,
            obj: 9,
            size: 1 << 21,
            extents: vec![(0, vec![7u8; 700 << 10])],
        };
        // Ends past 1 MiB, not on a MiB boundary.
        assert!(log.commit(big.clone()).expect("commit"));
        assert!(log.commit(rec(1, 2)).expect("commit"));
        assert!(log.commit(big.clone()).expect("commit"));
        let end = HEADER + 2 * big.encode(1).len() as u64 + rec(1, 2).encode(1).len() as u64;
        assert!(end > 1 << 20 && !end.is_multiple_of(1 << 20));
        drop(log);
        for cut in [end, end - 10] {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .expect("open");
            f.set_len(cut).expect("cut");
            let before = std::fs::read(&p).expect("read");
            let want = if cut == end {
                vec![big.clone(), rec(1, 2), big.clone()]
            } else {
                vec![big.clone(), rec(1, 2)]
            };
            for _ in 0..2 {
                let (log, got) = IntentLog::open(&p).expect("reopen");
                assert_eq!(got, want);
                let after = std::fs::read(&p).expect("read");
                assert_eq!(after.len() as u64, LOG_BYTES);
                assert!(after[..cut as usize] == before[..], "kept");
                assert!(after[cut as usize..].iter().all(|&x| x == 0));
                assert!(log.damaged().is_none());
            }
        }
    }

    #[test]
    fn a_file_shorter_than_its_header_starts_over() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("intent");
        std::fs::write(&p, [0xffu8; 100]).expect("write");
        let (log, got) = IntentLog::open(&p).expect("open");
        assert!(got.is_empty());
        let dmg = log.damaged().expect("reported");
        assert_eq!((dmg.gen, dmg.recovered, dmg.dropped.len()), (1, 0, 0));
        assert!(dmg.to_string().contains("nothing is lost"), "{dmg}");
        assert_eq!(std::fs::metadata(&p).expect("stat").len(), LOG_BYTES);
        assert_eq!(header_gen(&p), Some(1));
        // A new file (or one of zeros) is no damage.
        std::fs::write(&p, [0u8; 5000]).expect("write");
        let (log, _) = IntentLog::open(&p).expect("open");
        assert!(log.damaged().is_none());
        assert_eq!(header_gen(&p), Some(1));
    }

    #[test]
    fn a_damaged_header_that_still_names_the_generation_is_rewritten() {
        // Magic, version, generation (crc intact) or the crc alone.
        for at in [&[0u64][..], &[9], &[12, 13], &[21], &[20, 23]] {
            let d = tempfile::tempdir().expect("tempdir");
            let p = log_of_gen4(d.path());
            flip(&p, at);
            assert_eq!(header_gen(&p), None);
            let (log, got) = IntentLog::open(&p).expect("open");
            assert_eq!(got, vec![rec(1, 3), rec(2, 1)], "{at:?}");
            let dmg = log.damaged().expect("reported").clone();
            assert_eq!((dmg.gen, dmg.recovered), (4, 2), "{at:?}");
            assert!(dmg.dropped.is_empty());
            assert_eq!(header_gen(&p), Some(4), "{at:?}");
            log.reset().expect("reset");
            drop(log);
            assert!(IntentLog::open(&p).expect("open").1.is_empty());
        }
    }

    #[test]
    fn a_header_that_does_not_name_the_generation_drops_loudly() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = log_of_gen4(d.path());
        flip(&p, &[12, 20]);
        let (log, got) = IntentLog::open(&p).expect("open");
        assert!(got.is_empty());
        let dmg = log.damaged().expect("reported").clone();
        assert_eq!(
            dmg,
            Damaged {
                gen: 5,
                recovered: 0,
                dropped: vec![(4, 1, 1 << 20), (4, 2, 1 << 20)],
            }
        );
        let msg = dmg.to_string();
        assert!(
            msg.contains("NOT replayed") && msg.contains("(4, 2, 1048576)"),
            "{msg}"
        );
        assert_eq!(header_gen(&p), Some(5));
        drop(log);
        // A crash before the next reset: the old records are not replayed.
        let (log, got) = IntentLog::open(&p).expect("open");
        assert!(got.is_empty() && log.damaged().is_none());
    }

    #[test]
    fn a_newer_record_anywhere_blocks_recovery() {
        // The header's crc names generation 4, but a record of generation 6 (a torn batch
        // whose first record was lost) lies further on: the header may have named 6.
        let d = tempfile::tempdir().expect("tempdir");
        let p = log_of_gen4(d.path());
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .expect("open");
        f.write_all_at(&rec(5, 2).encode(6), 3 << 20)
            .expect("write");
        drop(f);
        flip(&p, &[12]);
        let (log, got) = IntentLog::open(&p).expect("open");
        assert!(got.is_empty());
        let dmg = log.damaged().expect("reported");
        assert_eq!((dmg.gen, dmg.dropped.len()), (7, 2));
        assert_eq!(header_gen(&p), Some(7));
    }

    #[test]
    fn a_crafted_huge_generation_restarts_at_one() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = log_of_gen4(d.path());
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .expect("open");
        f.write_all_at(&rec(5, 2).encode(u64::MAX), 3 << 20)
            .expect("write");
        drop(f);
        flip(&p, &[12, 20]);
        let (log, got) = IntentLog::open(&p).expect("open");
        assert!(got.is_empty());
        assert_eq!(
            log.damaged().map(|d| (d.gen, d.dropped.len())),
            Some((1, 2))
        );
        let b = std::fs::read(&p).expect("read");
        assert_eq!(decode_header(&b), Some(1));
        assert!(
            b[HEADER as usize..].iter().all(|&x| x == 0),
            "records zeroed"
        );
        log.reset().expect("reset");
        assert!(log.commit(rec(3, 1)).expect("commit"));
    }

    #[test]
    fn a_header_of_a_newer_version_is_refused() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = log_of_gen4(d.path());
        let mut h = header(4);
        h[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c::crc32c(&h[..20]);
        h[20..24].copy_from_slice(&crc.to_le_bytes());
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .expect("open");
        f.write_all_at(&h, 0).expect("write");
        drop(f);
        let before = std::fs::read(&p).expect("read");
        let e = IntentLog::open(&p).err().expect("refused");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("newer tierstack"), "{e}");
        assert!(std::fs::read(&p).expect("read") == before, "untouched");
    }

    proptest! {
        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..600), gen in 0u64..3) {
            let _ = decode_records(&b, gen);
            let _ = decode_header(&b);
            let _ = newest_generation(&b);
            let _ = header_version(&b);
            let _ = damaged_header_names(&b, gen);
        }

        #[test]
        fn records_round_trip(ino in any::<u64>(), size in any::<u64>(),
                              ext in proptest::collection::vec((any::<u64>(), proptest::collection::vec(any::<u8>(), 0..64)), 0..5)) {
            let r = Record { ino, obj: ino ^ 1, size, extents: ext };
            prop_assert_eq!(decode_records(&r.encode(3), 3), vec![r]);
        }
    }
}
