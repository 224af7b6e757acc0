//! Errors of the burst-buffer front.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("namespace journal: {0}")]
    Db(#[from] rusqlite::Error),
    #[error("store: {0}")]
    Store(#[from] tierstack_store::StoreError),
    #[error("array: {0}")]
    Array(#[from] tierstack_array::ArrayError),
    #[error("{0}")]
    Config(String),
    #[error("control socket {path}: {msg}")]
    Control { path: PathBuf, msg: String },
}

pub type Result<T, E = FsError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> FsError {
    let path = path.into();
    move |source| FsError::Io { path, source }
}
