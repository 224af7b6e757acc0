//! The array descriptor: a small TOML file naming the drives of an array, written by
//! `array create` and `array assemble`. The drives themselves are authoritative (superblocks);
//! the descriptor only says where to find them.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::array::{hex, read_superblock_path, Array, ArrayOptions};
use crate::error::{ArrayError, Result};

/// The contents of a descriptor file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Descriptor {
    /// The array's UUID in hex, checked against the drives' superblocks on open.
    pub uuid: String,
    /// RAID level number (0, 1, 10, 5, 6, 50, 60).
    pub level: u32,
    /// Chunk size in bytes.
    pub chunk: usize,
    /// Redundancy groups.
    pub groups: usize,
    /// Absolute paths of the drives, in array order.
    pub drives: Vec<PathBuf>,
}

impl Descriptor {
    /// The descriptor of an open array, with its drive paths made absolute.
    pub fn for_array(a: &Array) -> Descriptor {
        let g = a.geometry();
        Descriptor {
            uuid: hex(&a.uuid()),
            level: g.level.number(),
            chunk: g.chunk,
            groups: g.groups,
            drives: a.drive_paths().iter().map(|p| absolute(p)).collect(),
        }
    }

    /// Reads and parses the descriptor at `path`; fails with [`ArrayError::Descriptor`] if it
    /// cannot be read or is not a descriptor.
    pub fn load(path: &Path) -> Result<Descriptor> {
        let err = |msg: String| ArrayError::Descriptor {
            path: path.to_path_buf(),
            msg,
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            err(format!(
                "cannot read it ({e}): create the array first or rebuild the descriptor with `tierstack array assemble`"
            ))
        })?;
        toml::from_str(&text)
            .map_err(|e| err(format!("is not a tierstack descriptor: {}", e.message())))
    }

    /// Writes the descriptor atomically (temporary file, then rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        let err = |e: std::io::Error| ArrayError::Descriptor {
            path: path.to_path_buf(),
            msg: format!("cannot write it: {e}"),
        };
        let text = toml::to_string_pretty(self).map_err(|e| ArrayError::Descriptor {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        let tmp = path.with_extension("tmp-descriptor");
        std::fs::write(&tmp, text).map_err(err)?;
        std::fs::rename(&tmp, path).map_err(err)
    }

    /// Opens the array the descriptor names and checks it is the same array.
    pub fn open(&self, opts: &ArrayOptions) -> Result<Array> {
        let a = Array::open(&self.drives, opts)?;
        if hex(&a.uuid()) != self.uuid {
            return Err(ArrayError::Config(format!(
                "the drives hold array {}, the descriptor names {}: run `tierstack array assemble`",
                hex(&a.uuid()),
                self.uuid
            )));
        }
        Ok(a)
    }
}

/// Opens the array whose descriptor is at `path`.
pub fn open_array(path: &Path, opts: &ArrayOptions) -> Result<Array> {
    Descriptor::load(path)?.open(opts)
}

/// Reassembles an array from its drives and writes a new descriptor at `path`.
pub fn assemble(path: &Path, drives: &[PathBuf], opts: &ArrayOptions) -> Result<Array> {
    for d in drives {
        read_superblock_path(d).map_err(|e| ArrayError::Drive {
            path: d.clone(),
            msg: format!("has no readable tierstack superblock ({e}): give the array's drives"),
        })?;
    }
    let a = Array::open(drives, opts)?;
    Descriptor::for_array(&a).save(path)?;
    Ok(a)
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| {
        std::env::current_dir()
            .map(|c| c.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    })
}
