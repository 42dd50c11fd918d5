//! Loads and attaches the eBPF programs. Every program is loaded (verified) before anything
//! is attached, so a verifier rejection leaves nothing half-attached; all links are file
//! descriptors, so even SIGKILL leaves the kernel clean.
use std::os::fd::AsFd as _;

use aya::{
    Btf, Ebpf, EbpfLoader,
    programs::{
        BtfTracePoint, PerfEvent, ProgramError, TracePoint, UProbe,
        perf_event::{
            PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent,
        },
        tp_btf::BtfTracePointLinkId,
    },
};
use profiler_common::{Config, Offsets};

/// A program that failed the verifier: its name and the whole verifier log.
#[derive(Debug, thiserror::Error)]
#[error(
    "the kernel's verifier rejected eBPF program `{program}`: {error}\n--- verifier log ---\n{log}"
)]
pub struct VerifierRejection {
    pub program: String,
    pub error: String,
    pub log: String,
}

/// The tracepoint of every context switch on the host (see [`SwitchHook`]).
const SCHED_SWITCH: &str = "sched_switch";
const SCHED: [&str; 3] = [
    "sched_process_fork",
    "sched_process_exit",
    "sched_process_exec",
];
/// Who woke a tracked thread (see profiler-ebpf's `sched_waking`): loaded with `--wakers`.
const WAKING: &str = "sched_waking";
/// The program of each tracked thread's context-switch event (see `switch_hooks.rs`).
const SWITCH_OUT: &str = "switch_out";
const BLOCK: [&str; 3] = ["block_submit", "block_rq_issue", "block_rq_complete"];
const FILEMAP: &str = "mm_filemap_add_to_page_cache";

/// Tests set this to load a program the verifier rejects (see profiler-ebpf's canary.rs).
const CANARY_ENV: &str = "STALLSCOPE_TEST_VERIFIER_CANARY";
/// `0` keeps the CUDA probes on one perf-event uprobe per function, as on kernels before 6.6
/// (the tests check that path still works where uprobe_multi exists).
pub const UPROBE_MULTI_ENV: &str = "STALLSCOPE_UPROBE_MULTI";

static BYTECODE: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/stallscope"));

fn rejection(program: &str, e: ProgramError) -> anyhow::Error {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => VerifierRejection {
            program: program.to_string(),
            error: io_error.to_string(),
            log: verifier_log.to_string(),
        }
        .into(),
        other => anyhow::Error::new(other).context(format!("loading eBPF program `{program}`")),
    }
}

/// Returns memory the allocator holds free to the kernel (glibc keeps it otherwise, and the
/// recorder's peak RSS counts it).
pub fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: no preconditions; it only gives free heap pages back.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The kernel's largest `pid_max` on 64-bit (`PID_MAX_LIMIT`).
const PID_MAX_LIMIT: u32 = 1 << 22;

/// Elements of `TRACKED`: a lane for every TID below `pid_max`.
fn tracked_elements() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(PID_MAX_LIMIT)
        .clamp(1, PID_MAX_LIMIT)
        .div_ceil(profiler_common::TIDS_PER_ELEMENT)
}

/// Loads every program, with room for `max_threads` tracked threads at once. Optional
/// signals in `skip` (block_io, page_cache, cuda, wakers) are not loaded.
pub fn load(
    offsets: &Offsets,
    config: &Config,
    max_threads: u32,
    skip: &[String],
) -> anyhow::Result<Ebpf> {
    let mut ebpf = EbpfLoader::new()
        .map_max_entries("TRACKED", tracked_elements())
        .map_max_entries("SLOTS", max_threads)
        .map_max_entries("FREE_SLOTS", max_threads)
        .override_global("OFFSETS", offsets, true)
        .override_global("CONFIG", config, true)
        .load(BYTECODE)
        .map_err(|e| anyhow::Error::new(e).context("loading stallscope's eBPF object"))?;
    if let Err(e) = aya_log::EbpfLogger::init(&mut ebpf) {
        log::debug!("eBPF logging not active: {e}");
    }
    if std::env::var_os(CANARY_ENV).is_some() {
        let prog: &mut TracePoint = program(&mut ebpf, "verifier_canary")?;
        prog.load().map_err(|e| rejection("verifier_canary", e))?;
    }
    // The loader parsed the kernel's BTF for its relocations and has dropped it; the
    // programs need it parsed again. Handing the first copy's memory back before the second
    // is made keeps the two from adding up in the recorder's peak RSS.
    release_freed_memory();
    let btf = Btf::from_sys_fs().map_err(|e| anyhow::anyhow!("reading kernel BTF: {e}"))?;
    for name in std::iter::once(SCHED_SWITCH).chain(SCHED) {
        let prog: &mut BtfTracePoint = program(&mut ebpf, name)?;
        prog.load(name, &btf).map_err(|e| rejection(name, e))?;
    }
    let wanted = |signal: &str| !skip.iter().any(|s| s == signal);
    if wanted("wakers") {
        let prog: &mut BtfTracePoint = program(&mut ebpf, WAKING)?;
        prog.load(WAKING, &btf).map_err(|e| rejection(WAKING, e))?;
    }
    if wanted("block_io") {
        for name in BLOCK {
            let prog: &mut TracePoint = program(&mut ebpf, name)?;
            prog.load().map_err(|e| rejection(name, e))?;
        }
    }
    if wanted("page_cache") {
        let prog: &mut TracePoint = program(&mut ebpf, FILEMAP)?;
        prog.load().map_err(|e| rejection(FILEMAP, e))?;
    }
    let prog: &mut UProbe = program(&mut ebpf, crate::capture::probes::dlopen::PROGRAM)?;
    prog.load()
        .map_err(|e| rejection(crate::capture::probes::dlopen::PROGRAM, e))?;
    let prog: &mut PerfEvent = program(&mut ebpf, "cpu_sample")?;
    prog.load().map_err(|e| rejection("cpu_sample", e))?;
    if offsets.rq_clock != 0 {
        let prog: &mut PerfEvent = program(&mut ebpf, SWITCH_OUT)?;
        prog.load().map_err(|e| rejection(SWITCH_OUT, e))?;
    }
    if wanted("cuda") {
        use crate::capture::probes::cuda::{ENTER, ENTER_MULTI, EXIT, EXIT_MULTI, LAUNCH};
        let classic: &[&str] = if load_multi(&mut ebpf, [ENTER_MULTI, EXIT_MULTI]) {
            &[]
        } else {
            &[ENTER, EXIT]
        };
        for &name in classic.iter().chain(&[LAUNCH]) {
            let prog: &mut UProbe = program(&mut ebpf, name)?;
            prog.load().map_err(|e| rejection(name, e))?;
        }
    }
    Ok(ebpf)
}

/// Loads the CUDA entry and return programs for uprobe_multi links where the kernel makes
/// them (removed with one grace period per library, see `probes::uprobe_multi`); false, with
/// both unloaded, where it does not or `STALLSCOPE_UPROBE_MULTI=0` says not to.
fn load_multi(ebpf: &mut Ebpf, names: [&str; 2]) -> bool {
    if std::env::var_os(UPROBE_MULTI_ENV).is_some_and(|v| v == "0") {
        return false;
    }
    let mut loaded = true;
    for name in names {
        if let Err(e) = program::<UProbe>(ebpf, name).and_then(|p| Ok(p.load_multi()?)) {
            log::debug!("{name} not loaded for uprobe_multi: {e}");
            loaded = false;
        }
    }
    let supported = loaded
        && program::<UProbe>(ebpf, names[0])
            .ok()
            .and_then(|p| p.fd().ok())
            .is_some_and(|fd| crate::capture::probes::uprobe_multi::supported(fd.as_fd()));
    if !supported {
        for name in names {
            if let Ok(p) = program::<UProbe>(ebpf, name) {
                let _ = p.unload();
            }
        }
    }
    supported
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> anyhow::Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let prog = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow::anyhow!("eBPF program `{name}` missing from the object"))?;
    Ok(prog.try_into()?)
}

/// Attaches the loaded programs. Scheduler tracing is required; the other signals degrade
/// to a named entry in the returned list.
pub fn attach(
    ebpf: &mut Ebpf,
    sample_hz: u64,
    submit_tracepoint: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut unavailable = Vec::new();
    for name in SCHED {
        let prog: &mut BtfTracePoint = program(ebpf, name)?;
        prog.attach()
            .map_err(|e| anyhow::Error::new(e).context(format!("attaching {name}")))?;
    }
    if let Ok(prog) = program::<BtfTracePoint>(ebpf, WAKING)
        && prog.fd().is_ok()
        && let Err(e) = prog.attach()
    {
        unavailable.push(("wakers".into(), format!("attaching {WAKING}: {e}")));
    }
    for name in BLOCK {
        if let Ok(prog) = program::<TracePoint>(ebpf, name) {
            if prog.fd().is_err() {
                continue;
            }
            let tracepoint = if name == "block_submit" {
                submit_tracepoint
            } else {
                name
            };
            if let Err(e) = prog.attach("block", tracepoint) {
                unavailable.push((
                    "block_io".into(),
                    format!("attaching block:{tracepoint}: {e}"),
                ));
            }
        }
    }
    if let Ok(prog) = program::<TracePoint>(ebpf, FILEMAP)
        && prog.fd().is_ok()
        && let Err(e) = prog.attach("filemap", FILEMAP)
    {
        unavailable.push((
            "page_cache".into(),
            format!("attaching filemap:{FILEMAP}: {e}"),
        ));
    }
    if sample_hz > 0 {
        let prog: &mut PerfEvent = program(ebpf, "cpu_sample")?;
        let cpus = aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
        for cpu in cpus {
            if let Err(e) = prog.attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(sample_hz),
                false,
            ) {
                unavailable.push((
                    "cpu_stacks".into(),
                    format!("perf_event_open on CPU {cpu}: {e}"),
                ));
                break;
            }
        }
    }
    Ok(unavailable)
}

/// How tracked threads' context switches reach the programs (see `switch_choice.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchHook {
    Tracepoint,
    PerThread,
}

/// Tells the programs which hook accounts the tracked threads' switches
/// (`profiler_common::switch_hook`).
pub fn set_switch_mode(ebpf: &mut Ebpf, mode: u32) -> anyhow::Result<()> {
    let mut modes: aya::maps::Array<_, u32> = aya::maps::Array::try_from(
        ebpf.map_mut("SWITCH_HOOK")
            .ok_or_else(|| anyhow::anyhow!("map SWITCH_HOOK missing"))?,
    )?;
    modes.set(0, mode, 0)?;
    Ok(())
}

/// Attaches the program of every context switch on the host.
pub fn attach_switch_tracepoint(ebpf: &mut Ebpf) -> anyhow::Result<BtfTracePointLinkId> {
    let prog: &mut BtfTracePoint = program(ebpf, SCHED_SWITCH)?;
    prog.attach()
        .map_err(|e| anyhow::Error::new(e).context(format!("attaching {SCHED_SWITCH}")))
}

pub fn detach_switch_tracepoint(ebpf: &mut Ebpf, link: BtfTracePointLinkId) -> anyhow::Result<()> {
    let prog: &mut BtfTracePoint = program(ebpf, SCHED_SWITCH)?;
    prog.detach(link)
        .map_err(|e| anyhow::Error::new(e).context(format!("detaching {SCHED_SWITCH}")))
}

/// Forgets what each CPU last switched to: the tracepoint's program, which kept it, saw none
/// of the switches while per-thread events accounted them. A CPU without a record looks its
/// next `prev` up and takes a switch-in it did not see from the scheduler.
pub fn clear_cpu_records(ebpf: &mut Ebpf) -> anyhow::Result<()> {
    let mut records: aya::maps::PerCpuArray<_, profiler_common::CpuSlot> =
        aya::maps::PerCpuArray::try_from(
            ebpf.map_mut("CPU_CURRENT")
                .ok_or_else(|| anyhow::anyhow!("map CPU_CURRENT missing"))?,
        )?;
    let cpus = aya::util::nr_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
    let none = aya::maps::PerCpuValues::try_from(vec![profiler_common::CpuSlot::default(); cpus])?;
    records.set(0, none, 0)?;
    Ok(())
}

/// The tracked threads' switch-outs the programs accounted so far, over all CPUs.
pub fn switches_out(ebpf: &Ebpf) -> anyhow::Result<u64> {
    let counts: aya::maps::PerCpuArray<_, u64> = aya::maps::PerCpuArray::try_from(
        ebpf.map("SWITCHES_OUT")
            .ok_or_else(|| anyhow::anyhow!("map SWITCHES_OUT missing"))?,
    )?;
    Ok(counts.get(&0, 0)?.iter().sum())
}

/// Opens a context-switch event on thread `tid` that runs the switch-out program, and that
/// the kernel copies to every thread and process `tid` creates from then on.
pub fn hook_switches(ebpf: &mut Ebpf, tid: u32) -> anyhow::Result<PerfEventLinkId> {
    let prog: &mut PerfEvent = program(ebpf, SWITCH_OUT)?;
    Ok(prog.attach(
        PerfEventConfig::Software(SoftwareEvent::ContextSwitches),
        PerfEventScope::OneProcess {
            pid: tid,
            cpu: None,
        },
        SamplePolicy::Period(1),
        true,
    )?)
}

/// Closes a thread's context-switch event, and with it the copies its threads inherited.
pub fn unhook_switches(ebpf: &mut Ebpf, link: PerfEventLinkId) -> anyhow::Result<()> {
    let prog: &mut PerfEvent = program(ebpf, SWITCH_OUT)?;
    prog.detach(link)?;
    Ok(())
}

/// Detaches and unloads every program; the maps stay readable. Each program on a thread of
/// its own: detaching a program from a perf event (a classic tracepoint, a uprobe) waits for
/// RCU grace periods, which concurrent detaches share, and which a busy host can stretch to
/// seconds each (up to 55 s seen for one tracepoint, eight spinning ranks on two CPUs).
pub fn detach_all(ebpf: &mut Ebpf) {
    std::thread::scope(|s| {
        for (name, prog) in ebpf.programs_mut() {
            s.spawn(move || {
                let result = match prog {
                    aya::programs::Program::BtfTracePoint(p) => p.unload(),
                    aya::programs::Program::TracePoint(p) => p.unload(),
                    aya::programs::Program::PerfEvent(p) => p.unload(),
                    aya::programs::Program::UProbe(p) => p.unload(),
                    _ => Ok(()),
                };
                if let Err(e) = result {
                    log::debug!("unloading {name}: {e}");
                }
            });
        }
    });
}
