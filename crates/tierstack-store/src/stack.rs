//! [`StackSpec`]: the one place a tiered store is put together, for the mount, `run` (the
//! preload shim) and the benchmarks alike. From the top: the DRAM tier, then (optionally) a
//! compressed DRAM tier, then (optionally) GPU memory, then the array, then read-only
//! snapshot arrays (a forked process's view of its ancestors' pages).
//!
//! Adding a tier: its implementation (a file or folder of its own, implementing [`Tier`]),
//! a field and a builder method here with its place in [`StackSpec::build`]'s order, and the
//! option that asks for it at the edge (the CLI's flag; for `run`, the shim's setting in
//! `tierstack_common::env`).

use std::sync::Arc;

use tierstack_array::Array;

use crate::{ArrayTier, CompressedTier, Result, StoreError, Tier, TieredStore, VramTier};

/// What a tiered store is made of (see the module documentation for the order).
#[derive(Clone)]
pub struct StackSpec {
    dram: u64,
    compressed: u64,
    vram: Option<(u32, u64)>,
    array: Option<Arc<Array>>,
    snapshots: Vec<Arc<Array>>,
}

impl StackSpec {
    /// A store whose DRAM tier holds `dram` bytes, over nothing yet.
    pub fn new(dram: u64) -> StackSpec {
        StackSpec {
            dram,
            compressed: 0,
            vram: None,
            array: None,
            snapshots: Vec::new(),
        }
    }

    /// The array at the bottom of the writable tiers (kept by the caller too).
    pub fn array(mut self, array: Arc<Array>) -> StackSpec {
        self.array = Some(array);
        self
    }

    /// A compressed DRAM tier of `bytes` under the DRAM tier (0: none).
    pub fn compressed(mut self, bytes: u64) -> StackSpec {
        self.compressed = bytes;
        self
    }

    /// `bytes` of GPU `gpu`'s memory above the array (0 bytes: none).
    pub fn vram(mut self, gpu: u32, bytes: u64) -> StackSpec {
        self.vram = (bytes > 0).then_some((gpu, bytes));
        self
    }

    /// Read-only arrays read after the array, never written (newest first).
    pub fn snapshots(mut self, snapshots: &[Arc<Array>]) -> StackSpec {
        self.snapshots = snapshots.to_vec();
        self
    }

    /// The tiers below DRAM, fastest first, as [`StackSpec::build`] stacks them: each wraps
    /// the one below it where it writes its evictions there.
    fn lower(&self) -> Result<Vec<Box<dyn Tier>>> {
        let mut tiers: Vec<Box<dyn Tier>> = Vec::new();
        if let Some(array) = &self.array {
            let mut first: Box<dyn Tier> = Box::new(ArrayTier::shared(array.clone()));
            if let Some((gpu, bytes)) = self.vram {
                first = Box::new(VramTier::on_gpu(gpu, bytes, first)?);
            }
            if self.compressed > 0 {
                first = Box::new(CompressedTier::new(self.compressed, first));
            }
            tiers.push(first);
        } else if self.vram.is_some() || self.compressed > 0 {
            return Err(StoreError::Config(
                "a VRAM or compressed tier needs an array below it".into(),
            ));
        }
        for s in &self.snapshots {
            tiers.push(Box::new(ArrayTier::shared(s.clone())));
        }
        Ok(tiers)
    }

    /// The store.
    pub fn build(&self) -> Result<TieredStore> {
        TieredStore::new(self.dram, self.lower()?)
    }
}
