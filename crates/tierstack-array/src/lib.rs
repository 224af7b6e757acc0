//! tierstack-array: a log-structured user-space software RAID over files or block devices.
//!
//! * Levels 0, 1, 10, 5, 6, 50, 60 ([`layout`]); chunk 4 KiB – 1 MiB.
//! * Values (up to 1 MiB per key) are appended to an open stripe in DRAM; a stripe is written
//!   only when full (or at a flush, padded), with one large aligned write per drive, so no
//!   stripe is ever read-modified-written.
//! * Every value carries a crc32c verified on every read; a mismatch is repaired from
//!   redundancy and counted.
//! * [`Array::flush`] is the durability point; recovery rebuilds the index from the stripe
//!   summaries on the drives alone.

#![warn(missing_docs)]

pub mod array;
pub mod descriptor;
pub mod error;
pub mod format;
pub mod image;
pub mod io;
pub mod layout;
pub mod objects;
pub mod parity;

pub use array::{Array, ArrayOptions, ArrayStatus, CreateParams, DriveStatus, Key, ScrubReport};
pub use error::{ArrayError, Result};
pub use format::DriveState;
pub use io::{EngineKind, UnknownEngine};
pub use layout::{Geometry, Level, MAX_VALUE};
