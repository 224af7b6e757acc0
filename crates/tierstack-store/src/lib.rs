//! tierstack-store: the tiered write-back store.
//!
//! Pages are keyed by `(object, page number)` and live in an ordered list of tiers, fastest
//! first: DRAM, then the array (later: VRAM in front, a backing directory behind). Writes land
//! in the first tier and are acknowledged there; when a tier passes its high watermark the
//! store evicts pages (clock order) down to its low watermark, writing dirty pages to the next
//! tier and dropping clean ones that the next tier already holds. Reads are served by the
//! first tier that has the page and promoted into the first tier (admission). `flush()` writes
//! every dirty page down to the last persistent tier and makes it durable there.

mod dram;
mod tier;

pub use dram::DramTier;
pub use tier::{ArrayTier, Tier, TierCounters, TierStatus};

use parking_lot::Mutex;

/// A page key: object id and page number.
pub type PageKey = (u64, u64);

/// Largest page the store holds (the array's largest value).
pub const MAX_PAGE: usize = tierstack_array::MAX_VALUE;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("page of {0} bytes exceeds the store's maximum page of {1} bytes")]
    TooLarge(usize, usize),
    #[error("the store is full: {0}")]
    Full(String),
    #[error("object id {0:#x} is reserved: use ids below 2^56")]
    ReservedId(u64),
    #[error("array tier: {0}")]
    Array(#[from] tierstack_array::ArrayError),
    #[error("invalid store configuration: {0}")]
    Config(String),
}

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
}

impl TieredStore {
    /// A store with a DRAM tier of `dram_bytes` over the given lower tiers (fastest first).
    pub fn new(dram_bytes: u64, lower: Vec<Box<dyn Tier>>) -> Result<TieredStore> {
        if dram_bytes == 0 {
            return Err(StoreError::Config(
                "the DRAM tier needs a size above 0".into(),
            ));
        }
        Ok(TieredStore {
            dram: DramTier::new(dram_bytes),
            lower,
            evicting: Mutex::new(()),
        })
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
        if self.lower.is_empty() {
            let replaced = self.dram.len_of(key);
            if self.dram.used() - replaced + data.len() as u64 > self.dram.capacity() {
                return Err(StoreError::Full(
                    "DRAM tier full and no tier below it".into(),
                ));
            }
        }
        self.dram.insert(key, data.to_vec(), true);
        self.maybe_evict()
    }

    /// Reads a page from the fastest tier that has it, promoting it into DRAM.
    pub fn get(&self, key: PageKey) -> Result<Option<Vec<u8>>> {
        Self::check(key, 0)?;
        if let Some(v) = self.dram.get(key) {
            return Ok(Some(v));
        }
        for t in &self.lower {
            if let Some(v) = t.get(key)? {
                // Clean copy: the lower tier keeps it, so eviction can simply drop it.
                self.dram.insert(key, v.clone(), false);
                self.maybe_evict()?;
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    /// Removes a page from every tier. Returns whether any tier had it.
    pub fn remove(&self, key: PageKey) -> Result<bool> {
        Self::check(key, 0)?;
        // Not while an eviction may be writing this page down (it would come back).
        let _g = self.evicting.lock();
        let mut found = self.dram.remove(key);
        for t in &self.lower {
            found |= t.remove(key)?;
        }
        Ok(found)
    }

    /// Writes every dirty page to the lower tiers and makes them durable.
    pub fn flush(&self) -> Result<()> {
        let _g = self.evicting.lock();
        let Some(first) = self.lower.first() else {
            return Ok(());
        };
        let dirty = self.dram.dirty_pages();
        for (k, v, _) in &dirty {
            first.put(*k, v).map_err(full)?;
        }
        for (k, _, gen) in &dirty {
            self.dram.mark_clean(*k, *gen);
        }
        for t in &self.lower {
            t.flush()?;
        }
        Ok(())
    }

    fn maybe_evict(&self) -> Result<()> {
        if !self.dram.over_high() {
            return Ok(());
        }
        let _g = self.evicting.lock();
        let Some(first) = self.lower.first() else {
            // DRAM is the only tier: writers are refused rather than silently dropped.
            if self.dram.used() > self.dram.capacity() {
                return Err(StoreError::Full(
                    "DRAM tier full and no tier below it".into(),
                ));
            }
            return Ok(());
        };
        while self.dram.over_low() {
            let batch = self.dram.pick_victims(64);
            if batch.is_empty() {
                break;
            }
            for (k, v, dirty, gen) in batch {
                if dirty {
                    // On failure the page simply stays in DRAM: nothing acknowledged is lost.
                    first.put(k, &v).map_err(full)?;
                }
                self.dram.finish_evict(k, gen);
            }
        }
        Ok(())
    }

    /// Status of every tier, fastest first.
    pub fn status(&self) -> Vec<TierStatus> {
        let mut v = vec![self.dram.status()];
        v.extend(self.lower.iter().map(|t| t.status()));
        v
    }
}
