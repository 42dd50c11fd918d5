//! What each command is asked to do, in plain types. `cli` builds them from the flags, the
//! agent builds the recording plans of its recorders, and nothing below `main` reads a clap
//! struct. A recording plan also writes itself back as a `record` command line
//! ([`RecordingPlan::command_line`]), so the agent's child recorders get exactly its plan.
use std::{ffi::OsString, path::PathBuf, time::Duration};

use profiler_core::{Destination, Format};

/// What a recording traces.
#[derive(Clone, Debug, PartialEq)]
pub enum Targets {
    /// Processes already running, with their threads and descendants.
    Running(Running),
    /// A command to launch and trace from its first instruction.
    Launch(Vec<String>),
}

/// Running processes: these PIDs, and every GPU process when asked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Running {
    pub pids: Vec<u32>,
    pub all_gpu_processes: bool,
}

/// The processes [`Running`] chose, and the GPU processes it had to leave out, with why.
pub struct Chosen {
    pub pids: Vec<u32>,
    pub skipped: Vec<(u32, String)>,
}

impl Running {
    /// The PIDs asked for, with every GPU process NVML lists that the caller may trace when
    /// `all_gpu_processes` is set: sorted, each once.
    pub fn choose(&self, nvml_lib: Option<PathBuf>) -> anyhow::Result<Chosen> {
        let mut pids = self.pids.clone();
        let mut skipped = Vec::new();
        if self.all_gpu_processes {
            let found = crate::nvml_reader::all_gpu_processes(nvml_lib)?;
            let (traceable, refused) =
                crate::privileges::split_traceable(crate::privileges::caller_uid(), &found);
            pids.extend(traceable);
            skipped = refused;
        }
        pids.sort_unstable();
        pids.dedup();
        Ok(Chosen { pids, skipped })
    }
}

/// How user stacks are walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Unwind {
    Dwarf,
    Fp,
}

/// How the tracked threads' context switches are seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SwitchHookChoice {
    Auto,
    Tracepoint,
    PerThread,
}

/// What a recording reads beyond the threads' time.
#[derive(Clone, Debug, PartialEq)]
pub struct Signals {
    /// Sample the GPUs through NVML.
    pub gpu: bool,
    /// The NVML library to load (None: `$STALLSCOPE_NVML_LIB`, else the system's).
    pub nvml_lib: Option<PathBuf>,
    /// Uprobes on the CUDA and NCCL libraries the targets map.
    pub cuda_probes: bool,
    /// The Python frames of CPython processes.
    pub python: bool,
    /// Who woke each sampled wait (the `sched_waking` program); off by default for its cost.
    pub wakers: bool,
    pub unwind: Unwind,
    pub switch_hook: SwitchHookChoice,
}

impl Default for Signals {
    fn default() -> Self {
        Self {
            gpu: true,
            nvml_lib: None,
            cuda_probes: true,
            python: true,
            wakers: false,
            unwind: Unwind::Dwarf,
            switch_hook: SwitchHookChoice::Auto,
        }
    }
}

/// How often a recording samples and snapshots.
#[derive(Clone, Debug, PartialEq)]
pub struct Rates {
    /// On-CPU stack samples per second per CPU (0: none).
    pub sample_hz: u64,
    /// How often thread accounting is snapshotted into the timeline.
    pub tick: Duration,
    /// Mean spacing of one thread's off-CPU stack captures (see `OFFCPU_SAMPLE_BURST`).
    pub offcpu_interval: Duration,
    /// Percent of the time the kernel-launch probes are on.
    pub launch_duty: f64,
    /// Most threads tracked at once.
    pub max_threads: u32,
}

impl Default for Rates {
    fn default() -> Self {
        Self {
            sample_hz: 99,
            tick: Duration::from_millis(50),
            offcpu_interval: Duration::from_millis(5),
            launch_duty: 0.25,
            max_threads: profiler_common::MAX_SLOTS,
        }
    }
}

/// What a report is written as, and where its files go.
#[derive(Clone, Debug, PartialEq)]
pub struct Outputs {
    /// Every format asked for, stdout's and the files' (flame graphs unless refused).
    pub formats: Vec<Format>,
    /// Where flame graphs, folded stacks and the timeline files go (None: beside the
    /// recording).
    pub dir: Option<PathBuf>,
}

impl Default for Outputs {
    fn default() -> Self {
        Self {
            formats: vec![Format::Text, Format::Flamegraph],
            dir: None,
        }
    }
}

impl Outputs {
    /// The report's format on stdout: JSON when asked for, else Markdown when asked for,
    /// else text.
    pub fn stdout(&self) -> Format {
        [Format::Json, Format::Markdown]
            .into_iter()
            .find(|f| self.formats.contains(f))
            .unwrap_or(Format::Text)
    }

    pub fn wants(&self, f: Format) -> bool {
        self.formats.contains(&f)
    }

    /// The formats written as one file each (the HTML page, the Perfetto trace), each once:
    /// one per report, where the flame graphs are several files per recording.
    pub fn file_formats(&self) -> Vec<Format> {
        let mut files: Vec<Format> = self
            .formats
            .iter()
            .copied()
            .filter(|f| matches!(f.destination(), Destination::File { .. }))
            .collect();
        files.sort();
        files.dedup();
        files
    }

    /// Whether a format asked for draws the timeline (which keeps the timed events past the
    /// attribution).
    pub fn draws_timeline(&self) -> bool {
        self.formats.iter().any(|f| f.draws_timeline())
    }

    /// Where the flame graphs and timeline files of `recording` go.
    pub fn dir_for(&self, recording: &std::path::Path) -> PathBuf {
        self.dir
            .clone()
            .or_else(|| recording.parent().map(std::path::Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from("."))
    }
}

/// One `record`: what it traces, for how long, what it reads and how often, and what it
/// writes.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordingPlan {
    pub targets: Targets,
    /// None: until interrupted or the targets exit.
    pub duration: Option<Duration>,
    /// The recording file (None: a name from the target and the time).
    pub recording: Option<PathBuf>,
    /// Cut the recording into files of this length, each reported as it ends.
    pub segment: Option<Duration>,
    pub signals: Signals,
    pub rates: Rates,
    pub outputs: Outputs,
}

impl RecordingPlan {
    /// Recording `targets` with every other setting at its default.
    pub fn new(targets: Targets) -> Self {
        Self {
            targets,
            duration: None,
            recording: None,
            segment: None,
            signals: Signals::default(),
            rates: Rates::default(),
            outputs: Outputs::default(),
        }
    }

    /// The arguments of the `stallscope` command line that records this plan, every setting
    /// spelled out (a child recorder then does not depend on its defaults).
    pub fn command_line(&self) -> Vec<OsString> {
        let mut line: Vec<OsString> = vec!["record".into()];
        let mut flag = |name: &str, value: OsString| {
            line.push(format!("--{name}").into());
            line.push(value);
        };
        let secs = |d: Duration| OsString::from(d.as_secs_f64().to_string());
        if let Targets::Running(r) = &self.targets {
            for p in &r.pids {
                flag("pid", p.to_string().into());
            }
        }
        if let Some(d) = self.duration {
            flag("duration", secs(d));
        }
        if let Some(p) = &self.recording {
            flag("output", p.into());
        }
        if let Some(d) = self.segment {
            flag("segment", secs(d));
        }
        let r = &self.rates;
        flag("rate", r.sample_hz.to_string().into());
        flag("tick", secs(r.tick));
        flag("offcpu-interval", secs(r.offcpu_interval));
        flag("launch-duty", r.launch_duty.to_string().into());
        flag("max-threads", r.max_threads.to_string().into());
        let s = &self.signals;
        if let Some(lib) = &s.nvml_lib {
            flag("nvml-lib", lib.into());
        }
        flag("unwind", value_name(s.unwind));
        flag("switch-hook", value_name(s.switch_hook));
        let names: Vec<&str> = self.outputs.formats.iter().map(|f| f.name()).collect();
        flag("format", names.join(",").into());
        if let Some(dir) = &self.outputs.dir {
            flag("flamegraph-dir", dir.into());
        }
        let switches = [
            (
                matches!(&self.targets, Targets::Running(r) if r.all_gpu_processes),
                "--all-gpu-processes",
            ),
            (!s.gpu, "--no-gpu"),
            (!s.cuda_probes, "--no-cuda-probes"),
            (!s.python, "--no-python"),
            (s.wakers, "--wakers"),
            (!self.outputs.wants(Format::Flamegraph), "--no-flamegraphs"),
        ];
        line.extend(
            switches
                .into_iter()
                .filter(|(on, _)| *on)
                .map(|(_, name)| OsString::from(name)),
        );
        if let Targets::Launch(command) = &self.targets {
            line.push("--".into());
            line.extend(command.iter().map(OsString::from));
        }
        line
    }
}

/// The name a value of `v`'s enum is given on the command line.
fn value_name(v: impl clap::ValueEnum) -> OsString {
    v.to_possible_value()
        .expect("no variant is skipped")
        .get_name()
        .into()
}

/// One `stallscope agent`.
#[derive(Clone, Debug)]
pub struct AgentPlan {
    /// Where /metrics is served.
    pub listen: std::net::SocketAddr,
    pub targets: Running,
    pub nvml_lib: Option<PathBuf>,
    /// Each recording segment's length.
    pub segment: Duration,
    /// How long each cause's stacks are kept for /flamegraph (zero: none drawn).
    pub flamegraphs: Duration,
    /// The endpoint's TLS and authentication (exporter-toolkit's format).
    pub web_config: Option<PathBuf>,
}

impl AgentPlan {
    /// The plan of one recorder of `pids`, which writes into `dir`: segments of the agent's
    /// length reported as JSON, with folded stacks only when the agent serves flame graphs.
    pub fn recorder(&self, pids: Vec<u32>, dir: &std::path::Path) -> RecordingPlan {
        let graphs = !self.flamegraphs.is_zero();
        RecordingPlan {
            recording: Some(dir.join("segment.rec")),
            segment: Some(self.segment),
            signals: Signals {
                nvml_lib: self.nvml_lib.clone(),
                ..Signals::default()
            },
            outputs: Outputs {
                formats: [Some(Format::Json), graphs.then_some(Format::Flamegraph)]
                    .into_iter()
                    .flatten()
                    .collect(),
                dir: graphs.then(|| dir.to_path_buf()),
            },
            ..RecordingPlan::new(Targets::Running(Running {
                pids,
                all_gpu_processes: false,
            }))
        }
    }
}

/// `diff`: runs against a baseline.
#[derive(Debug)]
pub struct DiffPlan {
    pub base: PathBuf,
    pub new: PathBuf,
    /// `NAME=PP` thresholds, as given.
    pub thresholds: Vec<String>,
    pub format: Format,
    /// Where the differential flame graphs go (None: beside the new runs).
    pub flamegraph_dir: Option<PathBuf>,
    pub flamegraphs: bool,
}

/// `check`: one run against budgets.
#[derive(Debug)]
pub struct CheckPlan {
    pub run: PathBuf,
    pub budget: PathBuf,
    pub format: Format,
}

/// Which kernel log lines doctor reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Since {
    Boot,
    Last(Duration),
}

/// `doctor`: this host's GPUs, and a job's when `pid` is given.
#[derive(Debug)]
pub struct DoctorPlan {
    pub pid: Option<u32>,
    pub format: Format,
    pub nvml_lib: Option<PathBuf>,
    pub kernel_log_since: Since,
    /// How long the job's GPU memory is watched for growth.
    pub trend: Duration,
    /// Where the kernel module says its version.
    pub driver_version_file: PathBuf,
}

/// `stallscope top`: what to watch, and where its recording is kept, if anywhere.
#[derive(Debug, Clone)]
pub struct TopPlan {
    pub targets: Running,
    /// Keep the one-second segments as `FILE.N.rec`; `None`: a private folder, removed.
    pub keep: Option<PathBuf>,
    pub duration: Option<Duration>,
    pub nvml_lib: Option<PathBuf>,
}

impl TopPlan {
    /// The recording `top` runs: `record`'s defaults, cut every second, into `recording`.
    pub fn recording(&self, recording: PathBuf) -> RecordingPlan {
        RecordingPlan {
            targets: Targets::Running(self.targets.clone()),
            duration: self.duration,
            recording: Some(recording),
            segment: Some(Duration::from_secs(1)),
            signals: Signals {
                nvml_lib: self.nvml_lib.clone(),
                ..Signals::default()
            },
            rates: Rates::default(),
            outputs: Outputs {
                formats: vec![profiler_core::Format::Json],
                dir: None,
            },
        }
    }
}
