//! [`PathIoError`]: an I/O call that failed on a path, with what was being done. The error
//! enums of the benchmarks and of the stager wrap it (`#[error(transparent)]`), so the message
//! `cannot {what} {path}: {error}` is written once.

use std::io;
use std::path::{Path, PathBuf};

/// An I/O call failed on a path: `cannot {what} {path}: {source}`.
#[derive(Debug, thiserror::Error)]
#[error("cannot {what} {}: {source}", path.display())]
pub struct PathIoError {
    /// What was being done (e.g. `create`, `join cgroup`, `write the plot to`).
    pub what: &'static str,
    /// The path it was done on.
    pub path: PathBuf,
    /// The error of the call.
    #[source]
    pub source: io::Error,
}

/// For `map_err`: turns the [`io::Error`] of doing `what` on `path` into a [`PathIoError`]
/// (which `?` converts into any error that wraps it with `#[from]`).
pub fn io_err<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> PathIoError + 'a {
    move |source| PathIoError {
        what,
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_what_and_path() {
        let e = io_err("create", Path::new("/tmp/x y"))(io::Error::from(io::ErrorKind::NotFound));
        let os = io::Error::from(io::ErrorKind::NotFound).to_string();
        assert_eq!(e.to_string(), format!("cannot create /tmp/x y: {os}"));
        assert!(std::error::Error::source(&e).is_some());
    }
}
