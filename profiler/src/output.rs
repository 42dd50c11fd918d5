//! Turns a recording file into what the user sees: the report on stdout (text or JSON) and
//! flamegraphs plus folded stacks on disk. `record` and `report` both end here, on the same
//! file, so a live run and a later `report` print the same thing. The analysis is
//! `profiler_core::pipeline`'s; this adds the files and the terminal.
use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use profiler_core::{
    Format, Inputs, Report, Subject,
    attribution::waiting::Calibration,
    pipeline::{self, Analyzed, Keep, Loaded},
    report::{flamegraph as folded, json},
};

use crate::{owner, plan::Outputs, timeline_files};
use profiler_core::report::html::Flamegraph;

/// What drawing the flame graphs made: the files, and for an HTML report, each graph again
/// with its narrowest frames left out.
#[derive(Default)]
struct Drawn {
    paths: Vec<PathBuf>,
    embedded: Vec<Flamegraph>,
}

/// What the outputs `out` asks for need kept past the attribution.
fn keep(out: &Outputs) -> Keep {
    Keep {
        timeline: out.draws_timeline(),
        cause_stacks: out.flamegraphs,
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

fn say_written(drawn: &anyhow::Result<Drawn>) {
    if let Ok(d) = drawn {
        for p in &d.paths {
            eprintln!("stallscope: wrote {}", p.display());
        }
    }
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
        let (a, paths) = attribute_and_draw(l, r, out, &calibration);
        say_written(&paths);
        match paths {
            Ok(d) => svgs.extend(d.embedded.into_iter().map(|g| Flamegraph {
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
        let (dir, stem) = flamegraph_place(&recordings[0], out);
        let input = Inputs {
            subject: Subject::Job(&job),
            lanes: &lanes,
            graphs: &svgs,
        };
        timeline_files::write(out, &dir, &format!("{stem}-job"), &input)?;
    }
    drawn
}

fn flamegraph_place(recording: &Path, out: &Outputs) -> (PathBuf, String) {
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
    let (mut analyzed, drawn) = attribute_and_draw(loaded, recording, out, &calibration);
    let events = analyzed.events.take();
    let report = analyzed.report();
    let stdout = std::io::stdout();
    let mut stdout = stdout.lock();
    match segment {
        None => {
            stdout_renderer(out)?.render(&Inputs::report(Subject::One(&report)), &mut stdout)?
        }
        Some(n) => write_segment(&report, out, n, recording, &mut stdout)?,
    }
    stdout.flush()?;
    drop(stdout);
    say_written(&drawn);
    let graphs: &[Flamegraph] = match &drawn {
        Ok(d) => &d.embedded,
        Err(_) => &[],
    };
    let files = events.map_or(Ok(()), |events| {
        let lanes = [analyzed.lanes(events)];
        let (dir, stem) = flamegraph_place(recording, out);
        let input = Inputs {
            subject: Subject::One(&report),
            lanes: &lanes,
            graphs,
        };
        timeline_files::write(out, &dir, &stem, &input)
    });
    drop(report);
    if segment.is_none() {
        // Freeing an hour's model piece by piece takes a tenth of a second; the process is
        // about to exit and the OS takes it back at once. A segment's recorder goes on.
        std::mem::forget(analyzed);
    }
    drawn?;
    files
}

/// Attributes the GPU idle time and, unless told not to, writes the flame graphs and folded
/// stacks: the on- and off-CPU graphs while the attribution runs, each cause's after it. The
/// attribution is made whether or not they can be written.
fn attribute_and_draw(
    loaded: Loaded,
    recording: &Path,
    out: &Outputs,
    calibration: &Calibration,
) -> (Analyzed, anyhow::Result<Drawn>) {
    let (dir, stem) = flamegraph_place(recording, out);
    let keep = keep(out);
    if !out.flamegraphs {
        let (analyzed, ()) = pipeline::attribute(loaded, calibration, keep, |_| ());
        return (analyzed, Ok(Drawn::default()));
    }
    if let Err(e) = std::fs::create_dir_all(&dir) {
        // No graph can be written: their stacks are not kept.
        let keep = Keep {
            cause_stacks: false,
            ..keep
        };
        let (analyzed, ()) = pipeline::attribute(loaded, calibration, keep, |_| ());
        let e = Err(e).with_context(|| format!("cannot create {}", dir.display()));
        return (analyzed, e);
    }
    let embed = out.wants(Format::Html);
    // The on- and off-CPU graphs are drawn after the attribution, not beside it: their folded
    // lines (tens of megabytes for an hour) would otherwise be held at once with the timed
    // samples, the bulk of the memory, which are gone by then.
    let (mut analyzed, ()) = pipeline::attribute(loaded, calibration, keep, |_| ());
    // The timed samples are gone: the graphs reuse their memory.
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free heap pages; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
    let causes = std::mem::take(&mut analyzed.causes);
    let a = &analyzed.analysis;
    let plain = [
        Graph {
            name: "oncpu".into(),
            title: "On-CPU".into(),
            fold: Box::new(move || (folded::on_cpu_folded(a), "samples")),
        },
        Graph {
            name: "offcpu".into(),
            title: "Off-CPU".into(),
            fold: Box::new(move || (folded::off_cpu_folded(a), "us")),
        },
    ];
    let graphs: Vec<Graph<'_>> = plain
        .into_iter()
        .chain(
            causes
                .into_iter()
                .filter(|stacks| !stacks.is_empty())
                .map(|stacks| {
                    let cause = stacks.cause();
                    Graph {
                        name: format!("cause-{}", cause.name()),
                        title: format!("GPU idle time: {}", cause.name()),
                        fold: Box::new(move || folded::cause_lines(a, &stacks)),
                    }
                }),
        )
        .collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, RENDER_THREADS);
    let written = draw(&dir, &stem, graphs, embed, threads);
    (analyzed, written)
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

/// Draws `graphs` on up to `threads` threads; what they wrote comes out in `graphs`' order
/// whatever thread drew each.
fn draw(
    dir: &Path,
    stem: &str,
    graphs: Vec<Graph<'_>>,
    embed: bool,
    threads: usize,
) -> anyhow::Result<Drawn> {
    let queue = std::sync::Mutex::new(graphs.into_iter().enumerate());
    let results = std::sync::Mutex::new(std::collections::BTreeMap::new());
    let work = || {
        loop {
            let next = match queue.lock() {
                Ok(mut q) => q.next(),
                Err(_) => break,
            };
            let Some((i, graph)) = next else { break };
            let done = write_graph(dir, stem, graph, embed);
            if let Ok(mut results) = results.lock() {
                results.insert(i, done);
            }
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..threads {
            let _ = std::thread::Builder::new()
                .name("flamegraph".into())
                .spawn_scoped(scope, work);
        }
        work();
    });
    let results = results
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a flame graph thread panicked"))?;
    let mut written = Drawn::default();
    for done in results.into_values() {
        let (paths, embedded) = done?;
        written.paths.extend(paths);
        written.embedded.extend(embedded);
    }
    Ok(written)
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
