//! Where a paged process's memory is: its resident set split, from `/proc/PID/smaps`, into
//! the paged regions' resident pages (`[anon:tierstack-paged]`), tierstack's other named
//! mappings (`[anon:tierstack-compressed]`, the compressed arena) and the rest: the program's
//! own memory and tierstack's tables, buffers and thread stacks, which live in glibc's heap
//! (`--dram` counts them: the engine's split in `run --json`). `run --stats`/`--json` report
//! the split at the sample where the resident set was largest ([`Sampler`]).
//!
//! The names need a kernel built with `CONFIG_ANON_VMA_NAME` (Linux 5.17+; Debian's and
//! Ubuntu's have it). Elsewhere nothing is named and `named` is false: everything counts as
//! `other_bytes` (this test machine's kernel is one such).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// The prefix of every mapping name tierstack gives.
pub const PREFIX: &str = "[anon:tierstack-";
/// The name of the paged regions' mappings.
pub const PAGED: &str = "[anon:tierstack-paged]";

/// One process's resident memory, split.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Footprint {
    /// Resident bytes in all (the sum of `Rss:` over the mappings).
    pub rss_bytes: u64,
    /// Of which the paged regions' resident pages (within `--dram`).
    pub paged_resident_bytes: u64,
    /// Of which tierstack's other named mappings.
    pub tierstack_bytes: u64,
    /// The rest: the program's own memory (and tierstack's heap allocations and stacks).
    pub other_bytes: u64,
    /// Whether any mapping carried a tierstack name (false on a kernel without
    /// `CONFIG_ANON_VMA_NAME`: then the split is not known).
    pub named: bool,
}

/// Splits the text of `/proc/PID/smaps`.
pub fn parse_smaps(text: &str) -> Footprint {
    let mut f = Footprint::default();
    // Which kind the current mapping is: 0 other, 1 paged, 2 tierstack.
    let mut kind = 0u8;
    for line in text.lines() {
        if let Some(kb) = line.strip_prefix("Rss:") {
            let b = kb
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                * 1024;
            f.rss_bytes += b;
            match kind {
                1 => f.paged_resident_bytes += b,
                2 => f.tierstack_bytes += b,
                _ => f.other_bytes += b,
            }
        } else if line.split_whitespace().next().is_some_and(is_range) {
            let name = line.split_whitespace().nth(5).unwrap_or("");
            kind = if name == PAGED {
                1
            } else if name.starts_with(PREFIX) {
                2
            } else {
                0
            };
            f.named |= kind > 0;
        }
    }
    f
}

/// Whether `w` is a mapping's address range (`7f12a000-7f12b000`): the first word of a
/// mapping's header line in smaps.
fn is_range(w: &str) -> bool {
    w.split_once('-').is_some_and(|(a, b)| {
        !a.is_empty()
            && a.bytes().all(|c| c.is_ascii_hexdigit())
            && b.bytes().all(|c| c.is_ascii_hexdigit())
    })
}

/// Samples a process's footprint every `every` until stopped, keeping the sample with the
/// largest resident set.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Footprint>>,
}

impl Sampler {
    /// Starts sampling process `pid`.
    pub fn start(pid: u32, every: Duration) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ts-footprint".into())
            .spawn(move || {
                let mut peak = Footprint::default();
                let path = format!("/proc/{pid}/smaps");
                while !s.load(Relaxed) {
                    match std::fs::read_to_string(&path) {
                        Ok(t) => {
                            let f = parse_smaps(&t);
                            if f.rss_bytes > peak.rss_bytes {
                                peak = f;
                            }
                        }
                        Err(_) => break,
                    }
                    std::thread::sleep(every);
                }
                peak
            })
            .ok();
        Sampler { stop, thread }
    }

    /// Stops sampling; the largest sample (all zeros when none was taken).
    pub fn finish(mut self) -> Footprint {
        self.stop.store(true, Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_smaps_by_mapping_name() {
        let t = "\
55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0                          [heap]
Size:                132 kB
Rss:                 100 kB
7f0000000000-7f0004000000 rw-p 00000000 00:00 0                          [anon:tierstack-paged]
Size:              65536 kB
Rss:               20480 kB
7f1000000000-7f1000f00000 rw-p 00000000 00:00 0                          [anon:tierstack-compressed]
Rss:                4096 kB
7f3000000000-7f3000100000 r-xp 00000000 fd:01 123                        /usr/lib/libc.so.6
Rss:                1000 kB
7f4000000000-7f4000100000 rw-p 00000000 00:00 0 
Rss:                  24 kB
";
        let f = parse_smaps(t);
        assert_eq!(f.paged_resident_bytes, 20480 << 10);
        assert_eq!(f.tierstack_bytes, 4096 << 10);
        assert!(f.named);
        assert!(
            !parse_smaps("7f4000000000-7f4000100000 rw-p 00000000 00:00 0 \nRss: 24 kB\n").named
        );
        assert_eq!(f.other_bytes, 1124 << 10);
        assert_eq!(
            f.rss_bytes,
            f.paged_resident_bytes + f.tierstack_bytes + f.other_bytes
        );
    }
}
