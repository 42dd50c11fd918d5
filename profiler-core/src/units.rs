//! Human-readable numbers for the text report: bytes, durations, percentages, shortened text.

/// `512 B`, `1.5 KiB`, `12.0 MiB`, `3.2 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Nanoseconds as milliseconds with two decimals, or `-` when absent.
pub fn ms(ns: Option<u64>) -> String {
    match ns {
        Some(ns) => format!("{:.2}", ns as f64 / 1e6),
        None => "-".to_owned(),
    }
}

/// Nanoseconds as seconds with three decimals.
pub fn seconds(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e9)
}

/// `part` as a percentage of `whole` with one decimal, or `-` when `whole` is zero.
pub fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".to_owned();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

/// `text` cut to at most `max_chars` characters, ending in `...` when cut.
pub fn shorten(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let keep = max_chars.saturating_sub(3);
    let mut out: String = text.chars().take(keep).collect();
    out.push_str("...");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
        assert_eq!(bytes(u64::MAX), "16.0 EiB");
        assert_eq!(ms(Some(1_500_000)), "1.50");
        assert_eq!(ms(None), "-");
        assert_eq!(seconds(12_345_678_901), "12.346");
        assert_eq!(percent(1, 3), "33.3%");
        assert_eq!(percent(1, 0), "-");
        assert_eq!(shorten("abcdef", 6), "abcdef");
        assert_eq!(shorten("abcdefg", 6), "abc...");
        assert_eq!(shorten("ééééééé", 5), "éé...");
    }
}
