//! Folded stacks (`frame;frame;... count`, as inferno and flamegraph.pl read them) and SVG.
//!
//! Every stack is prefixed with `{process comm} ({pid})` and `{thread comm} ({tid})` frames, so a
//! flame graph splits first by process, then by thread. Off-CPU stacks add an `[io]` or
//! `[blocked]` frame after the thread and count microseconds of scaled off-CPU time.
use std::io::{self, Write};

use inferno::flamegraph;

pub mod graph;
mod prune;
pub mod render;

use graph::Builder;
pub use graph::FoldedGraph;

use super::cause_stacks::{CauseStacks, cause_stacks};
use crate::analysis::fold::Folded;
use crate::analysis::model::Analysis;
use crate::attribution::{Attribution, Cause, Stacks};

/// On-CPU stacks; the count is samples. Sorted, one entry per distinct stack.
pub fn on_cpu_folded(a: &Analysis) -> Vec<String> {
    on_cpu_graph(a).lines()
}

/// [`on_cpu_folded`]'s lines, not yet text.
pub fn on_cpu_graph(a: &Analysis) -> FoldedGraph {
    let mut b = Builder::new(a);
    for s in &a.cpu_samples {
        b.add(s.tid, s.pid, None, s.stack, s.samples);
    }
    b.finish(|n| n)
}

/// Off-CPU stacks; the count is microseconds (rounded) of scaled off-CPU time. Sorted, one entry
/// per distinct stack; stacks under half a microsecond are left out.
pub fn off_cpu_folded(a: &Analysis) -> Vec<String> {
    off_cpu_graph(a).lines()
}

/// [`off_cpu_folded`]'s lines, not yet text.
pub fn off_cpu_graph(a: &Analysis) -> FoldedGraph {
    let mut b = Builder::new(a);
    for s in &a.off_cpu {
        let state = if s.io { "[io]" } else { "[blocked]" };
        b.add(s.tid, s.pid, Some(state), s.stack, s.scaled_ns);
    }
    b.finish(micros)
}

/// Nanoseconds summed over a line, as the microseconds its count gives.
fn micros(ns: u64) -> u64 {
    ns.saturating_add(500) / 1000
}

/// Writes folded lines, one per line.
pub fn write_folded<W: Write>(lines: &[String], mut w: W) -> io::Result<()> {
    for line in lines {
        w.write_all(line.as_bytes())?;
        w.write_all(b"\n")?;
    }
    Ok(())
}

/// Renders folded lines as a flame graph SVG. `count_name` labels the counts (`samples`, `us`).
/// Colours are derived from frame names, so the same input gives the same SVG. Fails with
/// `InvalidData` and writes nothing when there are no stacks.
pub fn flamegraph_svg<W: Write>(
    lines: &[String],
    title: &str,
    count_name: &str,
    w: W,
) -> io::Result<()> {
    render_svg(lines, title, count_name, w, true)
}

/// Frames narrower than this percent of the total are left out of the flame graphs an HTML
/// report embeds (inferno's default is 0.1): an hour's graphs then fit in a page.
pub const EMBEDDED_MIN_WIDTH_PCT: f64 = 0.5;

/// As [`flamegraph_svg`], leaving out frames under [`EMBEDDED_MIN_WIDTH_PCT`], at a fixed
/// width the page scales: inferno's fluid width reads its frame's size while it loads, which
/// in a frame not laid out yet is nothing.
pub fn embedded_svg<W: Write>(
    lines: &[String],
    title: &str,
    count_name: &str,
    w: W,
) -> io::Result<()> {
    render_svg_with(
        lines,
        title,
        count_name,
        w,
        true,
        EMBEDDED_MIN_WIDTH_PCT,
        Some(1200),
    )
}

fn render_svg<W: Write>(
    lines: &[String],
    title: &str,
    count_name: &str,
    w: W,
    prune: bool,
) -> io::Result<()> {
    let default = flamegraph::Options::default().min_width;
    render_svg_with(lines, title, count_name, w, prune, default, None)
}

fn render_svg_with<W: Write>(
    lines: &[String],
    title: &str,
    count_name: &str,
    w: W,
    prune: bool,
    min_width: f64,
    image_width: Option<usize>,
) -> io::Result<()> {
    if lines.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "no stacks were recorded, so there is no flame graph to draw",
        ));
    }
    let mut options = flamegraph::Options::default();
    options.title = title.to_owned();
    options.count_name = count_name.to_owned();
    options.hash = true;
    options.deterministic = true;
    options.min_width = min_width;
    options.image_width = image_width;
    let drawable = prune
        .then(|| prune::drawable(lines, options.min_width))
        .flatten();
    let lines = drawable.as_deref().unwrap_or(lines);
    // inferno checks the order of the lines it is told are sorted, after trimming them.
    options.no_sort = lines.windows(2).all(|w| w[0].trim() <= w[1].trim());
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), w)
}

/// A folded line with the process and thread IDs taken out of its first two frames
/// (`python (1234)` → `python`): another run's IDs differ, its stacks should still match.
pub fn without_ids(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    for (i, frame) in line.split(';').enumerate() {
        if i > 0 {
            out.push(';');
        }
        let bare = (i < 2)
            .then(|| {
                let (name, id) = frame.rsplit_once(" (")?;
                // The last frame also holds the count after its closing parenthesis.
                let (digits, rest) = id.split_once(')')?;
                digits
                    .bytes()
                    .all(|b| b.is_ascii_digit())
                    .then(|| format!("{name}{rest}"))
            })
            .flatten();
        out.push_str(bare.as_deref().unwrap_or(frame));
    }
    out
}

/// A differential flame graph (inferno's): the new run's stacks, coloured by how their
/// share changed from the base run's, red for more. Both sides are normalised to the same
/// total, so the colours show shares, not run lengths.
pub fn differential_svg<W: Write>(
    before: &[String],
    after: &[String],
    title: &str,
    count_name: &str,
    w: W,
) -> io::Result<()> {
    let join = |lines: &[String]| -> Vec<u8> {
        let mut out = Vec::new();
        for l in lines {
            out.extend_from_slice(without_ids(l).as_bytes());
            out.push(b'\n');
        }
        out
    };
    let mut diffed = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options {
            normalize: true,
            strip_hex: false,
        },
        &join(before)[..],
        &join(after)[..],
        &mut diffed,
    )?;
    let mut lines: Vec<String> = String::from_utf8_lossy(&diffed)
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    render_svg(&lines, title, count_name, w, false)
}

/// The on-CPU flame graph of an analysis.
pub fn on_cpu_svg<W: Write>(a: &Analysis, w: W) -> io::Result<()> {
    flamegraph_svg(&on_cpu_folded(a), "On-CPU", "samples", w)
}

/// The off-CPU flame graph of an analysis (widths are microseconds).
pub fn off_cpu_svg<W: Write>(a: &Analysis, w: W) -> io::Result<()> {
    flamegraph_svg(&off_cpu_folded(a), "Off-CPU", "us", w)
}

/// `;` separates frames and a newline ends a line, so neither may appear inside a frame. An
/// empty frame would merge with its neighbour's separator, so it gets a visible name.
fn sanitize(frame: &str) -> std::borrow::Cow<'_, str> {
    if frame.is_empty() {
        return "[empty]".into();
    }
    if !frame.contains([';', '\n', '\r']) {
        return frame.into();
    }
    frame
        .chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect::<String>()
        .into()
}

/// The stacks behind one cause's GPU idle time: samples of the threads that cause is about
/// (workers for `dataloader_cpu`, the feeder for `host_compute`, every thread otherwise), taken
/// inside the windows labelled with it. `disk` uses off-CPU IO stacks weighted in
/// microseconds; the others on-CPU samples. The second value is the count's unit.
pub fn cause_folded(
    folded: &Folded,
    attribution: Option<&Attribution>,
    cause: Cause,
) -> (Vec<String>, &'static str) {
    cause_lines(
        &folded.analysis,
        &cause_stacks(&folded.timed, attribution, cause),
    )
}

/// What a cause's flame graph counts: microseconds waited on IO, or on-CPU samples.
pub fn cause_unit(cause: Cause) -> &'static str {
    if cause.spec().stacks == Stacks::IoWait {
        "us"
    } else {
        "samples"
    }
}

/// Folded lines (`frame;frame count`) of several graphs of one kind merged: each stack once,
/// its counts summed, in stack order. Lines that do not end in a count are skipped.
pub fn merge_folded<'l>(lines: impl IntoIterator<Item = &'l str>) -> Vec<String> {
    let mut sums: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for line in lines {
        let Some((stack, count)) = line.trim_end().rsplit_once(' ') else {
            continue;
        };
        if let Ok(n) = count.parse::<u64>() {
            *sums.entry(stack).or_default() += n;
        }
    }
    sums.into_iter().map(|(s, n)| format!("{s} {n}")).collect()
}

/// Folded lines of one cause's stacks, and the count's unit.
pub fn cause_lines(a: &Analysis, stacks: &CauseStacks) -> (Vec<String>, &'static str) {
    let (graph, unit) = cause_graph(a, stacks);
    (graph.lines(), unit)
}

/// [`cause_lines`]' lines, not yet text, and the count's unit.
pub fn cause_graph(a: &Analysis, stacks: &CauseStacks) -> (FoldedGraph, &'static str) {
    let disk = stacks.cause().spec().stacks == Stacks::IoWait;
    let state = disk.then_some("[io]");
    let mut b = Builder::new(a);
    for &(tid, stack, total) in stacks.totals() {
        let pid = a.threads.get(&tid).map_or(0, |t| t.pid);
        b.add(tid, pid, state, stack, total);
    }
    let graph = if disk {
        b.finish(micros)
    } else {
        b.finish(|n| n)
    };
    (graph, cause_unit(stacks.cause()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_graphs_sum_each_stacks_counts() {
        let a = ["py;load;decode 3", "py;step 5"];
        let b = ["py;load;decode 4", "garbage", "py;load 1"];
        assert_eq!(
            merge_folded(a.iter().chain(&b).copied()),
            ["py;load 1", "py;load;decode 7", "py;step 5"]
        );
        assert_eq!(cause_unit(Cause::Disk), "us");
        assert_eq!(cause_unit(Cause::DataloaderCpu), "samples");
    }

    #[test]
    fn ids_leave_the_process_and_thread_frames_only() {
        assert_eq!(
            without_ids("python (12);worker (13);f (1);g 7"),
            "python;worker;f (1);g 7"
        );
        assert_eq!(without_ids("python (12);worker (13) 7"), "python;worker 7");
        assert_eq!(without_ids("a (x);b 3"), "a (x);b 3");
    }

    #[test]
    fn a_differential_graph_colours_the_stack_that_grew() {
        let before = vec![
            "p (1);t (1);decode 50".to_owned(),
            "p (1);t (1);resize 50".to_owned(),
        ];
        let after = vec![
            "p (2);t (2);decode 90".to_owned(),
            "p (2);t (2);resize 10".to_owned(),
        ];
        let mut svg = Vec::new();
        differential_svg(&before, &after, "diff", "samples", &mut svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(svg.contains("decode") && svg.contains("resize"), "{svg}");
        // inferno labels each frame's change of share in its tooltip.
        assert!(
            svg.contains("<title>decode (90 samples, 90.00%; +40.00%)</title>"),
            "{svg}"
        );
        assert!(
            svg.contains("<title>resize (10 samples, 10.00%; -40.00%)</title>"),
            "{svg}"
        );
    }

    #[test]
    fn sanitizes_separators() {
        assert_eq!(sanitize("f<[u8; 8]>"), "f<[u8: 8]>");
        assert_eq!(sanitize("a\nb"), "a b");
        assert_eq!(sanitize(""), "[empty]");
    }

    #[test]
    fn pruned_input_draws_the_same_svg() {
        // Skewed counts over a branching tree: a few wide frames over a long tail of narrow
        // ones, the shape of a real profile. Names that are prefixes of others (`f1`, `f10`)
        // are left out: inferno splits such a frame when lines end inside it, and cut lines
        // can make it whole again.
        let mut lines = Vec::new();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for i in 0..4000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let count =
                1 + (seed % 1000).pow(4) / 10_000_000_000 + if i % 97 == 0 { 50_000 } else { 0 };
            let frames: Vec<String> = (0..(3 + i % 9))
                .map(|d| format!("m{}::f{:03}", d % 3, (i * 7 + d * d) % (4 + d * 11)))
                .collect();
            lines.push((format!("p (1);t ({});{}", i % 3, frames.join(";")), count));
        }
        let mut sums = std::collections::BTreeMap::new();
        for (path, count) in lines {
            *sums.entry(path).or_insert(0u64) += count;
        }
        let lines: Vec<String> = sums.into_iter().map(|(p, c)| format!("{p} {c}")).collect();
        let pruned = prune::drawable(&lines, flamegraph::Options::default().min_width);
        let pruned = pruned.map_or(0, |p| p.len());
        assert!(
            pruned > 0 && pruned * 2 < lines.len(),
            "{pruned} of {} lines",
            lines.len()
        );
        let render = |prune| {
            let mut out = Vec::new();
            render_svg(&lines, "t", "samples", &mut out, prune).unwrap();
            String::from_utf8(out).unwrap()
        };
        let drawn = |prune| {
            let svg = render(prune);
            let mut titles: Vec<String> = svg
                .split("<title>")
                .skip(1)
                .filter_map(|t| t.split("</title>").next())
                .map(str::to_owned)
                .collect();
            titles.sort();
            titles
        };
        let (pruned, whole) = (drawn(true), drawn(false));
        assert!(whole.len() > 100, "{} frames drawn", whole.len());
        assert_eq!(pruned, whole, "the same frames, with the same widths");
        // No name here is a prefix of another, so nothing can trade places either.
        assert!(render(true) == render(false), "the same SVG");
    }

    #[test]
    fn empty_input_is_an_error_not_an_svg() {
        let mut out = Vec::new();
        let err = flamegraph_svg(&[], "t", "samples", &mut out).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(out.is_empty());
    }
}
