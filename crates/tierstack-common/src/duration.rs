//! Durations on command lines and in the configuration file, one grammar everywhere:
//! humantime's (`90s`, `10m`, `2h 30m`, `1day`, `250ms`), and a plain number of seconds
//! (`3600`, what SLURM's timeouts and older command lines give).

use std::time::Duration;

/// A duration that does not parse; the message names the value and the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration '{0}': give e.g. 90s, 10m, 2h 30m or a number of seconds")]
pub struct DurationError(pub String);

/// Longest duration accepted (about 31 years): beyond it a deadline overflows `Instant`.
const MAX: Duration = Duration::from_secs(1_000_000_000);

/// Parses `90s`, `10m`, `2h 30m`, `1.5` (seconds), `3600`.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let t = s.trim();
    let bad = || DurationError(s.to_string());
    let d = if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        let v: f64 = t.parse().map_err(|_| bad())?;
        if !v.is_finite() || v > MAX.as_secs_f64() {
            return Err(bad());
        }
        Duration::from_secs_f64(v)
    } else {
        humantime::parse_duration(t).map_err(|_| bad())?
    };
    if d > MAX {
        return Err(bad());
    }
    Ok(d)
}

/// Formats a duration in the grammar [`parse_duration`] reads: `1h 30m`, `250ms`.
pub fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_a_user_types() {
        let s = Duration::from_secs;
        assert_eq!(parse_duration("90s"), Ok(s(90)));
        assert_eq!(parse_duration("10m"), Ok(s(600)));
        assert_eq!(parse_duration("2h 30m"), Ok(s(9000)));
        assert_eq!(parse_duration("1day"), Ok(s(86400)));
        assert_eq!(parse_duration("3600"), Ok(s(3600)));
        assert_eq!(parse_duration(" 1.5 "), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        for bad in ["", "-1", "ten", "1x", "1e99", "99999999999"] {
            assert!(parse_duration(bad).is_err(), "{bad} accepted");
        }
        assert!(parse_duration("1x")
            .unwrap_err()
            .to_string()
            .contains("90s"));
    }

    #[test]
    fn what_is_printed_reads_back() {
        for secs in [0, 1, 59, 61, 3600, 5400, 86_461] {
            let d = Duration::from_secs(secs);
            assert_eq!(parse_duration(&fmt_duration(d)), Ok(d));
        }
    }
}
