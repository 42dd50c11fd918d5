//! Folded stacks (`frame;frame;... count`, as inferno and flamegraph.pl read them) and SVG.
//!
//! Every stack is prefixed with `{process comm} ({pid})` and `{thread comm} ({tid})` frames, so a
//! flame graph splits first by process, then by thread. Off-CPU stacks add an `[io]` or
//! `[blocked]` frame after the thread and count microseconds of scaled off-CPU time.
use std::collections::BTreeMap;
use std::io::{self, Write};

use inferno::flamegraph;

use crate::attribution::{Cause, evidence::in_window, evidence::relevant};
use crate::model::Analysis;

/// On-CPU stacks; the count is samples. Sorted, one entry per distinct stack.
pub fn on_cpu_folded(a: &Analysis) -> Vec<String> {
    let mut paths = Paths::new(a);
    let mut folded: BTreeMap<String, u64> = BTreeMap::new();
    for s in &a.cpu_samples {
        let stack = paths.path(s.tid, s.pid, None, s.stack);
        let count = folded.entry(stack).or_default();
        *count = count.saturating_add(s.samples);
    }
    into_lines(folded)
}

/// Off-CPU stacks; the count is microseconds (rounded) of scaled off-CPU time. Sorted, one entry
/// per distinct stack; stacks under half a microsecond are left out.
pub fn off_cpu_folded(a: &Analysis) -> Vec<String> {
    let mut paths = Paths::new(a);
    let mut folded: BTreeMap<String, u64> = BTreeMap::new();
    for s in &a.off_cpu {
        let state = if s.io { "[io]" } else { "[blocked]" };
        let stack = paths.path(s.tid, s.pid, Some(state), s.stack);
        let ns = folded.entry(stack).or_default();
        *ns = ns.saturating_add(s.scaled_ns);
    }
    let micros = folded
        .into_iter()
        .map(|(stack, ns)| (stack, ns.saturating_add(500) / 1000))
        .collect();
    into_lines(micros)
}

/// Writes folded lines, one per line.
pub fn write_folded<W: Write>(lines: &[String], mut w: W) -> io::Result<()> {
    for line in lines {
        writeln!(w, "{line}")?;
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
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), w)
}

/// The on-CPU flame graph of an analysis.
pub fn on_cpu_svg<W: Write>(a: &Analysis, w: W) -> io::Result<()> {
    flamegraph_svg(&on_cpu_folded(a), "On-CPU", "samples", w)
}

/// The off-CPU flame graph of an analysis (widths are microseconds).
pub fn off_cpu_svg<W: Write>(a: &Analysis, w: W) -> io::Result<()> {
    flamegraph_svg(&off_cpu_folded(a), "Off-CPU", "us", w)
}

fn into_lines(folded: BTreeMap<String, u64>) -> Vec<String> {
    folded
        .into_iter()
        .filter(|(_, count)| *count > 0)
        .map(|(stack, count)| format!("{stack} {count}"))
        .collect()
}

/// Builds `process;thread[;state];frames` paths, joining each stack's frames only once:
/// a long recording has few distinct stacks but many (thread, stack) pairs.
struct Paths<'a> {
    a: &'a Analysis,
    joined: crate::fxhash::FxHashMap<u32, String>,
}

impl<'a> Paths<'a> {
    fn new(a: &'a Analysis) -> Self {
        Self {
            a,
            joined: Default::default(),
        }
    }

    fn path(&mut self, tid: u32, pid: u32, state: Option<&str>, stack: u32) -> String {
        let a = self.a;
        let frames = self
            .joined
            .entry(stack)
            .or_insert_with(|| match a.stacks.get(&stack) {
                Some(frames) => {
                    let mut out = String::new();
                    for frame in frames {
                        out.push(';');
                        out.push_str(&sanitize(frame));
                    }
                    out
                }
                None => format!(";[unknown stack {stack}]"),
            });
        let process_comm = a.processes.get(&pid).map_or("", |p| p.comm.as_str());
        let thread_comm = a.threads.get(&tid).map_or("", |t| t.comm.as_str());
        let mut path = format!(
            "{} ({pid});{} ({tid})",
            sanitize(or_unknown(process_comm)),
            sanitize(or_unknown(thread_comm))
        );
        if let Some(state) = state {
            path.push(';');
            path.push_str(state);
        }
        path.push_str(frames);
        path
    }
}

fn or_unknown(comm: &str) -> &str {
    if comm.is_empty() { "?" } else { comm }
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
pub fn cause_folded(a: &Analysis, cause: Cause) -> (Vec<String>, &'static str) {
    let Some(attr) = &a.attribution else {
        return (Vec::new(), "samples");
    };
    let mut windows: Vec<(u64, u64)> = attr
        .gpus
        .iter()
        .flat_map(|g| g.windows.iter())
        .filter(|w| w.3 == cause && w.2 > 0)
        .map(|w| (w.0, w.1))
        .collect();
    windows.sort_unstable();
    // Windows of several GPUs overlap: merge them so that each sample counts once.
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(windows.len());
    for (start, end) in windows {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    // Sum per (tid, stack) first and build each stack's text once: formatting a path per
    // sample was most of a long recording's report time.
    let mut totals: crate::fxhash::FxHashMap<(u32, u32), u64> = Default::default();
    for (start, end) in merged {
        if cause == Cause::Disk {
            for s in in_window(&a.timed.off_cpu, |s| s.ts_ns, start, end) {
                if s.io {
                    *totals.entry((s.tid, s.stack)).or_default() += s.duration_ns;
                }
            }
        } else {
            for s in in_window(&a.timed.cpu, |s| s.ts_ns, start, end) {
                if relevant(&attr.roles, cause, s.tid) {
                    *totals.entry((s.tid, s.stack)).or_default() += 1;
                }
            }
        }
    }
    let pid_of = |tid: u32| a.threads.get(&tid).map_or(0, |t| t.pid);
    let mut paths = Paths::new(a);
    let mut folded: BTreeMap<String, u64> = BTreeMap::new();
    for ((tid, stack), total) in totals {
        let (state, value) = if cause == Cause::Disk {
            (Some("[io]"), total.saturating_add(500) / 1000)
        } else {
            (None, total)
        };
        *folded
            .entry(paths.path(tid, pid_of(tid), state, stack))
            .or_default() += value;
    }
    let unit = if cause == Cause::Disk {
        "us"
    } else {
        "samples"
    };
    (into_lines(folded), unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitizes_separators() {
        assert_eq!(sanitize("f<[u8; 8]>"), "f<[u8: 8]>");
        assert_eq!(sanitize("a\nb"), "a b");
        assert_eq!(sanitize(""), "[empty]");
    }

    #[test]
    fn empty_input_is_an_error_not_an_svg() {
        let mut out = Vec::new();
        let err = flamegraph_svg(&[], "t", "samples", &mut out).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(out.is_empty());
    }
}
