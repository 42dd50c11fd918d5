//! The alert rules in `deploy/prometheus/` as Prometheus itself reads them: `promtool check
//! rules` for their syntax, and `promtool test rules` for each alert firing and staying quiet
//! on the series of `alerts_test.yml`.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("deploy/prometheus")
}

/// Debian's `prometheus` package puts promtool in /usr/bin; `cargo xtask test` installs it.
fn promtool() -> PathBuf {
    common::find_tool("promtool").unwrap_or_else(|| {
        panic!("promtool is missing: apt-get install prometheus, or run `cargo xtask test`")
    })
}

fn run(args: &[&str]) -> String {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(deploy())
        .output()
        .expect("runs promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn the_alert_rules_are_valid_prometheus_rules() {
    let out = run(&["check", "rules", "alerts.yml"]);
    assert!(out.contains("SUCCESS: 6 rules found"), "{out}");
}

#[test]
fn every_alert_fires_on_its_case_and_stays_quiet_on_the_others() {
    let out = run(&["test", "rules", "alerts_test.yml"]);
    assert!(out.contains("SUCCESS"), "{out}");
    // Each alert is exercised: a rule nobody tests could be anything.
    let rules = std::fs::read_to_string(deploy().join("alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(deploy().join("alerts_test.yml")).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(alerts.len(), 6, "{alerts:?}");
    for a in alerts {
        let firing = tests
            .split("alertname: ")
            .skip(1)
            .filter(|t| t.starts_with(a) && t.contains("exp_labels"))
            .count();
        assert!(firing > 0, "{a} has no firing case in alerts_test.yml");
    }
}
