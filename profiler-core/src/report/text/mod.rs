//! The human summary: a header with caveats, then one thread table per process.
//!
//! Percentages are of each thread's own observed lifetime (the sum of its four time counters),
//! so a short-lived worker and the main thread read on the same scale.
use std::io::{self, Write};

use super::model::{Inputs, JobReport, Render, Report, Subject};
use crate::analysis::model::{Analysis, ProcessSummary, ThreadSummary};
use crate::cuda::CudaSummary;
use crate::recording::reader::LoadInfo;
use crate::recording::record::EndReason;
use crate::table::{Align, Table};
use crate::units;

/// Longest command line shown in a process heading.
const CMDLINE_CHARS: usize = 80;
/// How many files the page-cache section lists.
const TOP_FILES: usize = 5;

pub mod gpu;

/// The text format.
pub struct Text;

impl Render for Text {
    fn render(&self, input: &Inputs<'_, '_>, w: &mut dyn Write) -> io::Result<()> {
        match input.subject {
            Subject::One(report) => write_text(report, w),
            Subject::Job(job) => write_job(job, w),
        }
    }
}

/// Each recording's report under its file name, then the ranks across all of them.
fn write_job(job: &JobReport<'_>, mut w: &mut dyn Write) -> io::Result<()> {
    {
        for (file, report) in &job.recordings {
            writeln!(w, "=== {file} ===")?;
            write_text(report, &mut *w)?;
            writeln!(w)?;
        }
        writeln!(w, "=== all recordings ===")?;
        write_ranks(&job.ranks, &mut w)?;
        writeln!(w, "{}", job.clock_note)
    }
}

/// Writes the text report.
pub fn write_text<W: Write>(report: &Report<'_>, mut w: W) -> io::Result<()> {
    let analysis = report.analysis;
    write_header(analysis, report.load, &mut w)?;
    write_advice(report, &mut w)?;
    gpu::write_text(report, &mut w)?;
    let ranks = &report.ranks;
    // With ranks, the job's answer is the straggler: say it next to the verdict.
    if let Some(s) = &ranks.straggler {
        writeln!(w, "straggler: {}", s.text)?;
    }
    write_cuda(&report.cuda, &mut w)?;
    if !ranks.ranks.is_empty() {
        writeln!(w)?;
        write_ranks(ranks, &mut w)?;
    }
    for process in analysis.processes.values() {
        writeln!(w)?;
        write_process(analysis, process, &mut w)?;
    }
    write_top_files(analysis, &mut w)
}

/// What to change, first: each change with its expected speedup and the numbers behind it.
fn write_advice<W: Write>(report: &Report<'_>, w: &mut W) -> io::Result<()> {
    let advice = report.attribution.map_or(&[][..], |a| &a.advice);
    if advice.is_empty() {
        return Ok(());
    }
    writeln!(w, "what to change (largest gain first):")?;
    for (i, a) in advice.iter().enumerate() {
        writeln!(
            w,
            "  {}. {} on GPU {} ({:.1}× faster): {}",
            i + 1,
            a.cause.name(),
            a.gpu,
            a.expected_speedup,
            a.change
        )?;
        for e in &a.evidence {
            writeln!(w, "       {e}")?;
        }
    }
    writeln!(w)
}

fn write_cuda<W: Write>(summary: &CudaSummary<'_>, w: &mut W) -> io::Result<()> {
    if summary.libraries.is_empty() && summary.processes.is_empty() {
        return Ok(());
    }
    writeln!(w)?;
    writeln!(w, "CUDA/NCCL probes:")?;
    for l in summary.libraries.iter() {
        writeln!(
            w,
            "  {} {} (PID {}): {} functions probed{}",
            l.library.name(),
            l.path,
            l.pid,
            l.attached,
            if l.missing.is_empty() {
                String::new()
            } else {
                format!(
                    ", missing: {}",
                    l.missing
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        )?;
    }
    for p in &summary.processes {
        let waits: Vec<String> = p
            .wait_ns
            .iter()
            .map(|(k, ns)| format!("{} {} s", k.replace('_', " "), units::seconds(*ns)))
            .collect();
        writeln!(
            w,
            "  PID {}{}: waited in CUDA: {}",
            p.pid,
            p.rank
                .map(|r| format!(" (rank {} of {})", r.rank, r.nranks))
                .unwrap_or_default(),
            if waits.is_empty() {
                "nothing".to_string()
            } else {
                waits.join(", ")
            }
        )?;
        if p.pinned_copy_bytes > 0 || p.pageable_copy_bytes > 0 {
            writeln!(
                w,
                "    copies: {} MiB from pinned memory, {} MiB from pageable memory",
                p.pinned_copy_bytes >> 20,
                p.pageable_copy_bytes >> 20
            )?;
        }
        if let Some(l) = p.launches {
            writeln!(
                w,
                "    kernel launches: about {:.0}/s ({} counted while the launch probes were on)",
                l.per_sec, l.counted
            )?;
        }
        for c in p.calls.iter().take(5) {
            writeln!(
                w,
                "    {:<28} {:>7} calls {:>9} s{}",
                c.api,
                c.calls,
                units::seconds(c.total_ns),
                if c.errors > 0 {
                    format!(" ({} failed)", c.errors)
                } else {
                    String::new()
                }
            )?;
            for from in &c.callers {
                writeln!(
                    w,
                    "      from {} ({} calls, {} s)",
                    from.caller,
                    from.calls,
                    units::seconds(from.total_ns)
                )?;
            }
        }
    }
    Ok(())
}

/// The NCCL ranks and the straggler.
pub fn write_ranks<W: Write>(
    ranks: &crate::attribution::ranks::RankView,
    w: &mut W,
) -> io::Result<()> {
    writeln!(w, "NCCL ranks:")?;
    for r in &ranks.ranks {
        writeln!(
            w,
            "  rank {} PID {}{}{}: {:.0}% of the time waiting in collectives{}",
            match (r.rank, r.nranks) {
                (Some(rank), Some(n)) => format!("{rank}/{n}"),
                (Some(rank), None) => rank.to_string(),
                _ => "?".into(),
            },
            r.pid,
            if r.host.is_empty() {
                String::new()
            } else {
                format!(" on {}", r.host)
            },
            r.gpu.map(|g| format!(", GPU {g}")).unwrap_or_default(),
            r.nccl_wait_share * 100.0,
            r.own_cause
                .map(|c| format!("; own cause: {}", c.name()))
                .unwrap_or_default()
        )?;
        if let (Some(n), Some(late)) = (r.arrived_last, r.late_ns)
            && n > 0
        {
            writeln!(
                w,
                "    queued last in {n} collectives, {} s later than the others' median in all",
                crate::units::seconds(late)
            )?;
        }
    }
    for arr in &ranks.arrivals {
        writeln!(
            w,
            "  {} collectives matched across ranks; the last rank queued them {} ms after the others' median (median)",
            arr.matched,
            format_args!("{:.1}", arr.median_late_ns as f64 / 1e6)
        )?;
    }
    match &ranks.straggler {
        Some(s) => writeln!(w, "  {}", s.text),
        None => writeln!(w, "  no straggler: the ranks waited alike"),
    }
}

/// The text report as a string.
pub fn to_text(report: &Report<'_>) -> String {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = write_text(report, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Which events were lost, when any were: the header's total does not say what is missing.
fn write_losses<W: Write>(a: &Analysis, w: &mut W) -> io::Result<()> {
    if let Some(c) = a.events.get(UNTRACKED).filter(|c| c.lost > 0) {
        writeln!(
            w,
            "warning: {} threads were not traced: more were alive at once than --max-threads \
             allows",
            c.lost
        )?;
    }
    let lost: Vec<String> = a
        .events
        .iter()
        .filter(|(kind, c)| c.lost > 0 && kind.as_str() != UNTRACKED)
        .map(|(kind, c)| format!("{kind} {} of {}", c.lost, c.attempted))
        .collect();
    if !lost.is_empty() {
        writeln!(w, "warning: events lost: {}", lost.join(", "))?;
    }
    Ok(())
}

/// The event kind that counts threads the kernel's table had no room for.
const UNTRACKED: &str = "thread_untracked";

fn write_header<W: Write>(a: &Analysis, load: &LoadInfo, w: &mut W) -> io::Result<()> {
    let pids = a.target_pids();
    let target = match pids {
        [] => "unknown target".to_owned(),
        [pid] => format!("target pid {pid}"),
        _ => {
            let list: Vec<String> = pids.iter().map(u32::to_string).collect();
            format!("target pids {}", list.join(","))
        }
    };
    writeln!(
        w,
        "stallscope: {target}, {} s, {} threads in {} processes, lost {} of {} events",
        units::seconds(a.duration_ns),
        a.threads.len(),
        a.processes.len(),
        a.lost_events,
        a.attempted_events,
    )?;
    for (kind, e) in a.events.iter().filter(|(_, e)| e.lost > 0) {
        if let Some(what) = crate::report::losses::weakens(kind) {
            writeln!(
                w,
                "lost {} {}: weakens {what}",
                e.lost,
                kind.replace('_', " ")
            )?;
        }
    }
    let thinned: Vec<String> = a
        .events
        .iter()
        .filter(|(_, e)| e.thinned > 0)
        .map(|(kind, e)| format!("{} {}", e.thinned, kind.replace('_', " ")))
        .collect();
    if !thinned.is_empty() {
        writeln!(
            w,
            "thinned while the reader was behind (stack evidence only; every state change, \
             CUDA call and IO kept): {}",
            thinned.join(", ")
        )?;
    }
    if let Some(meta) = a.meta.as_ref().filter(|m| !m.command.is_empty()) {
        let command = units::shorten(&meta.command.join(" "), CMDLINE_CHARS);
        writeln!(w, "command: {command}")?;
    }
    match a.end_reason {
        Some(EndReason::Duration) => writeln!(w, "ended: requested duration elapsed")?,
        Some(EndReason::Signal) => writeln!(w, "ended: interrupted")?,
        Some(EndReason::TargetExited) => writeln!(w, "ended: target exited")?,
        None => writeln!(
            w,
            "warning: no end record; the duration runs to the last event"
        )?,
    }
    for u in &a.unavailable {
        writeln!(w, "warning: {} unavailable: {}", u.signal, u.reason)?;
    }
    write_losses(a, w)?;
    if let Some(u) = &a.unwinding {
        write_unwinding(u, w)?;
    }
    if let Some(p) = &a.python {
        write_python(p, w)?;
    }
    if let Some(t) = load.truncated {
        writeln!(
            w,
            "warning: recording truncated at byte {} after {} records (the profiler stopped \
             mid-write); the rest is lost",
            t.offset, t.records_loaded
        )?;
    }
    if load.unknown_records > 0 {
        writeln!(
            w,
            "warning: skipped {} records of a kind this version does not know (written by a \
             newer stallscope)",
            load.unknown_records
        )?;
    }
    Ok(())
}

fn write_python<W: Write>(p: &crate::recording::record::PythonStats, w: &mut W) -> io::Result<()> {
    if !p.processes.is_empty() {
        let mut versions: Vec<&str> = p.processes.iter().map(|(_, v)| v.as_str()).collect();
        versions.sort_unstable();
        versions.dedup();
        write!(
            w,
            "python: {} samples with Python frames (CPython {} in {} process{})",
            p.samples,
            versions.join(", "),
            p.processes.len(),
            if p.processes.len() == 1 { "" } else { "es" },
        )?;
        if p.unreadable > 0 {
            write!(w, "; {} frames unreadable", p.unreadable)?;
        }
        if p.truncated > 0 {
            write!(w, "; {} samples deeper than the walk reads", p.truncated)?;
        }
        writeln!(w)?;
    }
    for warning in &p.warnings {
        writeln!(w, "warning: {warning}")?;
    }
    Ok(())
}

fn write_unwinding<W: Write>(
    u: &crate::recording::record::UnwindStats,
    w: &mut W,
) -> io::Result<()> {
    let n = u.samples();
    if n > 0 {
        let pct = |k: u64| 100.0 * k as f64 / n as f64;
        write!(
            w,
            "stacks: {n} samples unwound: {:.1}% complete, {:.1}% truncated, {:.1}% failed \
             (DWARF {:.0}%, frame pointers {:.0}%)",
            pct(u.complete),
            pct(u.truncated),
            pct(u.failed),
            pct(u.by_dwarf),
            pct(u.by_frame_pointers),
        )?;
        if u.without_copy > 0 {
            write!(w, "; {} came without their stack copy", u.without_copy)?;
        }
        if u.dwarf_walks > 0 {
            write!(
                w,
                "; {:.1} µs per DWARF unwind",
                u.dwarf_ns as f64 / 1e3 / u.dwarf_walks as f64
            )?;
        }
        writeln!(w)?;
    }
    for warning in &u.warnings {
        writeln!(w, "warning: unwinding: {warning}")?;
    }
    Ok(())
}

fn write_process<W: Write>(a: &Analysis, p: &ProcessSummary, w: &mut W) -> io::Result<()> {
    let mut heading = format!("PID {}  {}", p.pid, display_comm(&p.comm));
    if let Some(ppid) = p.ppid {
        heading.push_str(&format!("  (ppid {ppid})"));
    }
    if !p.cmdline.is_empty() {
        heading.push_str("  ");
        heading.push_str(&units::shorten(&p.cmdline, CMDLINE_CHARS));
    }
    writeln!(w, "{heading}")?;
    if p.threads.is_empty() {
        return writeln!(w, "  (no threads seen)");
    }

    let mut threads: Vec<&ThreadSummary> = p
        .threads
        .iter()
        .filter_map(|tid| a.threads.get(tid))
        .collect();
    threads.sort_by(|x, y| {
        y.counters
            .on_cpu_ns
            .cmp(&x.counters.on_cpu_ns)
            .then(x.tid.cmp(&y.tid))
    });

    let mut table = Table::new(&[
        ("TID", Align::Right),
        ("COMM", Align::Left),
        ("ON-CPU", Align::Right),
        ("RUNQ", Align::Right),
        ("IOWAIT", Align::Right),
        ("BLOCKED", Align::Right),
        ("BLK-IO", Align::Right),
        ("P50-MS", Align::Right),
        ("P99-MS", Align::Right),
        ("PC-MISS", Align::Right),
        ("MISS-BYTES", Align::Right),
        ("READ-BYTES", Align::Right),
        ("BLOCKED-ON", Align::Left),
    ]);
    for t in threads {
        let c = &t.counters;
        let life = c.lifetime_ns();
        let mut comm = display_comm(&t.comm).to_owned();
        if t.exited {
            comm.push_str(" (exited)");
        }
        table.row(vec![
            t.tid.to_string(),
            comm,
            units::percent(c.on_cpu_ns, life),
            units::percent(c.runqueue_ns, life),
            units::percent(c.io_wait_ns, life),
            units::percent(c.blocked_ns, life),
            t.block_io.count.to_string(),
            units::ms(t.block_io.p50_ns),
            units::ms(t.block_io.p99_ns),
            c.page_cache_misses.to_string(),
            units::bytes(c.page_cache_miss_bytes),
            units::bytes(t.block_io.read_bytes),
            top_wait(t),
        ]);
    }
    table.write("  ", w)
}

/// The thread's top wait, for the BLOCKED-ON column: `recvfrom socket TCP ... (82%)`, the
/// share of its sampled off-CPU time, and who ended it most (`<- TID 812 (python)`); `-`
/// when it never blocked or the recording does not say.
fn top_wait(t: &ThreadSummary) -> String {
    let Some(top) = t.blocked_on.first() else {
        return "-".into();
    };
    let all: u64 = t.blocked_on.iter().map(|b| b.ns).sum();
    let what = if top.detail.is_empty() {
        top.call.clone()
    } else {
        format!("{} {}", top.call, top.detail)
    };
    match top.wakers.first() {
        Some(w) => format!("{what} ({}) <- {}", units::percent(top.ns, all), w.who),
        None => format!("{what} ({})", units::percent(top.ns, all)),
    }
}

fn write_top_files<W: Write>(a: &Analysis, w: &mut W) -> io::Result<()> {
    let files = a.top_page_cache_files(TOP_FILES);
    if files.is_empty() {
        return Ok(());
    }
    writeln!(w)?;
    writeln!(w, "top page-cache-missing files")?;
    let mut table = Table::new(&[
        ("MISS-BYTES", Align::Right),
        ("PAGES", Align::Right),
        ("FILE", Align::Left),
    ]);
    for f in &files {
        table.row(vec![
            units::bytes(f.bytes),
            f.pages.to_string(),
            f.display_name(),
        ]);
    }
    table.write("  ", w)
}

fn display_comm(comm: &str) -> &str {
    if comm.is_empty() { "?" } else { comm }
}
