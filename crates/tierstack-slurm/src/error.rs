//! The hooks' typed error. A hook's error reaches SLURM as one line (the Lua script hands the
//! last line the hook printed back to SLURM, which shows it to the user), so nearly every
//! error is a sentence naming the problem and the fix, built where the problem is known.

use std::io;

/// What a SLURM hook can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SlurmError {
    /// A bad command-line value (the CLI exits with status 2 for it).
    #[error("{0}")]
    Usage(String),
    /// A hook's failure, as a sentence that names the problem and the fix.
    #[error("{0}")]
    Hook(String),
    /// A local I/O operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, and the fix where there is one.
        what: String,
        /// The operating system's error.
        source: io::Error,
    },
}

/// The hooks' result.
pub type Result<T, E = SlurmError> = std::result::Result<T, E>;

/// `SlurmError::Hook` from a format string.
macro_rules! err {
    ($($t:tt)*) => {
        $crate::error::SlurmError::Hook(format!($($t)*))
    };
}

/// Return early with `err!`.
macro_rules! bail {
    ($($t:tt)*) => {
        return Err(err!($($t)*))
    };
}

/// Names what an I/O operation was doing when it failed.
pub(crate) trait Context<T> {
    /// The error, as `SlurmError::Io` with `what`.
    fn context(self, what: &str) -> Result<T>;
}

impl<T> Context<T> for std::result::Result<T, io::Error> {
    fn context(self, what: &str) -> Result<T> {
        self.map_err(|source| SlurmError::Io {
            what: what.to_string(),
            source,
        })
    }
}
