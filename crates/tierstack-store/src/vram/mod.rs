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
//! - One lock guards the tier's map and is held across its device copies and the write of an
//!   evicted page below: simple and correct, and the copies (PCIe, GB/s) are short next to
//!   the drives' writes.

pub mod buddy;
pub mod cuda;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{PageKey, Result, Tier, TierCounters, TierStatus};
use buddy::{order_for, Buddy};
use cuda::{DeviceBuf, Gpu};

#[derive(Debug, Clone, Copy)]
struct Slot {
    at: u64,
    order: u32,
    len: u32,
    dirty: bool,
    referenced: bool,
}

struct State {
    map: HashMap<PageKey, Slot>,
    buddy: Buddy,
    /// Keys in clock order (may hold keys that left the map since: skipped).
    clock: VecDeque<PageKey>,
    used: u64,
    dirty: u64,
    /// Bumped by every put and remove: a page read from below is admitted only when nothing
    /// changed the tier while it was being read.
    changes: u64,
}

/// GPU memory as a tier in front of another tier (see the module's documentation).
pub struct VramTier {
    gpu: Arc<Gpu>,
    buf: DeviceBuf,
    below: Box<dyn Tier>,
    state: Mutex<State>,
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
            state: Mutex::new(State {
                map: HashMap::new(),
                buddy: Buddy::new(bytes),
                clock: VecDeque::new(),
                used: 0,
                dirty: 0,
                changes: 0,
            }),
            buf,
            below,
            counters: TierCounters::default(),
        })
    }

    /// The GPU the tier lives on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The tier below.
    pub fn below(&self) -> &dyn Tier {
        self.below.as_ref()
    }

    fn forget(st: &mut State, key: PageKey) -> Option<Slot> {
        let s = st.map.remove(&key)?;
        st.buddy.release(s.at, s.order);
        st.used -= 1 << s.order;
        if s.dirty {
            st.dirty -= s.len as u64;
        }
        Some(s)
    }

    fn copy_out(&self, s: &Slot) -> Result<Vec<u8>> {
        let mut v = vec![0u8; s.len as usize];
        self.buf.read(s.at, &mut v).map_err(gpu_err)?;
        Ok(v)
    }

    /// Evicts one page in clock order, writing it below first when dirty. False when the tier
    /// holds nothing.
    fn evict_one(&self, st: &mut State) -> Result<bool> {
        while let Some(key) = st.clock.pop_front() {
            let Some(s) = st.map.get_mut(&key) else {
                continue;
            };
            if s.referenced {
                s.referenced = false;
                st.clock.push_back(key);
                continue;
            }
            let s = *s;
            if s.dirty {
                let v = self.copy_out(&s)?;
                if let Err(e) = self.below.put(key, &v) {
                    // The page stays here: nothing acknowledged is lost.
                    st.clock.push_front(key);
                    return Err(e);
                }
            }
            Self::forget(st, key);
            self.counters.evictions.fetch_add(1, Relaxed);
            return Ok(true);
        }
        Ok(false)
    }

    /// Takes a block of `order`, evicting until one is free. `None` when even an empty tier
    /// has no block that large.
    fn take(&self, st: &mut State, order: u32) -> Result<Option<u64>> {
        loop {
            if let Some(at) = st.buddy.alloc(order) {
                return Ok(Some(at));
            }
            if !self.evict_one(st)? {
                return Ok(None);
            }
        }
    }

    fn insert(&self, st: &mut State, key: PageKey, data: &[u8], dirty: bool) -> Result<bool> {
        let order = order_for(data.len() as u64);
        let Some(at) = self.take(st, order)? else {
            return Ok(false);
        };
        if let Err(e) = self.buf.write(at, data) {
            st.buddy.release(at, order);
            return Err(gpu_err(e));
        }
        st.map.insert(
            key,
            Slot {
                at,
                order,
                len: data.len() as u32,
                dirty,
                referenced: false,
            },
        );
        st.used += 1 << order;
        if dirty {
            st.dirty += data.len() as u64;
        }
        st.clock.push_back(key);
        if st.clock.len() > 2 * st.map.len() + 64 {
            let map = &st.map;
            st.clock.retain(|k| map.contains_key(k));
        }
        Ok(true)
    }

    /// Admits a page read from below as a clean copy, unless the tier changed meanwhile.
    fn admit(&self, key: PageKey, data: &[u8], seen: u64) {
        let mut st = self.state.lock();
        if st.changes != seen || st.map.contains_key(&key) {
            return;
        }
        // A failed admission only costs a later read from below.
        let _ = self.insert(&mut st, key, data, false);
    }

    fn hit(&self, s: &mut Slot) -> Result<Vec<u8>> {
        s.referenced = true;
        let v = self.copy_out(s)?;
        self.counters.hits.fetch_add(1, Relaxed);
        self.counters.bytes_out.fetch_add(v.len() as u64, Relaxed);
        Ok(v)
    }
}

impl Tier for VramTier {
    fn name(&self) -> &str {
        "vram"
    }

    fn put(&self, key: PageKey, data: &[u8]) -> Result<()> {
        let mut st = self.state.lock();
        st.changes += 1;
        Self::forget(&mut st, key);
        if !self.insert(&mut st, key, data, true)? {
            // Larger than the whole tier: straight below.
            drop(st);
            return self.below.put(key, data);
        }
        self.counters.puts.fetch_add(1, Relaxed);
        self.counters.bytes_in.fetch_add(data.len() as u64, Relaxed);
        Ok(())
    }

    fn get(&self, key: PageKey) -> Result<Option<Vec<u8>>> {
        let seen = {
            let mut st = self.state.lock();
            if let Some(mut s) = st.map.get(&key).copied() {
                let v = self.hit(&mut s)?;
                st.map.insert(key, s);
                return Ok(Some(v));
            }
            st.changes
        };
        self.counters.misses.fetch_add(1, Relaxed);
        let v = self.below.get(key)?;
        if let Some(d) = &v {
            self.admit(key, d, seen);
        }
        Ok(v)
    }

    fn get_many(&self, keys: &[PageKey]) -> Result<Vec<Option<Vec<u8>>>> {
        let mut out: Vec<Option<Vec<u8>>> = Vec::with_capacity(keys.len());
        let mut missing = Vec::new();
        let seen = {
            let mut st = self.state.lock();
            for (i, k) in keys.iter().enumerate() {
                match st.map.get(k).copied() {
                    Some(mut s) => {
                        out.push(Some(self.hit(&mut s)?));
                        st.map.insert(*k, s);
                    }
                    None => {
                        out.push(None);
                        missing.push(i);
                    }
                }
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
                self.admit(keys[i], d, seen);
            }
            out[i] = v;
        }
        Ok(out)
    }

    fn remove(&self, key: PageKey) -> Result<bool> {
        let here = {
            let mut st = self.state.lock();
            st.changes += 1;
            Self::forget(&mut st, key).is_some()
        };
        Ok(self.below.remove(key)? || here)
    }

    fn flush(&self) -> Result<()> {
        {
            let mut st = self.state.lock();
            let mut dirty: Vec<PageKey> = st
                .map
                .iter()
                .filter(|(_, s)| s.dirty)
                .map(|(k, _)| *k)
                .collect();
            // In key order: the pages of a run land next to each other below.
            dirty.sort_unstable();
            for key in dirty {
                let Some(s) = st.map.get(&key).copied() else {
                    continue;
                };
                let v = self.copy_out(&s)?;
                self.below.put(key, &v)?;
                if let Some(s) = st.map.get_mut(&key) {
                    s.dirty = false;
                }
                st.dirty -= s.len as u64;
            }
        }
        self.below.flush()
    }

    fn status(&self) -> TierStatus {
        let st = self.state.lock();
        self.counters
            .snapshot("vram", st.buddy.capacity(), st.used, st.dirty)
    }

    fn statuses(&self) -> Vec<TierStatus> {
        let mut v = vec![self.status()];
        v.extend(self.below.statuses());
        v
    }

    fn index_bytes(&self) -> u64 {
        let st = self.state.lock();
        let own = st.map.capacity() * (std::mem::size_of::<(PageKey, Slot)>() + 1)
            + st.clock.capacity() * std::mem::size_of::<PageKey>();
        own as u64 + self.below.index_bytes()
    }
}
