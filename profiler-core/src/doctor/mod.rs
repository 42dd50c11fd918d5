//! `stallscope doctor`: the field guides' host checks as judgements over readings. The readings
//! (NVML, procfs, the kernel log) are gathered by the binary; everything here is pure, so each
//! rule is unit-tested with the values that trip it.
//!
//! A check is pass, warn, fail, or unavailable (it could not run: no permission, NVML lacks
//! the call), never left out; each carries its evidence and the guide's fix in one line.
use std::fmt::Write as _;

use serde::Serialize;

pub mod gpu;
pub mod kernel_log;
pub mod target;
pub mod versions;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Unavailable,
    Warn,
    Fail,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Unavailable => "unavailable",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    /// The GPU's NVML index, for a per-GPU check.
    pub gpu: Option<u32>,
    pub evidence: String,
    /// What the guides would do about it; absent on a pass.
    pub fix: Option<String>,
}

impl Check {
    pub fn new(name: &'static str, status: Status, evidence: impl Into<String>) -> Self {
        Check {
            name,
            status,
            gpu: None,
            evidence: evidence.into(),
            fix: None,
        }
    }

    pub fn pass(name: &'static str, evidence: impl Into<String>) -> Self {
        Check::new(name, Status::Pass, evidence)
    }

    pub fn warn(name: &'static str, evidence: impl Into<String>, fix: &str) -> Self {
        Check::new(name, Status::Warn, evidence).fix(fix)
    }

    pub fn fail(name: &'static str, evidence: impl Into<String>, fix: &str) -> Self {
        Check::new(name, Status::Fail, evidence).fix(fix)
    }

    /// A check that could not run, and why.
    pub fn unavailable(name: &'static str, reason: impl Into<String>) -> Self {
        Check::new(name, Status::Unavailable, reason)
    }

    pub fn fix(mut self, fix: &str) -> Self {
        self.fix = Some(fix.to_owned());
        self
    }

    pub fn on_gpu(mut self, gpu: u32) -> Self {
        self.gpu = Some(gpu);
        self
    }
}

/// A reading, or why it could not be taken (the check it feeds is then `unavailable`).
pub type Reading<T> = Result<T, String>;

/// Every check of one run, in the order they ran.
#[derive(Debug, Default, Serialize)]
pub struct Diagnosis {
    pub checks: Vec<Check>,
}

impl Diagnosis {
    pub fn worst(&self) -> Status {
        self.checks
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(Status::Pass)
    }

    /// 0 when all passed, 1 on a warning, 2 on a failure. A check that could not run does not
    /// fail the host: it is said, with its reason.
    pub fn exit_code(&self) -> i32 {
        match self.worst() {
            Status::Pass | Status::Unavailable => 0,
            Status::Warn => 1,
            Status::Fail => 2,
        }
    }

    pub fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("checks serialize")
    }

    /// One line per check, worst first within the order they ran, then a summary.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            let gpu = c.gpu.map(|g| format!("GPU {g} ")).unwrap_or_default();
            let _ = writeln!(
                out,
                "{:<11} {gpu}{}: {}",
                c.status.name().to_uppercase(),
                c.name,
                c.evidence
            );
            if let Some(fix) = &c.fix {
                let _ = writeln!(out, "{:<11} fix: {fix}", "");
            }
        }
        let _ = writeln!(
            out,
            "\n{} checks: {} pass, {} warn, {} fail, {} unavailable",
            self.checks.len(),
            self.count(Status::Pass),
            self.count(Status::Warn),
            self.count(Status::Fail),
            self.count(Status::Unavailable)
        );
        out
    }
}

/// `bytes` in GiB with one decimal, as nvidia-smi users read memory.
pub(crate) fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_code_is_the_worst_status() {
        let mut d = Diagnosis::default();
        assert_eq!(d.exit_code(), 0);
        d.checks.push(Check::pass("a", "fine"));
        d.checks.push(Check::unavailable("b", "no permission"));
        assert_eq!(d.exit_code(), 0);
        d.checks.push(Check::warn("c", "hot", "cool it"));
        assert_eq!(d.exit_code(), 1);
        d.checks.push(Check::fail("d", "ECC", "replace it"));
        assert_eq!(d.exit_code(), 2);
    }

    #[test]
    fn json_has_the_documented_fields() {
        let d = Diagnosis {
            checks: vec![Check::fail("ecc", "2 uncorrectable", "drain it").on_gpu(1)],
        };
        let v: serde_json::Value = serde_json::from_str(&d.to_json()).unwrap();
        let c = &v["checks"][0];
        assert_eq!(c["name"], "ecc");
        assert_eq!(c["status"], "fail");
        assert_eq!(c["gpu"], 1);
        assert_eq!(c["evidence"], "2 uncorrectable");
        assert_eq!(c["fix"], "drain it");
    }
}
