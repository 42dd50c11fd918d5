//! `stallscope record`: everything between the command line and a finished recording.
use std::{collections::BTreeSet, path::PathBuf};

use aya::maps::RingBuf;
use profiler_common::{Config, ThreadStats};
use profiler_core::{
    kernel_support,
    recording::record::{EndReason, Meta, Record},
};

use crate::{
    capture::{
        clock::monotonic_ns,
        decode::Decoder,
        gpu,
        kernel::slots::Slots,
        kernel::{
            loader::{self, SwitchHook},
            offsets, switch_choice,
            switch_control::SwitchControl,
        },
        probes::{
            cuda::{CudaProbes, LaunchDuty},
            dlopen::DlopenWatch,
        },
        proc::target,
        recording_file::{RecordingFile, WriteFailed},
        segment_files::SegmentFiles,
        session::{self, Session},
        sink::{Sink, write_process},
        stacks::{FramePointers, Unwinding},
    },
    output,
    plan::{RecordingPlan, Signals, SwitchHookChoice, Targets, Unwind},
    privileges, spawn,
};

fn default_output(plan: &RecordingPlan, root: u32) -> PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let name = match &plan.targets {
        Targets::Launch(command) => command
            .first()
            .and_then(|c| std::path::Path::new(c).file_name())
            .map(|n| n.to_string_lossy().into_owned()),
        Targets::Running(_) => None,
    }
    .unwrap_or_else(|| root.to_string());
    PathBuf::from(format!("stallscope-{name}-{secs}.rec"))
}

fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Records `plan` in four steps: attach the programs and probes to the targets, open the
/// recording and write what is known at the start, run until the plan's end, and finish (the
/// launched command's status, the report, the probes removed). Returns the exit status.
pub fn run(plan: &RecordingPlan) -> anyhow::Result<i32> {
    run_with(plan, Segments::Report)
}

/// What becomes of each finished `--segment` file.
pub enum Segments {
    /// Reported on stdout as it ends, in the plan's format (`record --segment`).
    Report,
    /// Handed over as it ends, the last one at the recording's end (`top`); nothing is
    /// written on stdout. `attached` runs once the probes are attached and the capabilities
    /// dropped (threads started before would keep theirs: the drop refuses to run beside
    /// them). `stop` ends the recording as an interrupt would, even when notified before it
    /// started.
    Hand {
        to: std::sync::mpsc::Sender<PathBuf>,
        stop: std::sync::Arc<tokio::sync::Notify>,
        attached: Box<dyn FnOnce() + Send>,
    },
}

/// As [`run`], with the segments used as `segments` says.
pub fn run_with(plan: &RecordingPlan, segments: Segments) -> anyhow::Result<i32> {
    if let Some(every) = plan.segment {
        anyhow::ensure!(
            every >= std::time::Duration::from_secs(1),
            "--segment {every:?} is shorter than a second"
        );
    }
    let attached = attach(plan)?;
    let segments = match segments {
        Segments::Hand { to, stop, attached } => {
            attached();
            Segments::Hand {
                to,
                stop,
                attached: Box::new(|| ()),
            }
        }
        report => report,
    };
    let opened = open(plan, attached, segments)?;
    let ran = opened.run(plan)?;
    finish(plan, ran)
}

/// The programs loaded and attached to the targets, the clock started: nothing written yet.
struct Attached {
    launched: Option<spawn::Launched>,
    /// The processes asked for (a launched command's).
    roots: Vec<u32>,
    /// Those and their descendants.
    tree: BTreeSet<u32>,
    seeds: Vec<target::SeedThread>,
    ebpf: aya::Ebpf,
    ring: RingBuf<aya::maps::MapData>,
    slots: Slots,
    decoder: Decoder,
    probes: CudaProbes,
    dlopen: DlopenWatch,
    /// The CUDA libraries found mapped at attach.
    early: Vec<Record>,
    /// The signals this recording lacks, with why.
    unavailable: Vec<(String, String)>,
    /// Python frames are walked (asked for, and the kernel has `bpf_loop`).
    python: bool,
    switches: SwitchControl,
    start_ns: u64,
    /// The reading thread's raised priority, held until the recording ends.
    reader: crate::capture::reader_priority::Raised,
}

/// The processes `plan` traces, a launched command started (held before its first
/// instruction until released).
fn targets(plan: &RecordingPlan) -> anyhow::Result<(Option<spawn::Launched>, Vec<u32>)> {
    let running = match &plan.targets {
        Targets::Launch(command) => {
            let launched = spawn::spawn(command)?;
            let pid = launched.pid;
            return Ok((Some(launched), vec![pid]));
        }
        Targets::Running(r) => r,
    };
    let chosen = running.choose(plan.signals.nvml_lib.clone())?;
    for (pid, why) in &chosen.skipped {
        eprintln!("stallscope: --all-gpu-processes: skipping PID {pid}: {why}");
    }
    anyhow::ensure!(
        !chosen.pids.is_empty(),
        "--all-gpu-processes: every GPU process on this host belongs to another user \
         (PIDs {})",
        chosen
            .skipped
            .iter()
            .map(|(p, _)| p.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok((None, chosen.pids))
}

fn attach(plan: &RecordingPlan) -> anyhow::Result<Attached> {
    privileges::check()?;
    let mut layout = offsets::read_layout()?;
    // What this kernel can run of what was asked; each part it cannot is named once.
    let choice = kernel_support::choose(
        &layout.features,
        kernel_support::Wanted {
            python_stacks: plan.signals.python,
            dwarf_unwind: plan.signals.unwind == Unwind::Dwarf,
            cuda_probes: plan.signals.cuda_probes,
        },
        layout.offsets.task_state != 0,
    )
    .map_err(anyhow::Error::msg)?;
    let signals = &Signals {
        python: choice.python_stacks,
        cuda_probes: choice.cuda_probes,
        unwind: if choice.dwarf_unwind {
            Unwind::Dwarf
        } else {
            Unwind::Fp
        },
        ..plan.signals.clone()
    };
    if !choice.syscalls {
        layout.offsets.regs_syscall = 0;
        layout.offsets.regs_arg0 = 0;
    }
    layout.missing.extend(choice.unavailable);
    for (signal, reason) in &layout.missing {
        eprintln!("stallscope: warning: {signal} unavailable: {reason}");
    }
    let (launched, roots) = targets(plan)?;
    let tree = target::process_tree(&roots, privileges::caller_uid())?;
    let config = Config {
        offcpu_sample_interval_ns: plan.rates.offcpu_interval.as_nanos() as u64,
        // SAFETY: sysconf has no preconditions.
        page_size: unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64,
        copy_user_stack: u32::from(signals.unwind == Unwind::Dwarf),
        python_stacks: u32::from(signals.python),
        prev_state_arg: u32::from(choice.prev_state_arg),
        _pad: 0,
    };
    let mut skip: Vec<String> = layout.missing.iter().map(|(s, _)| s.clone()).collect();
    if !signals.cuda_probes {
        skip.push("cuda".into());
    }
    if !signals.wakers {
        skip.push("wakers".into());
    }
    // The kernel's symbols load before attaching (see `Namer::load_kernel_symbols`), on this
    // thread (a symbolizer stays on the thread that made it) while another loads the programs.
    let offsets = layout.offsets;
    let max_threads = plan.rates.max_threads;
    let loading = std::thread::spawn(move || loader::load(&offsets, &config, max_threads, &skip));
    // While the programs load: how often the target switches against the host.
    let hook_choice = {
        let (choice, tree): (_, Vec<u32>) = (signals.switch_hook, tree.iter().copied().collect());
        // A move between hooks also needs each thread's count of its runs (see
        // `switch_hook::BOTH`).
        let possible = offsets.rq_clock != 0 && offsets.task_pcount != 0;
        std::thread::spawn(move || choose_switch_hook(choice, possible, &tree))
    };
    let mut decoder = Decoder::with_kernel_symbols(
        match signals.unwind {
            Unwind::Dwarf => Unwinding::default(),
            Unwind::Fp => Unwinding(Box::new(FramePointers)),
        },
        signals.unwind == Unwind::Dwarf,
    );
    let mut ebpf = loading
        .join()
        .map_err(|_| anyhow::anyhow!("loading the eBPF programs panicked"))??;

    let ring = RingBuf::try_from(
        ebpf.take_map("EVENTS")
            .ok_or_else(|| anyhow::anyhow!("map EVENTS missing"))?,
    )?;
    // The CUDA and NCCL libraries the tree maps now are probed before the clock starts, so
    // that no moment of the recording has a feeder whose CUDA calls go unseen: the probes
    // record nothing for a thread until it is tracked.
    let mut probes = CudaProbes::new(&mut ebpf, signals.cuda_probes);
    let mut dlopen = DlopenWatch::default();
    let mut early = Vec::new();
    for &pid in &tree {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        early.extend(probes.scan(&mut ebpf, pid, &maps));
        dlopen.scan(&mut ebpf, pid, &maps);
        // Before the programs attach, so that the first samples carry their Python frames.
        if signals.python {
            decoder.python.scan(&mut ebpf, pid, Some(&maps));
        }
    }
    // Before the threads' states are read: the measuring takes 0.2 s, and states read before
    // it aged unseen until the switch hook attached (two spinners sharing a CPU, seeded as
    // queued, read 5 points less on-CPU than schedstat over the first second).
    let (hook, auto) = hook_choice
        .join()
        .map_err(|_| anyhow::anyhow!("measuring the switch rates panicked"))??;
    let start_ns = monotonic_ns();
    let seeds = match &launched {
        Some(l) => vec![target::SeedThread {
            tid: l.pid,
            pid: l.pid,
            state: profiler_common::state::BLOCKED,
            run_delay_ns: target::run_delay(l.pid, l.pid),
        }],
        None => target::threads(&tree),
    };
    let slots = Slots::seed(&mut ebpf, plan.rates.max_threads, &seeds, |s| ThreadStats {
        tgid: s.pid,
        state: s.state,
        since_ns: start_ns,
        off_state: profiler_common::state::ON_CPU,
        run_delay_ns: s.run_delay_ns.unwrap_or(profiler_common::RUN_DELAY_UNKNOWN),
        ..ThreadStats::default()
    })?;
    let mut unavailable = layout.missing.clone();
    unavailable.extend(loader::attach(
        &mut ebpf,
        plan.rates.sample_hz,
        layout.submit_tracepoint,
    )?);
    for (signal, reason) in unavailable.iter().skip(layout.missing.len()) {
        eprintln!("stallscope: warning: {signal} unavailable: {reason}");
    }
    // After the fork program: a thread created from here on is reported, and the control
    // decides whether it inherited its creator's event.
    if hook == SwitchHook::PerThread || auto {
        raise_open_files_limit();
    }
    let seed_tids: Vec<u32> = seeds.iter().map(|s| s.tid).collect();
    let switches = SwitchControl::start(&mut ebpf, hook, auto, &seed_tids)?;
    // The reading thread at real-time priority from here to the recording's end: raised
    // while the capability to is still held, put back (which needs none) before the report.
    let reader = crate::capture::reader_priority::raise();
    if let Some(reason) = reader.shortfall() {
        eprintln!("stallscope: warning: realtime-reader unavailable: {reason}");
        unavailable.push(("realtime-reader".to_string(), reason));
    }
    // Before any other thread starts: capability sets are per thread.
    let kept = privileges::drop_after_attach(signals.cuda_probes)?;
    log::info!("capabilities kept after attach: {kept:?}");
    probes.start_launch_duty(&mut ebpf, LaunchDuty::from_percent(plan.rates.launch_duty));
    Ok(Attached {
        launched,
        roots,
        tree,
        seeds,
        ebpf,
        ring,
        slots,
        decoder,
        probes,
        dlopen,
        early,
        unavailable,
        python: signals.python,
        switches,
        start_ns,
        reader,
    })
}

/// The recording open, its start written, the session ready to run.
struct Opened {
    session: Session,
    ring: RingBuf<aya::maps::MapData>,
    launched: Option<spawn::Launched>,
    path: PathBuf,
    /// Reports each segment as it ends; says whether one failed.
    segment_reports: Option<std::thread::JoinHandle<bool>>,
    reader: crate::capture::reader_priority::Raised,
}

fn open(plan: &RecordingPlan, a: Attached, segments: Segments) -> anyhow::Result<Opened> {
    let path = plan
        .recording
        .clone()
        .unwrap_or_else(|| default_output(plan, a.roots[0]));
    let mut writer: Box<dyn Sink> = match plan.segment {
        Some(_) => Box::new(SegmentFiles::create(&path)?),
        None => Box::new(RecordingFile::create(&path)?),
    };
    let shown = writer.segment().unwrap_or_else(|| path.clone());
    let command = match &plan.targets {
        Targets::Launch(command) => command.clone(),
        Targets::Running(_) => Vec::new(),
    };
    writer.write(&Record::Meta(Box::new(Meta {
        target_pids: a.roots.clone(),
        command,
        start_ns: a.start_ns,
        start_unix_ns: unix_ns(),
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap_or_default()
            .trim()
            .to_string(),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        sample_hz: plan.rates.sample_hz,
        tick_ns: plan.rates.tick.as_nanos() as u64,
        stallscope_version: env!("CARGO_PKG_VERSION").to_string(),
    })))?;
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u32;
    writer.write(&Record::Host { cpus })?;
    let (bytes, ns) = crate::capture::proc::host_copy::measure();
    writer.write(&Record::HostCopy { bytes, ns })?;
    for (signal, reason) in &a.unavailable {
        writer.write(&Record::Unavailable {
            signal: signal.clone(),
            reason: reason.clone(),
        })?;
    }
    for &pid in &a.tree {
        let process = Record::Process {
            ts_ns: a.start_ns,
            pid,
            ppid: target::ppid(pid),
            cmdline: target::cmdline(pid).unwrap_or_default(),
        };
        write_process(writer.as_mut(), &process)?;
    }
    for s in &a.seeds {
        writer.write(&Record::Thread {
            ts_ns: a.start_ns,
            tid: s.tid,
            pid: s.pid,
            comm: target::comm(s.tid).unwrap_or_default(),
        })?;
    }
    for r in &a.early {
        writer.write(r)?;
    }
    let pids = std::sync::Arc::new(std::sync::Mutex::new(a.tree));
    let gpu = plan
        .signals
        .gpu
        .then(|| gpu::GpuSampler::start(plan.signals.nvml_lib.clone(), pids.clone(), a.start_ns));
    let mut session = Session::new(a.ebpf, a.slots, a.decoder, writer, pids, gpu, a.probes);
    session.switches = Some(a.switches);
    session.python = a.python;
    session.dlopen = a.dlopen;
    // Each finished segment is reported on a thread of its own while the recording goes on,
    // or handed over.
    let segment_reports = plan.segment.and_then(|every| {
        let (done, finished) = match segments {
            Segments::Hand { to, stop, .. } => {
                session.stop = Some(stop);
                (to, None)
            }
            Segments::Report => {
                let (done, finished) = std::sync::mpsc::channel::<PathBuf>();
                (done, Some(finished))
            }
        };
        session.segments = Some(session::SegmentClock {
            every,
            next_ns: a.start_ns + every.as_nanos() as u64,
            done,
        });
        let finished = finished?;
        let out = plan.outputs.clone();
        Some(std::thread::spawn(move || {
            let mut failed = false;
            for (n, file) in (1..).zip(finished) {
                if let Err(e) = output::render_segment(&file, &out, n) {
                    eprintln!("stallscope: segment {n}: {e:#}");
                    failed = true;
                }
                eprintln!("stallscope: segment {n} saved to {}", file.display());
            }
            failed
        }))
    });
    // Setting up parsed the kernel's BTF (twice, for loading) and more.
    crate::capture::kernel::loader::release_freed_memory();
    eprintln!(
        "stallscope: tracing {} thread(s) of PID {}{}; writing {}",
        a.seeds.len(),
        a.roots
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        plan.duration
            .map(|d| format!(" for {:.1}s", d.as_secs_f64()))
            .unwrap_or_else(|| " until Ctrl-C or exit".into()),
        shown.display()
    );
    Ok(Opened {
        session,
        ring: a.ring,
        launched: a.launched,
        path,
        segment_reports,
        reader: a.reader,
    })
}

/// A recording run to its end.
struct Ran {
    outcome: anyhow::Result<EndReason>,
    /// Closing the probes' links (quick where the helper holds them too).
    unprobe: Option<std::thread::JoinHandle<()>>,
    /// The helper process that removes the links whose removal waits for grace periods.
    handed: Option<crate::capture::handover::Handed>,
    launched: Option<spawn::Launched>,
    path: PathBuf,
    segment_reports: Option<std::thread::JoinHandle<bool>>,
}

impl Opened {
    /// Runs the session until the plan's duration, an interrupt, or the targets' exit; a
    /// launched command runs from here.
    fn run(mut self, plan: &RecordingPlan) -> anyhow::Result<Ran> {
        if let Some(l) = self.launched.as_mut() {
            l.release();
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let outcome = runtime.block_on(self.session.run(self.ring, plan.rates.tick, plan.duration));
        // The report is made at the normal priority.
        drop(self.reader);
        let unprobe = self.session.unprobe.take();
        let handed = self.session.handed.take();
        drop(self.session);
        Ok(Ran {
            outcome,
            unprobe,
            handed,
            launched: self.launched,
            path: self.path,
            segment_reports: self.segment_reports,
        })
    }
}

/// Says how the recording ended, reports it (or waits for its segments' reports), and waits
/// for the probes to be removed. A recording that could not be written to the end (a full
/// disk) is still reported, up to its last complete record; the exit status says it is
/// incomplete.
fn finish(plan: &RecordingPlan, mut ran: Ran) -> anyhow::Result<i32> {
    let mut status = 0;
    match ran.outcome.map_err(|e| e.downcast::<WriteFailed>()) {
        Ok(EndReason::TargetExited) => {
            eprintln!("stallscope: the target exited; recording ends");
        }
        Ok(EndReason::Signal) => eprintln!("stallscope: interrupted; recording flushed"),
        Ok(EndReason::Duration) => {}
        Err(Ok(failed)) => {
            eprintln!(
                "stallscope: error: {:#}; tracing stopped there, and the report covers what \
                 was written before it",
                anyhow::Error::new(failed)
            );
            status = 1;
        }
        Err(Err(other)) => return Err(other),
    }
    // The recording's success is stallscope's exit status; the command's is reported.
    if let Some(l) = ran.launched.take() {
        let code = l.wait_exit_code();
        if code != 0 {
            eprintln!("stallscope: the command exited with status {code}");
        }
    }
    let handed = plan.segment.is_some() && ran.segment_reports.is_none();
    let rendered = match ran.segment_reports {
        Some(reports) => match reports.join() {
            Ok(false) => Ok(()),
            Ok(true) => Err(anyhow::anyhow!("a segment could not be reported")),
            Err(_) => Err(anyhow::anyhow!("reporting the segments panicked")),
        },
        None if handed => Ok(()),
        None => {
            let r = output::render(&ran.path, &plan.outputs);
            eprintln!("stallscope: recording saved to {}", ran.path.display());
            r
        }
    };
    if rendered.is_ok() && !handed {
        end_stdout();
    }
    if let Some(h) = ran.unprobe {
        // Closing links the helper holds too is quick: say something only if this waits.
        let quiet_until = std::time::Instant::now() + std::time::Duration::from_millis(300);
        while !h.is_finished() && std::time::Instant::now() < quiet_until {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        if !h.is_finished() {
            eprintln!("stallscope: removing the probes (the kernel takes a moment per probe)");
        }
        let _ = h.join();
    }
    if let Some(mut handed) = ran.handed {
        let quiet_until = std::time::Instant::now() + std::time::Duration::from_millis(300);
        while matches!(handed.helper.try_wait(), Ok(None))
            && std::time::Instant::now() < quiet_until
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        if matches!(handed.helper.try_wait(), Ok(None)) {
            eprintln!(
                "stallscope: {} probe link(s) are left to PID {} to remove (the kernel waits \
                 for grace periods to remove them; their programs send nothing)",
                handed.links,
                handed.helper.id()
            );
        }
        // Reaped in the background where this process goes on (top, the agent).
        std::thread::spawn(move || handed.helper.wait());
    }
    rendered?;
    Ok(status)
}

/// Ends standard output once the report is written, ahead of the exit: a reader (the agent)
/// then has the whole report while the kernel still takes seconds to remove the probes, and
/// can start its next recording.
fn end_stdout() {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else {
        return;
    };
    // SAFETY: dup2 onto descriptor 1 replaces it atomically; Rust's stdout handle writes to
    // fd 1 by number, so later writes go to /dev/null, never to a closed or reused fd.
    unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), libc::STDOUT_FILENO) };
}

/// The hook for the tracked threads' switches at attach, and whether the recording moves
/// between hooks as the rates change: as asked, or (`auto`) the cheaper one for the rates
/// measured now, said on stderr with the rates.
fn choose_switch_hook(
    choice: SwitchHookChoice,
    possible: bool,
    tree: &[u32],
) -> anyhow::Result<(SwitchHook, bool)> {
    let without = "this kernel's BTF lacks the scheduler fields they need (sched_info, \
                   se.cfs_rq, rq.clock)";
    match choice {
        SwitchHookChoice::Tracepoint => Ok((SwitchHook::Tracepoint, false)),
        SwitchHookChoice::PerThread if possible => Ok((SwitchHook::PerThread, false)),
        SwitchHookChoice::PerThread => anyhow::bail!("--switch-hook per-thread: {without}"),
        SwitchHookChoice::Auto if !possible => {
            log::info!("per-thread switch events unavailable: {without}");
            Ok((SwitchHook::Tracepoint, false))
        }
        SwitchHookChoice::Auto => {
            let rates = switch_choice::measure(tree)?;
            let hook = switch_choice::choose(&rates);
            eprintln!(
                "stallscope: context switches seen by {} (the target made {:.0}/s, {:.1}% of \
                 the host's {:.0}/s; --switch-hook to choose)",
                crate::capture::kernel::switch_control::name(hook),
                rates.target_per_s,
                rates.target_share() * 100.0,
                rates.host_per_s
            );
            Ok((hook, true))
        }
    }
}

/// Each tracked thread listed at attach holds two descriptors with per-thread switch events
/// (its event and the program's link to it): a large job's threads pass the usual soft limit
/// of 1024.
fn raise_open_files_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for the call to fill, then to set.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                log::debug!("raising RLIMIT_NOFILE: {}", std::io::Error::last_os_error());
            }
        }
    }
}
