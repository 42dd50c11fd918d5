//! `stallscope diff` and `stallscope check`: the regression gate on the command line. Every
//! input is read into a [`Run`] through the JSON report, so a recording and a kept JSON
//! baseline are the same input; what is compared and decided lives in `profiler_core::gate`.
use std::{
    fs::File,
    io::{BufReader, Read, Write as _},
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use profiler_core::{
    attribution::{Cause, Stacks},
    gate::{
        check::{Budget, check},
        diff::{Thresholds, diff},
        input::{InputError, Run},
        render::{write_check, write_diff},
    },
    pipeline::{self, Keep},
    recording::format::MAGIC,
    report::flamegraph,
};

use crate::{
    owner,
    plan::{CheckPlan, DiffPlan},
};

/// The file at `path`, opened once (it may be a pipe), and whether it is a recording: its
/// first bytes are the format's magic. The reader gives the whole file, those bytes included.
fn open_input(path: &Path) -> std::io::Result<(bool, impl Read + Send)> {
    let mut f = File::open(path)?;
    let mut head = Vec::with_capacity(MAGIC.len());
    (&mut f).take(MAGIC.len() as u64).read_to_end(&mut head)?;
    let recording = head == MAGIC;
    Ok((
        recording,
        BufReader::new(std::io::Cursor::new(head).chain(f)),
    ))
}

/// One run from a recording or a JSON report. A recording is streamed through the pipeline,
/// never held whole: its model is the largest thing in memory, and it is freed before this
/// returns.
fn read_run(path: &Path) -> Result<Run, InputError> {
    let file = path.display().to_string();
    let cannot_read = |e: std::io::Error| InputError::new(&file, format!("cannot read it: {e}"));
    let (recording, mut reader) = open_input(path).map_err(cannot_read)?;
    if recording {
        let loaded =
            pipeline::load(&file, reader).map_err(|e| InputError::new(&file, e.to_string()))?;
        if let Some(t) = loaded.load.truncated {
            return Err(InputError::new(
                &file,
                format!(
                    "the recording is cut short at byte {} (the recorder was killed, or its disk \
                     filled up): a partial run is no baseline",
                    t.offset
                ),
            ));
        }
        let analyzed = pipeline::analyze(loaded, Keep::default());
        return Ok(Run::from_report(&analyzed.report(), &file));
    }
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes).map_err(cannot_read)?;
    Run::from_json(&bytes, &file)
}

/// A file's run, or every recording and JSON report in a directory (repeated runs).
fn read_side(path: &Path) -> Result<Vec<Run>, InputError> {
    if !path.is_dir() {
        return Ok(vec![read_run(path)?]);
    }
    let file = path.display().to_string();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| InputError::new(&file, format!("cannot list it: {e}")))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file() && matches!(p.extension().and_then(|e| e.to_str()), Some("rec" | "json"))
        })
        .collect();
    if paths.is_empty() {
        return Err(InputError::new(
            &file,
            "holds no recording (.rec) or JSON report (.json)",
        ));
    }
    paths.sort();
    paths.iter().map(|p| read_run(p)).collect()
}

pub fn run_diff(args: &DiffPlan) -> anyhow::Result<i32> {
    let thresholds = Thresholds::parse(&args.thresholds).map_err(anyhow::Error::msg)?;
    // One side after the other: each recording's model is freed once its run is read, so
    // `diff` needs no more memory than one `report` (loading both at once took 3.7 times as
    // much on an hour-long pair).
    let base = read_side(&args.base)?;
    let new = read_side(&args.new)?;
    let report = diff(&base, &new, &thresholds)?;
    let mut stdout = std::io::stdout().lock();
    write_diff(&report, args.format, &mut stdout).context("writing the diff")?;
    drop(stdout);
    if args.flamegraphs {
        let causes: Vec<&str> = report.changes.iter().map(|c| c.cause.as_str()).collect();
        for path in differential_graphs(&base, &new, &causes, args)? {
            eprintln!("stallscope: wrote {}", path.display());
        }
    }
    Ok(report.exit_code())
}

/// A recording's folded stacks behind each of `causes`; `None` for a JSON report, which has
/// none.
fn cause_lines(path: &Path, causes: &[Cause]) -> anyhow::Result<Option<Vec<Vec<String>>>> {
    let cannot = || format!("cannot read {}", path.display());
    let (recording, reader) = open_input(path).with_context(cannot)?;
    if !recording {
        return Ok(None);
    }
    let loaded = pipeline::load(path.display().to_string(), reader).with_context(cannot)?;
    let keep = Keep {
        cause_stacks: true,
        ..Keep::default()
    };
    let analyzed = pipeline::analyze(loaded, keep);
    Ok(Some(
        causes
            .iter()
            .map(|&cause| {
                analyzed
                    .causes
                    .iter()
                    .find(|s| s.cause() == cause)
                    .map(|s| flamegraph::cause_lines(&analyzed.analysis, s).0)
                    .unwrap_or_default()
            })
            .collect(),
    ))
}

/// For each regressed cause, a differential flame graph of its stacks, the first base run
/// against the first new one, where both are recordings.
fn differential_graphs(
    base: &[Run],
    new: &[Run],
    causes: &[&str],
    args: &DiffPlan,
) -> anyhow::Result<Vec<PathBuf>> {
    let dir = args.flamegraph_dir.clone().unwrap_or_else(|| {
        if args.new.is_dir() {
            args.new.clone()
        } else {
            args.new.parent().map(Path::to_path_buf).unwrap_or_default()
        }
    });
    let mut written = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let causes: Vec<Cause> = causes
        .iter()
        .filter(|&&name| seen.insert(name))
        .filter_map(|&name| Cause::from_name(name))
        .collect();
    if causes.is_empty() {
        return Ok(written);
    }
    // Each side is read once for all its causes, one side after the other.
    let Some(before) = cause_lines(Path::new(&base[0].file), &causes)? else {
        return Ok(written);
    };
    let Some(after) = cause_lines(Path::new(&new[0].file), &causes)? else {
        return Ok(written);
    };
    for ((cause, before), after) in causes.iter().zip(before).zip(after) {
        let name = cause.name();
        if after.is_empty() {
            continue;
        }
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join(format!("stallscope-diff.{name}.svg"));
        let unit = if cause.spec().stacks == Stacks::IoWait {
            "us"
        } else {
            "samples"
        };
        let title = format!("{name}: new against base (red: a larger share)");
        let mut w = std::io::BufWriter::new(owner::create_private(&path)?);
        flamegraph::differential_svg(&before, &after, &title, unit, &mut w)
            .and_then(|()| w.flush())
            .with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

pub fn run_check(args: &CheckPlan) -> anyhow::Result<i32> {
    let name = args.budget.display().to_string();
    let text = std::fs::read_to_string(&args.budget)
        .map_err(|e| InputError::new(&name, format!("cannot read it: {e}")))?;
    let budget = Budget::parse(&text, &name)?;
    let run = read_run(&args.run)?;
    let report = check(&run, &budget)?;
    let mut stdout = std::io::stdout().lock();
    write_check(&report, args.format, &mut stdout).context("writing the check")?;
    Ok(report.exit_code())
}
