//! Sizes on command lines, in configs and in reports: `64K`, `1.5G`, `8GiB`, `4096`.

/// A size that does not parse; the message names the value and the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size '{0}': use a number with an optional K, M, G or T suffix, e.g. 64K or 8G")]
pub struct SizeError(pub String);

/// Parses sizes like `64K`, `1.5G`, `512` (bytes). Suffixes K, M, G, T are powers of 1024;
/// `B`, `iB` after them are accepted. The error names the value and the accepted forms.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let bad = || SizeError(s.to_string());
    let mut t = s.trim().to_ascii_uppercase();
    // Accept 8G, 8GB, 8GIB and a plain byte count (optionally with B).
    if let Some(x) = t.strip_suffix("IB") {
        t = x.to_string();
    } else if t.len() > 1 && t.ends_with('B') {
        t.pop();
    }
    let (num, mult) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        Some('T') => (&t[..t.len() - 1], 1 << 40),
        Some(c) if c.is_ascii_digit() || c == '.' => (&t[..], 1),
        _ => return Err(bad()),
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if !v.is_finite() || v < 0.0 {
        return Err(bad());
    }
    let bytes = v * mult as f64;
    if bytes > u64::MAX as f64 / 2.0 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// Formats bytes with a binary suffix: `512 B`, `1.5 MiB`.
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
        assert_eq!(
            parse_size("12Q").map_err(|e| e.to_string()),
            Err("invalid size '12Q': use a number with an optional K, M, G or T suffix, e.g. 64K or 8G".into())
        );
        assert_eq!(fmt_size(512), "512 B");
        assert_eq!(fmt_size(3 << 19), "1.5 MiB");
    }
}

/// The memory a table of `capacity` entries of `entry` bytes holding `len` of them may take,
/// its next growth included: a hash table (hashbrown's: `capacity` is 7/8 of its buckets, a
/// control byte each) or a ring buffer doubles when full, and while it moves its entries the
/// old and the new allocation are both held, three times the old one. Charging that from the
/// time the table is nine tenths full lets a budget make room before the growth instead of
/// passing it for the moment it lasts (a 21 MiB index doubling under `run --dram 512M` took
/// the peak 21 MiB over).
pub fn table_charge(len: usize, capacity: usize, entry: usize) -> u64 {
    let now = (capacity as u64) * (entry as u64 + 1) * 8 / 7;
    if capacity > 0 && len as u64 * 10 >= capacity as u64 * 9 {
        3 * now
    } else {
        now
    }
}

#[cfg(test)]
mod table_charge_tests {
    use super::table_charge;

    #[test]
    fn a_table_near_its_growth_is_charged_for_both_allocations() {
        assert_eq!(table_charge(0, 0, 40), 0);
        assert_eq!(table_charge(10, 896, 39), 896 * 40 * 8 / 7);
        assert_eq!(table_charge(806, 896, 39), 896 * 40 * 8 / 7);
        assert_eq!(table_charge(807, 896, 39), 3 * 896 * 40 * 8 / 7);
        assert_eq!(table_charge(896, 896, 39), 3 * 896 * 40 * 8 / 7);
    }
}
