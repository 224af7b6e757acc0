//! tierstack-store: the tiered write-back store.
//!
//! Pages are keyed by `(object, page number)` and live in an ordered list of tiers, fastest
//! first: DRAM, then optionally compressed DRAM ([`compressed`]) and GPU memory ([`vram`]),
//! then the array. Writes land
//! in the first tier and are acknowledged there; when a tier passes its high watermark the
//! store evicts pages (clock order) down to its low watermark, writing dirty pages to the next
//! tier and dropping clean ones that the next tier already holds. Reads are served by the
//! first tier that has the page and promoted into the first tier (admission). `flush()` writes
//! every dirty page down to the last persistent tier and makes it durable there.

#![warn(missing_docs)]

mod clock;
pub mod compressed;
mod dram;
mod stack;
mod tier;
pub mod vram;

pub use compressed::CompressedTier;
pub use dram::{DramTier, PageData};
pub use stack::{StackSpec, Tiers, Vram};
pub use tier::{ArrayTier, Tier, TierCounters, TierStatus};
pub use vram::cuda::{Gpu, GpuError, GpuInfo};
pub use vram::VramTier;

use std::sync::Arc;

use parking_lot::Mutex;

/// A page key: object id and page number.
pub type PageKey = (u64, u64);

/// Largest page the store holds (the array's largest value).
pub const MAX_PAGE: usize = tierstack_array::MAX_VALUE;

/// What the store can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A page larger than [`MAX_PAGE`] (its length, the maximum).
    #[error("page of {0} bytes exceeds the store's maximum page of {1} bytes")]
    TooLarge(usize, usize),
    /// No tier has room for the page.
    #[error("the store is full: {0}")]
    Full(String),
    /// An object id the store keeps for itself.
    #[error("object id {0:#x} is reserved: use ids below 2^56")]
    ReservedId(u64),
    /// The array below failed.
    #[error("array tier: {0}")]
    Array(#[from] tierstack_array::ArrayError),
    /// The GPU of a VRAM tier failed (or there is none).
    #[error("VRAM tier: {0}")]
    Gpu(#[from] GpuError),
    /// A bad size or tier list at construction.
    #[error("invalid store configuration: {0}")]
    Config(String),
}

/// The store's results.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

fn full(e: StoreError) -> StoreError {
    match e {
        StoreError::Array(tierstack_array::ArrayError::NoSpace(m)) => StoreError::Full(m),
        other => other,
    }
}

/// Object ids at or above this are reserved for the array's own object layer.
pub const MAX_OBJECT_ID: u64 = 1 << 56;

/// The tiered store. Cheap operations on one tier at a time; safe to share between threads.
pub struct TieredStore {
    dram: DramTier,
    lower: Vec<Box<dyn Tier>>,
    /// Serialises evictions so that a page is never written down twice at once.
    evicting: Mutex<()>,
    /// Buffers of `MAX_PAGE` bytes capacity freed by eviction and removal, handed out again by
    /// [`TieredStore::page_buf`]: a fresh buffer costs a page fault and the zeroing of every
    /// 4 KiB page in it, a reused one nothing.
    pool: Mutex<Vec<Vec<u8>>>,
    /// At most this many buffers wait in `pool` (the DRAM tier's eviction batch).
    pool_max: usize,
}

impl TieredStore {
    /// A store with a DRAM tier of `dram_bytes` over the given lower tiers (fastest first).
    pub fn new(dram_bytes: u64, lower: Vec<Box<dyn Tier>>) -> Result<TieredStore> {
        if dram_bytes == 0 {
            return Err(StoreError::Config(
                "the DRAM tier needs a size above 0".into(),
            ));
        }
        let dram = DramTier::new(dram_bytes);
        // Eviction frees the pages between the high and the low watermark in one go.
        let pool_max = ((dram_bytes - dram.low()) / MAX_PAGE as u64).clamp(1, 1024) as usize;
        Ok(TieredStore {
            dram,
            lower,
            evicting: Mutex::new(()),
            pool: Mutex::new(Vec::new()),
            pool_max,
        })
    }

    /// An empty buffer for a page of `len` bytes, to fill and hand to
    /// [`TieredStore::put_owned`]. Buffers for pages above half of `MAX_PAGE` come from the
    /// store's pool of freed pages (capacity `MAX_PAGE`); smaller ones are allocated.
    pub fn page_buf(&self, len: usize) -> Vec<u8> {
        if len <= MAX_PAGE / 2 {
            return Vec::with_capacity(len);
        }
        self.pool
            .lock()
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(MAX_PAGE))
    }

    /// Takes back the contents of a page that left the store, for reuse by `page_buf` when
    /// nobody else holds it.
    fn recycle(&self, data: PageData) {
        let Ok(mut v) = Arc::try_unwrap(data) else {
            return;
        };
        if v.capacity() != MAX_PAGE {
            return;
        }
        let mut pool = self.pool.lock();
        if pool.len() < self.pool_max {
            v.clear();
            pool.push(v);
        }
    }

    fn check(key: PageKey, len: usize) -> Result<()> {
        if key.0 >= MAX_OBJECT_ID {
            return Err(StoreError::ReservedId(key.0));
        }
        if len > MAX_PAGE {
            return Err(StoreError::TooLarge(len, MAX_PAGE));
        }
        Ok(())
    }

    /// Stores a page; acknowledged in DRAM (write-back). Evicts to lower tiers when DRAM passes
    /// its high watermark; fails with `Full` only when no tier below can take the evicted pages.
    pub fn put(&self, key: PageKey, data: &[u8]) -> Result<()> {
        Self::check(key, data.len())?;
        let mut v = self.page_buf(data.len());
        v.extend_from_slice(data);
        self.put_owned(key, v)
    }

    /// [`TieredStore::put`] of a buffer the store takes over (no copy). A buffer from
    /// [`TieredStore::page_buf`] returns to the store's pool once the page leaves DRAM.
    pub fn put_owned(&self, key: PageKey, data: Vec<u8>) -> Result<()> {
        self.put_shared(key, Arc::new(data))
    }

    /// [`TieredStore::put`] of contents the caller may keep reading (they are never changed
    /// in place).
    pub fn put_shared(&self, key: PageKey, data: PageData) -> Result<()> {
        Self::check(key, data.len())?;
        if self.lower.is_empty() {
            let replaced = self.dram.len_of(key);
            if self.dram.used() - replaced + data.len() as u64 > self.dram.capacity() {
                return Err(StoreError::Full(
                    "DRAM tier full and no tier below it".into(),
                ));
            }
        }
        if let Some(old) = self.dram.insert_shared(key, data, true) {
            self.recycle(old);
        }
        self.maybe_evict()
    }

    /// Changes a page in place when its contents are in DRAM and nobody reads them at the
    /// moment (no copy of the page is made): the page is cut to its first `keep` bytes,
    /// zero-extended to `len` bytes (at most `MAX_PAGE`), and `f` changes those bytes. The
    /// page becomes dirty, as after a `put`. Returns false, without changing anything, when
    /// the page is not in DRAM or its contents are shared; the caller then puts a copy.
    pub fn update(
        &self,
        key: PageKey,
        keep: usize,
        len: usize,
        f: impl FnOnce(&mut [u8]),
    ) -> Result<bool> {
        Self::check(key, len)?;
        let done = self
            .dram
            .update(key, |v| {
                v.truncate(keep);
                v.resize(len, 0);
                f(v);
            })
            .is_some();
        if done {
            self.maybe_evict()?;
        }
        Ok(done)
    }

    /// Reads a page from the fastest tier that has it, promoting it into DRAM.
    pub fn get(&self, key: PageKey) -> Result<Option<Vec<u8>>> {
        Ok(self.get_shared(key)?.map(|d| {
            let mut v = self.page_buf(d.len());
            v.extend_from_slice(&d);
            v
        }))
    }

    /// [`TieredStore::get`] without the copy: the page's contents as the DRAM tier holds them
    /// (a later `put` of the key replaces them, it never changes them).
    pub fn get_shared(&self, key: PageKey) -> Result<Option<PageData>> {
        Self::check(key, 0)?;
        if let Some(v) = self.dram.get(key) {
            return Ok(Some(v));
        }
        for t in &self.lower {
            if let Some(v) = t.get(key)? {
                // Clean copy: the lower tier keeps it, so eviction can simply drop it.
                let v = Arc::new(v);
                if let Some(old) = self.dram.admit_clean(key, v.clone()) {
                    self.recycle(old);
                }
                self.maybe_evict()?;
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    /// [`TieredStore::get`] for a caller that keeps the page itself (the memory front maps it
    /// into the program): a page read from a lower tier is not also cached in the DRAM tier,
    /// and the read never waits for an eviction of the DRAM tier.
    pub fn get_uncached(&self, key: PageKey) -> Result<Option<Vec<u8>>> {
        Self::check(key, 0)?;
        if let Some(v) = self.dram.get(key) {
            let mut out = self.page_buf(v.len());
            out.extend_from_slice(&v);
            return Ok(Some(out));
        }
        for t in &self.lower {
            if let Some(v) = t.get(key)? {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    /// [`TieredStore::get_uncached`] of several pages: those not in DRAM are asked of each
    /// tier below in one call (neighbours in the array are read together).
    pub fn get_many_uncached(&self, keys: &[PageKey]) -> Result<Vec<Option<Vec<u8>>>> {
        let mut out: Vec<Option<Vec<u8>>> = Vec::with_capacity(keys.len());
        let mut missing: Vec<usize> = Vec::new();
        for (i, &k) in keys.iter().enumerate() {
            Self::check(k, 0)?;
            match self.dram.get(k) {
                Some(v) => {
                    let mut o = self.page_buf(v.len());
                    o.extend_from_slice(&v);
                    out.push(Some(o));
                }
                None => {
                    out.push(None);
                    missing.push(i);
                }
            }
        }
        for t in &self.lower {
            if missing.is_empty() {
                break;
            }
            let ks: Vec<PageKey> = missing.iter().map(|&i| keys[i]).collect();
            let got = t.get_many(&ks)?;
            let mut still = Vec::new();
            for (&i, v) in missing.iter().zip(got) {
                match v {
                    Some(v) => out[i] = Some(v),
                    None => still.push(i),
                }
            }
            missing = still;
        }
        Ok(out)
    }

    /// Whether the store would keep a copy of `key`, whose current version it holds, if it
    /// were handed one ([`TieredStore::admit`]): not when the DRAM tier has it, and only where
    /// the first tier below keeps copies (the compressed tier) and wants this one. A caller
    /// that would have to read the page first asks this before.
    pub fn wants_copy(&self, key: PageKey) -> bool {
        self.dram.len_of(key) == 0 && self.lower.first().is_some_and(|t| t.wants_copy(key))
    }

    /// Hands the store a copy of a page whose current version it holds already (the memory
    /// front drops a page the program did not change): the first tier below may keep it, so
    /// the next read is served there instead of from the array (see [`Tier::admit`]).
    pub fn admit(&self, key: PageKey, data: &[u8]) -> Result<()> {
        Self::check(key, data.len())?;
        match self.lower.first() {
            Some(t) if self.dram.len_of(key) == 0 => t.admit(key, data),
            _ => Ok(()),
        }
    }

    /// Removes a page from every tier. Returns whether any tier had it.
    pub fn remove(&self, key: PageKey) -> Result<bool> {
        Self::check(key, 0)?;
        // Not while an eviction may be writing this page down (it would come back).
        let _g = self.evicting.lock();
        // The lowest copy goes first: a removal that fails there (a full array cannot take
        // the tombstone) leaves the newest copy where reads find it, never an older one
        // below a page the caller then forgets (it would come back after a crash).
        let mut found = false;
        for t in self.lower.iter().rev() {
            found |= t.remove(key)?;
        }
        if let Some(old) = self.dram.remove(key) {
            found = true;
            self.recycle(old);
        }
        Ok(found)
    }

    /// Writes every dirty page to the lower tiers and makes them durable.
    pub fn flush(&self) -> Result<()> {
        let _g = self.evicting.lock();
        self.write_back_locked(u64::MAX)?;
        for t in &self.lower {
            t.flush()?;
        }
        Ok(())
    }

    /// Writes every dirty page down to the last tier without making it durable: the files of
    /// an array tier then hold everything the store holds (for a forked child that reads
    /// them). Returns the bytes the DRAM tier wrote.
    pub fn settle(&self) -> Result<u64> {
        let _g = self.evicting.lock();
        let n = self.write_back_locked(u64::MAX)?;
        for t in &self.lower {
            t.settle()?;
        }
        Ok(n)
    }

    /// Writes dirty pages (about `max_bytes` of them) to the tier below without making them
    /// durable there, and keeps them in DRAM as clean pages: a later [`TieredStore::flush`]
    /// has that much less to write. Returns the bytes written.
    pub fn write_back(&self, max_bytes: u64) -> Result<u64> {
        let _g = self.evicting.lock();
        self.write_back_locked(max_bytes)
    }

    fn write_back_locked(&self, max_bytes: u64) -> Result<u64> {
        let Some(first) = self.lower.first() else {
            return Ok(0);
        };
        let dirty = self.dram.dirty_pages(max_bytes);
        let mut bytes = 0;
        for batch in dirty.chunks(64) {
            let pages: Vec<(PageKey, &[u8])> =
                batch.iter().map(|(k, v, _)| (*k, v.as_slice())).collect();
            first.put_many(&pages).map_err(full)?;
            bytes += pages.iter().map(|p| p.1.len() as u64).sum::<u64>();
        }
        for (k, _, gen) in &dirty {
            self.dram.mark_clean(*k, *gen);
        }
        Ok(bytes)
    }

    /// Bytes of DRAM pages the tier below does not have yet.
    pub fn dirty_bytes(&self) -> u64 {
        self.dram.dirty_bytes()
    }

    fn maybe_evict(&self) -> Result<()> {
        if !self.dram.over_high() {
            return Ok(());
        }
        let _g = self.evicting.lock();
        if self.lower.is_empty() {
            // DRAM is the only tier: writers are refused rather than silently dropped.
            if self.dram.used() > self.dram.capacity() {
                return Err(StoreError::Full(
                    "DRAM tier full and no tier below it".into(),
                ));
            }
            return Ok(());
        }
        self.evict_locked(self.dram.low()).map(|_| ())
    }

    /// Evicts ahead of need, for a background thread, so that writers seldom evict
    /// themselves: when less than `headroom` bytes of the DRAM budget are free, evicts down to
    /// the low watermark, or lower to leave `headroom` free. Returns whether it evicted.
    pub fn make_room(&self, headroom: u64) -> Result<bool> {
        let cap = self.dram.capacity();
        if self.lower.is_empty() || self.dram.used() + headroom <= cap {
            return Ok(false);
        }
        let _g = self.evicting.lock();
        self.evict_locked(self.dram.low().min(cap.saturating_sub(headroom)))
    }

    /// Evicts in clock order until DRAM holds at most `target` bytes (`evicting` held).
    fn evict_locked(&self, target: u64) -> Result<bool> {
        let Some(first) = self.lower.first() else {
            return Ok(false);
        };
        let mut any = false;
        loop {
            let used = self.dram.used();
            if used <= target {
                break;
            }
            // Only what brings it down to `target`: a page read once and admitted at the
            // hand goes first, and the pages behind it keep their place.
            let mut batch = self.dram.pick_victims(64, used - target);
            if batch.is_empty() {
                break;
            }
            // In key order: the pages of a run land next to each other in the tier below,
            // where a later read of the run takes one request.
            batch.sort_unstable_by_key(|v| v.0);
            any = true;
            let dirty: Vec<(PageKey, &[u8])> = batch
                .iter()
                .filter(|p| p.2)
                .map(|(k, v, _, _)| (*k, v.as_slice()))
                .collect();
            // On failure the pages simply stay in DRAM: nothing acknowledged is lost.
            first.put_many(&dirty).map_err(full)?;
            for (k, v, _, gen) in batch {
                self.dram.finish_evict(k, gen);
                self.recycle(v);
            }
        }
        Ok(any)
    }

    /// Gives back what the lower tiers hold in DRAM for pages the tiers below them have too
    /// (see [`Tier::release_memory`]): a forked child calls it on its parent's store.
    pub fn release_memory(&self) {
        for t in &self.lower {
            t.release_memory();
        }
    }

    /// DRAM the lower tiers hold for their bookkeeping (the arrays' indexes), bytes.
    pub fn index_bytes(&self) -> u64 {
        self.lower.iter().map(|t| t.index_bytes()).sum()
    }

    /// The most [`TieredStore::index_bytes`] may reach: the lower tiers that grow by choice
    /// (the compressed tier) stay under it ([`Tier::limit_index`]).
    pub fn limit_index(&self, bytes: u64) {
        for t in &self.lower {
            t.limit_index(bytes);
        }
    }

    /// Status of the first lower tier named `name` (only that tier is asked: an array's
    /// status walks its whole index).
    pub fn tier_status(&self, name: &str) -> Option<TierStatus> {
        self.lower
            .iter()
            .find(|t| t.name() == name)
            .map(|t| t.status())
    }

    /// Status of every tier, fastest first.
    pub fn status(&self) -> Vec<TierStatus> {
        let mut v = vec![self.dram.status()];
        v.extend(self.lower.iter().flat_map(|t| t.statuses()));
        v
    }
}

/// Makes this thread's reads from the array tier poll for their completion instead of
/// sleeping (see [`tierstack_array::io::set_poll_reads`]): for threads on a latency-critical
/// path, such as the memory front's fault handlers.
pub fn poll_reads_on_this_thread(on: bool) {
    tierstack_array::io::set_poll_reads(on);
}
