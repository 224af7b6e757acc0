//! The `Tier` trait and the array tier.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use tierstack_array::Array;

use crate::{PageKey, Result};

/// Counters every tier keeps.
#[derive(Debug, Default)]
pub struct TierCounters {
    /// Reads the tier answered with a page.
    pub hits: AtomicU64,
    /// Reads of pages the tier does not hold.
    pub misses: AtomicU64,
    /// Pages stored.
    pub puts: AtomicU64,
    /// Bytes stored.
    pub bytes_in: AtomicU64,
    /// Bytes read back.
    pub bytes_out: AtomicU64,
    /// Pages moved out of the tier to make room.
    pub evictions: AtomicU64,
}

/// A snapshot of one tier, for status output.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TierStatus {
    /// `dram`, `array`, `snapshot`.
    pub name: String,
    /// Bytes the tier may hold.
    pub capacity_bytes: u64,
    /// Bytes it holds.
    pub used_bytes: u64,
    /// Bytes it holds that the tier below does not have yet.
    pub dirty_bytes: u64,
    /// See [`TierCounters`].
    pub hits: u64,
    /// See [`TierCounters`].
    pub misses: u64,
    /// See [`TierCounters`].
    pub puts: u64,
    /// See [`TierCounters`].
    pub bytes_in: u64,
    /// See [`TierCounters`].
    pub bytes_out: u64,
    /// See [`TierCounters`].
    pub evictions: u64,
}

impl TierCounters {
    /// The counters now, with the tier's name and sizes.
    pub fn snapshot(&self, name: &str, capacity: u64, used: u64, dirty: u64) -> TierStatus {
        TierStatus {
            name: name.to_string(),
            capacity_bytes: capacity,
            used_bytes: used,
            dirty_bytes: dirty,
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            puts: self.puts.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
            bytes_out: self.bytes_out.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
        }
    }
}

/// A tier below DRAM: the array, or a VRAM tier in front of it.
pub trait Tier: Send + Sync {
    /// The tier's name in status output.
    fn name(&self) -> &str;
    /// Stores a page (durable after `flush`).
    fn put(&self, key: PageKey, data: &[u8]) -> Result<()>;
    /// Stores several pages (a tier that can copies neighbours with fewer requests). On an
    /// error some may have been stored: the caller keeps every one until it succeeds.
    fn put_many(&self, pages: &[(PageKey, &[u8])]) -> Result<()> {
        pages.iter().try_for_each(|(k, d)| self.put(*k, d))
    }
    /// The page under `key`, if the tier holds it.
    fn get(&self, key: PageKey) -> Result<Option<Vec<u8>>>;
    /// Several pages at once (a tier that can reads neighbours with fewer requests).
    fn get_many(&self, keys: &[PageKey]) -> Result<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get(*k)).collect()
    }
    /// Forgets the page under `key`; whether it was there.
    fn remove(&self, key: PageKey) -> Result<bool>;
    /// Makes everything put so far durable.
    fn flush(&self) -> Result<()>;
    /// Writes what this tier holds that the tiers it writes to do not have yet down to them,
    /// without making it durable (a forked child reads the array's files: they must be
    /// complete). Tiers that write through have nothing to do.
    fn settle(&self) -> Result<()> {
        Ok(())
    }
    /// Sizes and counters.
    fn status(&self) -> TierStatus;
    /// This tier's status and those of the tiers it writes to itself (a VRAM tier's array).
    fn statuses(&self) -> Vec<TierStatus> {
        vec![self.status()]
    }
    /// Drops what the tier holds in DRAM for pages that the tier below has too, when it can do
    /// so without waiting (a forked child's copy of its parent's store, which the child never
    /// uses). Nothing by default.
    fn release_memory(&self) {}
    /// DRAM the tier holds for its own bookkeeping (an array's index), bytes.
    fn index_bytes(&self) -> u64 {
        0
    }
    /// The most [`Tier::index_bytes`] may reach, this tier and those below together: a tier
    /// that grows by choice (the compressed tier's arena) stops growing there and replaces
    /// its own pages instead. Nothing by default (an index grows with what is stored).
    fn limit_index(&self, _bytes: u64) {}
    /// Whether the tier would keep a clean copy of `key` handed to [`Tier::admit`] (a tier
    /// that keeps copies of pages the tiers below hold: the compressed tier). Asking may count
    /// as a try (the compressed tier's give-up streak). No by default.
    fn wants_copy(&self, _key: PageKey) -> bool {
        false
    }
    /// Keeps a clean copy of a page whose current version the tiers below hold already (a
    /// page the memory front drops unchanged): a later read finds it here instead of below.
    /// Nothing by default.
    fn admit(&self, _key: PageKey, _data: &[u8]) -> Result<()> {
        Ok(())
    }
}

/// The array as a tier: each page is one value of the array under the same key.
pub struct ArrayTier {
    array: Arc<Array>,
    counters: TierCounters,
}

impl ArrayTier {
    /// A tier over `array`, which it owns.
    pub fn new(array: Array) -> Self {
        Self::shared(Arc::new(array))
    }

    /// A tier over an array the caller keeps using too (e.g. to list its keys at start-up).
    pub fn shared(array: Arc<Array>) -> Self {
        ArrayTier {
            array,
            counters: TierCounters::default(),
        }
    }

    /// The array below.
    pub fn array(&self) -> &Array {
        &self.array
    }

    fn count_read(&self, v: &Option<Vec<u8>>) {
        match v {
            Some(d) => {
                self.counters.hits.fetch_add(1, Relaxed);
                self.counters.bytes_out.fetch_add(d.len() as u64, Relaxed);
            }
            None => {
                self.counters.misses.fetch_add(1, Relaxed);
            }
        }
    }
}

impl Tier for ArrayTier {
    fn name(&self) -> &str {
        if self.array.is_read_only() {
            "snapshot"
        } else {
            "array"
        }
    }

    fn put(&self, key: PageKey, data: &[u8]) -> Result<()> {
        self.array.put(key, data)?;
        self.counters.puts.fetch_add(1, Relaxed);
        self.counters.bytes_in.fetch_add(data.len() as u64, Relaxed);
        Ok(())
    }

    fn get(&self, key: PageKey) -> Result<Option<Vec<u8>>> {
        let v = self.array.get(key)?;
        self.count_read(&v);
        Ok(v)
    }

    fn get_many(&self, keys: &[PageKey]) -> Result<Vec<Option<Vec<u8>>>> {
        let v = self.array.get_many(keys)?;
        for d in &v {
            self.count_read(d);
        }
        Ok(v)
    }

    fn remove(&self, key: PageKey) -> Result<bool> {
        // A read-only view (a forked child's snapshot of its parent's pages) keeps its copy:
        // the page's owner no longer reads it from here once it removed it.
        if self.array.is_read_only() {
            return Ok(false);
        }
        Ok(self.array.delete(key)?)
    }

    fn flush(&self) -> Result<()> {
        Ok(self.array.flush()?)
    }

    fn index_bytes(&self) -> u64 {
        self.array.index_bytes()
    }

    fn status(&self) -> TierStatus {
        let st = self.array.status();
        self.counters
            .snapshot("array", st.capacity_bytes, st.used_bytes, 0)
    }
}
