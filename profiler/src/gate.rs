//! `stallscope diff` and `stallscope check`: the regression gate on the command line. Every
//! input is read into a [`Run`] through the JSON report, so a recording and a kept JSON
//! baseline are the same input; what is compared and decided lives in `profiler_core::gate`.
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use profiler_core::{
    gate::{
        check::{Budget, check},
        diff::{Thresholds, diff},
        input::{InputError, Run},
        render::{write_check, write_diff},
    },
    load_reader,
    recording::format::MAGIC,
    report::json::to_json_value,
};

use crate::cli::{CheckArgs, DiffArgs};

/// One run from a recording or a JSON report.
fn read_run(path: &Path) -> Result<Run, InputError> {
    let file = path.display().to_string();
    let bytes =
        std::fs::read(path).map_err(|e| InputError::new(&file, format!("cannot read it: {e}")))?;
    if bytes.starts_with(&MAGIC) {
        let (folded, load) =
            load_reader(&bytes[..]).map_err(|e| InputError::new(&file, e.to_string()))?;
        if let Some(t) = load.truncated {
            return Err(InputError::new(
                &file,
                format!(
                    "the recording is cut short at byte {} (the recorder was killed, or its disk \
                     filled up): a partial run is no baseline",
                    t.offset
                ),
            ));
        }
        let analyzed = folded.analyzed(load);
        return Run::from_json(&to_json_value(&analyzed.report()), &file);
    }
    let json: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        InputError::new(
            &file,
            format!("neither a recording nor a JSON report ({e})"),
        )
    })?;
    Run::from_json(&json, &file)
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

pub fn run_diff(args: &DiffArgs) -> anyhow::Result<i32> {
    let thresholds = Thresholds::parse(&args.thresholds).map_err(anyhow::Error::msg)?;
    let base = read_side(&args.base)?;
    let new = read_side(&args.new)?;
    let report = diff(&base, &new, &thresholds)?;
    let mut stdout = std::io::stdout().lock();
    write_diff(&report, args.format, &mut stdout).context("writing the diff")?;
    Ok(report.exit_code())
}

pub fn run_check(args: &CheckArgs) -> anyhow::Result<i32> {
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
