//! The flame-graph format: one recording's on- and off-CPU graphs and each cause's, each
//! written as `<name>.folded` and `<name>.svg` through the caller's [`Files`] and, when an HTML
//! page is written too, drawn again for it from the same folded lines (they are not folded
//! twice).
//!
//! Each graph is folded only when its turn comes, on at most [`RENDER_THREADS`] threads, and
//! holds its folded lines (tens of megabytes for an hour) only while it is drawn. The callers
//! draw them after the attribution, when the timed samples are gone, so the lines reuse that
//! memory instead of adding to it.
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::sync::Mutex;

use super::{CauseStacks, FoldedGraph, cause_graph, off_cpu_graph, on_cpu_graph};
use crate::analysis::model::Analysis;
use crate::report::model::{Files, Flamegraph, Inputs, Render, Subject};

/// The flame-graph format (see the module's documentation).
pub struct Flamegraphs;

/// Flame graphs drawn at once, at most: each holds its folded lines while it is drawn.
pub const RENDER_THREADS: usize = 2;

impl Render for Flamegraphs {
    fn render(&self, _: &Inputs<'_, '_>, _: &mut dyn Write) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "flame graphs are several files, not one stream",
        ))
    }

    fn render_files(
        &self,
        input: &Inputs<'_, '_>,
        files: &dyn Files,
        _extension: &str,
    ) -> io::Result<Vec<Flamegraph>> {
        let Subject::One(report) = input.subject else {
            // Each recording's graphs go beside that recording, under its own name.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a job's flame graphs are its recordings': draw each recording's",
            ));
        };
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, RENDER_THREADS);
        draw(
            graphs(report.analysis, input.cause_stacks),
            files,
            input.for_page,
            threads,
        )
    }
}

type Fold<'a> = Box<dyn FnOnce() -> (FoldedGraph, &'static str) + Send + 'a>;

/// One flame graph to draw: its file names' part, its title, and how to fold its lines.
struct Graph<'a> {
    name: String,
    title: String,
    fold: Fold<'a>,
}

/// The on- and off-CPU graphs, then each cause's that has stacks, in [`Cause::ALL`]'s order.
///
/// [`Cause::ALL`]: crate::attribution::Cause::ALL
fn graphs<'a>(a: &'a Analysis, causes: &'a [CauseStacks]) -> Vec<Graph<'a>> {
    let plain = [
        Graph {
            name: "oncpu".into(),
            title: "On-CPU".into(),
            fold: Box::new(move || (on_cpu_graph(a), "samples")),
        },
        Graph {
            name: "offcpu".into(),
            title: "Off-CPU".into(),
            fold: Box::new(move || (off_cpu_graph(a), "us")),
        },
    ];
    let causes = causes.iter().filter(|s| !s.is_empty()).map(|stacks| {
        let cause = stacks.cause().name();
        Graph {
            name: format!("cause-{cause}"),
            title: format!("GPU idle time: {cause}"),
            fold: Box::new(move || cause_graph(a, stacks)),
        }
    });
    plain.into_iter().chain(causes).collect()
}

/// Draws `graphs` on up to `threads` threads; what was drawn for the page comes out in
/// `graphs`' order whatever thread drew each.
fn draw(
    graphs: Vec<Graph<'_>>,
    files: &dyn Files,
    for_page: bool,
    threads: usize,
) -> io::Result<Vec<Flamegraph>> {
    let queue = Mutex::new(graphs.into_iter().enumerate());
    let results = Mutex::new(BTreeMap::new());
    let work = || {
        loop {
            let next = match queue.lock() {
                Ok(mut q) => q.next(),
                Err(_) => break,
            };
            let Some((i, graph)) = next else { break };
            let done = write_graph(files, graph, for_page);
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
        .map_err(|_| io::Error::other("a flame graph thread panicked"))?;
    let mut embedded = Vec::new();
    for done in results.into_values() {
        embedded.extend(done?);
    }
    Ok(embedded)
}

/// Folds one graph and writes its folded lines and SVG; an empty graph writes nothing.
fn write_graph(
    files: &dyn Files,
    graph: Graph<'_>,
    for_page: bool,
) -> io::Result<Option<Flamegraph>> {
    let Graph { name, title, fold } = graph;
    let (lines, unit) = fold();
    if lines.is_empty() {
        return Ok(None);
    }
    let mut w = files.create(&format!("{name}.folded"))?;
    lines.write_folded(&mut w)?;
    w.flush()?;
    let mut w = files.create(&format!("{name}.svg"))?;
    lines.svg(&title, unit, &mut w)?;
    w.flush()?;
    if !for_page {
        return Ok(None);
    }
    let mut svg = Vec::new();
    lines.embedded_svg(&title, unit, &mut svg).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("drawing the {name} flame graph for the HTML report: {e}"),
        )
    })?;
    Ok(Some(Flamegraph {
        name,
        svg: String::from_utf8_lossy(&svg).into_owned(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::model::JobReport;

    struct Nowhere;

    impl Files for Nowhere {
        fn create(&self, name: &str) -> io::Result<Box<dyn Write + Send + '_>> {
            panic!("{name} was asked for");
        }
    }

    #[test]
    fn a_job_and_a_stream_are_refused_before_anything_is_written() {
        let job = JobReport::new(Vec::new());
        let input = Inputs::report(Subject::Job(&job));
        let e = Flamegraphs.render_files(&input, &Nowhere, "").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        let e = Flamegraphs.render(&input, &mut Vec::new()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
    }
}
