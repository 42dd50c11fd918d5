//! `bench unwind`: how readable the stacks are, frame pointers alone against DWARF CFI, and
//! with the Python frames. stallscope launches stallgen (a Rust release build, without frame
//! pointers) and the real PyTorch DataLoader job (tests/pyjob/train.py: CPython 3.11 and
//! libtorch, built without frame pointers) on the simulated GPU once per mode and scenario,
//! one after the other in one run; each recording's samples are read back for the share with
//! an `[unknown]` frame and the median depth of their user stacks, with the recorder's time
//! per DWARF unwind and the job's own steps per second under each mode.
use std::{path::Path, process::Command};

use anyhow::{Context as _, bail};
use profiler_core::Analysis;

use crate::release_bin;

/// A job to record: stallgen or the torch job, and its scenario.
#[derive(Clone, Copy)]
enum Job {
    Stallgen(&'static str),
    Torch(&'static str),
}

const JOBS: [Job; 3] = [
    Job::Stallgen("host-compute"),
    Job::Stallgen("dataloader-cpu"),
    Job::Torch("dataloader-cpu"),
];

/// How a recording walks stacks: `stallscope record` flags.
const FP: (&str, &[&str]) = ("fp", &["--unwind", "fp", "--no-python"]);
const DWARF: (&str, &[&str]) = ("dwarf", &["--unwind", "dwarf", "--no-python"]);
const PYTHON: (&str, &[&str]) = ("python", &["--unwind", "dwarf"]);

impl Job {
    fn name(self) -> String {
        match self {
            Job::Stallgen(s) => s.to_string(),
            Job::Torch(s) => format!("torch {s}"),
        }
    }

    fn modes(self) -> &'static [(&'static str, &'static [&'static str])] {
        match self {
            Job::Stallgen(_) => &[FP, DWARF],
            Job::Torch(_) => &[FP, DWARF, PYTHON],
        }
    }

    fn command(self, torch: Option<&Path>) -> anyhow::Result<Vec<std::ffi::OsString>> {
        Ok(match self {
            Job::Stallgen(s) => vec![
                release_bin("stallgen").into(),
                "--scenario".into(),
                s.into(),
            ],
            Job::Torch(s) => vec![
                torch.context("the torch job needs its virtualenv")?.into(),
                crate::root().join("tests/pyjob/train.py").into(),
                "--scenario".into(),
                s.into(),
            ],
        })
    }
}

/// What one recording's stacks look like.
struct Readability {
    samples: u64,
    with_unknown: u64,
    median_depth: usize,
    complete_pct: f64,
    us_per_dwarf_unwind: Option<f64>,
    steps_per_sec: f64,
}

fn user_depth(frames: &[String]) -> usize {
    frames
        .iter()
        .filter(|f| !f.ends_with("_[k]") && !f.starts_with('['))
        .count()
}

fn readability(a: &Analysis, steps_per_sec: f64) -> Readability {
    // Every on-CPU sample counts once, as does every captured off-CPU sample's stack.
    let weighted = a
        .cpu_samples
        .iter()
        .map(|s| (s.stack, s.samples))
        .chain(a.off_cpu.iter().map(|s| (s.stack, 1)));
    let (mut samples, mut with_unknown) = (0, 0);
    let mut depths = Vec::new();
    for (stack, n) in weighted {
        let Some(frames) = a.stacks.get(&stack) else {
            continue;
        };
        samples += n;
        if frames.iter().any(|f| f == "[unknown]") {
            with_unknown += n;
        }
        depths.extend(std::iter::repeat_n(user_depth(frames), n as usize));
    }
    depths.sort_unstable();
    let u = a.unwinding.clone().unwrap_or_default();
    Readability {
        samples,
        with_unknown,
        median_depth: depths.get(depths.len() / 2).copied().unwrap_or(0),
        complete_pct: 100.0 * u.complete as f64 / u.samples().max(1) as f64,
        us_per_dwarf_unwind: (u.dwarf_walks > 0)
            .then(|| u.dwarf_ns as f64 / 1e3 / u.dwarf_walks as f64),
        steps_per_sec,
    }
}

fn record(
    dir: &Path,
    job: Job,
    (mode, flags): (&str, &[&str]),
    secs: u32,
    torch: Option<&Path>,
) -> anyhow::Result<Readability> {
    let lib = dir.join("lib");
    let tag = job.name().replace(' ', "-");
    let out = dir.join(format!("{tag}-{mode}.rec"));
    let state = dir.join(format!("gpu-{tag}-{mode}"));
    let run = Command::new(release_bin("stallscope"))
        .arg("record")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg("--nvml-lib")
        .arg(lib.join("libnvidia-ml.so.1"))
        .env("STALLSCOPE_SIMGPU_STATE", &state)
        .arg("--")
        .args(job.command(torch)?)
        .args(["--secs", &secs.to_string()])
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .context("running stallscope record")?;
    let name = job.name();
    if !run.status.success() {
        bail!(
            "stallscope record ({mode}) of {name} failed: {}",
            String::from_utf8_lossy(&run.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&run.stdout);
    // stallgen prints its rate; the torch job its steps and seconds.
    let steps_per_sec = stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix("steps_per_sec="))
        .and_then(|v| v.parse().ok())
        .or_else(|| stdout.lines().find_map(super::overhead::parse_totals))
        .unwrap_or(f64::NAN);
    let bytes = std::fs::read(&out).with_context(|| format!("reading {}", out.display()))?;
    let (folded, _) = profiler_core::load_reader(&bytes[..])
        .with_context(|| format!("loading {}", out.display()))?;
    Ok(readability(&folded.analysis, steps_per_sec))
}

pub fn unwind(secs: u32) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the unwind benchmark loads eBPF programs: run it as root");
    }
    let dir = std::env::temp_dir().join(format!("stallscope-bench-unwind-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    simgpu_state::install_dir(&crate::root().join("target/release"), &dir.join("lib"))?;
    println!(
        "{:<22} {:<6} {:>8} {:>10} {:>7} {:>9} {:>10} {:>10}",
        "job", "stacks", "samples", "[unknown]", "depth", "complete", "µs/unwind", "steps/s"
    );
    let torch = crate::setup::ensure_torch()?;
    for job in JOBS {
        for &mode in job.modes() {
            let r = record(&dir, job, mode, secs, Some(&torch))?;
            println!(
                "{:<22} {:<6} {:>8} {:>9.1}% {:>7} {:>8.1}% {:>10} {:>10.2}",
                job.name(),
                mode.0,
                r.samples,
                100.0 * r.with_unknown as f64 / r.samples.max(1) as f64,
                r.median_depth,
                r.complete_pct,
                r.us_per_dwarf_unwind
                    .map_or("-".to_string(), |us| format!("{us:.1}")),
                r.steps_per_sec,
            );
        }
    }
    println!(
        "[unknown]: samples with any unnamed frame; depth: median user frames (Python frames \
         included); complete: the recorder's count of unwinds that reached the thread's first \
         frame; stacks: fp = frame pointers alone, dwarf = DWARF CFI, python = DWARF CFI with \
         the Python frames (the default)"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
