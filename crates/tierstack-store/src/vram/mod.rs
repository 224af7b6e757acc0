//! The VRAM tier: GPU memory as a write-back cache between the DRAM tier and the array, as
//! seed 000 put a GPU's memory (vramfs under bcache) in front of its NVMe RAID. Pages the DRAM
//! tier evicts land here at PCIe speed instead of going to the drives; when the tier is full it
//! evicts in clock order, writing dirty pages to the tier below (the array, which turns them
//! into full-stripe writes) and dropping clean ones; pages read from below are admitted as
//! clean copies, so a page that leaves DRAM twice is read from the GPU, not the drives.
//!
//! - One block of device memory of the tier's size is taken when the tier is made; pages of
//!   any size share it through a buddy allocator ([`buddy`]).
//! - Nothing here is durable: `flush` writes every dirty page down and flushes the tier below,
//!   so the store's durability point is unchanged (VRAM is as volatile as DRAM).
//! - The driver is loaded at run time ([`cuda`]): without a GPU the tier cannot be made and says
//!   why; everything else works as before.
//! - A read-write lock guards the tier's map. Reads copy from the GPU under the read lock
//!   (several at once, each thread on its own stream; a block is freed only under the write
//!   lock, so it cannot go while it is read). A put takes its block under the write lock,
//!   copies to the GPU with no lock held (the block is its own until it enters the map), and
//!   enters it under the write lock again. Evicting a full tier's pages (the copy out and the
//!   write below) happens under the write lock.
//! - `get_many` copies the pages of a run that lie next to each other on the GPU in one copy
//!   (pages evicted together were placed together).

pub use crate::clock::buddy;
pub mod cuda;

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::clock::buddy::{order_for, Buddy};
use crate::clock::{Block, Blocks};
use crate::{PageKey, Result, Tier, TierCounters, TierStatus};
use cuda::{DeviceBuf, Gpu};

struct State {
    /// The pages' blocks of device memory (each block's `seq` is the tier's change count when
    /// its put began: a slower put of an older version never replaces a newer one).
    blocks: Blocks,
    /// Bumped when a put or remove begins and again when it ends: a page read from below is
    /// admitted only when no put or remove began, ran or ended while it was being read.
    changes: u64,
}

/// The largest single copy `get_many` makes of neighbouring pages.
const MAX_RUN_COPY: u64 = 8 << 20;

/// GPU memory as a tier in front of another tier (see the module's documentation).
pub struct VramTier {
    gpu: Arc<Gpu>,
    buf: DeviceBuf,
    below: Box<dyn Tier>,
    state: RwLock<State>,
    counters: TierCounters,
}

fn gpu_err(e: cuda::GpuError) -> crate::StoreError {
    crate::StoreError::Gpu(e)
}

impl VramTier {
    /// A tier of `bytes` of `gpu`'s memory (taken now) in front of `below`.
    pub fn new(gpu: Arc<Gpu>, bytes: u64, below: Box<dyn Tier>) -> Result<VramTier> {
        if bytes < 1 << 20 {
            return Err(crate::StoreError::Config(format!(
                "a VRAM tier of {bytes} bytes is too small: give it at least 1M"
            )));
        }
        let buf = gpu.alloc(bytes).map_err(gpu_err)?;
        Ok(VramTier {
            gpu,
            state: RwLock::new(State {
                blocks: Blocks::new(Buddy::new(bytes)),
                changes: 0,
            }),
            buf,
            below,
            counters: TierCounters::default(),
        })
    }

    /// A tier of `bytes` of GPU `gpu`'s memory (0 is the first GPU) in front of `below`: what
    /// `mount --vram` and `run --vram` make.
    pub fn on_gpu(gpu: u32, bytes: u64, below: Box<dyn Tier>) -> Result<VramTier> {
        VramTier::new(Gpu::open(gpu).map_err(gpu_err)?, bytes, below)
    }

    /// The GPU the tier lives on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The tier below.
    pub fn below(&self) -> &dyn Tier {
        self.below.as_ref()
    }

    fn copy_out(&self, s: &Block) -> Result<Vec<u8>> {
        let mut v = vec![0u8; s.len as usize];
        self.buf.read(s.at, &mut v).map_err(gpu_err)?;
        Ok(v)
    }

    /// Evicts one page in clock order, writing it below first when dirty. False when the tier
    /// holds nothing.
    fn evict_one(&self, st: &mut State) -> Result<bool> {
        let Some(key) = st.blocks.next_victim() else {
            return Ok(false);
        };
        if let Some(s) = st.blocks.map.get(&key).filter(|s| s.dirty) {
            let v = match self.copy_out(s) {
                Ok(v) => v,
                Err(e) => {
                    st.blocks.put_back(key, true);
                    return Err(e);
                }
            };
            if let Err(e) = self.below.put(key, &v) {
                // The page stays here: nothing acknowledged is lost. At the back, so that
                // the next eviction tries other pages (clean ones need no write) first.
                st.blocks.put_back(key, false);
                return Err(e);
            }
        }
        st.blocks.forget(key);
        self.counters.evictions.fetch_add(1, Relaxed);
        Ok(true)
    }

    /// Takes a block of `order`, evicting until one is free. `None` when even an empty tier
    /// has no block that large.
    fn take(&self, st: &mut State, order: u32) -> Result<Option<u64>> {
        loop {
            if let Some(at) = st.blocks.region.alloc(order) {
                return Ok(Some(at));
            }
            if !self.evict_one(st)? {
                return Ok(None);
            }
        }
    }

    /// Enters a filled block into the map, unless a put that began later is there already
    /// (or, for a clean copy admitted from below, unless anything changed since `seq`).
    fn enter_locked(st: &mut State, key: PageKey, at: u64, len: usize, dirty: bool, seq: u64) {
        let order = order_for(len as u64);
        let stale = if dirty {
            st.blocks.map.get(&key).is_some_and(|s| s.seq > seq)
        } else {
            st.changes != seq || st.blocks.map.contains_key(&key)
        };
        if stale {
            st.blocks.region.release(at, order);
            return;
        }
        st.blocks.forget(key);
        st.blocks.insert(
            key,
            Block {
                at,
                span: 1 << order,
                stored: len as u32,
                len: len as u32,
                packed: 0,
                dirty,
                referenced: AtomicBool::new(false),
                seq,
            },
        );
    }

    /// Copies `data` into a new block and enters it. False when the page is larger than the
    /// whole tier. `admit`: a clean copy read from below, entered only when the tier did not
    /// change since `seen`.
    fn store(&self, key: PageKey, data: &[u8], admit: Option<u64>) -> Result<bool> {
        let order = order_for(data.len() as u64);
        let (at, seq) = {
            let mut st = self.state.write();
            match admit {
                Some(seen) if st.changes != seen || st.blocks.map.contains_key(&key) => {
                    return Ok(true)
                }
                Some(_) => {}
                None => {
                    st.changes += 1;
                    // The old version must not be read any more (the caller still holds the
                    // new one until this returns).
                    st.blocks.forget(key);
                }
            }
            let Some(at) = self.take(&mut st, order)? else {
                return Ok(false);
            };
            (at, st.changes)
        };
        // The block is this put's alone until it enters the map.
        if let Err(e) = self.buf.write(at, data) {
            let mut st = self.state.write();
            st.blocks.region.release(at, order);
            if admit.is_none() {
                st.changes += 1;
            }
            return Err(gpu_err(e));
        }
        let mut st = self.state.write();
        Self::enter_locked(&mut st, key, at, data.len(), admit.is_none(), seq);
        if admit.is_none() {
            // The put ends: a page read from below meanwhile is older than this one.
            st.changes += 1;
        }
        Ok(true)
    }

    fn count_hit(&self, n: usize) {
        self.counters.hits.fetch_add(1, Relaxed);
        self.counters.bytes_out.fetch_add(n as u64, Relaxed);
    }
}

impl Tier for VramTier {
    fn name(&self) -> &str {
        "vram"
    }

    fn put(&self, key: PageKey, data: &[u8]) -> Result<()> {
        if !self.store(key, data, None)? {
            // Larger than the whole tier: straight below; a copy admitted from below while it
            // went there is older.
            let res = self.below.put(key, data);
            let mut st = self.state.write();
            st.blocks.forget(key);
            st.changes += 1;
            return res;
        }
        self.counters.puts.fetch_add(1, Relaxed);
        self.counters.bytes_in.fetch_add(data.len() as u64, Relaxed);
        Ok(())
    }

    fn put_many(&self, pages: &[(PageKey, &[u8])]) -> Result<()> {
        // Blocks for all under one lock; pages larger than the whole tier go straight below.
        let mut placed: Vec<(u64, usize)> = Vec::with_capacity(pages.len());
        let mut through = Vec::new();
        let seq = {
            let mut st = self.state.write();
            st.changes += 1;
            for (i, (key, data)) in pages.iter().enumerate() {
                st.blocks.forget(*key);
                match self.take(&mut st, order_for(data.len() as u64)) {
                    Ok(Some(at)) => placed.push((at, i)),
                    Ok(None) => through.push(i),
                    Err(e) => {
                        for &(at, j) in &placed {
                            st.blocks
                                .region
                                .release(at, order_for(pages[j].1.len() as u64));
                        }
                        st.changes += 1;
                        return Err(e);
                    }
                }
            }
            st.changes
        };
        // Blocks that follow each other on the GPU: one copy each run (pages put together,
        // e.g. a DRAM eviction batch in key order, get neighbouring blocks).
        placed.sort_unstable();
        let mut j = 0;
        let mut failed = None;
        while j < placed.len() {
            let start = placed[j].0;
            let mut end = j + 1;
            while end < placed.len() && {
                let (at, i) = placed[end - 1];
                placed[end].0 == at + (1u64 << order_for(pages[i].1.len() as u64))
                    && placed[end].0 - start < MAX_RUN_COPY
            } {
                end += 1;
            }
            let res = if end - j == 1 {
                self.buf.write(start, pages[placed[j].1].1)
            } else {
                let (last_at, last_i) = placed[end - 1];
                let mut run = vec![0u8; (last_at - start) as usize + pages[last_i].1.len()];
                for &(at, i) in &placed[j..end] {
                    let off = (at - start) as usize;
                    run[off..off + pages[i].1.len()].copy_from_slice(pages[i].1);
                }
                self.buf.write(start, &run)
            };
            if let Err(e) = res {
                failed = Some(e);
                break;
            }
            j = end;
        }
        {
            let mut st = self.state.write();
            st.changes += 1;
            if let Some(e) = failed {
                for &(at, i) in &placed {
                    st.blocks
                        .region
                        .release(at, order_for(pages[i].1.len() as u64));
                }
                return Err(gpu_err(e));
            }
            for &(at, i) in &placed {
                Self::enter_locked(&mut st, pages[i].0, at, pages[i].1.len(), true, seq);
                self.counters.puts.fetch_add(1, Relaxed);
                self.counters
                    .bytes_in
                    .fetch_add(pages[i].1.len() as u64, Relaxed);
            }
        }
        if through.is_empty() {
            return Ok(());
        }
        let res = through
            .iter()
            .try_for_each(|&i| self.below.put(pages[i].0, pages[i].1));
        // A copy admitted from below while these went there is older than them.
        let mut st = self.state.write();
        for &i in &through {
            st.blocks.forget(pages[i].0);
        }
        st.changes += 1;
        res
    }

    fn get(&self, key: PageKey) -> Result<Option<Vec<u8>>> {
        let seen = {
            let st = self.state.read();
            if let Some(s) = st.blocks.map.get(&key) {
                s.referenced.store(true, Relaxed);
                let v = self.copy_out(s)?;
                self.count_hit(v.len());
                return Ok(Some(v));
            }
            st.changes
        };
        self.counters.misses.fetch_add(1, Relaxed);
        let v = self.below.get(key)?;
        if let Some(d) = &v {
            // A failed admission only costs a later read from below.
            let _ = self.store(key, d, Some(seen));
        }
        Ok(v)
    }

    fn get_many(&self, keys: &[PageKey]) -> Result<Vec<Option<Vec<u8>>>> {
        let mut out: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        let mut missing = Vec::new();
        let seen = {
            let st = self.state.read();
            // (block offset, block size, length, index) of each page here, in GPU order.
            let mut hits: Vec<(u64, u64, usize, usize)> = Vec::new();
            for (i, k) in keys.iter().enumerate() {
                match st.blocks.map.get(k) {
                    Some(s) => {
                        s.referenced.store(true, Relaxed);
                        hits.push((s.at, s.span, s.len as usize, i));
                    }
                    None => missing.push(i),
                }
            }
            hits.sort_unstable();
            // Runs of blocks that follow each other on the GPU: one copy each.
            let mut j = 0;
            while j < hits.len() {
                let start = hits[j].0;
                let mut end = j + 1;
                while end < hits.len()
                    && hits[end].0 == hits[end - 1].0 + hits[end - 1].1
                    && hits[end].0 + hits[end].2 as u64 - start <= MAX_RUN_COPY
                {
                    end += 1;
                }
                let last = hits[end - 1];
                let mut run = vec![0u8; (last.0 - start) as usize + last.2];
                self.buf.read(start, &mut run).map_err(gpu_err)?;
                for &(at, _, len, i) in &hits[j..end] {
                    let off = (at - start) as usize;
                    out[i] = Some(run[off..off + len].to_vec());
                    self.count_hit(len);
                }
                j = end;
            }
            st.changes
        };
        if missing.is_empty() {
            return Ok(out);
        }
        self.counters
            .misses
            .fetch_add(missing.len() as u64, Relaxed);
        let ks: Vec<PageKey> = missing.iter().map(|&i| keys[i]).collect();
        for (&i, v) in missing.iter().zip(self.below.get_many(&ks)?) {
            if let Some(d) = &v {
                let _ = self.store(keys[i], d, Some(seen));
            }
            out[i] = v;
        }
        Ok(out)
    }

    fn remove(&self, key: PageKey) -> Result<bool> {
        // Below first: if that fails, the copy here (newer than the one below) stays.
        let below = self.below.remove(key)?;
        // A copy admitted from below while the removal ran goes too.
        let mut st = self.state.write();
        st.changes += 1;
        let here = st.blocks.forget(key).is_some();
        Ok(below || here)
    }

    fn flush(&self) -> Result<()> {
        self.settle()?;
        self.below.flush()
    }

    fn settle(&self) -> Result<()> {
        let mut st = self.state.write();
        for key in st.blocks.dirty_keys() {
            let Some(s) = st.blocks.map.get(&key) else {
                continue;
            };
            let v = self.copy_out(s)?;
            self.below.put(key, &v)?;
            st.blocks.mark_clean(key);
        }
        drop(st);
        self.below.settle()
    }

    fn status(&self) -> TierStatus {
        self.state.read().blocks.status("vram", &self.counters)
    }

    fn statuses(&self) -> Vec<TierStatus> {
        let mut v = vec![self.status()];
        v.extend(self.below.statuses());
        v
    }

    fn index_bytes(&self) -> u64 {
        self.state.read().blocks.table_bytes() + self.below.index_bytes()
    }
}
