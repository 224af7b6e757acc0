//! tierstack-fs: the burst-buffer front (FUSE mount over a backing directory, namespace
//! journal, drainer, stager).
//!
//! * [`core`]: the namespace (in memory, written through to the journal database) and file
//!   contents (pages in the tiered store over a base file in BACKING); backpressure.
//! * [`db`]: the SQLite namespace journal and inode table.
//! * [`drain`]: the drainer that replays the journal to BACKING.
//! * [`ops`]: the table of operations ([`ops::Op`], [`ops::Out`]) and their FUSE wire form
//!   ([`ops::wire`]), decoded once for both transports.
//! * [`fuse`]: the operations' handlers over the core, and the INIT handshake.
//! * [`dev`]: the readers that carry them over `/dev/fuse`.
//! * [`uring`]: FUSE over io_uring, the same operations through the kernel's per-CPU queues.
//! * [`mount`]: the mount daemon, its control socket and the client side of it.
//! * [`notify`]: systemd's readiness protocol (`READY=1`, `STOPPING=1`) for the daemon.
//!
//! The other modules are the crate's own (attributes, BACKING helpers, operation timing,
//! the polling FUSE thread); `core`, `db`, `intent`, `drain`, `fuse`, `ops` and `refresh` are
//! public for the crate's tests in `tests/` (operations without FUSE, format fixtures).

#![warn(missing_docs)]

pub(crate) mod attr;
pub(crate) mod backing;
pub mod buffers;
pub mod client_env;
pub mod core;
pub mod db;
pub(crate) mod dev;
pub mod drain;
mod error;
pub mod fuse;
pub mod intent;
pub mod io;
pub mod kernel_refs;
pub mod mount;
pub mod notify;
pub mod ops;
pub(crate) mod opstats;
pub(crate) mod poll;
pub mod refresh;
pub mod uring;

pub use error::{FsError, Result};
pub use mount::{MountSpec, MountStatus};
