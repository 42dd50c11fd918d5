//! `cargo xtask fuzz`: coverage-guided fuzzing (cargo-fuzz, libFuzzer) of the recording
//! decoder and the report chain; the targets live in `fuzz/` (see fuzz/README.md).
//!
//! Installs cargo-fuzz (pinned) and checks for the nightly toolchain (sanitizers need it),
//! then runs each target for its share of the time, from a scratch corpus under `fuzz/target`
//! that starts empty each run and is read together with the checked-in seeds, which nothing
//! writes to. Prints each target's executions, rate, coverage and peak memory, and fails,
//! naming the input libFuzzer saved, when a target crashed, hung or ran out of memory.
use std::{
    fs::File,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::{cargo, root, run as run_cmd};

/// The fuzz targets, in the order they run.
pub const TARGETS: [&str; 2] = ["decode", "report"];
/// Builds with this workspace's stable (1.95) and nightly (1.97) toolchains.
pub const CARGO_FUZZ_VERSION: &str = "0.13.2";
/// libFuzzer's limits: a run over this RSS, a single allocation over it, or an input taking
/// longer than the timeout, is a failure with its input saved.
const RSS_LIMIT_MB: u32 = 2048;
const TIMEOUT_S: u32 = 10;

/// What one target's run did.
#[derive(Clone, Debug, Default)]
pub struct FuzzStats {
    pub target: String,
    /// Inputs run (libFuzzer's `number_of_executed_units`).
    pub executions: u64,
    /// Wall time of the fuzzer, from its start to its exit (build excluded).
    pub seconds: f64,
    pub execs_per_sec: f64,
    /// Coverage at the end: libFuzzer's `cov:` (edges) and `ft:` (features).
    pub cov: Option<u64>,
    pub ft: Option<u64>,
    /// `corp:` at the end: inputs / bytes of the working corpus.
    pub corpus: Option<String>,
    /// Inputs that found new coverage (`new_units_added`).
    pub new_units: u64,
    pub peak_rss_mb: Option<u64>,
    /// The input libFuzzer saved when the target crashed, hung or ran out of memory.
    pub crash: Option<PathBuf>,
    /// libFuzzer's whole output.
    pub log: PathBuf,
}

/// The command line: `targets` defaults to both.
pub fn main(minutes: f64, target: Option<&str>) -> anyhow::Result<()> {
    let targets: Vec<&str> = match target {
        Some(t) => vec![t],
        None => TARGETS.to_vec(),
    };
    run(minutes, &targets).map(|_| ())
}

/// Fuzzes each of `targets` for its share of `minutes` (at least one second each) and prints
/// a summary. `Err` when a target crashed (the message names the saved input) or when the
/// set-up or build failed; `cargo xtask test` calls this with a small budget.
pub fn run(minutes: f64, targets: &[&str]) -> anyhow::Result<Vec<FuzzStats>> {
    if !minutes.is_finite() || minutes <= 0.0 {
        bail!("--minutes must be a positive number, not {minutes}");
    }
    if targets.is_empty() {
        bail!("no fuzz target given (there are {TARGETS:?})");
    }
    if let Some(t) = targets.iter().find(|t| !TARGETS.contains(t)) {
        bail!("no fuzz target {t:?} (there are {TARGETS:?})");
    }
    ensure_tools()?;
    let fuzz_dir = root().join("fuzz");
    let share_s = ((minutes * 60.0 / targets.len() as f64).round() as u64).max(1);

    let mut stats = Vec::new();
    for &target in targets {
        let started = Instant::now();
        run_cmd(fuzz_cmd("build", &fuzz_dir).arg(target))
            .with_context(|| format!("building fuzz target {target}"))?;
        eprintln!(
            "xtask fuzz: built {target} in {:.0} s; fuzzing it for {share_s} s",
            started.elapsed().as_secs_f64()
        );
        stats.push(fuzz_one(&fuzz_dir, target, share_s)?);
    }

    eprintln!("xtask fuzz: summary");
    for s in &stats {
        eprintln!("  {}", summary(s));
    }
    let crashed: Vec<String> = stats
        .iter()
        .filter_map(|s| {
            s.crash
                .as_ref()
                .map(|c| format!("{}: {} (log {})", s.target, c.display(), s.log.display()))
        })
        .collect();
    if !crashed.is_empty() {
        bail!(
            "fuzzing found a crash:\n  {}\nreproduce with `cargo +nightly fuzz run <target> <file>`; \
             once fixed, add the file under fuzz/regressions/ (see fuzz/README.md)",
            crashed.join("\n  ")
        );
    }
    Ok(stats)
}

/// One line about a target's run.
pub fn summary(s: &FuzzStats) -> String {
    let opt = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
    format!(
        "{}: {} executions in {:.1} s ({:.0} exec/s), cov: {} ft: {}, corpus {}, {} new units, \
         peak RSS {} MB, {}",
        s.target,
        s.executions,
        s.seconds,
        s.execs_per_sec,
        opt(s.cov),
        opt(s.ft),
        s.corpus.as_deref().unwrap_or("?"),
        s.new_units,
        opt(s.peak_rss_mb),
        match &s.crash {
            Some(c) => format!("CRASH: {}", c.display()),
            None => "no crash".to_owned(),
        }
    )
}

/// cargo-fuzz at the pinned version, and a nightly toolchain.
fn ensure_tools() -> anyhow::Result<()> {
    let nightly = Command::new("rustc")
        .args(["+nightly", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !nightly {
        eprintln!("xtask fuzz: installing the nightly toolchain (sanitizers need it)");
        run_cmd(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
    }
    let want = format!("cargo-fuzz {CARGO_FUZZ_VERSION}");
    let have = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    if have.as_deref() != Some(want.as_str()) {
        eprintln!(
            "xtask fuzz: installing {want} (found {})",
            have.as_deref().unwrap_or("none")
        );
        run_cmd(cargo().args([
            "install",
            "cargo-fuzz",
            "--version",
            CARGO_FUZZ_VERSION,
            "--locked",
        ]))?;
    }
    Ok(())
}

/// `cargo +nightly fuzz <sub> --fuzz-dir fuzz`. Through rustup's `cargo` (not `$CARGO`, the
/// stable toolchain's own binary, which does not take `+nightly`), with the toolchain
/// choices of the `cargo xtask` that runs this cleared so that they do not leak into it.
fn fuzz_cmd(sub: &str, fuzz_dir: &Path) -> Command {
    let mut c = Command::new("cargo");
    c.current_dir(root())
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("CARGO")
        .args(["+nightly", "fuzz", sub, "--fuzz-dir"])
        .arg(fuzz_dir);
    c
}

fn fuzz_one(fuzz_dir: &Path, target: &str, seconds: u64) -> anyhow::Result<FuzzStats> {
    let scratch = fuzz_dir.join("target/corpus").join(target);
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch)
            .with_context(|| format!("clearing {}", scratch.display()))?;
    }
    std::fs::create_dir_all(&scratch)?;
    let seeds = fuzz_dir.join("corpus").join(target);
    let log_path = fuzz_dir.join("target/logs").join(format!("{target}.log"));
    std::fs::create_dir_all(log_path.parent().expect("a parent"))?;
    let mut log =
        File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;

    let mut cmd = fuzz_cmd("run", fuzz_dir);
    cmd.arg(target)
        // New inputs go to the first directory; the seeds are only read.
        .arg(&scratch)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg("-print_final_stats=1")
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-timeout={TIMEOUT_S}"))
        // Edge values as postcard varints: a mutation seldom builds a 10-byte u64 by itself.
        .arg(format!(
            "-dict={}",
            fuzz_dir.join("recording.dict").display()
        ))
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
    let stderr = child.stderr.take().context("the fuzzer's stderr")?;

    let mut s = FuzzStats {
        target: target.to_owned(),
        log: log_path.clone(),
        ..FuzzStats::default()
    };
    let mut failing = false;
    // `cargo fuzz run` builds again first (a no-op unless a source changed since): the time
    // counts from when the fuzzer itself starts.
    let mut fuzzing_since = None;
    for line in BufReader::new(stderr).lines() {
        let line = line.context("reading the fuzzer's output")?;
        if fuzzing_since.is_none() && line.trim_start().starts_with("Running `") {
            fuzzing_since = Some(Instant::now());
        }
        writeln!(log, "{line}")?;
        parse_line(&line, &mut s);
        failing |= line.starts_with("==") || line.contains("panicked at");
        // Keep the terminal to progress and failures; the log has everything.
        if failing
            || line.contains("\tpulse ")
            || line.contains("\tINITED ")
            || line.contains("\tDONE ")
            || line.starts_with("stat::")
            || line.contains("Test unit written to")
        {
            eprintln!("[{target}] {line}");
        }
    }
    let status = child.wait()?;
    s.seconds = fuzzing_since.unwrap_or(started).elapsed().as_secs_f64();
    if s.seconds > 0.0 {
        s.execs_per_sec = s.executions as f64 / s.seconds;
    }
    if !status.success() && s.crash.is_none() {
        bail!(
            "fuzz target {target} failed with {status} without saving an input; see {}",
            log_path.display()
        );
    }
    Ok(s)
}

/// The value after `key` (`cov:`, `ft:`, ...) in a libFuzzer status line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let mut words = line.split_whitespace();
    words.by_ref().find(|w| *w == key)?;
    words.next()
}

fn parse_line(line: &str, s: &mut FuzzStats) {
    if let Some(v) = field(line, "cov:").and_then(|v| v.parse().ok()) {
        s.cov = Some(v);
    }
    if let Some(v) = field(line, "ft:").and_then(|v| v.parse().ok()) {
        s.ft = Some(v);
    }
    if let Some(v) = field(line, "corp:") {
        s.corpus = Some(v.to_owned());
    }
    // `#123\tNEW ...`: the execution count so far, for a run that never prints its stats.
    if let Some(n) = line
        .strip_prefix('#')
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
    {
        s.executions = s.executions.max(n);
    }
    if let Some((key, value)) = line.strip_prefix("stat::").and_then(|l| l.split_once(':')) {
        let value: u64 = value.trim().parse().unwrap_or(0);
        match key {
            "number_of_executed_units" => s.executions = value,
            "new_units_added" => s.new_units = value,
            "peak_rss_mb" => s.peak_rss_mb = Some(value),
            _ => {}
        }
    }
    // A slow unit is only a report (libFuzzer goes on); the timeout turns a hang into a crash.
    if let Some((_, path)) = line.split_once("Test unit written to ")
        && !path.contains("slow-unit-")
    {
        s.crash = Some(PathBuf::from(path.trim()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_libfuzzer_output() {
        let mut s = FuzzStats::default();
        for line in [
            "#2\tINITED cov: 120 ft: 130 corp: 16/30Kb exec/s: 0 rss: 40Mb",
            "#4096\tpulse  cov: 1500 ft: 4100 corp: 200/50Kb lim: 8296 exec/s: 2048 rss: 90Mb",
            "#9000\tDONE   cov: 1600 ft: 4400 corp: 230/61Kb lim: 8296 exec/s: 3000 rss: 95Mb",
            "stat::number_of_executed_units: 9001",
            "stat::average_exec_per_sec:     3000",
            "stat::new_units_added:          214",
            "stat::peak_rss_mb:              97",
        ] {
            parse_line(line, &mut s);
        }
        assert_eq!((s.cov, s.ft), (Some(1600), Some(4400)));
        assert_eq!(s.corpus.as_deref(), Some("230/61Kb"));
        assert_eq!(
            (s.executions, s.new_units, s.peak_rss_mb),
            (9001, 214, Some(97))
        );
        assert_eq!(s.crash, None);
        parse_line(
            "artifact_prefix='/w/fuzz/artifacts/decode/'; Test unit written to /w/fuzz/artifacts/decode/crash-ab12",
            &mut s,
        );
        assert_eq!(
            s.crash,
            Some(PathBuf::from("/w/fuzz/artifacts/decode/crash-ab12"))
        );
    }
}
