//! Command-line interface: `record` captures (root), `report` re-analyses a file (no root).
use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};
use profiler_core::Format;

use crate::plan::{
    AgentPlan, CheckPlan, DiffPlan, DoctorPlan, Outputs, Rates, RecordingPlan, Running, Signals,
    Since, SwitchHookChoice, Targets, TopPlan, Unwind,
};

#[derive(Debug, Parser)]
#[command(
    name = "stallscope",
    version,
    about = "Explains why a GPU training job's GPU sits idle"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Attach to running processes (or launch a command) and record their threads' time.
    Record(RecordArgs),
    /// Analyse a recording made earlier; needs no privileges.
    Report(ReportArgs),
    /// Compare runs against a baseline: exit 1 when a cause's share of GPU time rose.
    #[command(long_about = DIFF_ABOUT, after_help = EXIT_CODES)]
    Diff(DiffArgs),
    /// Hold one run to absolute budgets: exit 1 when one is exceeded.
    #[command(after_help = EXIT_CODES)]
    Check(CheckArgs),
    /// Check this host's GPUs the way the field guides do: driver, kernel log, ECC, PCIe,
    /// clocks and throttling, temperature, power, MIG, memory holders; with --pid, the job's
    /// CUDA devices, runtime and memory trend.
    #[command(after_help = DOCTOR_EXIT_CODES)]
    Doctor(DoctorArgs),
    /// Watch a running job live: each GPU's busy, waiting and idle time, the top cause of
    /// the last seconds and the code behind it, refreshed every second (q quits). Without a
    /// terminal, one line a second.
    #[command(after_help = TOP_KEYS)]
    Top(TopArgs),
    /// Serve record, report, diff, check, doctor, steps, what-if and advice to a coding
    /// assistant as a Model Context Protocol server on stdio; each runs as this command line
    /// would, with the same privileges
    #[command(after_help = MCP_SETUP)]
    Mcp(McpArgs),
    /// Serve this host's GPU time by state and cause, and its GPUs' health, as OpenMetrics on
    /// /metrics, recording the GPU processes (or --pid) continuously.
    Agent(AgentArgs),
    /// Print a shell's completion script, e.g. `stallscope completions bash >
    /// /etc/bash_completion.d/stallscope`.
    Completions(CompletionsArgs),
    /// Write the man pages (stallscope.1 and one per command) into a folder; the release
    /// tarball ships them.
    Manpages(ManpagesArgs),
    /// Close the BPF links inherited as these descriptors (a recording hands over the ones
    /// whose removal waits for the kernel's grace periods).
    #[command(name = "__unprobe", hide = true)]
    Unprobe { fds: Vec<i32> },
}

#[derive(Debug, Clone, Args)]
pub struct CompletionsArgs {
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Clone, Args)]
pub struct ManpagesArgs {
    /// The folder to write them into (created if missing).
    pub dir: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// Address to serve /metrics on, e.g. 0.0.0.0:9464 (port 0: any free port, said on
    /// stderr).
    #[arg(long, value_name = "ADDR")]
    pub listen: std::net::SocketAddr,
    /// A process to record, with its threads and descendants. Repeatable.
    #[arg(
        short,
        long = "pid",
        value_name = "PID",
        required_unless_present = "all_gpu_processes"
    )]
    pub pids: Vec<u32>,
    /// Record every process NVML lists on this host's GPUs, found again for every segment.
    #[arg(long)]
    pub all_gpu_processes: bool,
    /// NVML library to load (default: $STALLSCOPE_NVML_LIB, else libnvidia-ml.so.1).
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// How long each recording segment runs before its seconds are added.
    #[arg(long, value_parser = parse_duration, default_value = "15s")]
    pub segment: Duration,
    /// Keep this long of each cause's stacks and serve them as a flame graph on
    /// /flamegraph?cause=CAUSE (e.g. 10m; 0, the default: off, and the recorders draw none).
    #[arg(long, value_parser = parse_duration, default_value = "0s", value_name = "DURATION")]
    pub flamegraphs: Duration,
    /// TLS, client certificates, basic-auth users and response headers for the endpoint, in
    /// the Prometheus exporter-toolkit's web config format (node_exporter's
    /// --web.config.file). Without it /metrics is plain HTTP, open to anyone who reaches the
    /// port; /flamegraph serves the job's function names and file paths.
    #[arg(long = "web.config.file", value_name = "FILE")]
    pub web_config: Option<PathBuf>,
}

const TOP_KEYS: &str = "Keys: g next GPU, c next cause (t: back to the top one), space or f \
                        freeze the display, q or Ctrl-C quit (the probes are removed).";

#[derive(Debug, Clone, Args)]
pub struct TopArgs {
    /// A process to watch, with its threads and descendants. Repeatable.
    #[arg(
        short,
        long = "pid",
        value_name = "PID",
        required_unless_present = "all_gpu_processes"
    )]
    pub pids: Vec<u32>,
    /// Watch every process NVML lists on this host's GPUs.
    #[arg(long)]
    pub all_gpu_processes: bool,
    /// Keep the recording, one file a second (FILE.1.rec, FILE.2.rec, ...; `stallscope
    /// report` reads them). Without it nothing is kept.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Stop after this long (default: until q, Ctrl-C, or the targets' exit).
    #[arg(short, long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// NVML library to load (default: $STALLSCOPE_NVML_LIB, else libnvidia-ml.so.1).
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
}

impl From<TopArgs> for TopPlan {
    fn from(a: TopArgs) -> Self {
        TopPlan {
            targets: Running {
                pids: a.pids,
                all_gpu_processes: a.all_gpu_processes,
            },
            keep: a.output,
            duration: a.duration,
            nvml_lib: a.nvml_lib,
        }
    }
}

const MCP_SETUP: &str = "An assistant starts it itself, e.g. in its MCP settings: \
                         {\"command\": \"sudo\", \"args\": [\"stallscope\", \"mcp\"]} \
                         (root to record; report, diff and check need none).";

#[derive(Debug, Clone, Args)]
pub struct McpArgs {
    /// Where `record` writes the recordings it is not given a path for (default: a folder
    /// private to the user in the temporary directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// NVML library for `record` and `doctor` (default: $STALLSCOPE_NVML_LIB, else
    /// libnvidia-ml.so.1).
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
}

const DOCTOR_EXIT_CODES: &str = "Exit status: 0 every check passed (or could not run, which is \
                                 said with its reason), 1 a warning, 2 a failure, 3 doctor \
                                 itself could not run (no such --pid).";

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Also check this process: its CUDA_VISIBLE_DEVICES against the physical GPUs, the CUDA
    /// runtime it loaded against the driver, its allocator and DataLoader settings, and its
    /// GPU memory trend.
    #[arg(short, long)]
    pub pid: Option<u32>,
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = one_of(Format::names(Format::DOCTOR)))]
    pub format: Format,
    /// NVML library to load (default: $STALLSCOPE_NVML_LIB, else libnvidia-ml.so.1).
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// Kernel log lines to read: `boot` (all of them), or those of the last DURATION (e.g.
    /// 1h, 30m).
    #[arg(long, value_name = "boot|DURATION", default_value = "boot", value_parser = parse_since)]
    pub kernel_log_since: Since,
    /// How long to watch the --pid process's GPU memory for steady growth.
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    pub trend: Duration,
    /// Where the kernel module says its version (a test seam for machines without the module).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/proc/driver/nvidia/version",
        hide = true
    )]
    pub driver_version_file: PathBuf,
}

fn parse_since(s: &str) -> Result<Since, String> {
    if s.trim() == "boot" {
        Ok(Since::Boot)
    } else {
        parse_duration(s).map(Since::Last)
    }
}

const DIFF_ABOUT: &str =
    "Compare runs against a baseline: exit 1 when a cause's share of GPU time rose.

Per GPU, each cause's share of GPU time (its idle time over the time NVML sampled), the idle
share and the busy share, base against new. A share regresses when it rose by at least its
threshold (3 percentage points unless --threshold says otherwise) and by more than 1.645
standard errors of the difference: one-sided 95% confidence that it rose at all. Each side's
error is the larger of the spread between its runs (a directory of repeated runs) and a
circular block bootstrap over each run's seconds (2000 resamples, blocks of n^(1/3)
seconds, seeded: the same inputs give the same verdict). A fall by as much is reported as an
improvement and never fails.";

const EXIT_CODES: &str = "Exit status: 0 no regression (within budget), 1 a regression (over budget), 2 a usage or \
                          input error (an unreadable or cut-short file, a JSON report of another version, an \
                          empty directory, runs of different GPUs); the message names the file.";

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The baseline: a recording, a JSON report (`report --format json`), or a directory of
    /// either (repeated runs).
    pub base: PathBuf,
    /// The runs to judge, in the same forms.
    pub new: PathBuf,
    /// Percentage points of GPU time a share must rise by to fail: CAUSE=PP, idle=PP or
    /// any=PP (default any=3). Repeatable.
    #[arg(long = "threshold", value_name = "NAME=PP")]
    pub thresholds: Vec<String>,
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = one_of(Format::names(Format::GATE)))]
    pub format: Format,
    /// Where to write a differential flame graph per regressed cause, where both sides'
    /// first runs are recordings (default: beside NEW).
    #[arg(long, value_name = "DIR")]
    pub flamegraph_dir: Option<PathBuf>,
    /// Write no differential flame graphs.
    #[arg(long, conflicts_with = "flamegraph_dir")]
    pub no_flamegraphs: bool,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// A recording or a JSON report.
    pub run: PathBuf,
    /// A TOML file of budgets: `idle = "15%"`, `dataloader_cpu = "5%"` (at most),
    /// `busy = "80%"` (at least), `lost_events = 0` (at most), `step_ms_p50 = "120ms"` (the
    /// training step's median, at most; also p90 and p99).
    #[arg(long, value_name = "FILE")]
    pub budget: PathBuf,
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = one_of(Format::names(Format::GATE)))]
    pub format: Format,
}

#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// What to write: `text`, `json` or `markdown` on stdout; `perfetto` (a .pftrace for
    /// ui.perfetto.dev), `html` (one self-contained page) and `flamegraph` (SVG and folded
    /// stacks, on-CPU, off-CPU and per cause; always, unless --no-flamegraphs) as files beside
    /// the recording. Several may be given, comma-separated or repeated (e.g. `--format
    /// text,html,perfetto`); of the stdout formats, json wins over markdown, and markdown over
    /// text.
    #[arg(
        long,
        value_name = "FORMAT",
        default_value = "text",
        value_delimiter = ',',
        action = clap::ArgAction::Append,
        value_parser = one_of(Format::names(Format::REPORT)),
    )]
    pub format: Vec<Format>,
    /// The same as --format json.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// Where to write flamegraphs, folded stacks and the Perfetto and HTML files (default:
    /// next to the recording).
    #[arg(long, value_name = "DIR")]
    pub flamegraph_dir: Option<PathBuf>,
    /// Write no flamegraphs or folded stacks (an HTML report then has none): leaves out the
    /// `flamegraph` format.
    #[arg(long)]
    pub no_flamegraphs: bool,
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// PID of a running process to trace, with all its threads and descendants. Repeatable.
    #[arg(
        short,
        long = "pid",
        value_name = "PID",
        required_unless_present_any = ["command", "all_gpu_processes"]
    )]
    pub pids: Vec<u32>,
    /// Trace every process NVML lists on this host's GPUs (each rank of a job), with their
    /// descendants. Combines with --pid.
    #[arg(long, conflicts_with = "command")]
    pub all_gpu_processes: bool,
    /// Stop after this long (e.g. 30s, 2m, 500ms). Default: until Ctrl-C or the target exits.
    #[arg(short, long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Recording file (default: stallscope-<pid>-<timestamp>.rec).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Cut the recording into back-to-back files of this length, FILE.1.rec, FILE.2.rec, ...
    /// (at least 1s), each a recording of its own, reported as soon as it ends, while the
    /// probes stay attached: a long recording (the agent's) covers the job without gaps.
    /// With --format json, each report comes as one document:
    /// `{"segment": N, "recording": PATH, "report": {...}}`.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub segment: Option<Duration>,
    /// On-CPU stack sampling rate per CPU, in Hz (0 turns sampling off).
    #[arg(short, long, default_value_t = 99)]
    pub rate: u64,
    /// How often thread accounting is snapshotted into the timeline.
    #[arg(long, value_parser = parse_duration, default_value = "50ms")]
    pub tick: Duration,
    /// NVML library to load (default: $STALLSCOPE_NVML_LIB, else libnvidia-ml.so.1).
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// Do not sample the GPUs (host-side report only).
    #[arg(long)]
    pub no_gpu: bool,
    /// Do not put uprobes on the CUDA and NCCL libraries the targets map.
    #[arg(long)]
    pub no_cuda_probes: bool,
    /// Percent of the time the kernel-launch probes are on (100: always; fractions allowed),
    /// in one on-period every 8 s. A uprobe costs microseconds per hit (14 µs on our test
    /// VM), and each on-period costs a launch-bound job about 35 ms more as its probes are
    /// added and removed, so launch counts are sampled in short on-periods and scaled: at
    /// the default 0.25% (20 ms every 8 s), our launch-bound test job (200k kernels/s) ran at
    /// 0.984 of its untraced rate, against 0.997 with the launch probes off.
    #[arg(long, value_name = "PCT", default_value_t = 0.25, value_parser = parse_percent)]
    pub launch_duty: f64,
    /// Most threads of the target's tree tracked at once (112 bytes of kernel memory each).
    /// Threads created while every slot is in use are not traced; the report counts them
    /// as lost `thread_untracked` events.
    #[arg(long, value_name = "N", default_value_t = profiler_common::MAX_SLOTS, value_parser = clap::value_parser!(u32).range(1..=i64::from(profiler_common::MAX_SLOTS)))]
    pub max_threads: u32,
    /// Mean spacing of off-CPU stack captures per thread (up to four in a row after a quiet
    /// spell, so that a wait just after a short one is not skipped).
    #[arg(long, value_parser = parse_duration, default_value = "5ms")]
    pub offcpu_interval: Duration,
    /// How user stacks are walked. `dwarf`: the kernel also copies the top 16 KiB of the
    /// stack and its registers, and a walk by frame pointers that stops short is redone
    /// from that copy with each object's DWARF CFI (.eh_frame), so code built without frame
    /// pointers (CPython, libtorch, Rust release builds) does not end the stack. `fp`: frame
    /// pointers only.
    #[arg(long, value_enum, default_value_t = Unwind::Dwarf)]
    pub unwind: Unwind,
    /// How the tracked threads' context switches are seen. `tracepoint`: `sched_switch`,
    /// whose program runs on every switch of the host, tracked or not (measured: 3.4% off an
    /// unrelated ping-pong, 9.6% off a traced one). `per-thread`: a context-switch perf
    /// event on each tracked thread (inherited by the threads it creates), which untracked
    /// switches do not run (about 2% off the unrelated ping-pong) but which costs each
    /// tracked switch about four times more (38% off the traced one): for a quiet job on a
    /// busy shared host. `auto` (the default) measures both rates for 0.2 s before attaching
    /// and takes per-thread events when the target makes under 5% of the host's switches
    /// (and the others over 1,000/s); it keeps measuring at each tick, moves to the
    /// tracepoint at the first tick where the target passes 8%, and back once it stays under
    /// 5% for 1 s (doubled by each move back, up to 64 s). Each move is said on stderr.
    #[arg(long, value_enum, env = "STALLSCOPE_SWITCH_HOOK", default_value_t = SwitchHookChoice::Auto)]
    pub switch_hook: SwitchHookChoice,
    /// Leave out the Python frames. By default the stacks of CPython processes (3.8 to 3.13)
    /// carry their Python frames (function, file, line) in place of the interpreter loop's.
    #[arg(long)]
    pub no_python: bool,
    /// Also say who woke each sampled wait (`blocked_on[].wakers`): a program on the kernel's
    /// `sched_waking` tracepoint then runs for every wake-up on the host (about 46 ns each,
    /// most of them leaving at once for a thread not traced; 2 points of a wake-up storm's
    /// throughput on 2 CPUs), which is why it is not on by default.
    #[arg(long)]
    pub wakers: bool,
    #[command(flatten)]
    pub out: OutputArgs,
    /// Launch this command and trace it from its first instruction.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The recording to analyse; several recordings of one job (one per host) are reported
    /// together, with the NCCL ranks across them.
    #[arg(required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub out: OutputArgs,
}

impl From<OutputArgs> for Outputs {
    fn from(a: OutputArgs) -> Self {
        let mut formats = a.format;
        if a.json {
            formats.push(Format::Json);
        }
        // Flame graphs come with every report unless refused, whatever else is asked for.
        if a.no_flamegraphs {
            formats.retain(|&f| f != Format::Flamegraph);
            if formats.is_empty() {
                formats.push(Format::Text);
            }
        } else if !formats.contains(&Format::Flamegraph) {
            formats.push(Format::Flamegraph);
        }
        Outputs {
            formats,
            dir: a.flamegraph_dir,
        }
    }
}

impl From<RecordArgs> for RecordingPlan {
    fn from(a: RecordArgs) -> Self {
        let targets = if a.command.is_empty() {
            Targets::Running(Running {
                pids: a.pids,
                all_gpu_processes: a.all_gpu_processes,
            })
        } else {
            Targets::Launch(a.command)
        };
        RecordingPlan {
            targets,
            duration: a.duration,
            recording: a.output,
            segment: a.segment,
            signals: Signals {
                gpu: !a.no_gpu,
                nvml_lib: a.nvml_lib,
                cuda_probes: !a.no_cuda_probes,
                python: !a.no_python,
                wakers: a.wakers,
                unwind: a.unwind,
                switch_hook: a.switch_hook,
            },
            rates: Rates {
                sample_hz: a.rate,
                tick: a.tick,
                offcpu_interval: a.offcpu_interval,
                launch_duty: a.launch_duty,
                max_threads: a.max_threads,
            },
            outputs: a.out.into(),
        }
    }
}

impl From<AgentArgs> for AgentPlan {
    fn from(a: AgentArgs) -> Self {
        AgentPlan {
            listen: a.listen,
            targets: Running {
                pids: a.pids,
                all_gpu_processes: a.all_gpu_processes,
            },
            nvml_lib: a.nvml_lib,
            segment: a.segment,
            flamegraphs: a.flamegraphs,
            web_config: a.web_config,
        }
    }
}

impl From<DiffArgs> for DiffPlan {
    fn from(a: DiffArgs) -> Self {
        DiffPlan {
            base: a.base,
            new: a.new,
            thresholds: a.thresholds,
            format: a.format,
            flamegraph_dir: a.flamegraph_dir,
            flamegraphs: !a.no_flamegraphs,
        }
    }
}

impl From<CheckArgs> for CheckPlan {
    fn from(a: CheckArgs) -> Self {
        CheckPlan {
            run: a.run,
            budget: a.budget,
            format: a.format,
        }
    }
}

impl From<DoctorArgs> for DoctorPlan {
    fn from(a: DoctorArgs) -> Self {
        DoctorPlan {
            pid: a.pid,
            format: a.format,
            nvml_lib: a.nvml_lib,
            kernel_log_since: a.kernel_log_since,
            trend: a.trend,
            driver_version_file: a.driver_version_file,
        }
    }
}

/// A parser for one of a format's `names`, listed in `--help`, into what `FromStr` makes of it.
fn one_of<const N: usize>(
    names: [&'static str; N],
) -> impl clap::builder::TypedValueParser<Value = Format> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(names).map(|name| {
        name.parse::<Format>()
            .unwrap_or_else(|_| unreachable!("{name} is one of the possible values"))
    })
}

/// A percentage from 0 to 100, fractions allowed, with or without a `%`.
pub fn parse_percent(s: &str) -> Result<f64, String> {
    match s.trim().trim_end_matches('%').parse::<f64>() {
        Ok(p) if (0.0..=100.0).contains(&p) => Ok(p),
        Ok(p) => Err(format!("{p} is not a percentage from 0 to 100")),
        Err(e) => Err(format!("{s:?} is not a number: {e}")),
    }
}

/// Parses `30s`, `2m`, `500ms`, `1h` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (try 30s, 2m or 500ms)"))?;
    let secs = match unit {
        "" | "s" => value,
        "ms" => value / 1e3,
        "us" => value / 1e6,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{s}` (use ms, s, m or h)"
            ));
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("`{s}` is not a valid duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("stallscope").chain(args.iter().copied()))
    }

    #[test]
    fn record_by_pid() {
        let cli = parse(&[
            "record", "--pid", "42", "-p", "43", "-d", "2s", "-o", "x.rec", "--json",
        ])
        .unwrap();
        let Command::Record(r) = cli.command else {
            panic!("not record")
        };
        assert_eq!(r.pids, [42, 43]);
        assert_eq!(r.duration, Some(Duration::from_secs(2)));
        assert_eq!(r.output.as_deref(), Some(std::path::Path::new("x.rec")));
        assert_eq!(Outputs::from(r.out).stdout(), Format::Json);
        assert_eq!(r.rate, 99);
    }

    #[test]
    fn launch_duty_takes_fractions_of_a_percent() {
        let duty = |args: &[&str]| match parse(args).map(|c| c.command) {
            Ok(Command::Record(r)) => Ok(r.launch_duty),
            Ok(_) => panic!("not record"),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(duty(&["record", "-p", "1"]), Ok(0.25));
        assert_eq!(
            duty(&["record", "-p", "1", "--launch-duty", "1.5%"]),
            Ok(1.5)
        );
        assert_eq!(
            duty(&["record", "-p", "1", "--launch-duty", "100"]),
            Ok(100.0)
        );
        let err = duty(&["record", "-p", "1", "--launch-duty", "101"]).unwrap_err();
        assert!(err.contains("not a percentage from 0 to 100"), "{err}");
        assert!(duty(&["record", "-p", "1", "--launch-duty", "NaN"]).is_err());
        let on = crate::capture::probes::cuda::LaunchDuty::from_percent(0.25).on;
        assert_eq!(on, Duration::from_millis(20));
    }

    #[test]
    fn record_launch_mode() {
        let cli = parse(&["record", "--", "python", "train.py", "--epochs", "1"]).unwrap();
        let Command::Record(r) = cli.command else {
            panic!("not record")
        };
        assert!(r.pids.is_empty());
        assert_eq!(r.command, ["python", "train.py", "--epochs", "1"]);
    }

    #[test]
    fn record_needs_a_target() {
        assert!(parse(&["record"]).is_err());
        assert!(parse(&["record", "--pid", "abc"]).is_err());
    }

    #[test]
    fn report_takes_a_file() {
        let cli = parse(&["report", "a.rec", "--json"]).unwrap();
        let Command::Report(r) = cli.command else {
            panic!("not report")
        };
        assert_eq!(r.files, [PathBuf::from("a.rec")]);
        assert_eq!(Outputs::from(r.out).stdout(), Format::Json);
    }

    #[test]
    fn format_by_name_with_json_as_an_alias() {
        let format = |args: &[&str]| match parse(args).map(|c| c.command) {
            Ok(Command::Report(r)) => Ok(Outputs::from(r.out).stdout()),
            Ok(_) => panic!("not report"),
            Err(e) => Err(e.kind()),
        };
        assert_eq!(format(&["report", "a.rec"]), Ok(Format::Text));
        assert_eq!(
            format(&["report", "a.rec", "--format", "json"]),
            Ok(Format::Json)
        );
        assert_eq!(
            format(&["report", "a.rec", "--format", "text"]),
            Ok(Format::Text)
        );
        assert_eq!(
            format(&["report", "a.rec", "--format", "yaml"]),
            Err(clap::error::ErrorKind::InvalidValue)
        );
        assert_eq!(
            format(&["report", "a.rec", "--format", "text", "--json"]),
            Err(clap::error::ErrorKind::ArgumentConflict)
        );
        assert_eq!(
            format(&["report", "a.rec", "--format", "html,json"]),
            Ok(Format::Json)
        );
        let Command::Report(r) = parse(&[
            "report", "a.rec", "--format", "perfetto", "--format", "html",
        ])
        .unwrap()
        .command
        else {
            panic!("not report")
        };
        let out = Outputs::from(r.out);
        assert!(out.wants(Format::Perfetto) && out.wants(Format::Html));
        assert_eq!(out.stdout(), Format::Text);
        assert_eq!(out.file_formats(), [Format::Html, Format::Perfetto]);
        assert_eq!(
            format(&["report", "a.rec", "--format", "markdown,html"]),
            Ok(Format::Markdown)
        );
    }

    /// Flame graphs are a format like the others: on unless refused, whatever else is asked,
    /// and named like the others.
    #[test]
    fn flame_graphs_are_a_format_on_by_default() {
        let formats = |args: &[&str]| match parse(args).map(|c| c.command) {
            Ok(Command::Report(r)) => Outputs::from(r.out).formats,
            other => panic!("{args:?}: {other:?}"),
        };
        assert_eq!(
            formats(&["report", "a.rec"]),
            [Format::Text, Format::Flamegraph]
        );
        assert_eq!(
            formats(&["report", "a.rec", "--json"]),
            [Format::Text, Format::Json, Format::Flamegraph]
        );
        assert_eq!(
            formats(&["report", "a.rec", "--format", "flamegraph,html"]),
            [Format::Flamegraph, Format::Html]
        );
        assert_eq!(
            formats(&["report", "a.rec", "--format", "json", "--no-flamegraphs"]),
            [Format::Json]
        );
        assert_eq!(
            formats(&[
                "report",
                "a.rec",
                "--format",
                "flamegraph",
                "--no-flamegraphs"
            ]),
            [Format::Text]
        );
        let out = Outputs::from(
            match parse(&["report", "a.rec", "--format", "flamegraph"]) {
                Ok(Cli {
                    command: Command::Report(r),
                }) => r.out,
                other => panic!("{other:?}"),
            },
        );
        assert_eq!(out.stdout(), Format::Text);
        assert!(out.file_formats().is_empty(), "{:?}", out.file_formats());
    }

    /// One enum drives every `--format`, each command taking its own formats only.
    #[test]
    fn each_command_takes_its_own_formats() {
        let kind = |args: &[&str]| parse(args).map(|_| ()).map_err(|e| e.kind());
        for f in Format::GATE {
            assert_eq!(
                kind(&["diff", "a", "b", "--format", f.name()]),
                Ok(()),
                "{f}"
            );
        }
        for f in Format::DOCTOR {
            assert_eq!(kind(&["doctor", "--format", f.name()]), Ok(()), "{f}");
        }
        let invalid = Err(clap::error::ErrorKind::InvalidValue);
        assert_eq!(kind(&["diff", "a", "b", "--format", "html"]), invalid);
        assert_eq!(
            kind(&["check", "a", "--budget", "b", "--format", "perfetto"]),
            invalid
        );
        assert_eq!(kind(&["doctor", "--format", "markdown"]), invalid);
    }

    fn plan_of(args: &[std::ffi::OsString]) -> RecordingPlan {
        let cli =
            Cli::try_parse_from(std::iter::once("stallscope".into()).chain(args.iter().cloned()))
                .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let Command::Record(r) = cli.command else {
            panic!("not record")
        };
        r.into()
    }

    /// The plan's defaults are the flags' defaults: a plan built in code (the agent's) records
    /// what the same flags would.
    #[test]
    fn a_plan_defaults_to_what_the_flags_default_to() {
        let plan = plan_of(&["record".into(), "-p".into(), "7".into()]);
        assert_eq!(
            plan,
            RecordingPlan::new(Targets::Running(Running {
                pids: vec![7],
                all_gpu_processes: false
            }))
        );
    }

    /// A plan written as a command line reads back as the same plan, every setting changed
    /// from its default included: the agent's recorders get exactly the plan it made.
    #[test]
    fn a_plan_reads_back_from_its_command_line() {
        let changed = RecordingPlan {
            targets: Targets::Running(Running {
                pids: vec![3, 5],
                all_gpu_processes: true,
            }),
            duration: Some(Duration::from_millis(2500)),
            recording: Some(PathBuf::from("/tmp/dir with space/x.rec")),
            segment: Some(Duration::from_secs(15)),
            signals: Signals {
                gpu: false,
                nvml_lib: Some(PathBuf::from("/opt/libnvidia-ml.so.1")),
                cuda_probes: false,
                python: false,
                wakers: true,
                unwind: Unwind::Fp,
                switch_hook: SwitchHookChoice::PerThread,
            },
            rates: Rates {
                sample_hz: 0,
                tick: Duration::from_millis(20),
                offcpu_interval: Duration::from_micros(2500),
                launch_duty: 1.5,
                max_threads: 100,
            },
            outputs: Outputs {
                formats: vec![Format::Json, Format::Html, Format::Perfetto],
                dir: Some(PathBuf::from("graphs")),
            },
        };
        let launched = RecordingPlan::new(Targets::Launch(vec![
            "python".into(),
            "train.py".into(),
            "--epochs".into(),
            "1".into(),
        ]));
        for plan in [
            changed,
            launched,
            RecordingPlan::new(Targets::Running(Running {
                pids: vec![9],
                all_gpu_processes: false,
            })),
        ] {
            assert_eq!(plan_of(&plan.command_line()), plan);
        }
        let agent = AgentPlan {
            listen: "127.0.0.1:0".parse().unwrap(),
            targets: Running::default(),
            nvml_lib: Some(PathBuf::from("/x/libnvidia-ml.so")),
            segment: Duration::from_secs(15),
            flamegraphs: Duration::from_secs(600),
            web_config: None,
        };
        let recorder = agent.recorder(vec![11, 12], std::path::Path::new("/scratch/r1"));
        assert_eq!(plan_of(&recorder.command_line()), recorder);
        assert_eq!(recorder.outputs.stdout(), Format::Json);
        assert!(recorder.outputs.wants(Format::Flamegraph));
        let without = AgentPlan {
            flamegraphs: Duration::ZERO,
            ..agent.clone()
        }
        .recorder(vec![11], std::path::Path::new("/scratch/r2"));
        assert_eq!(plan_of(&without.command_line()), without);
        assert_eq!(without.outputs.formats, [Format::Json]);
        assert_eq!(
            recorder
                .outputs
                .dir_for(std::path::Path::new("/scratch/r1/segment.rec")),
            PathBuf::from("/scratch/r1")
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("3 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }
}
