//! Turns a recording file into what the user sees: the report on stdout, and on disk the flame
//! graphs of each recording and the report's timeline files. `record` and `report` both end
//! here, on the same file, so a live run and a later `report` print the same thing. The
//! analysis is `profiler_core::pipeline`'s and every format renders through its `Render`; this
//! adds the files and the terminal.
//!
//! The flame graphs are drawn after the attribution, not beside it: their folded lines (tens of
//! megabytes for an hour) would otherwise be held at once with the timed samples, the bulk of
//! the memory, which are gone by then. They are folded one at a time as each is drawn, on at
//! most `RENDER_THREADS` threads (`profiler_core::report::flamegraph::render`).
use std::{
    fs::File,
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use profiler_core::{
    Format, Inputs, Report, Subject,
    attribution::waiting::Calibration,
    pipeline::{self, Analyzed, Keep, Loaded},
    report::{cause_stacks::CauseStacks, json, model::Flamegraph},
};

use crate::{files, plan::Outputs};

/// What the outputs `out` asks for need kept past the attribution.
fn keep(out: &Outputs) -> Keep {
    Keep {
        timeline: out.draws_timeline(),
        cause_stacks: out.wants(Format::Flamegraph),
    }
}

fn file_name(recording: &Path) -> String {
    recording.file_name().map_or_else(
        || recording.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// The recording folded, not yet attributed.
fn load(recording: &Path) -> anyhow::Result<Loaded> {
    let file = File::open(recording)
        .with_context(|| format!("cannot open recording {}", recording.display()))?;
    let loaded = pipeline::load(file_name(recording), file)
        .with_context(|| format!("cannot read recording {}", recording.display()))?;
    if let Some(t) = &loaded.load.truncated {
        eprintln!(
            "stallscope: warning: {} is cut short at byte {} (the recorder was killed, or its \
             disk filled up); analysed the {} complete records before it",
            recording.display(),
            t.offset,
            t.records_loaded
        );
    }
    Ok(loaded)
}

/// One segment's report as the JSON reader gives it back (`top`'s input): the same pipeline
/// as `report`, no files drawn.
pub fn segment_report(recording: &Path) -> anyhow::Result<profiler_core::report::json::ReportDoc> {
    let loaded = load(recording)?;
    let calibration = pipeline::calibrate(&[&loaded]);
    let out = Outputs {
        formats: vec![Format::Json],
        dir: None,
    };
    let analyzed = attribute(loaded, &out, &calibration);
    let report = analyzed.report();
    let mut bytes = Vec::new();
    json::write_json(&report, &mut bytes)?;
    let name = recording.display().to_string();
    Ok(profiler_core::report::json::read_report(&bytes, &name)?)
}

/// Attributes the GPU idle time of one recording, keeping what `out`'s formats need.
fn attribute(loaded: Loaded, out: &Outputs, calibration: &Calibration) -> Analyzed {
    let (analyzed, ()) = pipeline::attribute(loaded, calibration, keep(out), |_| ());
    // The timed samples are gone: the flame graphs drawn next reuse their memory.
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free heap pages; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
    analyzed
}

/// One recording's flame graphs, beside it: what `report` renders through the flamegraph
/// format, and for an HTML page the graphs again.
fn flamegraphs(
    recording: &Path,
    out: &Outputs,
    report: &Report<'_>,
    causes: &[CauseStacks],
) -> anyhow::Result<Vec<Flamegraph>> {
    let (dir, stem) = place(recording, out);
    let input = Inputs {
        cause_stacks: causes,
        for_page: out.wants(Format::Html),
        ..Inputs::report(Subject::One(report))
    };
    files::flamegraphs(out, &dir, &stem, &input)
}

/// Several recordings of one job (one per host): each one's report, then the ranks across
/// all of them.
pub fn render_many(recordings: &[PathBuf], out: &Outputs) -> anyhow::Result<()> {
    if let [one] = recordings {
        return render(one, out);
    }
    let mut loaded = Vec::new();
    for r in recordings {
        loaded.push(load(r)?);
    }
    let calibration = pipeline::calibrate(&loaded.iter().collect::<Vec<_>>());
    let mut analyzed = Vec::new();
    let mut drawn = Ok(());
    let mut svgs = Vec::new();
    for (r, l) in recordings.iter().zip(loaded) {
        let mut a = attribute(l, out, &calibration);
        let causes = std::mem::take(&mut a.causes);
        match flamegraphs(r, out, &a.report(), &causes) {
            Ok(graphs) => svgs.extend(graphs.into_iter().map(|g| Flamegraph {
                name: format!("{}: {}", a.name, g.name),
                svg: g.svg,
            })),
            Err(e) => drawn = drawn.and(Err(e)),
        }
        analyzed.push(a);
    }
    let events: Vec<_> = analyzed.iter_mut().map(|a| a.events.take()).collect();
    let mut job = pipeline::job_report(&analyzed);
    // The job's report names each recording by the path it was given.
    for ((name, _), path) in job.recordings.iter_mut().zip(recordings) {
        *name = path.display().to_string();
    }
    let stdout = std::io::stdout();
    let mut stdout = stdout.lock();
    stdout_renderer(out)?.render(&Inputs::report(Subject::Job(&job)), &mut stdout)?;
    stdout.flush()?;
    if out.draws_timeline() {
        let lanes: Vec<_> = analyzed
            .iter()
            .zip(events)
            .filter_map(|(a, events)| Some(a.lanes(events?)))
            .collect();
        let (dir, stem) = place(&recordings[0], out);
        let input = Inputs {
            lanes: &lanes,
            graphs: &svgs,
            ..Inputs::report(Subject::Job(&job))
        };
        files::timeline(out, &dir, &format!("{stem}-job"), &input)?;
    }
    drawn
}

/// Where a recording's files go, and the stem of their names.
fn place(recording: &Path, out: &Outputs) -> (PathBuf, String) {
    let dir = out.dir_for(recording);
    let stem = recording
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "stallscope".into());
    (dir, stem)
}

/// The report on stdout, and the flame graphs. The report comes even when a flame graph cannot
/// be written (a full disk); the error, naming the file, comes after it.
pub fn render(recording: &Path, out: &Outputs) -> anyhow::Result<()> {
    render_one(recording, out, None)
}

/// As [`render`], for segment `number` of `record --segment`, while the recording goes on:
/// the report comes under a line naming the segment, or in JSON as
/// `{"segment": N, "recording": PATH, "report": {...}}`, one such document per segment.
pub fn render_segment(recording: &Path, out: &Outputs, number: u32) -> anyhow::Result<()> {
    render_one(recording, out, Some(number))
}

/// The renderer of `out`'s stdout format.
fn stdout_renderer(out: &Outputs) -> anyhow::Result<&'static dyn profiler_core::Render> {
    let format = out.stdout();
    format
        .renderer()
        .with_context(|| format!("this stallscope was built without the {format} format"))
}

fn write_segment(
    report: &Report,
    out: &Outputs,
    number: u32,
    recording: &Path,
    w: &mut dyn Write,
) -> anyhow::Result<()> {
    if out.stdout() == Format::Json {
        json::write_segment(report, number, &recording.display().to_string(), w)?;
    } else {
        writeln!(w, "=== segment {number}: {} ===", recording.display())?;
        stdout_renderer(out)?.render(&Inputs::report(Subject::One(report)), w)?;
    }
    Ok(())
}

fn render_one(recording: &Path, out: &Outputs, segment: Option<u32>) -> anyhow::Result<()> {
    let loaded = load(recording)?;
    let calibration = pipeline::calibrate(&[&loaded]);
    let mut analyzed = attribute(loaded, out, &calibration);
    let events = analyzed.events.take();
    let causes = std::mem::take(&mut analyzed.causes);
    let report = analyzed.report();
    let (dir, stem) = place(recording, out);
    let (drawn, files) = std::thread::scope(|scope| {
        // The timeline's lanes are built, and the files that hold no flame graph (the
        // Perfetto trace) written, while the flame graphs are drawn.
        let timeline = events.map(|events| {
            scope.spawn(|| {
                let lanes = [analyzed.lanes(events)];
                let input = Inputs {
                    lanes: &lanes,
                    ..Inputs::report(Subject::One(&report))
                };
                let written =
                    files::timeline_where(out, &dir, &stem, &input, |f| !f.embeds_flamegraphs());
                (lanes, written)
            })
        });
        // Before the report: the agent takes a segment's folded stacks when its report comes.
        let drawn = flamegraphs(recording, out, &report, &causes);
        let reported = report_on_stdout(&report, out, segment, recording);
        let files = timeline.map_or(Ok(()), |t| {
            let (lanes, written) = t
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            let graphs: &[Flamegraph] = drawn.as_deref().unwrap_or(&[]);
            let input = Inputs {
                lanes: &lanes,
                graphs,
                ..Inputs::report(Subject::One(&report))
            };
            written.and(files::timeline_where(out, &dir, &stem, &input, |f| {
                f.embeds_flamegraphs()
            }))
        });
        (drawn, reported.and(files))
    });
    drop(causes);
    drop(report);
    if segment.is_none() {
        // Freeing an hour's model piece by piece takes a tenth of a second; the process is
        // about to exit and the OS takes it back at once. A segment's recorder goes on.
        std::mem::forget(analyzed);
    }
    drawn?;
    files
}

fn report_on_stdout(
    report: &Report,
    out: &Outputs,
    segment: Option<u32>,
    recording: &Path,
) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut stdout = stdout.lock();
    match segment {
        None => stdout_renderer(out)?.render(&Inputs::report(Subject::One(report)), &mut stdout)?,
        Some(n) => write_segment(report, out, n, recording, &mut stdout)?,
    }
    stdout.flush()?;
    Ok(())
}
