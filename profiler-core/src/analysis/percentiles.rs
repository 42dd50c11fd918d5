//! Latency percentiles: exact over the first few thousand values, then a log-linear histogram.
//!
//! A ten-million-record recording can hold millions of block IOs, so keeping every latency is
//! not an option. Up to [`EXACT_LIMIT`] values are kept and percentiles over them are exact.
//! Past that, values go into a histogram with 128 sub-buckets per power of two (values below
//! 256 exactly), and a percentile is its bucket's midpoint clamped to the observed min and max:
//! within 0.4% of the exact answer, in at most 7424 counters (typically a few thousand).

/// Values kept verbatim before switching to the histogram.
pub const EXACT_LIMIT: usize = 4096;

const SUB_BUCKET_BITS: u32 = 7;
const SUB_BUCKETS: usize = 1 << SUB_BUCKET_BITS;
/// Below this every value has its own bucket.
const EXACT_BELOW: u64 = 2 * SUB_BUCKETS as u64;

/// Collects values (nanoseconds, in practice) and answers nearest-rank percentiles.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Percentiles {
    exact: Vec<u64>,
    /// Counts per bucket once past [`EXACT_LIMIT`]; empty before.
    buckets: Vec<u64>,
    count: u64,
    min: u64,
    max: u64,
}

impl Percentiles {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one value.
    pub fn record(&mut self, value: u64) {
        if self.count == 0 {
            self.min = value;
            self.max = value;
        } else {
            self.min = self.min.min(value);
            self.max = self.max.max(value);
        }
        self.count += 1;
        if self.buckets.is_empty() && self.exact.len() < EXACT_LIMIT {
            self.exact.push(value);
            return;
        }
        if self.buckets.is_empty() {
            for v in std::mem::take(&mut self.exact) {
                self.bump(v);
            }
        }
        self.bump(value);
    }

    fn bump(&mut self, value: u64) {
        let idx = bucket_index(value);
        if self.buckets.len() <= idx {
            self.buckets.resize(idx + 1, 0);
        }
        self.buckets[idx] += 1;
    }

    /// How many values were recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Whether the answers are exact (no histogram in use yet).
    pub fn is_exact(&self) -> bool {
        self.buckets.is_empty()
    }

    /// The nearest-rank percentile `pct` (0 to 100; larger is taken as 100): the smallest value
    /// with at least `pct`% of the values at or below it. `None` when empty.
    pub fn percentile(&self, pct: u32) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let pct = u128::from(pct.min(100));
        let n = u128::from(self.count);
        // rank is 1-based: ceil(pct * n / 100), at least 1.
        let rank = (pct * n).div_ceil(100).max(1);
        if self.buckets.is_empty() {
            let mut sorted = self.exact.clone();
            sorted.sort_unstable();
            let idx = usize::try_from(rank - 1).ok()?;
            return sorted.get(idx).copied();
        }
        let mut seen = 0u128;
        for (idx, &c) in self.buckets.iter().enumerate() {
            seen += u128::from(c);
            if seen >= rank {
                let (lo, hi) = bucket_bounds(idx);
                let mid = lo + (hi - lo) / 2;
                return Some(mid.clamp(self.min, self.max));
            }
        }
        Some(self.max)
    }
}

/// Buckets 0..256 hold one value each; above, 128 sub-buckets per power of two.
fn bucket_index(value: u64) -> usize {
    if value < EXACT_BELOW {
        return value as usize;
    }
    let exp = 63 - value.leading_zeros(); // >= 8
    let shift = exp - SUB_BUCKET_BITS;
    ((shift as usize) << SUB_BUCKET_BITS) + (value >> shift) as usize
}

/// The inclusive value range of a bucket.
fn bucket_bounds(idx: usize) -> (u64, u64) {
    if (idx as u64) < EXACT_BELOW {
        return (idx as u64, idx as u64);
    }
    let shift = (idx >> SUB_BUCKET_BITS) as u32 - 1;
    let mantissa = (idx % SUB_BUCKETS + SUB_BUCKETS) as u64;
    let lo = mantissa << shift;
    (lo, lo + ((1u64 << shift) - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_has_no_percentiles() {
        assert_eq!(Percentiles::new().percentile(50), None);
    }

    #[test]
    fn nearest_rank_exact() {
        let mut p = Percentiles::new();
        for v in (1..=100).rev() {
            p.record(v * 10);
        }
        assert_eq!(p.percentile(50), Some(500));
        assert_eq!(p.percentile(99), Some(990));
        assert_eq!(p.percentile(100), Some(1000));
        assert_eq!(p.percentile(0), Some(10));
        let mut one = Percentiles::new();
        one.record(7);
        assert_eq!(one.percentile(99), Some(7));
    }

    #[test]
    fn small_sets_round_up() {
        let mut p = Percentiles::new();
        for v in [1, 2, 3] {
            p.record(v);
        }
        // ceil(0.5 * 3) = 2nd value; ceil(0.99 * 3) = 3rd.
        assert_eq!(p.percentile(50), Some(2));
        assert_eq!(p.percentile(99), Some(3));
    }

    #[test]
    fn buckets_cover_values_in_order() {
        let mut last = 0;
        for v in (0..20_000u64).chain([u64::MAX / 3, u64::MAX - 1, u64::MAX]) {
            let idx = bucket_index(v);
            assert!(idx >= last, "bucket index must not decrease");
            last = idx;
            let (lo, hi) = bucket_bounds(idx);
            assert!(lo <= v && v <= hi, "{v} outside bucket {idx} [{lo}, {hi}]");
        }
        assert_eq!(bucket_index(u64::MAX), 7423);
    }

    #[test]
    fn histogram_stays_within_half_a_percent() {
        let mut p = Percentiles::new();
        // 100k latencies from 10 µs to ~1 s, spread geometrically and shuffled by stride.
        let n = 100_000u64;
        let mut values: Vec<u64> = (0..n)
            .map(|i| (10_000.0 * (1e5f64).powf(((i * 7919) % n) as f64 / n as f64)) as u64)
            .collect();
        for &v in &values {
            p.record(v);
        }
        assert!(!p.is_exact());
        values.sort_unstable();
        for pct in [1, 50, 90, 99, 100] {
            let rank = (u64::from(pct) * n).div_ceil(100).max(1);
            let exact = values[(rank - 1) as usize] as f64;
            let got = p.percentile(pct).unwrap() as f64;
            let err = (got - exact).abs() / exact;
            assert!(
                err <= 0.004,
                "p{pct}: got {got}, exact {exact}, error {err}"
            );
        }
    }
}
