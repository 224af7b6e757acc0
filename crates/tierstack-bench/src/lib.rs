//! Benchmark engines of tierstack. Every figure comes with its baseline from the same run.

pub mod array;
pub mod table;

/// Parses sizes like `64K`, `1.5G`, `512` (bytes). Suffixes K, M, G, T are powers of 1024.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = || {
        format!(
            "invalid size '{s}': use a number with an optional K, M, G or T suffix, e.g. 64K or 8G"
        )
    };
    if t.is_empty() {
        return Err(bad());
    }
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                'B' => 1,
                _ => return Err(bad()),
            };
            let rest = t[..i].trim_end_matches(['i', 'I']);
            (rest.to_string(), m)
        }
        _ => (t.to_string(), 1),
    };
    let v: f64 = num.parse().map_err(|_| bad())?;
    if !v.is_finite() || v < 0.0 {
        return Err(bad());
    }
    let bytes = v * mult as f64;
    if bytes > u64::MAX as f64 / 2.0 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// Formats bytes with a binary suffix.
pub fn fmt_size(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn sizes() {
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("1.5M"), Ok(3 << 19));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert!(parse_size("abc").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("-1G").is_err());
    }
}
