//! [`StackSpec`]: the one place a tiered store is put together, for the mount, `run` (the
//! preload shim) and the benchmarks alike. From the top: the DRAM tier, then (optionally) a
//! compressed DRAM tier, then (optionally) GPU memory, then the array, then read-only
//! snapshot arrays (a forked process's view of its ancestors' pages).
//!
//! [`Tiers`] is what a user chooses among the optional tiers (`--vram`, `--no-compress`): the
//! CLI fills it from its flags, `run` hands it to the preload shim as one variable
//! ([`Tiers::to_shim`] / [`Tiers::from_shim`]), and [`StackSpec::tiers`] applies it.
//!
//! Adding a tier touches four files: its implementation (a file or folder of its own,
//! implementing [`Tier`]); this file (a field of [`Tiers`] with its key in the shim text, a
//! field of [`StackSpec`] and its place in [`StackSpec::build`]'s order); and the flags that
//! ask for it at the edge (`crates/tierstack-cli/src/run_cmd.rs`, `mount_cmd.rs`). The shim,
//! its environment contract and the paging setup pass [`Tiers`] through unchanged.

use std::sync::Arc;

use tierstack_array::Array;

use crate::{ArrayTier, CompressedTier, Result, StoreError, Tier, TieredStore, VramTier};

/// `bytes` of GPU `gpu`'s memory between the DRAM tiers and the array.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Vram {
    /// The GPU (0 is the first).
    pub gpu: u32,
    /// Bytes of its memory.
    pub bytes: u64,
}

/// The optional tiers a user chose: the default is the compressed tier and nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Tiers {
    /// A VRAM tier (`--vram`, `--gpu`).
    pub vram: Option<Vram>,
    /// A compressed DRAM tier (off with `--no-compress`; its size is the caller's policy).
    pub compress: bool,
}

impl Default for Tiers {
    fn default() -> Tiers {
        Tiers {
            vram: None,
            compress: true,
        }
    }
}

impl Tiers {
    /// Bytes the chosen tiers hold outside the process's memory (GPU memory): what they add
    /// to a store's capacity above its DRAM tier.
    pub fn device_bytes(&self) -> u64 {
        self.vram.map_or(0, |v| v.bytes)
    }

    /// The choice as one line of text for the preload shim's environment:
    /// `compress=1,vram=BYTES@GPU` (keys in any order; a tier not chosen is left out or 0).
    pub fn to_shim(&self) -> String {
        let mut s = format!("compress={}", u8::from(self.compress));
        if let Some(v) = self.vram {
            s += &format!(",vram={}@{}", v.bytes, v.gpu);
        }
        s
    }

    /// Reads [`Tiers::to_shim`]'s text; an unknown key or a bad value is an error naming it
    /// (a shim older than the `run` that started it must not guess).
    pub fn from_shim(text: &str) -> Result<Tiers> {
        let bad = |what: &str| StoreError::Config(format!("tier setting {what:?} not understood"));
        let mut t = Tiers {
            vram: None,
            compress: false,
        };
        for item in text.split(',').filter(|i| !i.is_empty()) {
            let (key, value) = item.split_once('=').ok_or_else(|| bad(item))?;
            match key {
                "compress" => {
                    t.compress = match value {
                        "0" => false,
                        "1" => true,
                        _ => return Err(bad(item)),
                    }
                }
                "vram" => {
                    let (bytes, gpu) = value.split_once('@').unwrap_or((value, "0"));
                    let bytes: u64 = bytes.parse().map_err(|_| bad(item))?;
                    let gpu: u32 = gpu.parse().map_err(|_| bad(item))?;
                    t.vram = (bytes > 0).then_some(Vram { gpu, bytes });
                }
                _ => return Err(bad(item)),
            }
        }
        Ok(t)
    }
}

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

    /// The optional tiers of `tiers`; `compressed` bytes for the compressed tier if chosen
    /// (how much is the caller's policy: a share of the process's budget for `run`).
    pub fn tiers(self, tiers: &Tiers, compressed: u64) -> StackSpec {
        let spec = self.compressed(if tiers.compress { compressed } else { 0 });
        match tiers.vram {
            Some(v) => spec.vram(v.gpu, v.bytes),
            None => spec,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_survive_the_shim_text() {
        for t in [
            Tiers::default(),
            Tiers {
                vram: Some(Vram {
                    gpu: 3,
                    bytes: 8 << 30,
                }),
                compress: false,
            },
            Tiers {
                vram: None,
                compress: false,
            },
        ] {
            assert_eq!(Tiers::from_shim(&t.to_shim()).expect("decode"), t);
        }
        assert_eq!(
            Tiers::from_shim("vram=1024").expect("no gpu").vram,
            Some(Vram {
                gpu: 0,
                bytes: 1024
            })
        );
    }

    #[test]
    fn unknown_tier_settings_are_refused_by_name() {
        for bad in ["cxl=1", "compress=2", "vram=x@0", "compress"] {
            let e = Tiers::from_shim(bad).expect_err(bad).to_string();
            assert!(e.contains(bad), "{e}");
        }
    }
}
