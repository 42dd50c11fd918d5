//! The gate's verdicts as text for a terminal, Markdown for a pull-request comment or
//! `$GITHUB_STEP_SUMMARY`, and JSON for scripts.
use std::io::{self, Write};

use super::check::{Bound, CheckReport};
use super::diff::{Change, DiffReport, Row, StepRow};
use super::evidence::{CauseChange, Moved};
use crate::report::Format;

/// A format `diff` and `check` do not write (the command line offers only
/// [`Format::GATE`]).
fn not_a_gate_format(f: Format) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "the gate writes no {f}; one of: {}",
            Format::names(Format::GATE).join(", ")
        ),
    )
}

fn pct(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

fn pp(delta: f64) -> String {
    format!("{:+.1}", delta * 100.0)
}

fn verdict(c: Change) -> &'static str {
    match c {
        Change::Regression => "REGRESSION",
        Change::Improvement => "improved",
        Change::Unchanged => "unchanged",
        Change::Worse => "lower",
        Change::Better => "higher",
    }
}

fn files(f: &[String]) -> String {
    match f {
        [one] => one.clone(),
        many => format!("{} runs ({} ...)", many.len(), many[0]),
    }
}

fn summary(d: &DiffReport) -> String {
    if d.regressions == 0 {
        "no regression".to_owned()
    } else {
        let names: Vec<String> = d
            .regressed()
            .map(|r| format!("{} on GPU {}", r.metric, r.gpu))
            .collect();
        format!("{} regression(s): {}", d.regressions, names.join(", "))
    }
}

pub fn write_diff(d: &DiffReport, format: Format, w: &mut dyn Write) -> io::Result<()> {
    match format {
        f @ (Format::Html | Format::Perfetto | Format::Flamegraph) => Err(not_a_gate_format(f)),
        Format::Json => {
            serde_json::to_writer_pretty(&mut *w, d)?;
            writeln!(w)
        }
        Format::Text => {
            writeln!(w, "base: {}", files(&d.base))?;
            writeln!(w, "new:  {}", files(&d.new))?;
            writeln!(
                w,
                "{:>3}  {:<20} {:>7} {:>7} {:>7} {:>7} {:>6}  verdict",
                "GPU", "share of GPU time", "base", "new", "delta", "noise", "limit"
            )?;
            for r in &d.rows {
                writeln!(
                    w,
                    "{:>3}  {:<20} {:>7} {:>7} {:>7} {:>7} {:>6}  {}",
                    gpu_label(r),
                    r.metric,
                    pct(r.base),
                    pct(r.new),
                    pp(r.delta),
                    format!("±{:.1}", r.noise * 100.0),
                    limit(r),
                    verdict(r.change)
                )?;
            }
            writeln!(w, "{}", summary(d))?;
            if !d.steps.is_empty() {
                writeln!(
                    w,
                    "training step (p50) and the speedup each fix would give; shown, not gated:"
                )?;
            }
            for s in &d.steps {
                writeln!(
                    w,
                    "  GPU {}: {} -> {}{}",
                    step_label(s),
                    step_ms(s.base_ms),
                    step_ms(s.new_ms),
                    step_change(s)
                )?;
                for g in &s.gains {
                    writeln!(
                        w,
                        "    fixing {}: {} -> {}",
                        g.cause,
                        times(g.base),
                        times(g.new)
                    )?;
                }
            }
            for c in &d.changes {
                writeln!(w, "what changed behind {} on GPU {}:", c.cause, c.gpu)?;
                for (kind, list) in moved_lists(c) {
                    for m in list {
                        writeln!(
                            w,
                            "  {kind} {}: {} -> {}",
                            m.what,
                            amount(m, m.base),
                            amount(m, m.new)
                        )?;
                    }
                }
            }
            writeln!(w, "method: {}", d.method)
        }
        Format::Markdown => {
            writeln!(w, "### stallscope diff: {}", summary(d))?;
            writeln!(w)?;
            writeln!(
                w,
                "Base `{}` against new `{}`.",
                files(&d.base),
                files(&d.new)
            )?;
            writeln!(w)?;
            writeln!(
                w,
                "| GPU | share of GPU time | base | new | delta (pp) | noise (pp) | limit (pp) | verdict |"
            )?;
            writeln!(w, "|---:|---|---:|---:|---:|---:|---:|---|")?;
            for r in &d.rows {
                let v = verdict(r.change);
                writeln!(
                    w,
                    "| {} | `{}` | {} | {} | {} | ±{:.1} | {} | {} |",
                    gpu_label(r),
                    r.metric,
                    pct(r.base),
                    pct(r.new),
                    pp(r.delta),
                    r.noise * 100.0,
                    limit(r),
                    if r.change == Change::Regression {
                        format!("**{v}**")
                    } else {
                        v.to_owned()
                    }
                )?;
            }
            if !d.steps.is_empty() {
                writeln!(w)?;
                writeln!(w, "**Training step** (p50; shown, not gated)")?;
                writeln!(w)?;
                writeln!(w, "| GPU | | base | new |")?;
                writeln!(w, "|---:|---|---:|---:|")?;
                for s in &d.steps {
                    writeln!(
                        w,
                        "| {} | step time | {} | {}{} |",
                        step_label(s),
                        step_ms(s.base_ms),
                        step_ms(s.new_ms),
                        step_change(s)
                    )?;
                    for g in &s.gains {
                        writeln!(
                            w,
                            "| {} | fixing `{}` | {} | {} |",
                            step_label(s),
                            g.cause,
                            times(g.base),
                            times(g.new)
                        )?;
                    }
                }
            }
            for c in &d.changes {
                writeln!(w)?;
                writeln!(w, "**What changed behind `{}` on GPU {}**", c.cause, c.gpu)?;
                writeln!(w)?;
                writeln!(w, "| | what | base | new |")?;
                writeln!(w, "|---|---|---:|---:|")?;
                for (kind, list) in moved_lists(c) {
                    for m in list {
                        writeln!(
                            w,
                            "| {kind} | `{}` | {} | {} |",
                            m.what.replace('|', "\\|"),
                            amount(m, m.base),
                            amount(m, m.new)
                        )?;
                    }
                }
            }
            writeln!(w)?;
            writeln!(w, "<sub>{}</sub>", d.method)
        }
    }
}

fn moved_lists(c: &CauseChange) -> [(&'static str, &[Moved]); 4] {
    [
        ("stack", &c.stacks),
        ("thread", &c.threads),
        ("call", &c.calls),
        ("file", &c.files),
    ]
}

fn amount(m: &Moved, v: f64) -> String {
    match m.unit {
        "share" => pct(v),
        "s/s" => format!("{:.0} ms/s", v * 1000.0),
        "B/s" => format!("{:.1} MB/s", v / 1e6),
        other => format!("{v:.3} {other}"),
    }
}

fn step_label(s: &StepRow) -> String {
    match s.rank {
        Some(rank) => format!("{} (rank {rank})", s.gpu),
        None => s.gpu.to_string(),
    }
}

fn step_ms(ms: Option<f64>) -> String {
    ms.map_or("-".to_owned(), |ms| format!("{ms:.1} ms"))
}

/// ` (+12%)`: the new step against the base one, when both have one.
fn step_change(s: &StepRow) -> String {
    match (s.base_ms, s.new_ms) {
        (Some(b), Some(n)) if b > 0.0 => format!(" ({:+.0}%)", (n / b - 1.0) * 100.0),
        _ => String::new(),
    }
}

fn times(x: Option<f64>) -> String {
    x.map_or("-".to_owned(), |x| format!("{x:.2}×"))
}

/// The GPU index, with the rank when runs are matched by rank.
fn gpu_label(r: &Row) -> String {
    match r.rank {
        Some(rank) => format!("{} (rank {rank})", r.gpu),
        None => r.gpu.to_string(),
    }
}

fn limit(r: &Row) -> String {
    if r.metric == super::diff::BUSY {
        "-".into()
    } else {
        format!("{:.1}", r.threshold * 100.0)
    }
}

fn bound(b: Bound) -> String {
    match b {
        Bound::AtMost(s) => format!("≤ {}", pct(s)),
        Bound::AtLeast(s) => format!("≥ {}", pct(s)),
        Bound::CountAtMost(n) => format!("≤ {n}"),
        Bound::MsAtMost(ms) => format!("≤ {ms:.0} ms"),
    }
}

fn value(b: Bound, v: f64) -> String {
    match b {
        Bound::CountAtMost(_) => format!("{v:.0}"),
        Bound::MsAtMost(_) => format!("{v:.1} ms"),
        _ => pct(v),
    }
}

pub fn write_check(c: &CheckReport, format: Format, w: &mut dyn Write) -> io::Result<()> {
    let summary = if c.failures == 0 {
        "within budget".to_owned()
    } else {
        format!("{} budget(s) exceeded", c.failures)
    };
    let gpu = |g: Option<u32>| g.map_or("-".to_owned(), |g| g.to_string());
    match format {
        f @ (Format::Html | Format::Perfetto | Format::Flamegraph) => Err(not_a_gate_format(f)),
        Format::Json => {
            serde_json::to_writer_pretty(&mut *w, c)?;
            writeln!(w)
        }
        Format::Text => {
            writeln!(w, "run: {}  budget: {}", c.run, c.budget)?;
            for r in &c.rows {
                writeln!(
                    w,
                    "{:>3}  {:<20} {:>8}  {:<8} {}",
                    gpu(r.gpu),
                    r.name,
                    value(r.bound, r.value),
                    bound(r.bound),
                    if r.pass { "ok" } else { "OVER BUDGET" }
                )?;
            }
            writeln!(w, "{summary}")
        }
        Format::Markdown => {
            writeln!(w, "### stallscope check: {summary}")?;
            writeln!(w)?;
            writeln!(w, "Run `{}` against budget `{}`.", c.run, c.budget)?;
            writeln!(w)?;
            writeln!(w, "| GPU | budget | value | limit | verdict |")?;
            writeln!(w, "|---:|---|---:|---:|---|")?;
            for r in &c.rows {
                writeln!(
                    w,
                    "| {} | `{}` | {} | {} | {} |",
                    gpu(r.gpu),
                    r.name,
                    value(r.bound, r.value),
                    bound(r.bound),
                    if r.pass { "ok" } else { "**over budget**" }
                )?;
            }
            Ok(())
        }
    }
}
