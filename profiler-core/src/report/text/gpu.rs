//! The GPU part of the text report: busy and idle time per GPU, idle time by cause, each
//! cause's evidence, the longest stalls with theirs, and the verdict.
use std::io::{self, Write};

use crate::analysis::model::{Analysis, GpuTimeline};
use crate::attribution::{Attribution, Cause, CauseEvidence, Evidence};
use crate::report::model::Report;
use crate::units;

/// How many stalls the text report details per GPU.
const TEXT_STALLS: usize = 5;
/// How many leaf frames a stack shows in the text report.
const TEXT_FRAMES: usize = 4;

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

pub fn write_text<W: Write>(report: &Report<'_>, w: &mut W) -> io::Result<()> {
    let a = report.analysis;
    let Some(attr) = report.attribution else {
        if a.gpus.is_empty() {
            return Ok(());
        }
        return writeln!(w, "\nGPU: no utilization samples were recorded");
    };
    for g in &attr.gpus {
        let name = a.gpus.get(&g.gpu).map_or("", |t| t.info.name.as_str());
        writeln!(w)?;
        let sm = a
            .gpus
            .get(&g.gpu)
            .and_then(GpuTimeline::mean_sm_active)
            .map_or(String::new(), |p| format!(" (SM activity {p:.0}%)"));
        if g.waiting_ns > 0 {
            writeln!(
                w,
                "GPU {} {name}: busy {} (working {}, waiting in collectives {}), idle {} of {} s{sm}",
                g.gpu,
                pct(g.busy_ns, g.observed_ns),
                pct(g.busy_ns - g.waiting_ns.min(g.busy_ns), g.observed_ns),
                pct(g.waiting_ns, g.observed_ns),
                pct(g.idle_ns, g.observed_ns),
                units::seconds(g.observed_ns)
            )?;
        } else {
            writeln!(
                w,
                "GPU {} {name}: busy {}, idle {} of {} s{sm}",
                g.gpu,
                pct(g.busy_ns, g.observed_ns),
                pct(g.idle_ns, g.observed_ns),
                units::seconds(g.observed_ns)
            )?;
        }
        if let Some(wt) = g.waiting.as_ref().filter(|_| g.waiting_ns > 0) {
            writeln!(w, "  waiting told from work by {}", wt.note)?;
        }
        if let Some(steps) = &g.steps {
            writeln!(w, "  steps: {}", steps.describe())?;
        }
        for what_if in &g.what_if {
            writeln!(w, "  what if: {}", what_if.describe())?;
        }
        let mut causes: Vec<(&Cause, &u64)> =
            g.idle_by_cause.iter().filter(|(_, ns)| **ns > 0).collect();
        causes.sort_by(|x, y| y.1.cmp(x.1));
        for (cause, ns) in causes {
            writeln!(
                w,
                "  idle {:>15}: {:>8} s  {:>6} of GPU time",
                cause.name(),
                units::seconds(*ns),
                pct(*ns, g.observed_ns)
            )?;
        }
        let waited = g
            .lost_by_cause
            .get(&Cause::NcclWait)
            .copied()
            .unwrap_or(0)
            .saturating_sub(g.idle_by_cause.get(&Cause::NcclWait).copied().unwrap_or(0));
        if waited > 0 {
            writeln!(
                w,
                "  waiting {:>12}: {:>8} s  {:>6} of GPU time",
                Cause::NcclWait.name(),
                units::seconds(waited),
                pct(waited, g.observed_ns)
            )?;
        }
        write_causes(&g.causes, g.observed_ns, g.waiting_ns > 0, w)?;
        write_stalls(a, attr, g.gpu, w)?;
    }
    writeln!(w, "\nverdict: {}", attr.verdict.text)?;
    for u in &attr.unchecked {
        writeln!(
            w,
            "not checked: {} (no {}: {})",
            u.cause.name(),
            u.missing
                .iter()
                .map(|s| s.name())
                .collect::<Vec<_>>()
                .join(", "),
            u.reason
        )?;
    }
    Ok(())
}

/// Each cause's evidence over all of its windows: the answer for a job that idles a little
/// everywhere and so has no stall.
fn write_causes<W: Write>(
    causes: &[CauseEvidence],
    observed_ns: u64,
    waited: bool,
    w: &mut W,
) -> io::Result<()> {
    if causes.is_empty() {
        return Ok(());
    }
    let lost = if waited { "idle or waiting" } else { "idle" };
    writeln!(w, "  why, by cause (over every window it labelled):")?;
    for c in causes {
        writeln!(
            w,
            "    {}: {} s {lost} ({} of GPU time) in {} windows",
            c.cause.name(),
            units::seconds(c.idle_ns),
            pct(c.idle_ns, observed_ns),
            c.windows
        )?;
        write_evidence(&c.evidence, w)?;
    }
    Ok(())
}

fn write_stalls<W: Write>(a: &Analysis, attr: &Attribution, gpu: u32, w: &mut W) -> io::Result<()> {
    let Some(g) = attr.gpus.iter().find(|g| g.gpu == gpu) else {
        return Ok(());
    };
    if g.stalls.is_empty() {
        return Ok(());
    }
    writeln!(w, "  longest stalls:")?;
    for s in g.stalls.iter().take(TEXT_STALLS) {
        let waited = if s.waiting_ns > 0 {
            format!(" + {} s waiting", units::seconds(s.waiting_ns))
        } else {
            String::new()
        };
        writeln!(
            w,
            "    +{} s .. +{} s  {} s idle{waited}  {}",
            units::seconds(s.start_ns.saturating_sub(a.start_ns)),
            units::seconds(s.end_ns.saturating_sub(a.start_ns)),
            units::seconds(s.idle_ns),
            s.cause.name()
        )?;
        if let Some(reason) = &s.reason {
            writeln!(w, "      why unknown: {reason}")?;
        }
        write_evidence(&s.evidence, w)?;
    }
    Ok(())
}

/// The evidence lines under a stall or a cause.
fn write_evidence<W: Write>(ev: &Evidence, w: &mut W) -> io::Result<()> {
    for t in ev.threads.iter().take(3) {
        let total = t
            .on_cpu_ns
            .saturating_add(t.runqueue_ns)
            .saturating_add(t.io_wait_ns)
            .saturating_add(t.blocked_ns)
            .max(1);
        writeln!(
            w,
            "      {} {} ({}/{}): on-CPU {}, run-queue {}, IO {}, blocked {}",
            t.role,
            t.comm,
            t.pid,
            t.tid,
            pct(t.on_cpu_ns, total),
            pct(t.runqueue_ns, total),
            pct(t.io_wait_ns, total),
            pct(t.blocked_ns, total)
        )?;
    }
    for st in ev.stacks.iter().take(2) {
        let leaf: Vec<&str> = st
            .frames
            .iter()
            .rev()
            .take(TEXT_FRAMES)
            .map(String::as_str)
            .collect();
        writeln!(
            w,
            "      stack ({} {}): {}",
            st.weight,
            st.unit,
            leaf.join(" <- ")
        )?;
    }
    if let Some(io) = &ev.block_io {
        writeln!(
            w,
            "      block IO: {} requests, {} read, p99 {} ms",
            io.requests,
            units::bytes(io.read_bytes),
            io.p99_ns
                .map_or("-".into(), |ns| format!("{:.1}", ns as f64 / 1e6))
        )?;
    }
    if let Some(c) = &ev.cuda {
        write_cuda_evidence(c, w)?;
    }
    for wait in &ev.feeder_waits {
        writeln!(w, "      feeder blocked in: {wait}")?;
    }
    if let Some(o) = &ev.outside {
        writeln!(w, "      the GPU waited for work: {}", o.describe())?;
    }
    Ok(())
}

fn write_cuda_evidence<W: Write>(
    c: &crate::attribution::cuda_evidence::CudaEvidence,
    w: &mut W,
) -> std::io::Result<()> {
    for call in c.calls.iter().take(3) {
        writeln!(
            w,
            "      in {} ({} calls, {} s){}",
            call.api,
            call.calls,
            units::seconds(call.total_ns),
            if call.caller.is_empty() {
                String::new()
            } else {
                format!(" called from {}", call.caller)
            }
        )?;
    }
    if let Some(cp) = &c.copies {
        writeln!(
            w,
            "      copies: {} pinned, {} pageable{}{}",
            units::bytes(cp.pinned_bytes),
            units::bytes(cp.pageable_bytes),
            cp.achieved_gbps
                .map(|g| format!(", achieved {g:.2} GB/s"))
                .unwrap_or_default(),
            if cp.pageable_bytes > cp.pinned_bytes {
                " (pageable memory is staged by the CPU: pin_memory=True)"
            } else {
                ""
            }
        )?;
    }
    if let Some(l) = &c.link {
        writeln!(
            w,
            "      PCIe link: gen{} x{} (max gen{} x{}): {:.1} GB/s now, {:.1} GB/s at full width and speed{}",
            l.generation,
            l.width,
            l.max_gen,
            l.max_width,
            l.current_gbps,
            l.expected_gbps,
            if l.saturated { ", saturated" } else { "" }
        )?;
    }
    if let Some(rate) = c.launches_per_sec {
        writeln!(
            w,
            "      kernel launches: about {rate:.0}/s from the feeder's process ({})",
            c.launches_by_api
                .iter()
                .map(|(api, n)| format!("{api} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        )?;
    }
    for col in &c.collectives {
        writeln!(
            w,
            "      NCCL {}: {} calls, {} (they only enqueue; the wait is in the sync after them)",
            col.op,
            col.calls,
            units::bytes(col.bytes)
        )?;
    }
    Ok(())
}
