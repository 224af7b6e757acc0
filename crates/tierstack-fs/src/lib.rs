//! tierstack-fs: the burst-buffer front (FUSE mount over a backing directory, namespace
//! journal, drainer, stager).
pub mod stage;
