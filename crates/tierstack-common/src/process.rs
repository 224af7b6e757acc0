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
