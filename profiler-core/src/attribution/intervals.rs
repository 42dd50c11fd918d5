//! Lookups in sorted, non-overlapping `[start, end)` ranges of nanoseconds.
/// Whether `[start, end)` overlaps one of `ranges` (sorted, not overlapping).
pub fn overlaps(ranges: &[(u64, u64)], start: u64, end: u64) -> bool {
    // The last range that starts before `end` is the only one that can reach past `start`.
    let i = ranges.partition_point(|r| r.0 < end);
    i > 0 && ranges[i - 1].1 > start
}

/// Whether `ts` lies in one of `ranges` (sorted, not overlapping).
pub fn contains(ranges: &[(u64, u64)], ts: u64) -> bool {
    let i = ranges.partition_point(|r| r.0 <= ts);
    i > 0 && ts < ranges[i - 1].1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_lookups() {
        let r = [(10, 20), (30, 40)];
        assert!(overlaps(&r, 5, 11) && overlaps(&r, 19, 31) && overlaps(&r, 35, 36));
        assert!(!overlaps(&r, 0, 10) && !overlaps(&r, 20, 30) && !overlaps(&r, 40, 50));
        assert!(!overlaps(&[], 0, 100));
        assert!(contains(&r, 10) && contains(&r, 39));
        assert!(!contains(&r, 9) && !contains(&r, 20) && !contains(&r, 40));
    }
}
