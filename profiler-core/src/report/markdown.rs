//! The report as Markdown, for a pull request, an issue or `$GITHUB_STEP_SUMMARY`: the
//! verdict first, then each GPU's time by state and cause, its longest stalls, and what was
//! not checked. The details (threads, stacks, CUDA calls) stay in the text and JSON reports.
use std::io::{self, Write};

use super::model::{Inputs, JobReport, Render, Report, Subject};
use crate::attribution::Cause;
use crate::units;

/// Stalls listed per GPU.
const STALLS: usize = 5;

/// The Markdown format.
pub struct Markdown;

impl Render for Markdown {
    fn render(&self, input: &Inputs<'_, '_>, w: &mut dyn Write) -> io::Result<()> {
        match input.subject {
            Subject::One(report) => write_report(report, 1, w),
            Subject::Job(job) => write_job(job, w),
        }
    }
}

/// A table cell: no pipe or line break may end it early.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn write_job(job: &JobReport<'_>, w: &mut dyn Write) -> io::Result<()> {
    writeln!(w, "# stallscope: {} recordings", job.recordings.len())?;
    if let Some(s) = &job.ranks.straggler {
        writeln!(w, "\n**Straggler:** {}", s.text)?;
    }
    for (file, report) in &job.recordings {
        writeln!(w, "\n## `{}`", cell(file))?;
        write_report(report, 2, w)?;
    }
    writeln!(w, "\n_{}_", job.clock_note)
}

fn write_report(report: &Report<'_>, level: usize, w: &mut dyn Write) -> io::Result<()> {
    let a = report.analysis;
    let h = "#".repeat(level);
    if level == 1 {
        let host = a.meta.as_ref().map_or("", |m| m.hostname.as_str());
        let pids: Vec<String> = a.target_pids().iter().map(u32::to_string).collect();
        writeln!(
            w,
            "# stallscope: PID {} on {}",
            pids.join(", "),
            if host.is_empty() { "?" } else { host }
        )?;
    }
    writeln!(
        w,
        "\n{} s recorded; {} events lost.",
        units::seconds(a.duration_ns),
        a.lost_events
    )?;
    let Some(attr) = report.attribution else {
        return writeln!(w, "\nNo GPU utilization samples were recorded.");
    };
    if !attr.advice.is_empty() {
        writeln!(w, "\n{h}# What to change\n")?;
        for a in &attr.advice {
            writeln!(
                w,
                "1. **{}** on GPU {} ({:.1}× faster): {}",
                a.cause.name(),
                a.gpu,
                a.expected_speedup,
                cell(&a.change)
            )?;
            for e in &a.evidence {
                writeln!(w, "   - {}", cell(e))?;
            }
        }
    }
    writeln!(w, "\n**Verdict:** {}", attr.verdict.text)?;
    if level == 1
        && let Some(s) = &report.ranks.straggler
    {
        writeln!(w, "\n**Straggler:** {}", s.text)?;
    }
    for g in &attr.gpus {
        let name = a.gpus.get(&g.gpu).map_or("", |t| t.info.name.as_str());
        writeln!(w, "\n{h}# GPU {} {}\n", g.gpu, cell(name))?;
        if let Some(steps) = &g.steps {
            writeln!(w, "**Steps:** {}\n", steps.describe())?;
        }
        for what_if in &g.what_if {
            writeln!(w, "**What if:** {}\n", what_if.describe())?;
        }
        writeln!(w, "| time | seconds | of GPU time |")?;
        writeln!(w, "|---|---:|---:|")?;
        let working = g.busy_ns.saturating_sub(g.waiting_ns);
        writeln!(
            w,
            "| busy, working | {} | {} |",
            units::seconds(working),
            units::percent(working, g.observed_ns)
        )?;
        let mut lost: Vec<(&Cause, &u64)> =
            g.lost_by_cause.iter().filter(|(_, ns)| **ns > 0).collect();
        lost.sort_by(|x, y| y.1.cmp(x.1).then(x.0.cmp(y.0)));
        for (cause, ns) in lost {
            let idle = g.idle_by_cause.get(cause).copied().unwrap_or(0);
            let state = if idle >= *ns {
                "idle"
            } else {
                "idle or waiting"
            };
            writeln!(
                w,
                "| {state}: `{}` | {} | {} |",
                cause.name(),
                units::seconds(*ns),
                units::percent(*ns, g.observed_ns)
            )?;
        }
        let explained: u64 = g.lost_by_cause.values().sum();
        let unexplained = (g.idle_ns + g.waiting_ns).saturating_sub(explained);
        if unexplained > 0 {
            writeln!(
                w,
                "| idle, no cause | {} | {} |",
                units::seconds(unexplained),
                units::percent(unexplained, g.observed_ns)
            )?;
        }
        if !g.stalls.is_empty() {
            writeln!(w, "\n{h}## Longest stalls\n")?;
            writeln!(w, "| starts at | lasts | cause | why |")?;
            writeln!(w, "|---:|---:|---|---|")?;
            let mut stalls: Vec<_> = g.stalls.iter().collect();
            stalls.sort_by_key(|s| std::cmp::Reverse(s.idle_ns + s.waiting_ns));
            for s in stalls.into_iter().take(STALLS) {
                writeln!(
                    w,
                    "| {} s | {} s | `{}` | {} |",
                    units::seconds(s.start_ns.saturating_sub(a.start_ns)),
                    units::seconds(s.end_ns.saturating_sub(s.start_ns)),
                    s.cause.name(),
                    cell(s.reason.as_deref().unwrap_or(""))
                )?;
            }
        }
    }
    if !attr.unchecked.is_empty() {
        writeln!(w, "\n{h}# Not checked\n")?;
        for u in &attr.unchecked {
            writeln!(w, "- `{}`: {}", u.cause.name(), u.reason)?;
        }
    }
    Ok(())
}
