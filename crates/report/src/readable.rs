//! Sizes and counts as the trainer prints them for people to read: every size in binary units
//! (B, KiB, MiB, GiB, ..., as GPU memory is counted), every large count with K, M, B (thousands,
//! millions, billions).

/// Bytes in binary units: `512 B`, `1.50 KiB`, `3.25 GiB`.
pub fn bytes(n: u64) -> String {
    bytes_f64(n as f64)
}

/// [`bytes`] of a non-integer amount (an average, a rate's bytes per second).
pub fn bytes_f64(n: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

/// A count with K, M or B and at most one decimal, for axes and summaries: `500`, `20K`,
/// `1.5M`, `2.1B`.
pub fn count(n: f64) -> String {
    let (v, suffix) = match n.abs() {
        a if a >= 1e9 => (n / 1e9, "B"),
        a if a >= 1e6 => (n / 1e6, "M"),
        a if a >= 1e3 => (n / 1e3, "K"),
        _ => (n, ""),
    };
    let text = format!("{v:.1}");
    let text = text.strip_suffix(".0").unwrap_or(&text);
    format!("{text}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_binary() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(3 << 30), "3.00 GiB");
    }

    #[test]
    fn counts_read_like_the_axis() {
        assert_eq!(count(0.0), "0");
        assert_eq!(count(500.0), "500");
        assert_eq!(count(20_000.0), "20K");
        assert_eq!(count(1_500_000.0), "1.5M");
        assert_eq!(count(2.1e9), "2.1B");
    }
}
