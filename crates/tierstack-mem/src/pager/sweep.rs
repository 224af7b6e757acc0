//! Per-sweep accounting: for a region swept in a loop larger than the budget (see
//! `RState::sweeping`), the bytes read in from the store and written out to it during each
//! pass of the loop, next to what an ideal pager would move (the region less the budget, read
//! once per pass). It depends on no other module of the pager; the region's state holds a
//! [`PassTrack`] (under the region's lock, taken anyway by the fault and eviction paths) and
//! the pager one [`SweepLog`] of finished passes (a leaf lock, taken once per pass).

use std::collections::VecDeque;

/// Passes the log keeps (the oldest go first); the figures are over these.
pub(super) const KEPT_PASSES: usize = 4096;

/// Passes listed one by one in [`SweepStats::last`].
pub const LAST_PASSES: usize = 4;

/// Where the current pass of a region is, for [`begins_pass`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct PassPos {
    /// Lowest and highest page faulted on in this pass.
    pub(super) lo: usize,
    pub(super) hi: usize,
    /// Pages brought in during this pass (zero fills, store reads, read-ahead).
    pub(super) loaded: u64,
    /// The streams the pass follows go down (set by the last stream followed).
    pub(super) backward: bool,
}

/// Whether a fault at page `idx` begins a new pass of a loop over a region, the current pass
/// being at `p`; `again`: the page was brought in during this pass already and the fault
/// follows none of the region's streams (a page evicted under a stream and faulted again is
/// waste within the pass, not a new one). Once the pass has brought in at least `min_loaded`
/// pages (half of what an ideal pager reads per pass: the faults that start a pass, or a
/// stray one, end none), a fault begins the next pass when it jumped back over ground the
/// pass covered (`again`: the sweep came back, wherever it starts, from farther than `tol`
/// behind the pass's front),
/// or within `tol` pages of where the pass began or beyond it (a forward pass began at its
/// lowest page, a backward one at its highest: the sweep wrapped to the region's start, or to
/// the first page that did not stay resident, or restarted below where it was).
///
/// Interleaved streams of one pass (the pairs `i`, `i + 2^k` of a butterfly, threads that
/// each sweep a slice) stay one pass: only the lowest page of the pass counts, and every
/// stream moves away from it onto pages not yet brought in.
pub(super) fn begins_pass(
    p: &PassPos,
    idx: usize,
    again: bool,
    tol: usize,
    min_loaded: u64,
) -> bool {
    if p.loaded < min_loaded.max(1) {
        return false;
    }
    if again {
        // Back over ground the pass covered, farther than `tol` behind its front: the sweep
        // came back. A page the pass brought in and lost again near its front (evicted under
        // the program, faulted again off every stream) is waste within the pass.
        return if p.backward {
            idx > p.lo + tol
        } else {
            idx + tol < p.hi
        };
    }
    if p.backward {
        idx + tol >= p.hi
    } else {
        idx <= p.lo + tol
    }
}

/// Pages within which a fault counts as back at the start of a pass, for a region of
/// `npages` of which an ideal pager reads `ideal` per pass: a sixteenth of the region, at
/// most an eighth of the ideal (so that interleaved streams, which bring in a page each as
/// they move, have not brought in the half of the ideal that [`begins_pass`] wants before
/// they are that far from where the pass began), at least 8 (the local permutations of
/// `readahead`).
pub(super) fn pass_tolerance(npages: usize, ideal: u64) -> usize {
    (npages / 16).min((ideal / 8) as usize).max(8)
}

/// The pages an ideal pager reads per pass of a loop over `npages` with `budget_pages`
/// resident: the part that cannot stay. None when the region fits (no pass ever reads).
pub(super) fn ideal_pages(npages: usize, budget_pages: u64) -> Option<u64> {
    (npages as u64).checked_sub(budget_pages).filter(|&n| n > 0)
}

/// The current pass of a region and what it moved so far.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PassTrack {
    /// The pass's number (never 0; wraps), for the stamps of [`PassTrack::loaded`].
    pub(super) id: u16,
    pub(super) pos: PassPos,
    /// A fault was seen in this pass (`pos.lo`/`hi` mean something).
    pub(super) begun: bool,
    /// Bytes read in from the store, written out to it, during this pass.
    pub(super) read: u64,
    pub(super) written: u64,
}

/// One finished pass of a swept region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Pass {
    pub(super) read: u64,
    pub(super) written: u64,
    /// What an ideal pager would read in this pass (region less budget).
    pub(super) ideal: u64,
}

impl PassTrack {
    /// Notes that page `idx` was brought in: one more page loaded in this pass, stamped in
    /// `stamps` (one per page of the region) with the pass's number.
    pub(super) fn loaded(&mut self, stamps: &mut [u16], idx: usize) {
        self.pos.loaded += 1;
        if let Some(s) = stamps.get_mut(idx) {
            *s = self.id;
        }
    }

    /// Notes a fault at page `idx` of a region whose pages carry the `stamps` of
    /// [`PassTrack::loaded`] (one per page), pages of `page` bytes; `jump`: the fault follows
    /// none of the region's streams. Returns the pass it ended (the tracker then follows the
    /// next one). `ideal` is [`ideal_pages`] for the region.
    pub(super) fn fault(
        &mut self,
        stamps: &[u16],
        idx: usize,
        jump: bool,
        ideal: Option<u64>,
        page: u64,
    ) -> Option<Pass> {
        let ideal = ideal?;
        let again = jump && self.begun && stamps.get(idx) == Some(&self.id);
        let tol = pass_tolerance(stamps.len(), ideal);
        let ended =
            (self.begun && begins_pass(&self.pos, idx, again, tol, ideal / 2)).then(|| Pass {
                read: self.read,
                written: self.written,
                ideal: ideal * page,
            });
        if ended.is_some() || !self.begun {
            *self = PassTrack {
                // Never 0, the stamp of pages no pass brought in.
                id: self.id.wrapping_add(1).max(1),
                pos: PassPos {
                    lo: idx,
                    hi: idx,
                    loaded: 0,
                    backward: self.pos.backward,
                },
                begun: true,
                read: 0,
                written: 0,
            };
        } else {
            self.pos.lo = self.pos.lo.min(idx);
            self.pos.hi = self.pos.hi.max(idx);
        }
        ended
    }
}

/// The finished passes of the pager's swept regions (the last [`KEPT_PASSES`]).
#[derive(Default)]
pub(super) struct SweepLog {
    /// Passes recorded since the pager started.
    total: u64,
    passes: VecDeque<Pass>,
}

impl SweepLog {
    pub(super) fn push(&mut self, p: Pass) {
        self.total += 1;
        if self.passes.len() == KEPT_PASSES {
            self.passes.pop_front();
        }
        self.passes.push_back(p);
    }

    /// The figures over the kept passes.
    pub(super) fn stats(&self) -> SweepStats {
        let mut s = SweepStats {
            sweeps: self.total,
            ..SweepStats::default()
        };
        if self.passes.is_empty() {
            return s;
        }
        let spread = |f: fn(&Pass) -> u64| {
            let mut v: Vec<u64> = self.passes.iter().map(f).collect();
            v.sort_unstable();
            [v[0], v[v.len() / 2], v[v.len() - 1]]
        };
        [s.read_min, s.read_median, s.read_max] = spread(|p| p.read);
        [s.written_min, s.written_median, s.written_max] = spread(|p| p.written);
        s.ideal_read = spread(|p| p.ideal)[1];
        s.last = self
            .passes
            .iter()
            .rev()
            .take(LAST_PASSES)
            .rev()
            .map(|p| [p.read, p.written])
            .collect();
        s
    }
}

/// What the passes over regions swept in a loop larger than the budget moved: how many there
/// were, and bytes read in from the store and written out to it per pass (over the last 4096
/// passes), with what an ideal pager would read per pass (the region less the resident
/// budget: each page that cannot stay, once).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SweepStats {
    /// Passes finished (a pass ends when the sweep comes back to where it began).
    pub sweeps: u64,
    /// Median over the passes of the region's size less the resident budget.
    pub ideal_read: u64,
    /// Bytes read in per pass: smallest, median, largest.
    pub read_min: u64,
    /// See `read_min`.
    pub read_median: u64,
    /// See `read_min`.
    pub read_max: u64,
    /// Bytes written out per pass: smallest, median, largest.
    pub written_min: u64,
    /// See `written_min`.
    pub written_median: u64,
    /// See `written_min`.
    pub written_max: u64,
    /// The last passes (at most [`LAST_PASSES`]), oldest first: (read, written) bytes.
    pub last: Vec<[u64; 2]>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(lo: usize, hi: usize, loaded: u64) -> PassPos {
        PassPos {
            lo,
            hi,
            loaded,
            backward: false,
        }
    }

    #[test]
    fn a_forward_sweep_wraps_to_its_start() {
        // Past the least, back at the start (or within the tolerance of it).
        assert!(begins_pass(&pos(0, 1000, 600), 0, false, 8, 500));
        assert!(begins_pass(&pos(0, 1000, 600), 8, false, 8, 500));
        assert!(!begins_pass(&pos(0, 1000, 600), 9, false, 8, 500));
        // Restarted below where it began.
        assert!(begins_pass(&pos(100, 1000, 600), 3, false, 8, 500));
        // Not before the least (half the ideal) was brought in: the start of a pass, a stray fault.
        assert!(!begins_pass(&pos(0, 1000, 499), 0, false, 8, 500));
        assert!(!begins_pass(&pos(100, 1000, 10), 3, false, 8, 500));
        // Nothing to read (the region fits): never.
        assert!(!begins_pass(&pos(0, 1000, 0), 0, false, 8, 0));
    }

    #[test]
    fn a_backward_sweep_wraps_to_its_top() {
        let p = PassPos {
            backward: true,
            ..pos(0, 1000, 600)
        };
        assert!(begins_pass(&p, 1000, false, 8, 500));
        assert!(begins_pass(&p, 995, false, 8, 500));
        assert!(!begins_pass(&p, 10, false, 8, 500));
    }

    /// The tracker over fault sequences: one sequential sweep, two interleaved streams (a
    /// butterfly's pairs), two threads each on a half, a resident prefix skipped: one pass
    /// per loop; loops that alternate between the whole region and its upper half (a gate
    /// controlled by the top bit) too.
    #[test]
    fn the_tracker_counts_one_pass_per_loop() {
        let (n, ideal) = (1024usize, Some(256u64));
        let loops = |faults: &[&dyn Fn() -> Vec<usize>]| {
            let mut t = PassTrack::default();
            let mut stamps = vec![0u16; n];
            let mut ended = 0;
            for f in faults {
                // Only the first fault of a loop follows none of the streams.
                for (k, i) in f().into_iter().enumerate() {
                    ended += usize::from(t.fault(&stamps, i, k == 0, ideal, 4096).is_some());
                    t.loaded(&mut stamps, i);
                    t.read += 4096;
                }
            }
            ended
        };
        let seq = || (0..n).collect::<Vec<_>>();
        let pairs = || (0..n / 2).flat_map(|i| [i, i + n / 2]).collect::<Vec<_>>();
        let halves = || (0..n / 2).flat_map(|i| [n / 2 + i, i]).collect::<Vec<_>>();
        // Only the resident prefix skipped: the first fault of each pass is further in.
        let skip = || (300..n).collect::<Vec<_>>();
        let upper = || (n / 2..n).collect::<Vec<_>>();
        for f in [&seq as &dyn Fn() -> Vec<usize>, &pairs, &halves, &skip] {
            assert_eq!(loops(&[f, f, f, f, f]), 4);
        }
        assert_eq!(loops(&[&seq, &upper, &seq, &upper, &upper, &seq]), 5);
        // Back over ground the pass covered, wherever: a new pass (past the least).
        assert!(begins_pass(&pos(0, 1000, 600), 500, true, 8, 500));
        assert!(!begins_pass(&pos(0, 1000, 400), 500, true, 8, 500));
        assert!(!begins_pass(&pos(0, 1000, 600), 995, true, 8, 500));
        // A tracker after one sequential stream over pages 0..upto, from a jump to 0.
        let swept = |upto: usize| {
            let mut t = PassTrack::default();
            let mut stamps = vec![0u16; n];
            for i in 0..upto {
                assert!(t.fault(&stamps, i, i == 0, ideal, 4096).is_none());
                t.loaded(&mut stamps, i);
            }
            (t, stamps)
        };
        // A page of this pass faulted again along a stream (evicted under it) is waste, not
        // a new pass.
        let (mut t, stamps) = swept(600);
        assert!(t.fault(&stamps, 590, false, ideal, 4096).is_none());
        // Nor off every stream, near the pass's front (within the tolerance, 32 pages
        // here): the program was still on it when it was evicted (seen once in `make test`,
        // one pass of `footprint` counted as two halves).
        assert!(t.fault(&stamps, 590, true, ideal, 4096).is_none());
        assert!(t.fault(&stamps, 500, true, ideal, 4096).is_some());
        // A stray low fault in the middle of a pass, before half the ideal: no pass.
        let (mut t, stamps) = swept(100);
        assert!(t.fault(&stamps, 0, true, ideal, 4096).is_none());
        // No passes in a region that fits.
        let mut t = PassTrack::default();
        t.pos.loaded = 10_000;
        assert!(t.fault(&stamps, 0, true, None, 4096).is_none());
    }

    #[test]
    fn the_log_keeps_the_last_passes_and_their_spread() {
        let mut log = SweepLog::default();
        assert_eq!(log.stats(), SweepStats::default());
        for k in 0..KEPT_PASSES as u64 + 10 {
            log.push(Pass {
                read: k,
                written: 2 * k,
                ideal: 7,
            });
        }
        let s = log.stats();
        assert_eq!(s.sweeps, KEPT_PASSES as u64 + 10);
        assert_eq!((s.read_min, s.read_max), (10, KEPT_PASSES as u64 + 9));
        assert_eq!(s.read_median, 10 + KEPT_PASSES as u64 / 2);
        assert_eq!(s.written_max, 2 * (KEPT_PASSES as u64 + 9));
        assert_eq!(s.ideal_read, 7);
        assert_eq!(s.last.len(), LAST_PASSES);
        assert_eq!(
            s.last.last().copied(),
            Some([KEPT_PASSES as u64 + 9, 2 * (KEPT_PASSES as u64 + 9)])
        );
    }

    #[test]
    fn ideal_reads_are_what_cannot_stay() {
        assert_eq!(ideal_pages(1000, 400), Some(600));
        assert_eq!(ideal_pages(400, 400), None);
        assert_eq!(ideal_pages(100, 400), None);
        assert_eq!(pass_tolerance(64, 1000), 8);
        assert_eq!(pass_tolerance(65536, 60000), 4096);
        assert_eq!(pass_tolerance(65536, 1000), 125);
        assert_eq!(pass_tolerance(65536, 10), 8);
    }
}
