//! The ground-truth file: one JSON line per phase, saying which cause was injected when, on
//! CLOCK_MONOTONIC (the clock of stallscope's recordings).
use std::{
    fs::File,
    io::{self, BufWriter, Write as _},
    path::Path,
};

use crate::scenario::Scenario;

/// One phase's line: `{"phase", "scenario", "cause", "start_ns", "end_ns"}`.
pub fn line(phase: usize, scenario: Scenario, start_ns: u64, end_ns: u64) -> String {
    serde_json::json!({
        "phase": phase,
        "scenario": scenario.name(),
        "cause": scenario.cause(),
        "start_ns": start_ns,
        "end_ns": end_ns,
    })
    .to_string()
}

/// Writes phase lines as phases end, flushing each so a killed run keeps the finished ones.
pub struct Truth {
    out: Option<BufWriter<File>>,
}

impl Truth {
    pub fn create(path: Option<&Path>) -> io::Result<Self> {
        let out = path
            .map(|p| File::create(p).map(BufWriter::new))
            .transpose()?;
        Ok(Self { out })
    }

    pub fn record(
        &mut self,
        phase: usize,
        scenario: Scenario,
        start_ns: u64,
        end_ns: u64,
    ) -> io::Result<()> {
        if let Some(out) = &mut self.out {
            writeln!(out, "{}", line(phase, scenario, start_ns, end_ns))?;
            out.flush()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_has_the_agreed_fields() {
        let v: serde_json::Value =
            serde_json::from_str(&line(2, Scenario::HostCompute, 10, 20)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"phase": 2, "scenario": "host-compute", "cause": "host_compute",
                               "start_ns": 10, "end_ns": 20})
        );
    }

    #[test]
    fn writes_one_line_per_phase() {
        let p = std::env::temp_dir().join(format!("stallgen-truth-{}.jsonl", std::process::id()));
        let mut t = Truth::create(Some(&p)).unwrap();
        t.record(0, Scenario::Healthy, 1, 2).unwrap();
        t.record(1, Scenario::Disk, 2, 3).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        let causes: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["cause"].to_string())
            .collect();
        assert_eq!(causes, ["\"none\"", "\"disk\""]);
    }
}
