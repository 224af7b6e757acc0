//! What starting the shim's paging engine (or a forked child's own) fails with. The shim
//! prints it as one line on standard error; the program then runs unpaged, or a forked child
//! finds its paged memory fenced off.

use std::path::PathBuf;

/// Why the paging engine could not start or be taken over.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PreloadError {
    /// `tierstack run` sets the variables the shim reads; one is missing.
    #[error("{0} is not set")]
    NotSet(&'static str),
    /// The folder for this process's paging drives could not be made.
    #[error("cannot create {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The array named by `_TIERSTACK_SHIM_ARRAY` did not open.
    #[error("cannot open array {desc}: {source}")]
    OpenArray {
        desc: String,
        #[source]
        source: tierstack_array::ArrayError,
    },
    /// A forked child could not open a read-only view of its parent's array.
    #[error("cannot open the parent's array: {0}")]
    ParentArray(#[source] tierstack_array::ArrayError),
    /// The paging array failed.
    #[error(transparent)]
    Array(#[from] tierstack_array::ArrayError),
    /// The store under the pager failed (writing it out before a fork).
    #[error(transparent)]
    Store(#[from] tierstack_store::StoreError),
    /// The pager or its store could not be set up.
    #[error(transparent)]
    Mem(#[from] tierstack_mem::MemError),
    /// The parent's `fork` preparation failed (it said why on standard error).
    #[error("the parent could not prepare its store for the fork")]
    NotPrepared,
    /// A system call of the fork hand-over failed.
    #[error("{what}: {source}")]
    Os {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}
