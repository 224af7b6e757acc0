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

/// The records of generation `gen` at the start of `b` (the log after its header), in
/// order; stops at the first that is torn, stale or corrupt. Never panics on any input.
pub fn decode_records(b: &[u8], gen: u64) -> Vec<Record> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while let (Some(m), Some(len), Some(g), Some(crc)) = (
        u32_at(b, at),
        u32_at(b, at + 4),
        u64_at(b, at + 8),
        u32_at(b, at + 16),
    ) {
        if m != REC_MAGIC || g != gen {
            break;
        }
        let start = at + REC_HEAD;
        let Some(p) = start
            .checked_add(len as usize)
            .and_then(|end| b.get(start..end))
        else {
            break;
        };
        let mut c = crc32c::crc32c(&b[at + 4..at + 16]);
        c = crc32c::crc32c_append(c, p);
        if c != crc {
            break;
        }
        let Some(r) = decode_payload(p) else { break };
        out.push(r);
        at = start + len as usize;
    }
    out
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
}

fn io_ctx(p: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("intent log {}: {what}: {e}", p.display()))
}

impl IntentLog {
    /// Opens (or makes, preallocated with zeros) the log at `path` and returns it with the
    /// records of its current generation, to be replayed by the caller and then voided with
    /// [`IntentLog::reset`].
    pub fn open(path: &Path) -> io::Result<(IntentLog, Vec<Record>)> {
        let file =
            tierstack_common::file::open_or_create(path).map_err(|e| io_ctx(path, "open", e))?;
        let len = file.metadata().map_err(|e| io_ctx(path, "stat", e))?.len();
        let mut records = Vec::new();
        let mut gen = 0;
        if len >= HEADER {
            let mut h = vec![0u8; HEADER as usize];
            file.read_exact_at(&mut h, 0)
                .map_err(|e| io_ctx(path, "read", e))?;
            if let Some(g) = decode_header(&h) {
                gen = g;
                let mut b = vec![0u8; (len.min(LOG_BYTES) - HEADER) as usize];
                file.read_exact_at(&mut b, HEADER)
                    .map_err(|e| io_ctx(path, "read", e))?;
                records = decode_records(&b, gen);
            }
        }
        if len < LOG_BYTES {
            // Written once with zeros: later appends land in allocated, written blocks.
            let zeros = vec![0u8; 1 << 20];
            let mut at = len - len % (1 << 20);
            while at < LOG_BYTES {
                file.write_all_at(&zeros, at)
                    .map_err(|e| io_ctx(path, "preallocate", e))?;
                at += 1 << 20;
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
        };
        if records.is_empty() {
            log.reset()?;
        }
        Ok((log, records))
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
        self.file
            .write_all_at(&header(t.gen), 0)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| io_ctx(&self.path, "write header", e))
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

    proptest! {
        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..600), gen in 0u64..3) {
            let _ = decode_records(&b, gen);
            let _ = decode_header(&b);
        }

        #[test]
        fn records_round_trip(ino in any::<u64>(), size in any::<u64>(),
                              ext in proptest::collection::vec((any::<u64>(), proptest::collection::vec(any::<u8>(), 0..64)), 0..5)) {
            let r = Record { ino, obj: ino ^ 1, size, extents: ext };
            prop_assert_eq!(decode_records(&r.encode(3), 3), vec![r]);
        }
    }
}
