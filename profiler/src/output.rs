//! Turns a recording file into what the user sees: the report on stdout (text or JSON) and
//! flamegraphs plus folded stacks on disk. `record` and `report` both end here, on the same
//! file, so a live run and a later `report` print the same thing.
use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use profiler_core::attribution::{attribute_with, waiting::Calibration};
use profiler_core::{
    Analysis, Folded, JobReport, LoadInfo, Report, analysis::timed_events::TimedEvents,
    attribution::Attribution, attribution::Cause, load_reader, report::flamegraph as folded,
};

use crate::{
    cli::{OutputArgs, OutputFormat},
    owner,
    timeline_files::{self, Subject},
};
use profiler_core::report::html::Flamegraph;
use profiler_core::timeline::{self, TimelineEvents};

/// What drawing the flame graphs made: the files, and for an HTML report, each graph again
/// with its narrowest frames left out.
#[derive(Default)]
struct Drawn {
    paths: Vec<PathBuf>,
    embedded: Vec<Flamegraph>,
}

/// The timed events the timeline files need, kept before the attribution frees them.
fn keep_for_timeline(folded: &Folded, out: &OutputArgs) -> Option<TimelineEvents> {
    timeline_files::wanted(out).then(|| {
        let tick = folded.analysis.meta.as_ref().map_or(0, |m| m.tick_ns);
        TimelineEvents::keep(&folded.timed, tick)
    })
}

fn file_name(recording: &Path) -> String {
    recording.file_name().map_or_else(
        || recording.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// The recording folded, not yet attributed.
fn load(recording: &Path) -> anyhow::Result<(Folded, LoadInfo)> {
    let file = File::open(recording)
        .with_context(|| format!("cannot open recording {}", recording.display()))?;
    let (folded, load) = load_reader(file)
        .with_context(|| format!("cannot read recording {}", recording.display()))?;
    if let Some(t) = &load.truncated {
        eprintln!(
            "stallscope: warning: {} is cut short at byte {} (the recorder was killed, or its \
             disk filled up); analysed the {} complete records before it",
            recording.display(),
            t.offset,
            t.records_loaded
        );
    }
    Ok((folded, load))
}

/// Several recordings of one job (one per host): each one's report, then the ranks across
/// all of them.
pub fn render_many(recordings: &[PathBuf], out: &OutputArgs) -> anyhow::Result<()> {
    if let [one] = recordings {
        return render(one, out);
    }
    let mut folded_all = Vec::new();
    for r in recordings {
        folded_all.push((r, load(r)?));
    }
    // Waiting is told from work by SM activity over the whole job's GPUs: a host whose GPUs
    // all waited is judged against the straggler's.
    let calibration = profiler_core::attribution::waiting::calibration(
        &folded_all
            .iter()
            .map(|(_, (f, _))| &f.analysis)
            .collect::<Vec<_>>(),
    );
    let mut loaded = Vec::new();
    let mut drawn = Ok(());
    let mut svgs = Vec::new();
    let mut kept = Vec::new();
    for (r, (folded, load)) in folded_all {
        let events = keep_for_timeline(&folded, out);
        let (analysis, attribution, paths) = attribute_and_draw(folded, r, out, &calibration);
        match paths {
            Ok(d) => {
                for p in d.paths {
                    eprintln!("stallscope: wrote {}", p.display());
                }
                let file = file_name(r);
                svgs.extend(d.embedded.into_iter().map(|g| Flamegraph {
                    name: format!("{file}: {}", g.name),
                    svg: g.svg,
                }));
            }
            Err(e) => drawn = drawn.and(Err(e)),
        }
        loaded.push((r, analysis, attribution, load));
        kept.push(events);
    }
    let job = JobReport::new(
        loaded
            .iter()
            .map(|(path, a, attribution, load)| {
                (
                    path.display().to_string(),
                    Report::new(a, attribution.as_ref(), load),
                )
            })
            .collect(),
    );
    let stdout = std::io::stdout();
    let mut stdout = stdout.lock();
    out.format().renderer().render_job(&job, &mut stdout)?;
    stdout.flush()?;
    if timeline_files::wanted(out) {
        let lanes: Vec<_> = loaded
            .iter()
            .zip(kept)
            .filter_map(|((path, a, attribution, _), events)| {
                Some(timeline::build(
                    &file_name(path),
                    a,
                    attribution.as_ref(),
                    events?,
                ))
            })
            .collect();
        let (dir, stem) = flamegraph_place(&recordings[0], out);
        timeline_files::write(
            out,
            &dir,
            &format!("{stem}-job"),
            Subject::Job(&job),
            &lanes,
            &svgs,
        )?;
    }
    drawn
}

fn flamegraph_place(recording: &Path, out: &OutputArgs) -> (PathBuf, String) {
    let dir = out.dir_for(recording);
    let stem = recording
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "stallscope".into());
    (dir, stem)
}

/// The report on stdout, and the flame graphs. The report comes even when a flame graph cannot
/// be written (a full disk); the error, naming the file, comes after it.
pub fn render(recording: &Path, out: &OutputArgs) -> anyhow::Result<()> {
    render_one(recording, out, None)
}

/// As [`render`], for segment `number` of `record --segment`, while the recording goes on:
/// the report comes under a line naming the segment, or in JSON as
/// `{"segment": N, "recording": PATH, "report": {...}}`, one such document per segment.
pub fn render_segment(recording: &Path, out: &OutputArgs, number: u32) -> anyhow::Result<()> {
    render_one(recording, out, Some(number))
}

fn write_segment(
    report: &Report,
    format: profiler_core::Format,
    number: u32,
    recording: &Path,
    w: &mut dyn Write,
) -> anyhow::Result<()> {
    match format {
        profiler_core::Format::Json => {
            let mut inner = Vec::new();
            format.renderer().render(report, &mut inner)?;
            let path = serde_json::to_string(&recording.display().to_string())?;
            write!(
                w,
                "{{\"segment\": {number}, \"recording\": {path}, \"report\": "
            )?;
            w.write_all(inner.trim_ascii_end())?;
            writeln!(w, "}}")?;
        }
        profiler_core::Format::Text => {
            writeln!(w, "=== segment {number}: {} ===", recording.display())?;
            format.renderer().render(report, w)?;
        }
    }
    Ok(())
}

fn render_one(recording: &Path, out: &OutputArgs, segment: Option<u32>) -> anyhow::Result<()> {
    let (folded, load) = load(recording)?;
    let calibration = profiler_core::attribution::waiting::calibration(&[&folded.analysis]);
    let events = keep_for_timeline(&folded, out);
    let (analysis, attribution, drawn) = attribute_and_draw(folded, recording, out, &calibration);
    let report = Report::new(&analysis, attribution.as_ref(), &load);
    let stdout = std::io::stdout();
    let mut stdout = stdout.lock();
    match segment {
        None => out.format().renderer().render(&report, &mut stdout)?,
        Some(n) => write_segment(&report, out.format(), n, recording, &mut stdout)?,
    }
    stdout.flush()?;
    drop(stdout);
    let graphs: &[Flamegraph] = match &drawn {
        Ok(d) => {
            for p in &d.paths {
                eprintln!("stallscope: wrote {}", p.display());
            }
            &d.embedded
        }
        Err(_) => &[],
    };
    let files = events.map_or(Ok(()), |events| {
        let lanes = timeline::build(
            &file_name(recording),
            &analysis,
            attribution.as_ref(),
            events,
        );
        let (dir, stem) = flamegraph_place(recording, out);
        timeline_files::write(out, &dir, &stem, Subject::One(&report), &[lanes], graphs)
    });
    drop(report);
    if segment.is_none() {
        // Freeing an hour's model piece by piece takes a tenth of a second; the process is
        // about to exit and the OS takes it back at once. A segment's recorder goes on.
        std::mem::forget(analysis);
    }
    drawn?;
    files
}

/// Attributes the GPU idle time and, unless told not to, writes the flame graphs and folded
/// stacks, returning their paths. The attribution is made whether or not they can be written;
/// the timed samples are gone once it is.
fn attribute_and_draw(
    folded: Folded,
    recording: &Path,
    out: &OutputArgs,
    calibration: &Calibration,
) -> (Analysis, Option<Attribution>, anyhow::Result<Drawn>) {
    let Folded { analysis, timed } = folded;
    let (dir, stem) = flamegraph_place(recording, out);
    if out.no_flamegraphs {
        let attribution = attribute_with(&analysis, &timed, calibration);
        return (analysis, attribution, Ok(Drawn::default()));
    }
    if let Err(e) = std::fs::create_dir_all(&dir) {
        let attribution = attribute_with(&analysis, &timed, calibration);
        let e = Err(e).with_context(|| format!("cannot create {}", dir.display()));
        return (analysis, attribution, e);
    }
    let embed = out.wants(OutputFormat::Html);
    let (attribution, written) =
        draw_while_attributing(&analysis, timed, &dir, &stem, calibration, embed);
    (analysis, attribution, written)
}

/// Flame graphs rendered at once, at most: each holds its folded stacks, tens of megabytes for
/// a long recording, while it renders.
const RENDER_THREADS: usize = 2;

type Fold<'a> = Box<dyn FnOnce() -> (Vec<String>, &'static str) + Send + 'a>;

/// One flame graph to draw: file name part, title, and how to get its folded lines.
struct Graph<'a> {
    name: String,
    title: String,
    fold: Fold<'a>,
}

/// The on- and off-CPU graphs need no attribution, so they render while it runs; each cause's
/// graph follows as soon as its stacks are summed. Graphs come out in a fixed order whatever
/// thread drew them.
fn draw_while_attributing(
    analysis: &Analysis,
    timed: TimedEvents,
    dir: &Path,
    stem: &str,
    calibration: &Calibration,
    embed: bool,
) -> (Option<Attribution>, anyhow::Result<Drawn>) {
    let a = analysis;
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Graph<'_>)>();
    let rx = std::sync::Mutex::new(rx);
    let results = std::sync::Mutex::new(std::collections::BTreeMap::new());
    let draw = || {
        loop {
            let next = match rx.lock() {
                Ok(rx) => rx.recv(),
                Err(_) => break,
            };
            let Ok((i, graph)) = next else {
                break;
            };
            let done = write_graph(dir, stem, graph, embed);
            if let Ok(mut results) = results.lock() {
                results.insert(i, done);
            }
        }
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, RENDER_THREADS);
    let attribution = std::thread::scope(|scope| {
        let plain: [(&str, &str, Fold<'_>); 2] = [
            (
                "oncpu",
                "On-CPU",
                Box::new(|| (folded::on_cpu_folded(a), "samples")),
            ),
            (
                "offcpu",
                "Off-CPU",
                Box::new(|| (folded::off_cpu_folded(a), "us")),
            ),
        ];
        for (i, (name, title, fold)) in plain.into_iter().enumerate() {
            let graph = Graph {
                name: name.into(),
                title: title.into(),
                fold,
            };
            let _ = tx.send((i, graph));
        }
        for _ in 1..threads {
            // Without another thread, this one draws everything once the causes are queued.
            let _ = std::thread::Builder::new()
                .name("flamegraph".into())
                .spawn_scoped(scope, draw);
        }
        let attribution = attribute_with(a, &timed, calibration);
        let causes: Vec<folded::CauseStacks> = Cause::ALL
            .iter()
            .map(|&cause| folded::cause_stacks(&timed, attribution.as_ref(), cause))
            .collect();
        // Nothing reads the timed samples after this: the graphs still to come reuse their
        // memory.
        drop(timed);
        #[cfg(target_env = "gnu")]
        // SAFETY: malloc_trim only releases free heap pages; it has no preconditions.
        unsafe {
            libc::malloc_trim(0);
        }
        for (k, stacks) in causes.into_iter().enumerate() {
            let cause = stacks.cause();
            if stacks.is_empty() {
                continue;
            }
            let graph = Graph {
                name: format!("cause-{}", cause.name()),
                title: format!("GPU idle time: {}", cause.name()),
                fold: Box::new(move || folded::cause_lines(a, &stacks)),
            };
            let _ = tx.send((2 + k, graph));
        }
        drop(tx);
        draw();
        attribution
    });
    let written = results
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a flame graph thread panicked"))
        .and_then(|results| {
            let mut written = Drawn::default();
            for done in results.into_values() {
                let (paths, embedded) = done?;
                written.paths.extend(paths);
                written.embedded.extend(embedded);
            }
            Ok(written)
        });
    (attribution, written)
}

fn write_graph(
    dir: &Path,
    stem: &str,
    graph: Graph<'_>,
    embed: bool,
) -> anyhow::Result<(Vec<PathBuf>, Option<Flamegraph>)> {
    let Graph { name, title, fold } = graph;
    let (lines, unit) = fold();
    if lines.is_empty() {
        return Ok((Vec::new(), None));
    }
    let folded_path = dir.join(format!("{stem}.{name}.folded"));
    let writing = |path: &Path| format!("cannot write {}", path.display());
    let mut w = BufWriter::new(owner::create_private(&folded_path)?);
    folded::write_folded(&lines, &mut w)
        .and_then(|()| w.flush())
        .with_context(|| writing(&folded_path))?;
    let svg_path = dir.join(format!("{stem}.{name}.svg"));
    let mut w = BufWriter::new(owner::create_private(&svg_path)?);
    folded::flamegraph_svg(&lines, &title, unit, &mut w)
        .map_err(anyhow::Error::from)
        .and_then(|()| w.flush().map_err(anyhow::Error::from))
        .with_context(|| writing(&svg_path))?;
    let embedded = if embed {
        let mut svg = Vec::new();
        folded::embedded_svg(&lines, &title, unit, &mut svg)
            .with_context(|| format!("drawing the {name} flame graph for the HTML report"))?;
        Some(Flamegraph {
            name,
            svg: String::from_utf8_lossy(&svg).into_owned(),
        })
    } else {
        None
    };
    Ok((vec![folded_path, svg_path], embedded))
}
