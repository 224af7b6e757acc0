//! The DRAM tier: pages in process memory, a byte budget with high/low watermarks, clock
//! (second-chance) replacement and dirty tracking. Pages being evicted stay readable here
//! until the tier below has them.
//!
//! Page contents are shared (`Arc`): eviction and flush hand the tier below a reference to the
//! page instead of a copy, and a page nobody else holds any more is given back to the caller
//! for reuse.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::tier::{TierCounters, TierStatus};
use crate::PageKey;

struct Entry {
    data: Arc<Vec<u8>>,
    dirty: bool,
    referenced: bool,
    /// Changes on every insert, so an eviction never drops a newer write.
    gen: u64,
}

struct Inner {
    map: HashMap<PageKey, Entry>,
    clock: VecDeque<PageKey>,
    used: u64,
    dirty_bytes: u64,
    next_gen: u64,
}

/// Contents of a page, shared with an eviction or a flush in progress.
pub type PageData = Arc<Vec<u8>>;

/// A page chosen for eviction: key, contents, whether it must be written down, generation.
pub type Victim = (PageKey, PageData, bool, u64);

/// The top tier: pages in process memory, evicted in clock order when it passes its capacity.
pub struct DramTier {
    capacity: u64,
    low: u64,
    inner: Mutex<Inner>,
    counters: TierCounters,
}

impl DramTier {
    /// A tier of `capacity` bytes (eviction brings it down to 90 % of that).
    pub fn new(capacity: u64) -> Self {
        DramTier {
            capacity,
            low: capacity / 10 * 9,
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                clock: VecDeque::new(),
                used: 0,
                dirty_bytes: 0,
                next_gen: 1,
            }),
            counters: TierCounters::default(),
        }
    }

    /// Bytes it may hold.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The low watermark: eviction stops below it.
    pub fn low(&self) -> u64 {
        self.low
    }

    /// Bytes it holds.
    pub fn used(&self) -> u64 {
        self.inner.lock().used
    }

    /// Bytes held for `key` (0 if absent).
    pub fn len_of(&self, key: PageKey) -> u64 {
        self.inner
            .lock()
            .map
            .get(&key)
            .map_or(0, |e| e.data.len() as u64)
    }

    /// Whether it holds more than its capacity (eviction is due).
    pub fn over_high(&self) -> bool {
        self.inner.lock().used > self.capacity
    }

    /// Inserts (or replaces) a page; returns the contents it replaced.
    pub fn insert(&self, key: PageKey, data: Vec<u8>, dirty: bool) -> Option<PageData> {
        self.insert_shared(key, Arc::new(data), dirty)
    }

    /// [`DramTier::insert`] of contents that may be shared.
    pub fn insert_shared(&self, key: PageKey, data: PageData, dirty: bool) -> Option<PageData> {
        self.insert_at(key, data, dirty, false)
    }

    /// Admits a clean copy of a page read from the tier below as the clock's next victim
    /// (unreferenced, at the hand): a page read once leaves first, so a sequential read of
    /// more than the tier holds replaces only what it brought in, not the pages already here
    /// (which a plain clock would evict one by one just before they are read). A second read
    /// marks it referenced, and it stays like any other page. Nothing happens when the page
    /// is here already.
    pub fn admit_clean(&self, key: PageKey, data: PageData) -> Option<PageData> {
        self.insert_at(key, data, false, true)
    }

    fn insert_at(&self, key: PageKey, data: PageData, dirty: bool, cold: bool) -> Option<PageData> {
        let mut g = self.inner.lock();
        // A page here is at least as new as a copy read from below (a put may have landed
        // while that read ran): keep it.
        if cold && g.map.contains_key(&key) {
            return None;
        }
        let gen = g.next_gen;
        g.next_gen += 1;
        let len = data.len() as u64;
        let old = g.map.insert(
            key,
            Entry {
                data,
                dirty,
                referenced: !cold,
                gen,
            },
        );
        let old = match old {
            Some(o) => {
                g.used -= o.data.len() as u64;
                if o.dirty {
                    g.dirty_bytes -= o.data.len() as u64;
                }
                Some(o.data)
            }
            None if cold => {
                g.clock.push_front(key);
                None
            }
            None => {
                g.clock.push_back(key);
                None
            }
        };
        g.used += len;
        if dirty {
            g.dirty_bytes += len;
        }
        drop(g);
        if dirty {
            self.counters.puts.fetch_add(1, Relaxed);
            self.counters.bytes_in.fetch_add(len, Relaxed);
        }
        old
    }

    /// Changes a page in place, made dirty with a new generation, when nobody else holds its
    /// contents (no reader, eviction or flush has them): `f` gets the bytes and may change
    /// their length. Returns the page's length before and after, or None (`f` not called)
    /// when the page is not here or is shared.
    pub fn update(&self, key: PageKey, f: impl FnOnce(&mut Vec<u8>)) -> Option<(u64, u64)> {
        let mut guard = self.inner.lock();
        let g = &mut *guard;
        let gen = g.next_gen;
        let e = g.map.get_mut(&key)?;
        let data = Arc::get_mut(&mut e.data)?;
        let old = data.len() as u64;
        f(data);
        let new = data.len() as u64;
        let was_dirty = e.dirty;
        e.dirty = true;
        e.referenced = true;
        e.gen = gen;
        g.next_gen += 1;
        g.used = g.used - old + new;
        if was_dirty {
            g.dirty_bytes -= old;
        }
        g.dirty_bytes += new;
        drop(guard);
        self.counters.puts.fetch_add(1, Relaxed);
        self.counters.bytes_in.fetch_add(new, Relaxed);
        Some((old, new))
    }

    /// The page's contents, shared (no copy).
    pub fn get(&self, key: PageKey) -> Option<PageData> {
        let mut g = self.inner.lock();
        match g.map.get_mut(&key) {
            Some(e) => {
                e.referenced = true;
                self.counters.hits.fetch_add(1, Relaxed);
                self.counters
                    .bytes_out
                    .fetch_add(e.data.len() as u64, Relaxed);
                Some(e.data.clone())
            }
            None => {
                self.counters.misses.fetch_add(1, Relaxed);
                None
            }
        }
    }

    /// Removes a page; returns its contents if it was here.
    pub fn remove(&self, key: PageKey) -> Option<PageData> {
        let mut g = self.inner.lock();
        let e = g.map.remove(&key)?;
        g.used -= e.data.len() as u64;
        if e.dirty {
            g.dirty_bytes -= e.data.len() as u64;
        }
        Some(e.data)
    }

    /// Chooses victims in clock order (a referenced page gets a second chance) until there are
    /// `n` or they hold `bytes`. They stay in the tier until [`DramTier::finish_evict`].
    pub fn pick_victims(&self, n: usize, bytes: u64) -> Vec<Victim> {
        let mut guard = self.inner.lock();
        let g = &mut *guard;
        let mut out = Vec::new();
        let mut got = 0u64;
        let mut chosen = std::collections::HashSet::new();
        let mut budget = g.clock.len() * 2 + 1;
        while out.len() < n && got < bytes && budget > 0 {
            budget -= 1;
            let Some(k) = g.clock.pop_front() else { break };
            let Some(e) = g.map.get_mut(&k) else { continue };
            g.clock.push_back(k);
            if e.referenced {
                e.referenced = false;
                continue;
            }
            if chosen.insert(k) {
                got += e.data.len() as u64;
                out.push((k, e.data.clone(), e.dirty, e.gen));
            }
        }
        out
    }

    /// Drops an evicted page, unless it was written again meanwhile.
    pub fn finish_evict(&self, key: PageKey, gen: u64) {
        let mut g = self.inner.lock();
        if g.map.get(&key).is_some_and(|e| e.gen == gen) {
            if let Some(e) = g.map.remove(&key) {
                g.used -= e.data.len() as u64;
                if e.dirty {
                    g.dirty_bytes -= e.data.len() as u64;
                }
                self.counters.evictions.fetch_add(1, Relaxed);
            }
        }
    }

    /// Bytes of dirty pages.
    pub fn dirty_bytes(&self) -> u64 {
        self.inner.lock().dirty_bytes
    }

    /// Dirty pages (key, contents, generation), until they add up to `max_bytes` or more.
    pub fn dirty_pages(&self, max_bytes: u64) -> Vec<(PageKey, PageData, u64)> {
        let g = self.inner.lock();
        let mut bytes = 0;
        g.map
            .iter()
            .filter(|(_, e)| e.dirty)
            .take_while(|(_, e)| {
                let more = bytes < max_bytes;
                bytes += e.data.len() as u64;
                more
            })
            .map(|(k, e)| (*k, e.data.clone(), e.gen))
            .collect()
    }

    /// Marks a page clean after it was written down, unless it changed meanwhile.
    pub fn mark_clean(&self, key: PageKey, gen: u64) {
        let mut g = self.inner.lock();
        let mut cleaned = 0;
        if let Some(e) = g.map.get_mut(&key) {
            if e.gen == gen && e.dirty {
                e.dirty = false;
                cleaned = e.data.len() as u64;
            }
        }
        g.dirty_bytes -= cleaned;
    }

    /// Sizes and counters.
    pub fn status(&self) -> TierStatus {
        let g = self.inner.lock();
        self.counters
            .snapshot("dram", self.capacity, g.used, g.dirty_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy read from below while a put landed in DRAM never replaces the newer page.
    #[test]
    fn a_clean_copy_never_replaces_a_page_here() {
        let t = DramTier::new(1 << 20);
        t.insert((1, 0), vec![2; 4096], true);
        assert!(t.admit_clean((1, 0), Arc::new(vec![1; 4096])).is_none());
        assert_eq!(t.get((1, 0)).as_deref(), Some(&vec![2u8; 4096]));
        assert_eq!(t.status().dirty_bytes, 4096, "still dirty");
        // An absent page is admitted.
        assert!(t.admit_clean((1, 1), Arc::new(vec![3; 4096])).is_none());
        assert_eq!(t.get((1, 1)).as_deref(), Some(&vec![3u8; 4096]));
    }
}
