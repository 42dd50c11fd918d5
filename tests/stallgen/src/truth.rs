//! The ground-truth file: one JSON line per phase (with ranks, per rank and phase), saying
//! which cause was injected when, on CLOCK_MONOTONIC (the clock of stallscope's recordings),
//! and what the job measured of itself in that phase: the GPU time its kernels took and where
//! the feeder's time went. A test derives its expectations from these, not from constants
//! that hold only on one machine.
use std::{
    fs::File,
    io::{self, BufWriter, Write as _},
    path::Path,
};

use crate::{scenario::Scenario, train::Summary};

/// Which rank a line is about, and the cause it waits for when that is not its phases' own
/// (a healthy rank beside a slow one waits in the all-reduce).
#[derive(Clone, Copy, Debug)]
pub struct RankTag {
    pub rank: usize,
    pub pid: u32,
    pub cause: Option<&'static str>,
}

/// One phase's line: `{"phase", "scenario", "cause", "start_ns", "end_ns", "steps",
/// "gpu_busy_ns", "feeder": {"wait_batch_ns", "copy_ns", "launch_ns", "sync_ns", "host_ns"}}`,
/// plus `"rank"` and `"pid"` for a rank. `gpu_busy_ns` is the kernel time of the phase's steps
/// (the steps that began in it; on a throttled GPU, as long as they took): what NVML counts as
/// busy, leaving out NCCL's kernels.
pub fn line(
    phase: usize,
    scenario: Scenario,
    start_ns: u64,
    end_ns: u64,
    measured: &Summary,
    tag: Option<&RankTag>,
) -> String {
    let mut v = serde_json::json!({
        "phase": phase,
        "scenario": scenario.name(),
        "cause": tag.and_then(|t| t.cause).unwrap_or(scenario.cause()),
        "start_ns": start_ns,
        "end_ns": end_ns,
        "steps": measured.steps,
        "gpu_busy_ns": measured.kernel_ns,
        "feeder": {
            "wait_batch_ns": measured.wait_ns,
            "copy_ns": measured.copy_ns,
            "launch_ns": measured.launch_ns,
            "sync_ns": measured.sync_ns,
            "host_ns": measured.host_ns,
        },
    });
    if let Some(t) = tag {
        v["rank"] = t.rank.into();
        v["pid"] = t.pid.into();
    }
    v.to_string()
}

/// Prefix of a truth line a rank sends its parent.
pub const PARENT_PREFIX: &str = "truth ";

enum Sink {
    Nowhere,
    File(BufWriter<File>),
    /// A rank's pipe to its parent, which writes the file.
    Parent(File),
}

/// Writes phase lines as phases end, flushing each so a killed run keeps the finished ones.
pub struct Truth {
    out: Sink,
    tag: Option<RankTag>,
    /// Each step's own line (`--steps-log`), beside the phases'.
    pub steps: crate::train::StepsLog,
}

impl Truth {
    pub fn create(path: Option<&Path>) -> io::Result<Self> {
        let out = match path {
            Some(p) => Sink::File(BufWriter::new(File::create(p)?)),
            None => Sink::Nowhere,
        };
        Ok(Self {
            out,
            tag: None,
            steps: crate::train::StepsLog::nowhere(),
        })
    }

    /// A rank's truth, sent up `pipe` as `truth <json>` lines.
    pub fn to_parent(pipe: File, tag: RankTag) -> Self {
        Self {
            out: Sink::Parent(pipe),
            tag: Some(tag),
            steps: crate::train::StepsLog::nowhere(),
        }
    }

    /// Writes each step's line to `log` too.
    pub fn log_steps(&mut self, log: crate::train::StepsLog) {
        self.steps = log;
    }

    pub fn record(
        &mut self,
        phase: usize,
        scenario: Scenario,
        start_ns: u64,
        end_ns: u64,
        measured: &Summary,
    ) -> io::Result<()> {
        let text = line(
            phase,
            scenario,
            start_ns,
            end_ns,
            measured,
            self.tag.as_ref(),
        );
        match &mut self.out {
            Sink::Nowhere => Ok(()),
            Sink::File(out) => {
                writeln!(out, "{text}")?;
                out.flush()
            }
            Sink::Parent(pipe) => pipe.write_all(format!("{PARENT_PREFIX}{text}\n").as_bytes()),
        }
    }

    /// The descriptor of a pipe to the parent, which the rank's children must not inherit.
    pub fn fd(&self) -> Option<std::os::fd::RawFd> {
        match &self.out {
            Sink::Parent(pipe) => Some(std::os::fd::AsRawFd::as_raw_fd(pipe)),
            _ => None,
        }
    }

    /// Writes a line a rank sent (the parent's side).
    pub fn forward(&mut self, json: &str) -> io::Result<()> {
        if let Sink::File(out) = &mut self.out {
            writeln!(out, "{json}")?;
            out.flush()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Summary = Summary {
        steps: 0,
        launches: 0,
        kernel_ns: 0,
        secs: 0.0,
        wait_ns: 0,
        copy_ns: 0,
        launch_ns: 0,
        sync_ns: 0,
        host_ns: 0,
    };

    #[test]
    fn line_has_the_agreed_fields() {
        let measured = Summary {
            steps: 3,
            kernel_ns: 300,
            wait_ns: 1,
            copy_ns: 2,
            launch_ns: 3,
            sync_ns: 4,
            host_ns: 5,
            ..NONE
        };
        let v: serde_json::Value =
            serde_json::from_str(&line(2, Scenario::HostCompute, 10, 20, &measured, None)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"phase": 2, "scenario": "host-compute", "cause": "host_compute",
                               "start_ns": 10, "end_ns": 20, "steps": 3, "gpu_busy_ns": 300,
                               "feeder": {"wait_batch_ns": 1, "copy_ns": 2, "launch_ns": 3,
                                          "sync_ns": 4, "host_ns": 5}})
        );
    }

    #[test]
    fn rank_lines_name_the_rank_and_its_cause() {
        let waiting = RankTag {
            rank: 0,
            pid: 41,
            cause: Some("nccl_wait"),
        };
        let v: serde_json::Value = serde_json::from_str(&line(
            0,
            Scenario::NcclStraggler,
            1,
            2,
            &NONE,
            Some(&waiting),
        ))
        .unwrap();
        assert_eq!(
            (v["rank"].as_u64(), v["pid"].as_u64(), v["cause"].as_str()),
            (Some(0), Some(41), Some("nccl_wait"))
        );
        assert_eq!(v["scenario"], "nccl-straggler");
        let slow = RankTag {
            rank: 1,
            pid: 42,
            cause: None,
        };
        let v: serde_json::Value =
            serde_json::from_str(&line(0, Scenario::NcclStraggler, 1, 2, &NONE, Some(&slow)))
                .unwrap();
        assert_eq!(v["cause"], "disk");
    }

    #[test]
    fn writes_one_line_per_phase() {
        let p = std::env::temp_dir().join(format!("stallgen-truth-{}.jsonl", std::process::id()));
        let mut t = Truth::create(Some(&p)).unwrap();
        t.record(0, Scenario::Healthy, 1, 2, &NONE).unwrap();
        t.record(1, Scenario::Disk, 2, 3, &NONE).unwrap();
        t.forward(r#"{"cause":"pcie"}"#).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        let causes: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["cause"].to_string())
            .collect();
        assert_eq!(causes, ["\"none\"", "\"disk\"", "\"pcie\""]);
    }
}
