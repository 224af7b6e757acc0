//! Typed errors of the array layer. This module depends on nothing else in the crate: `layout`
//! and `format` depend on it (`format` -> `layout` -> `error`), never the other way round.

use std::path::PathBuf;

/// Everything that can go wrong in the array layer.
#[derive(Debug, thiserror::Error)]
pub enum ArrayError {
    /// The requested level, drive count, chunk, groups or size is not valid; the message says
    /// what to change.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A drive cannot be used: it is missing, is a directory, cannot be opened or read, or does
    /// not belong to this array.
    #[error("drive {path}: {msg}")]
    Drive {
        /// Path of the drive.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// An I/O call failed.
    #[error("I/O error on {what}: {source}")]
    Io {
        /// What was being read or written.
        what: String,
        /// The error the operating system returned.
        #[source]
        source: std::io::Error,
    },
    /// An on-disk structure did not decode.
    #[error("on-disk format: {0}")]
    Format(#[from] FormatError),
    /// No free segment or stripe is left for a write, even after cleaning.
    #[error("no space left on the array ({0}); delete objects or create a larger array")]
    NoSpace(String),
    /// A value is larger than the largest value a key holds: `(value bytes, limit bytes)`.
    #[error("value of {0} bytes exceeds the maximum page of {1} bytes")]
    TooLarge(usize, usize),
    /// Data could not be read back or reconstructed from redundancy.
    #[error("data lost: {0}")]
    DataLoss(String),
    /// The array or one of its drives is locked by another process, or a conflicting operation
    /// (such as a rebuild) is already running.
    #[error("array is in use by another process ({0}); stop it or wait for it to finish")]
    Busy(String),
    /// More drives are missing or failed in a redundancy group than the level tolerates.
    #[error("array is not redundant enough: {0}")]
    Redundancy(String),
    /// A drive carries a superblock (with a valid checksum) of an on-disk format version this
    /// code does not read: written by a newer tierstack. Such a drive is never counted as
    /// failed or free (a rebuild or a create would overwrite what the newer version wrote).
    #[error(
        "drive {} has on-disk format version {version}; this tierstack reads version {supported}: {}",
        path.display(),
        version_fix(*version, *supported)
    )]
    FormatVersion {
        /// Path of the drive.
        path: PathBuf,
        /// The format version its superblock names.
        version: u32,
        /// The format version this code reads and writes (`format::FORMAT_VERSION`).
        supported: u32,
    },
    /// Stripe summaries (the records of which key's version lives where, deletions included)
    /// failed their checksums and redundancy could not repair them: the newest versions and
    /// deletions they recorded are unknown, so reads could silently return older values or
    /// deleted keys. `Array::open` refuses the array (as md refuses to start an array it cannot
    /// trust) unless `ArrayOptions::accept_damaged` is set.
    #[error(
        "{} damaged beyond repair ({}): keys written or deleted there may read back stale; open it with --accept-damaged (ArrayOptions::accept_damaged) to quarantine them and read the rest, then copy the data off",
        count_summaries(stripes.len()),
        list_stripes(stripes)
    )]
    DamagedSummaries {
        /// The damaged stripes: (segment, stripe within the segment), in order.
        stripes: Vec<(u32, u32)>,
    },
    /// An array descriptor file could not be read, parsed or written.
    #[error("descriptor {path}: {msg}")]
    Descriptor {
        /// Path of the descriptor file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
}

/// A malformed on-disk structure, as the decoders of `format` report it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    /// The structure does not start with the expected magic number.
    #[error("bad magic")]
    Magic,
    /// The structure was written by an unsupported format version.
    #[error("unsupported format version {0}")]
    Version(u32),
    /// The structure's stored checksum does not match its contents.
    #[error("checksum mismatch")]
    Checksum,
    /// The buffer ends before the structure does.
    #[error("truncated structure")]
    Truncated,
    /// A field holds a value out of range; the name says which.
    #[error("invalid field: {0}")]
    Field(&'static str),
}

/// Result type of the array layer, failing with [`ArrayError`] unless told otherwise.
pub type Result<T, E = ArrayError> = std::result::Result<T, E>;

/// What to do about a drive of format version `version` when this code reads `supported`.
fn version_fix(version: u32, supported: u32) -> &'static str {
    if version > supported {
        "upgrade tierstack"
    } else {
        "no tierstack writes that version: check the drive"
    }
}

/// "1 stripe summary is" / "3 stripe summaries are".
fn count_summaries(n: usize) -> String {
    if n == 1 {
        "1 stripe summary is".into()
    } else {
        format!("{n} stripe summaries are")
    }
}

/// "segment 1 stripe 0, segment 4 stripe 2", the first 8 of `stripes` and a count of the rest.
fn list_stripes(stripes: &[(u32, u32)]) -> String {
    const SHOWN: usize = 8;
    let mut out: Vec<String> = stripes
        .iter()
        .take(SHOWN)
        .map(|(seg, s)| format!("segment {seg} stripe {s}"))
        .collect();
    if stripes.len() > SHOWN {
        out.push(format!("{} more", stripes.len() - SHOWN));
    }
    out.join(", ")
}

impl ArrayError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        ArrayError::Io {
            what: what.into(),
            source,
        }
    }
}
