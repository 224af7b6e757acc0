//! Typed errors of the array layer. This module depends on nothing else in the crate: `layout`
//! and `format` depend on it (`format` -> `layout` -> `error`), never the other way round.

use std::path::PathBuf;

/// Everything that can go wrong in the array layer.
#[derive(Debug, thiserror::Error)]
pub enum ArrayError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("drive {path}: {msg}")]
    Drive { path: PathBuf, msg: String },
    #[error("I/O error on {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("on-disk format: {0}")]
    Format(#[from] FormatError),
    #[error("no space left on the array ({0}); delete objects or create a larger array")]
    NoSpace(String),
    #[error("value of {0} bytes exceeds the maximum page of {1} bytes")]
    TooLarge(usize, usize),
    #[error("data lost: {0}")]
    DataLoss(String),
    #[error("array is in use by another process ({0}); stop it or wait for it to finish")]
    Busy(String),
    #[error("array is not redundant enough: {0}")]
    Redundancy(String),
    #[error("descriptor {path}: {msg}")]
    Descriptor { path: PathBuf, msg: String },
}

/// A malformed on-disk structure, as the decoders of `format` report it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("bad magic")]
    Magic,
    #[error("unsupported format version {0}")]
    Version(u32),
    #[error("checksum mismatch")]
    Checksum,
    #[error("truncated structure")]
    Truncated,
    #[error("invalid field: {0}")]
    Field(&'static str),
}

pub type Result<T, E = ArrayError> = std::result::Result<T, E>;

impl ArrayError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        ArrayError::Io {
            what: what.into(),
            source,
        }
    }
}
