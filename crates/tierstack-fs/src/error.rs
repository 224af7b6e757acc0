//! Errors of the burst-buffer front.

use std::path::PathBuf;

/// What the burst-buffer front can fail with.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// An I/O error on a file or directory.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory the operation was on.
        path: PathBuf,
        /// The error the operating system returned.
        #[source]
        source: std::io::Error,
    },
    /// An error of the SQLite namespace journal.
    #[error("namespace journal: {0}")]
    Db(#[from] rusqlite::Error),
    /// An error of the tiered store (the fast tier).
    #[error("store: {0}")]
    Store(#[from] tierstack_store::StoreError),
    /// An error of the array under the store.
    #[error("array: {0}")]
    Array(#[from] tierstack_array::ArrayError),
    /// A bad setting or a mount that cannot be set up; the message says what is wrong.
    #[error("{0}")]
    Config(String),
    /// The mount daemon's control socket could not be reached, or answered with an error or
    /// a reply that could not be read.
    #[error("control socket {path}: {msg}")]
    Control {
        /// The control socket's path.
        path: PathBuf,
        /// What went wrong.
        msg: String,
    },
}

impl FsError {
    /// Whether the fast tier (the store or the array under it) had no room.
    pub fn is_full(&self) -> bool {
        matches!(
            self,
            FsError::Store(tierstack_store::StoreError::Full(_))
                | FsError::Array(tierstack_array::ArrayError::NoSpace(_))
        )
    }
}

/// A result whose error defaults to [`FsError`].
pub type Result<T, E = FsError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> FsError {
    let path = path.into();
    move |source| FsError::Io { path, source }
}
