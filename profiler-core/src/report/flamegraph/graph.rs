//! One flame graph's folded lines without the text of each line: every line is a pair of
//! shared strings, its `process;thread[;state]` prefix and its stack's joined frames, with a
//! count. An hour's graph has a hundred thousand lines of a few hundred bytes each but only a
//! few thousand distinct stacks, so this holds megabytes where the lines' text took tens, and
//! what is done to every line (sorting, cutting to what is drawn) compares ids and shared
//! strings instead of copies. The text is made only where it is written: the `.folded` file,
//! streamed, and the lines cut to what inferno draws.
use std::io::{self, Write};

use super::{prune, sanitize};
use crate::analysis::model::Analysis;
use crate::fxhash::FxHashMap;

/// A graph's folded lines: distinct, sorted as their text, each count above zero.
#[derive(Debug, Default)]
pub struct FoldedGraph {
    /// `process (pid);thread (tid)[;state]`.
    prefixes: Vec<String>,
    /// `;frame;frame...`, each distinct text once.
    stacks: Vec<String>,
    /// (prefix, stack, count), in the order of `prefix + stack`.
    lines: Vec<(u32, u32, u64)>,
    /// No prefix is a proper prefix of another, so a line's place is its prefix's, then its
    /// stack's: the fast paths rely on it (thread names that break it take the text's).
    prefix_free: bool,
}

/// Gathers (thread, stack) counts into a [`FoldedGraph`], summing lines of the same text.
pub(super) struct Builder<'a> {
    a: &'a Analysis,
    prefix_of: FxHashMap<(u32, u32, Option<&'static str>), u32>,
    prefixes: Vec<String>,
    /// A recording's stack id → its text's id: two ids can symbolize to the same frames.
    text_of: FxHashMap<u32, u32>,
    stack_ids: FxHashMap<String, u32>,
    stacks: Vec<String>,
    sums: FxHashMap<(u32, u32), u64>,
}

impl<'a> Builder<'a> {
    pub(super) fn new(a: &'a Analysis) -> Self {
        Self {
            a,
            prefix_of: Default::default(),
            prefixes: Vec::new(),
            text_of: Default::default(),
            stack_ids: Default::default(),
            stacks: Vec::new(),
            sums: Default::default(),
        }
    }

    pub(super) fn add(
        &mut self,
        tid: u32,
        pid: u32,
        state: Option<&'static str>,
        stack: u32,
        count: u64,
    ) {
        let a = self.a;
        let prefixes = &mut self.prefixes;
        let prefix = *self.prefix_of.entry((tid, pid, state)).or_insert_with(|| {
            let process = a.processes.get(&pid).map_or("", |p| p.comm.as_str());
            let thread = a.threads.get(&tid).map_or("", |t| t.comm.as_str());
            let mut text = format!(
                "{} ({pid});{} ({tid})",
                sanitize(or_unknown(process)),
                sanitize(or_unknown(thread))
            );
            if let Some(state) = state {
                text.push(';');
                text.push_str(state);
            }
            prefixes.push(text);
            (prefixes.len() - 1) as u32
        });
        let (stack_ids, stacks) = (&mut self.stack_ids, &mut self.stacks);
        let text = *self.text_of.entry(stack).or_insert_with(|| {
            let joined = match a.stacks.get(&stack) {
                Some(frames) => {
                    let mut out = String::new();
                    for frame in frames {
                        out.push(';');
                        out.push_str(&sanitize(frame));
                    }
                    out
                }
                None => format!(";[unknown stack {stack}]"),
            };
            *stack_ids.entry(joined).or_insert_with_key(|joined| {
                stacks.push(joined.clone());
                (stacks.len() - 1) as u32
            })
        });
        let sum = self.sums.entry((prefix, text)).or_default();
        *sum = sum.saturating_add(count);
    }

    /// The graph, each summed count passed through `count` (a unit's rounding) first; lines
    /// that come to zero are left out.
    pub(super) fn finish(self, count: impl Fn(u64) -> u64) -> FoldedGraph {
        let Builder {
            prefixes,
            stacks,
            sums,
            ..
        } = self;
        let mut lines: Vec<(u32, u32, u64)> = sums
            .into_iter()
            .map(|((p, s), n)| (p, s, count(n)))
            .filter(|&(_, _, n)| n > 0)
            .collect();
        let prefix_rank = ranks(&prefixes);
        let stack_rank = ranks(&stacks);
        let mut sorted: Vec<&str> = prefixes.iter().map(String::as_str).collect();
        sorted.sort_unstable();
        // A string that is a proper prefix of another sorts right before one that starts with
        // it.
        let prefix_free = sorted.windows(2).all(|w| !w[1].starts_with(w[0]));
        if prefix_free {
            lines.sort_unstable_by_key(|&(p, s, _)| {
                (prefix_rank[p as usize], stack_rank[s as usize])
            });
        } else {
            lines.sort_unstable_by(|x, y| {
                let text = |&(p, s, _): &(u32, u32, u64)| {
                    let (p, s) = (&prefixes[p as usize], &stacks[s as usize]);
                    p.bytes().chain(s.bytes())
                };
                text(x).cmp(text(y))
            });
        }
        FoldedGraph {
            prefixes,
            stacks,
            lines,
            prefix_free,
        }
    }
}

/// Each string's place among them in sorted order.
fn ranks(strings: &[String]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..strings.len() as u32).collect();
    order.sort_unstable_by(|&x, &y| strings[x as usize].cmp(&strings[y as usize]));
    let mut rank = vec![0u32; strings.len()];
    for (r, &i) in order.iter().enumerate() {
        rank[i as usize] = r as u32;
    }
    rank
}

fn or_unknown(comm: &str) -> &str {
    if comm.is_empty() { "?" } else { comm }
}

impl FoldedGraph {
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    pub fn len(&self) -> usize {
        self.lines.len()
    }

    fn parts(&self, line: &(u32, u32, u64)) -> (&str, &str) {
        (
            &self.prefixes[line.0 as usize],
            &self.stacks[line.1 as usize],
        )
    }

    /// The lines as text, `frame;frame count`.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .iter()
            .map(|l| {
                let (p, s) = self.parts(l);
                format!("{p}{s} {}", l.2)
            })
            .collect()
    }

    /// Writes the lines, one per line, without holding their text.
    pub fn write_folded(&self, w: &mut dyn Write) -> io::Result<()> {
        let mut w = io::BufWriter::with_capacity(1 << 16, w);
        for l in &self.lines {
            let (p, s) = self.parts(l);
            w.write_all(p.as_bytes())?;
            w.write_all(s.as_bytes())?;
            writeln!(w, " {}", l.2)?;
        }
        w.flush()
    }

    /// The lines cut to what a graph of frames at least `min_width_pct` wide draws, as
    /// [`prune::drawable`] cuts their text (the same lines come out); `None` where that leaves
    /// the lines as they are or would not read them (inferno then gets them whole).
    pub fn drawable(&self, min_width_pct: f64) -> Option<Vec<String>> {
        if !self.prefix_free || !self.plain() {
            return prune::drawable(&self.lines(), min_width_pct);
        }
        let prefix_semis: Vec<usize> = self.prefixes.iter().map(|p| semicolons(p)).collect();
        let stack_semis: Vec<usize> = self.stacks.iter().map(|s| semicolons(s)).collect();
        let mut prefix_sums = Vec::with_capacity(self.lines.len() + 1);
        prefix_sums.push(0u64);
        for l in &self.lines {
            prefix_sums.push(prefix_sums.last()?.checked_add(l.2)?);
        }
        let time = *prefix_sums.last()?;
        if time == 0 {
            return None;
        }
        // inferno's own arithmetic, as prune::drawable's.
        let widthpertime_pct = 100.0 / time as f64;
        let minwidth_time = min_width_pct / widthpertime_pct;
        let drawn = |total: u64| (total as f64) >= minwidth_time;

        let mut keep = vec![0usize; self.lines.len()];
        let mut open: Vec<usize> = Vec::new();
        let close = |open: &mut Vec<usize>, depth: usize, end: usize, keep: &mut [usize]| {
            while open.len() > depth {
                let start = open.pop().unwrap_or(end);
                if drawn(prefix_sums[end] - prefix_sums[start]) {
                    let frames = open.len() + 1;
                    for k in &mut keep[start..end] {
                        if *k == 0 {
                            *k = frames;
                        }
                    }
                }
            }
        };
        for (i, l) in self.lines.iter().enumerate() {
            let (p, s) = (l.0 as usize, l.1 as usize);
            let frames = prefix_semis[p] + stack_semis[s] + 1;
            let common = match i.checked_sub(1).map(|j| &self.lines[j]) {
                None => 0,
                Some(prev) if prev.0 == l.0 => {
                    let before = &self.stacks[prev.1 as usize];
                    if !sorted_with_counts(before, prev.2, &self.stacks[s], l.2) {
                        // inferno would not take these lines as sorted: neither does the
                        // text's pruning.
                        return None;
                    }
                    prefix_semis[p] + prune::shared_frames(before, &self.stacks[s])
                }
                // Neither prefix is a prefix of the other: they part inside both.
                Some(prev) => {
                    prune::shared_frames(&self.prefixes[prev.0 as usize], &self.prefixes[p])
                }
            };
            close(&mut open, common, i, &mut keep);
            open.extend(std::iter::repeat_n(i, frames - common));
        }
        close(&mut open, 0, self.lines.len(), &mut keep);

        let mut out: Vec<((&str, &str), u64)> = Vec::new();
        for (l, keep) in self.lines.iter().zip(&keep) {
            let (p, s) = self.parts(l);
            let cut = cut_after(p, prefix_semis[l.0 as usize], s, keep + 1);
            match out.last_mut() {
                Some((last, total)) if *last == cut => *total += l.2,
                _ => out.push((cut, l.2)),
            }
        }
        if out.len() == self.lines.len() {
            return None;
        }
        let mut out: Vec<(String, u64)> = out
            .into_iter()
            .map(|((p, s), n)| (format!("{p}{s}"), n))
            .collect();
        // As prune::drawable: cut lines sort otherwise than whole ones; merge those that meet.
        out.sort_unstable_by(|x, y| x.0.cmp(&y.0));
        out.dedup_by(|later, kept| {
            if later.0 != kept.0 {
                return false;
            }
            kept.1 += later.1;
            true
        });
        let mut out: Vec<String> = out
            .into_iter()
            .map(|(mut s, c)| {
                use std::fmt::Write as _;
                let _ = write!(s, " {c}");
                s
            })
            .collect();
        out.sort_unstable();
        Some(out)
    }

    /// Whether every line is in the plain `stack count` form that [`prune::drawable`] reads
    /// (no blank around a line or before its count, no comment, no last word that reads as a
    /// count), judged once per prefix and stack. A prefix ends in `(tid)` or a `[state]`, so a
    /// line's last word is its stack's, or one with a parenthesis.
    fn plain(&self) -> bool {
        let prefixes_plain = self
            .prefixes
            .iter()
            .all(|p| !p.starts_with(char::is_whitespace) && !p.starts_with("# "));
        let stacks_plain = self.stacks.iter().all(|s| {
            let last_word_is_count = s.rsplit_once(' ').is_some_and(|(_, last)| {
                !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit() || b == b'.')
            });
            !s.ends_with(char::is_whitespace) && !last_word_is_count
        });
        prefixes_plain && stacks_plain
    }

    /// The flame graph's SVG (see [`super::flamegraph_svg`]).
    pub fn svg(&self, title: &str, count_name: &str, w: &mut dyn Write) -> io::Result<()> {
        let min_width = inferno::flamegraph::Options::default().min_width;
        self.render(title, count_name, w, min_width, None)
    }

    /// The SVG an HTML page embeds (see [`super::embedded_svg`]).
    pub fn embedded_svg(&self, title: &str, count_name: &str, w: &mut dyn Write) -> io::Result<()> {
        self.render(
            title,
            count_name,
            w,
            super::EMBEDDED_MIN_WIDTH_PCT,
            Some(1200),
        )
    }

    fn render(
        &self,
        title: &str,
        count_name: &str,
        w: &mut dyn Write,
        min_width: f64,
        image_width: Option<usize>,
    ) -> io::Result<()> {
        match self.drawable(min_width) {
            Some(cut) => {
                super::render_svg_with(&cut, title, count_name, w, false, min_width, image_width)
            }
            None => super::render_svg_with(
                &self.lines(),
                title,
                count_name,
                w,
                true,
                min_width,
                image_width,
            ),
        }
    }
}

/// Whether the lines `before` and `after` (stacks of one prefix, `before` the smaller) stay in
/// order with their counts: a stack that goes on where another ends, with a character that
/// sorts before the count's space (or is one), can sort before it once the counts are on.
fn sorted_with_counts(before: &str, before_count: u64, after: &str, after_count: u64) -> bool {
    match after.as_bytes().get(before.len()) {
        Some(&next) if after.starts_with(before) && next <= b' ' => {
            format!("{before} {before_count}") <= format!("{after} {after_count}")
        }
        _ => true,
    }
}

fn semicolons(s: &str) -> usize {
    s.bytes().filter(|&c| c == b';').count()
}

/// The first `frames` frames of `prefix + stack`, as its two parts.
fn cut_after<'s>(
    prefix: &'s str,
    prefix_semis: usize,
    stack: &'s str,
    frames: usize,
) -> (&'s str, &'s str) {
    if frames == 0 {
        return (prefix, stack);
    }
    if frames <= prefix_semis {
        let at = prefix
            .match_indices(';')
            .nth(frames - 1)
            .map_or(prefix.len(), |(at, _)| at);
        return (&prefix[..at], "");
    }
    match stack.match_indices(';').nth(frames - prefix_semis - 1) {
        Some((at, _)) => (prefix, &stack[..at]),
        None => (prefix, stack),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::model::{CpuStackSamples, ProcessSummary, ThreadSummary};
    use crate::report::flamegraph::on_cpu_graph;

    /// The lines as the text path makes them: each (prefix, stack) line's text summed, sorted.
    fn text_lines(a: &Analysis) -> Vec<String> {
        let mut sums = std::collections::BTreeMap::<String, u64>::new();
        for s in &a.cpu_samples {
            let process = &a.processes[&s.pid].comm;
            let thread = &a.threads[&s.tid].comm;
            let frames: String = a.stacks[&s.stack]
                .iter()
                .map(|f| format!(";{}", sanitize(f)))
                .collect();
            let path = format!(
                "{} ({});{} ({}){frames}",
                sanitize(or_unknown(process)),
                s.pid,
                sanitize(or_unknown(thread)),
                s.tid
            );
            *sums.entry(path).or_default() += s.samples;
        }
        sums.into_iter().map(|(p, c)| format!("{p} {c}")).collect()
    }

    /// A recording of `threads` (pid, tid, comm) sampled in `stacks`, with skewed counts.
    fn analysis(threads: &[(u32, u32, &str)], stacks: &[Vec<String>], seed: u64) -> Analysis {
        let mut a = Analysis::default();
        for &(pid, tid, comm) in threads {
            a.threads.insert(
                tid,
                ThreadSummary {
                    tid,
                    pid,
                    comm: comm.into(),
                    ..Default::default()
                },
            );
            a.processes.insert(
                pid,
                ProcessSummary {
                    pid,
                    comm: "proc".into(),
                    ..Default::default()
                },
            );
        }
        for (id, frames) in stacks.iter().enumerate() {
            a.stacks.insert(id as u32, frames.clone());
        }
        let mut x = seed;
        for &(pid, tid, _) in threads {
            for stack in 0..stacks.len() as u32 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x.is_multiple_of(3) {
                    continue;
                }
                let samples =
                    1 + (x % 1000).pow(3) / 1_000_000 + if x.is_multiple_of(53) { 5000 } else { 0 };
                a.cpu_samples.push(CpuStackSamples {
                    tid,
                    pid,
                    stack,
                    samples,
                });
            }
        }
        a
    }

    fn stacks(n: usize, seed: u64, names: &[&str]) -> Vec<Vec<String>> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (0..(1 + x % 7))
                    .map(|d| names[((x >> (d * 5)) % names.len() as u64) as usize].to_owned())
                    .collect()
            })
            .collect()
    }

    /// Every path of the graph gives what the lines' text gives: the same lines, and the same
    /// lines cut to what is drawn, at several widths, whatever the names hold.
    #[test]
    fn the_graph_cuts_as_the_text_does() {
        let plain = ["main", "step", "load", "decode", "resize", "f", "f1", "f10"];
        let odd = ["f", "f x", "f 12", "f\t", "a;b", "", "g (1)", " h"];
        let mut fast = 0;
        for (seed, names, threads) in [
            (
                1u64,
                &plain[..],
                &[(1, 1, "py"), (1, 2, "worker"), (3, 3, "py")][..],
            ),
            (
                2,
                &odd[..],
                &[(1, 1, "py"), (1, 12, "py"), (1, 2, "py (1)")][..],
            ),
            (3, &odd[..], &[(1, 1, " lead"), (1, 2, "# c")][..]),
            (
                4,
                &plain[..],
                &[(1, 1, "t"), (1, 11, "t"), (1, 111, "t")][..],
            ),
        ] {
            let a = analysis(threads, &stacks(60, seed, names), seed);
            let graph = on_cpu_graph(&a);
            let text = text_lines(&a);
            assert_eq!(graph.lines(), text, "seed {seed}");
            let mut written = Vec::new();
            graph.write_folded(&mut written).unwrap();
            assert_eq!(String::from_utf8(written).unwrap(), text.join("\n") + "\n");
            let mut cut = 0;
            for width in [0.01, 0.5, 2.0, 10.0] {
                let drawable = graph.drawable(width);
                cut += usize::from(drawable.is_some());
                assert_eq!(
                    drawable,
                    prune::drawable(&text, width),
                    "seed {seed} at {width}%"
                );
            }
            if names == plain {
                assert!(cut >= 2, "seed {seed}: lines cut at {cut} widths");
            }
            fast += usize::from(graph.prefix_free && graph.plain());
        }
        // Seeds 1 and 4 take the graph's own path; 2 and 3 the text's.
        assert_eq!(fast, 2);
    }

    #[test]
    fn two_stack_ids_of_the_same_frames_are_one_line() {
        let frames = vec!["main".to_owned(), "step".to_owned()];
        let mut a = analysis(&[(1, 1, "py")], &[frames.clone(), frames], 7);
        a.cpu_samples = vec![
            CpuStackSamples {
                tid: 1,
                pid: 1,
                stack: 0,
                samples: 2,
            },
            CpuStackSamples {
                tid: 1,
                pid: 1,
                stack: 1,
                samples: 3,
            },
        ];
        assert_eq!(on_cpu_graph(&a).lines(), ["proc (1);py (1);main;step 5"]);
    }
}
