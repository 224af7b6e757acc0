//! Benchmark engines of tierstack. Every figure comes with its baseline from the same run.

#![warn(missing_docs)]

pub mod array;
pub mod checkpoint;
pub mod error;
pub mod io;
pub mod mem;
pub mod meta;
pub mod plot;
pub mod program;
pub mod table;
pub mod vram;

pub use error::BenchError;
pub use tierstack_common::{fmt_size, parse_size, SizeError};
