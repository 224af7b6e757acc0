//! Other processes, as /proc shows them.

/// Whether process `pid` exists and has not exited: a zombie (`Z`, exited but not reaped) or
/// dead (`X`) process counts as gone.
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !matches!(state(&s), Some('Z' | 'X')))
        .unwrap_or(false)
}

/// The state letter of a /proc/PID/stat line (after the command name, which may itself hold
/// spaces and parentheses).
fn state(stat: &str) -> Option<char> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.trim_start().chars().next()
}

/// The last non-empty line of a tierstack child's output, without the `tierstack: error: `
/// prefix: what a parent hands on when the child failed (the hooks to SLURM, `mount` to its
/// user).
pub fn last_error_line(text: &str) -> String {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .trim_start_matches("tierstack: error: ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states() {
        assert_eq!(state("12 (a) b) Z 1 2"), Some('Z'));
        assert_eq!(state("12 (sleep) S 1 2"), Some('S'));
        assert_eq!(state("garbage"), None);
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX));
    }
}

/// Names of this process's anonymous mappings as `/proc/PID/maps` and `smaps` show them
/// (`[anon:NAME]`): what tierstack maps in a paged process, so that its share of the memory
/// can be told from the program's (`tierstack_node::footprint`).
pub mod mapping_names {
    /// The paged regions (the program's large allocations).
    pub const PAGED: &std::ffi::CStr = c"tierstack-paged";
    /// The compressed tier's arena.
    pub const COMPRESSED: &std::ffi::CStr = c"tierstack-compressed";
}

/// Names the anonymous mapping `addr..addr + len` of this process `name`
/// (`PR_SET_VMA_ANON_NAME`, Linux 5.17 and later). False where the kernel refuses (older
/// kernels, or a range that is not anonymous memory); the mapping is unchanged then.
pub fn name_mapping(addr: usize, len: usize, name: &std::ffi::CStr) -> bool {
    /// `PR_SET_VMA` and `PR_SET_VMA_ANON_NAME` of Linux's `include/uapi/linux/prctl.h`.
    const PR_SET_VMA: libc::c_int = 0x5356_4d41;
    const PR_SET_VMA_ANON_NAME: libc::c_ulong = 0;
    // SAFETY: naming changes no memory; the kernel checks the range and copies the
    // NUL-terminated name.
    unsafe {
        libc::prctl(
            PR_SET_VMA,
            PR_SET_VMA_ANON_NAME,
            addr as libc::c_ulong,
            len as libc::c_ulong,
            name.as_ptr() as libc::c_ulong,
        ) == 0
    }
}

/// Raises this process's soft limit on open descriptors to its hard limit (a daemon that
/// holds files open for its clients should not stop at the login default of 1,024), and
/// returns the soft limit in force after (the old one if it could not be read or raised).
pub fn raise_nofile() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into `rl`, a live local.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return 1024;
    }
    if rl.rlim_cur < rl.rlim_max {
        let want = libc::rlimit {
            rlim_cur: rl.rlim_max,
            rlim_max: rl.rlim_max,
        };
        // SAFETY: setrlimit reads `want`, a live local; lowering nothing.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            return want.rlim_cur;
        }
    }
    rl.rlim_cur
}
