//! How much a share would move by chance: within one run, from a block bootstrap over its
//! seconds; between runs, from their spread.
//!
//! A run's share of a cause is Σ idle / Σ observed over its seconds. Resampling blocks of
//! consecutive seconds (circular, length ⌈n^⅓⌉) with replacement keeps the seconds'
//! correlation (a slow phase lasts several seconds) while measuring how much the share depends
//! on which seconds happened to be recorded. The generator is seeded, so a verdict reproduces.

/// One-sided 95% quantile of the normal distribution.
pub const Z_95: f64 = 1.644_853_626_951_472_2;
/// Bootstrap resamples per share.
pub const RESAMPLES: usize = 2000;

/// xorshift64*: small, deterministic, good enough to pick blocks.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
}

fn sd(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (values.len() - 1) as f64;
    var.sqrt()
}

/// The bootstrap standard error of `Σ num / Σ den` over the items (seconds); 0 with fewer
/// than two items or no denominator.
pub fn ratio_se(num: &[f64], den: &[f64]) -> f64 {
    let n = num.len().min(den.len());
    if n < 2 || den.iter().sum::<f64>() <= 0.0 {
        return 0.0;
    }
    let block = (n as f64).cbrt().ceil().max(1.0) as usize;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ n as u64);
    let mut ratios = Vec::with_capacity(RESAMPLES);
    for _ in 0..RESAMPLES {
        let (mut top, mut bottom, mut taken) = (0.0, 0.0, 0);
        while taken < n {
            let start = rng.below(n);
            for k in 0..block.min(n - taken) {
                let i = (start + k) % n;
                top += num[i];
                bottom += den[i];
            }
            taken += block;
        }
        if bottom > 0.0 {
            ratios.push(top / bottom);
        }
    }
    sd(&ratios)
}

/// A side's share and its standard error, from each run's share and within-run error: the
/// mean of the runs, with the larger of the between-run error of that mean and the runs' own
/// errors combined.
pub fn combine(runs: &[(f64, f64)]) -> (f64, f64) {
    if runs.is_empty() {
        return (0.0, 0.0);
    }
    let k = runs.len() as f64;
    let shares: Vec<f64> = runs.iter().map(|r| r.0).collect();
    let mean = shares.iter().sum::<f64>() / k;
    let between = sd(&shares) / k.sqrt();
    let within = runs.iter().map(|r| r.1 * r.1).sum::<f64>().sqrt() / k;
    (mean, between.max(within))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_seconds_have_no_noise_and_uneven_ones_do() {
        let den = vec![1.0; 30];
        assert!(ratio_se(&vec![0.2; 30], &den) < 1e-12);
        // Scattered over [0, 0.4): sd about 0.12, so the mean's error is about 0.12 / √30.
        let uneven: Vec<f64> = (0..30)
            .map(|i| (i * 7919 % 13) as f64 / 13.0 * 0.4)
            .collect();
        let se = ratio_se(&uneven, &den);
        assert!((0.01..0.04).contains(&se), "{se}");
        assert_eq!(se, ratio_se(&uneven, &den), "seeded: the same every time");
    }

    #[test]
    fn a_slow_phase_is_noisier_than_the_same_idle_spread_evenly() {
        let den = vec![1.0; 30];
        let phase: Vec<f64> = (0..30).map(|i| if i < 6 { 1.0 } else { 0.0 }).collect();
        let even = vec![0.2; 30];
        assert!(ratio_se(&phase, &den) > 0.05);
        assert!(ratio_se(&even, &den) < 1e-12);
    }

    #[test]
    fn runs_combine_by_their_spread_or_their_own_error() {
        let (mean, se) = combine(&[(0.10, 0.0), (0.14, 0.0)]);
        assert!((mean - 0.12).abs() < 1e-12);
        assert!((se - 0.02).abs() < 1e-12, "{se}");
        let (_, se) = combine(&[(0.10, 0.05), (0.10, 0.05)]);
        assert!((se - 0.05 / 2f64.sqrt()).abs() < 1e-12, "{se}");
        assert_eq!(combine(&[(0.3, 0.01)]), (0.3, 0.01));
    }
}
