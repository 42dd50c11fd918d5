//! `stallscope diff` on separate runs of stallgen's healthy job on the simulated GPU: a pair
//! of healthy runs raises no alarm, and a regression of about 5 points of `dataloader_cpu`,
//! `disk` or `pinned_memory_copy` is found and named. A few pairs of each kind; the figures
//! over 20 pairs come from `cargo xtask bench gate`. Root: the runs are recorded.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use common::{Scratch, serial, stallscope::bin};
use stallscope_tests::gate_runs::{Injected, Runner};

const PAIRS: usize = 2;
const RECORD_SECS: u32 = 4;

#[test]
fn healthy_pairs_pass_and_injected_regressions_are_named() {
    let _guard = serial();
    let dir = Scratch::new("gate-pairs");
    let release = bin().parent().expect("a directory").to_path_buf();
    let mut runner = Runner::new(&release, &dir.join("runs")).unwrap();
    let mut failures = Vec::new();
    for injected in Injected::ALL {
        for pair in 1..=PAIRS {
            let base = runner.record(Injected::Nothing, RECORD_SECS).unwrap();
            let new = runner.record(injected, RECORD_SECS).unwrap();
            let v = runner.diff(&base, &new).unwrap();
            let regressed = v.regressed();
            let ok = match injected.cause() {
                None => v.code == 0 && regressed.is_empty(),
                Some(cause) => v.code == 1 && regressed.iter().any(|r| r == cause),
            };
            if !ok {
                failures.push(format!(
                    "{injected:?} pair {pair}: exit {}, regressed {regressed:?}, deltas: {}",
                    v.code, v.json["rows"]
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
