//! Gathers the kernel layout the eBPF programs need (BTF for `task_struct`, tracefs for
//! classic tracepoint records) and says which signals are missing on this kernel.
use profiler_common::Offsets;
use profiler_core::kernel_support::KernelFeatures;

use super::{btf::Btf, features, tracefs};

const NO_FIELD: u32 = u32::MAX;

/// The layout found, and the optional signals that cannot be traced, with the reason.
pub struct Layout {
    pub offsets: Offsets,
    pub missing: Vec<(String, String)>,
    /// The tracepoint that marks a request's creation in its submitter's context.
    pub submit_tracepoint: &'static str,
    /// What the kernel offers the programs (less what `STALLSCOPE_KERNEL_AS` takes away).
    pub features: KernelFeatures,
}

/// `task_struct` offsets are required: without them nothing can be traced.
pub fn read_layout() -> anyhow::Result<Layout> {
    let data = std::fs::read("/sys/kernel/btf/vmlinux").map_err(|e| {
        anyhow::anyhow!("cannot read kernel BTF at /sys/kernel/btf/vmlinux ({e}); stallscope needs a kernel built with CONFIG_DEBUG_INFO_BTF")
    })?;
    let btf = Btf::parse(&data)?;
    let pid = btf.member_offset("task_struct", "pid")?;
    let tgid = btf.member_offset("task_struct", "tgid")?;
    let mut missing = Vec::new();
    let mut submit_tracepoint = "block_io_start";
    let mut o = Offsets {
        task_pid: pid.byte_offset(),
        task_tgid: tgid.byte_offset(),
        filemap_order: NO_FIELD,
        ..Offsets::default()
    };
    match btf
        .member_offset("task_struct", "sched_info")
        .and_then(|si| {
            Ok(si.byte_offset() + btf.member_offset("sched_info", "run_delay")?.byte_offset())
        }) {
        Ok(off) => o.task_run_delay = off,
        Err(e) => missing.push((
            "runqueue_after_wakeup".to_string(),
            format!("{e}: the run-queue wait after a wake-up is counted as blocked"),
        )),
    }
    // The task's state: `__state` since 5.14, `state` (a long, whose low word holds it)
    // before. The `sched_switch` program reads it where the tracepoint has no prev_state.
    let task_state = btf
        .member_offset("task_struct", "__state")
        .or_else(|_| btf.member_offset("task_struct", "state"))
        .map(|m| m.byte_offset())
        .ok();
    o.task_state = task_state.unwrap_or(0);
    // Per-thread switch events time switch-ins from the scheduler's own account; without
    // these fields only the tracepoint can be used.
    let per_thread = || -> anyhow::Result<[u32; 6]> {
        let one = |outer: &str, member: &str| -> anyhow::Result<u32> {
            Ok(btf.member_offset(outer, member)?.byte_offset())
        };
        let nested = |member: &str, inner: &str, field: &str| -> anyhow::Result<u32> {
            Ok(one("task_struct", member)? + one(inner, field)?)
        };
        Ok([
            task_state.ok_or_else(|| anyhow::anyhow!("task_struct has no __state or state"))?,
            nested("sched_info", "sched_info", "last_arrival")?,
            nested("sched_info", "sched_info", "pcount")?,
            nested("se", "sched_entity", "cfs_rq")?,
            one("cfs_rq", "rq")?,
            one("rq", "clock")?,
        ])
    };
    match per_thread() {
        Ok([state, arrival, pcount, cfs_rq, rq, clock]) => {
            o.task_state = state;
            o.task_last_arrival = arrival;
            o.task_pcount = pcount;
            o.task_cfs_rq = cfs_rq;
            o.cfs_rq_rq = rq;
            o.rq_clock = clock;
        }
        Err(e) => log::info!("per-thread switch events unavailable: {e}"),
    }
    // What a blocked thread waits in: the call's number and first argument, as saved at
    // kernel entry (x86-64, then arm64 names).
    let regs = [("orig_ax", "di"), ("syscallno", "orig_x0")]
        .into_iter()
        .find_map(|(nr, arg)| {
            Some((
                btf.member_offset("pt_regs", nr).ok()?.byte_offset(),
                btf.member_offset("pt_regs", arg).ok()?.byte_offset(),
            ))
        });
    match regs {
        Some((nr, arg)) => {
            o.regs_syscall = nr;
            o.regs_arg0 = arg;
        }
        None => missing.push((
            "blocked_in".to_string(),
            "struct pt_regs has neither orig_ax/di nor syscallno/orig_x0 in BTF: what a \
             blocked thread waits in is not read"
                .to_string(),
        )),
    }
    match btf.member_offset("task_struct", "in_iowait") {
        Ok(m) => {
            o.task_in_iowait_byte = m.byte_offset();
            o.task_in_iowait_mask = 1 << (m.bit_offset % 8);
        }
        Err(e) => missing.push((
            "io_wait".to_string(),
            format!("{e}: IO waits are counted as blocked"),
        )),
    }
    let submit = ["block_io_start", "block_bio_queue"]
        .into_iter()
        .find_map(|name| {
            Some((
                name,
                tracefs::fields("block", name)?.get("sector").copied()?,
            ))
        });
    match submit {
        Some((name, sector)) => {
            o.submit_sector = sector;
            submit_tracepoint = name;
        }
        None => missing.push((
            "block_io".to_string(),
            "neither block:block_io_start nor block:block_bio_queue exists".to_string(),
        )),
    }
    let mut need = |cat: &str, name: &str, signal: &str, names: &[&str]| -> Option<Vec<u32>> {
        let found = tracefs::fields(cat, name).and_then(|f| {
            names
                .iter()
                .map(|n| f.get(*n).copied())
                .collect::<Option<Vec<_>>>()
        });
        if found.is_none() {
            missing.push((
                signal.to_string(),
                format!("tracepoint {cat}:{name} is missing or lacks fields {names:?}"),
            ));
        }
        found
    };
    if let Some(f) = need("block", "block_rq_issue", "block_io", &["dev", "sector"]) {
        (o.rq_issue_dev, o.rq_issue_sector) = (f[0], f[1]);
    }
    if let Some(f) = need(
        "block",
        "block_rq_complete",
        "block_io",
        &["dev", "sector", "nr_sector", "error", "rwbs"],
    ) {
        o.rq_complete_dev = f[0];
        o.rq_complete_sector = f[1];
        o.rq_complete_nr_sector = f[2];
        o.rq_complete_error = f[3];
        o.rq_complete_rwbs = f[4];
    }
    let filemap = tracefs::fields("filemap", "mm_filemap_add_to_page_cache");
    match filemap {
        Some(f) if f.contains_key("i_ino") && f.contains_key("s_dev") => {
            o.filemap_ino = f["i_ino"];
            o.filemap_dev = f["s_dev"];
            o.filemap_order = f.get("order").copied().unwrap_or(NO_FIELD);
        }
        _ => missing.push((
            "page_cache".to_string(),
            "tracepoint filemap:mm_filemap_add_to_page_cache is missing".to_string(),
        )),
    }
    missing.dedup_by(|a, b| a.0 == b.0);
    Ok(Layout {
        offsets: o,
        missing,
        submit_tracepoint,
        features: features::masked(features::probe(&btf))?,
    })
}
