//! Notices other load on a shared machine: another process with BPF programs attached (whose
//! sched_switch hooks would tax every run) or CPU time spent by anything but the benchmark's
//! own processes. Contended runs are retried, and flagged when retries run out.
use std::{
    collections::BTreeSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// Foreign CPU use above this (in CPUs, i.e. 0.15 = 15% of one core) marks a run contended.
const FOREIGN_CPU_LIMIT: f64 = 0.15;

/// Processes outside this benchmark that hold BPF links or perf events: "pid comm".
pub fn foreign_tracers() -> Vec<String> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        // Ours: the tracers we started, and their children (the agent's recorders).
        .filter(|&pid| {
            pid != me && parent(pid) != Some(me) && parent(pid).and_then(parent) != Some(me)
        })
        .filter(|&pid| super::proc::bpf_attachments(pid) > 0)
        .map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("{pid} {}", comm.trim())
        })
        .collect()
}

/// Fields after the `(comm)` of /proc/PID/stat, which may itself hold spaces.
fn stat_fields(pid: &str) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

fn parent(pid: u32) -> Option<u32> {
    stat_fields(&pid.to_string())?.get(1)?.parse().ok()
}

/// utime + stime of a process, in clock ticks.
fn process_ticks(pid: &str) -> u64 {
    stat_fields(pid).map_or(0, |f| {
        let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        n(11) + n(12)
    })
}

/// CPU ticks of a tracer with the processes it starts (the agent's recorders): its own,
/// those of the children it reaped (cutime + cstime), and those of its live children.
fn tracer_ticks(pid: &str) -> u64 {
    let reaped = stat_fields(pid).map_or(0, |f| {
        let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        n(13) + n(14)
    });
    let live: u64 = super::proc::children(pid.parse().unwrap_or(0))
        .into_iter()
        .map(|c| tracer_ticks(&c.to_string()))
        .sum();
    process_ticks(pid) + reaped + live
}

/// Busy clock ticks over all CPUs (user, nice, system, irq, softirq and steal: time taken
/// by the hypervisor is contention too).
fn busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0;
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| v.get(i)).sum()
}

fn ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as f64 } else { 100.0 }
}

/// Waits up to `max` for the machine to be quiet: no foreign tracer and nearly idle CPUs.
pub fn settle(max: Duration) -> bool {
    let deadline = Instant::now() + max;
    loop {
        let busy0 = busy_ticks();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(300));
        let load = (busy_ticks() - busy0) as f64 / ticks_per_s() / t0.elapsed().as_secs_f64();
        if load < FOREIGN_CPU_LIMIT && foreign_tracers().is_empty() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
    }
}

/// Watches one run's window: samples foreign tracers every half second on a thread and
/// counts CPU time not spent by the benchmark, the workload or the tracer under test.
pub struct Watch {
    started: Instant,
    busy0: u64,
    self0: u64,
    tracer: Option<(String, u64)>,
    stop: Arc<AtomicBool>,
    sampler: JoinHandle<BTreeSet<String>>,
}

impl Watch {
    pub fn start(tracer_pid: Option<u32>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let sampler = std::thread::spawn(move || {
            let mut seen = BTreeSet::new();
            while !flag.load(Ordering::Relaxed) {
                seen.extend(foreign_tracers());
                std::thread::sleep(Duration::from_millis(500));
            }
            seen
        });
        let tracer = tracer_pid.map(|p| (p.to_string(), tracer_ticks(&p.to_string())));
        Self {
            started: Instant::now(),
            busy0: busy_ticks(),
            self0: process_ticks("self"),
            tracer,
            stop,
            sampler,
        }
    }

    /// Ends the window, given the workload's CPU seconds; None when the run was clean,
    /// otherwise what contended with it.
    pub fn finish(self, workload_cpu_s: f64) -> Option<String> {
        let hz = ticks_per_s();
        let busy = busy_ticks().saturating_sub(self.busy0) as f64 / hz;
        let mine = process_ticks("self").saturating_sub(self.self0) as f64 / hz;
        let tracer = self.tracer.as_ref().map_or(0.0, |(pid, t0)| {
            tracer_ticks(pid).saturating_sub(*t0) as f64 / hz
        });
        let secs = self.started.elapsed().as_secs_f64();
        let foreign_cpus = (busy - mine - tracer - workload_cpu_s) / secs;
        self.stop.store(true, Ordering::Relaxed);
        let seen = self.sampler.join().unwrap_or_default();
        let mut why = Vec::new();
        if !seen.is_empty() {
            why.push(format!(
                "other tracer(s) attached: {}",
                seen.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
        if foreign_cpus > FOREIGN_CPU_LIMIT {
            why.push(format!("other load {:.0}% of a CPU", foreign_cpus * 100.0));
        }
        (!why.is_empty()).then(|| why.join("; "))
    }
}
