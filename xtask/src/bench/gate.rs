//! `bench gate`: how often `stallscope diff` raises a false alarm, and how often it finds a
//! regression of about 5 points of GPU time and names its cause, over N pairs of separate
//! runs of stallgen's healthy job on the simulated GPU (see `stallscope_tests::gate_runs`).
use anyhow::{Context as _, bail};
use stallscope_tests::gate_runs::{Injected, Runner};

use crate::release_bin;

/// Seconds recorded per run.
const RECORD_SECS: u32 = 4;

pub fn gate(pairs: usize) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the gate benchmark records with eBPF: run it as root");
    }
    let release = release_bin("stallscope")
        .parent()
        .context("the release directory")?
        .to_path_buf();
    let dir = std::env::temp_dir().join(format!("stallscope-gate-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut runner = Runner::new(&release, &dir).map_err(anyhow::Error::msg)?;
    eprintln!(
        "gate: {pairs} pairs of each kind, {RECORD_SECS} s recorded per run; each pair is a \
         fresh healthy run against a fresh run with the regression (or another healthy one)"
    );
    println!("| injected | pairs | flagged | named the cause | added (pp, mean ± sd) | target |");
    println!("|---|---|---|---|---|---|");
    let mut ok = true;
    for injected in Injected::ALL {
        let (mut flagged, mut named) = (0, 0);
        let mut added = Vec::new();
        for i in 0..pairs {
            let base = runner
                .record(Injected::Nothing, RECORD_SECS)
                .map_err(anyhow::Error::msg)?;
            let new = runner
                .record(injected, RECORD_SECS)
                .map_err(anyhow::Error::msg)?;
            let v = runner.diff(&base, &new).map_err(anyhow::Error::msg)?;
            let regressed = v.regressed();
            flagged += usize::from(v.code == 1);
            if let Some(cause) = injected.cause() {
                named += usize::from(regressed.iter().any(|r| r == cause));
                added.extend(v.delta_pp(cause));
            }
            eprintln!(
                "gate: {injected:?} pair {}: exit {}, regressed {regressed:?}",
                i + 1,
                v.code
            );
            let _ = std::fs::remove_file(&base);
            let _ = std::fs::remove_file(&new);
        }
        let (mean, sd) = mean_sd(&added);
        let (target, pass) = match injected {
            Injected::Nothing => ("≤ 1 false alarm in 20", flagged * 20 <= pairs),
            _ => ("≥ 19 of 20 found and named", named * 20 >= pairs * 19),
        };
        ok &= pass;
        println!(
            "| {injected:?} | {pairs} | {flagged} | {} | {} | {target}: {} |",
            injected.cause().map_or("-".into(), |_| named.to_string()),
            if added.is_empty() {
                "-".into()
            } else {
                format!("{mean:+.1} ± {sd:.1}")
            },
            if pass { "PASS" } else { "FAIL" }
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    if !ok {
        bail!("a gate target was missed");
    }
    Ok(())
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len().max(2) - 1) as f64;
    (mean, var.sqrt())
}
