//! The Perfetto trace and the HTML report of one recording, or of several recordings of one
//! job: written beside the recording (or in `--flamegraph-dir`), each file's path then said
//! with how to open it.
use std::{
    io::{BufWriter, Write as _},
    path::Path,
};

use anyhow::Context as _;
use profiler_core::{
    JobReport, Report,
    report::html::{self, Flamegraph},
    report::perfetto,
    timeline::RecordingLanes,
};

use crate::{
    cli::{OutputArgs, OutputFormat},
    owner,
};

/// Whether `out` asks for either timeline file, which keeps the timed events past the
/// attribution.
pub fn wanted(out: &OutputArgs) -> bool {
    out.wants(OutputFormat::Perfetto) || out.wants(OutputFormat::Html)
}

/// What one report draws on: the page is one report, or a job's.
pub enum Subject<'r, 'a> {
    One(&'r Report<'a>),
    Job(&'r JobReport<'a>),
}

/// Writes the files `out` asks for, as `<dir>/<stem>.pftrace` and `<dir>/<stem>.html`, and
/// says where they went. `graphs` are the flame graphs for the page.
pub fn write(
    out: &OutputArgs,
    dir: &Path,
    stem: &str,
    subject: Subject<'_, '_>,
    lanes: &[RecordingLanes<'_>],
    graphs: &[Flamegraph],
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let clock_note = match &subject {
        Subject::Job(job) => Some(job.clock_note.as_str()),
        Subject::One(_) => None,
    };
    if out.wants(OutputFormat::Perfetto) {
        let path = dir.join(format!("{stem}.pftrace"));
        write_file(&path, |w| perfetto::write_trace(lanes, clock_note, w))?;
        eprintln!(
            "stallscope: wrote {}: open it at https://ui.perfetto.dev (Open trace file)",
            path.display()
        );
    }
    if out.wants(OutputFormat::Html) {
        let path = dir.join(format!("{stem}.html"));
        write_file(&path, |w| match &subject {
            Subject::One(r) => html::write_page(html::Page::One(r), lanes, graphs, w),
            Subject::Job(j) => html::write_page(html::Page::Job(j), lanes, graphs, w),
        })?;
        let shown = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        eprintln!(
            "stallscope: wrote {}: open file://{} in a browser (it needs no network)",
            path.display(),
            shown.display()
        );
    }
    Ok(())
}

fn write_file(
    path: &Path,
    body: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    let mut w = BufWriter::new(owner::create_private(path)?);
    body(&mut w)
        .and_then(|()| w.flush())
        .with_context(|| format!("cannot write {}", path.display()))
}
