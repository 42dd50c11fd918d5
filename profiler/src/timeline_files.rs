//! The Perfetto trace and the HTML report of one recording, or of several recordings of one
//! job: written beside the recording (or in `--flamegraph-dir`), each file's path then said
//! with how to open it.
use std::{
    io::{BufWriter, Write as _},
    path::{Path, PathBuf},
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
/// says where they went. `svgs` are the flame graphs already written.
pub fn write(
    out: &OutputArgs,
    dir: &Path,
    stem: &str,
    subject: Subject<'_, '_>,
    lanes: &[RecordingLanes<'_>],
    svgs: &[PathBuf],
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
        let mut graphs = Vec::new();
        for svg in svgs
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "svg"))
        {
            let text = std::fs::read_to_string(svg)
                .with_context(|| format!("cannot read {} back", svg.display()))?;
            graphs.push(Flamegraph {
                name: graph_name(svg),
                svg: text,
            });
        }
        let path = dir.join(format!("{stem}.html"));
        write_file(&path, |w| match &subject {
            Subject::One(r) => html::write_page(html::Page::One(r), lanes, &graphs, w),
            Subject::Job(j) => html::write_page(html::Page::Job(j), lanes, &graphs, w),
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

/// `run.cause-disk.svg` → `cause-disk`.
fn graph_name(svg: &Path) -> String {
    let name = svg
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.rsplit_once('.')
        .map_or(name.clone(), |(_, kind)| kind.to_owned())
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
