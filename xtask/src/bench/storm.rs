//! W1's storm in paired windows inside one long run: one pingpong process runs throughout,
//! and each tracer is attached, left to settle, measured over a window, and detached, between
//! untraced windows of the same length. Each traced window is divided by the mean of the
//! untraced windows on either side of it.
//!
//! The whole-run ratios of the overhead table pair separate processes seconds apart, and a
//! baseline on this kind of VM moves by ±10% between two such runs (the host's other guests,
//! where a new process's threads and pipes land): a few points of tracing cost drown in it.
//! Windows a few seconds apart on the same threads share all of that. What the windows leave
//! out, and the table keeps, is the tracer's start-up: its attach and first seconds.
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use super::{
    overhead::Config,
    proc::Proc,
    quiet::Watch,
    report::median,
    tracers::{self, Tracer},
};

/// Each window's length.
const WINDOW: Duration = Duration::from_secs(2);
/// From a tracer's attach to its window: its first stacks unwound and named, its threads'
/// stack ends learned (see `decode::StackEnds`).
const SETTLE: Duration = Duration::from_secs(2);
/// From a tracer's exit to the next untraced window: the kernel keeps its scheduler hooks
/// for perf events on for a second after the last event closes (`perf_sched_work`), and
/// frees BPF programs after an RCU grace period.
const AFTERMATH: Duration = Duration::from_millis(1500);
/// Adjacent 2-second windows differ by up to 10% here: a median needs several.
pub const MIN_WINDOWS: u32 = 10;
/// The storm's comparison (issue 33): stallscope, the counting event, and bpftrace's
/// counter; the other variants and peers have the whole-run table.
const PAIRED: [Tracer; 3] = [
    Tracer::Stallscope,
    Tracer::PerfSwitchCount,
    Tracer::Bpftrace,
];

pub struct Paired {
    pub tracer: Tracer,
    /// Traced window / mean of the untraced windows around it, for each clean pair.
    pub ratios: Vec<f64>,
    /// Pairs dropped because other load or another tracer contended with one of the windows.
    pub contended: usize,
    pub failures: Vec<String>,
}

impl Paired {
    pub fn median(&self) -> Option<f64> {
        median(self.ratios.clone())
    }

    /// The interquartile range of the ratios.
    fn quartiles(&self) -> Option<(f64, f64)> {
        let mut v = self.ratios.clone();
        if v.len() < 4 {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Some((at(0.25), at(0.75)))
    }
}

/// A window's pingpong rate: the ping thread's context switches per second (one a round,
/// counted by the kernel, whatever the tracer), and whether anything else contended with it.
struct Window {
    rate: f64,
    contention: Option<String>,
}

/// The pingpong process and its ping thread.
struct Storm {
    proc: Proc,
    ping: u32,
}

impl Storm {
    fn start(cfg: &Config, secs: u64) -> Result<Self, String> {
        let proc = Proc::spawn(
            Command::new(&cfg.stallwork)
                .args(["pingpong", "--secs", &secs.to_string()])
                .args(["--cpu", &cfg.cpu.to_string()])
                .stdin(Stdio::null()),
        )
        .map_err(|e| format!("{e:#}"))?;
        proc.wait_line(Duration::from_secs(15), |l| l.starts_with("ready pid="))
            .ok_or("pingpong never printed `ready pid=`")?;
        let pid = proc.pid();
        let ping = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map_err(|e| format!("/proc/{pid}/task: {e}"))?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .find(|tid| {
                std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                    .is_ok_and(|c| c.trim() == "ping")
            })
            .ok_or_else(|| format!("pingpong (PID {pid}) has no `ping` thread"))?;
        Ok(Self { proc, ping })
    }

    /// The ping thread's context switches so far.
    fn switches(&self) -> Result<u64, String> {
        let path = format!("/proc/{}/task/{}/status", self.proc.pid(), self.ping);
        let status = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        context_switches(&status).ok_or_else(|| format!("{path}: no context-switch counts"))
    }

    fn window(&self, tracer_pid: Option<u32>) -> Result<Window, String> {
        let pid = self.proc.pid();
        let n0 = self.switches()?;
        // Finished on every path below: its sampling thread runs until then.
        let watch = Watch::start(tracer_pid);
        let (cpu0, t0) = (super::overhead::cpu_s(pid), Instant::now());
        std::thread::sleep(WINDOW);
        let (n1, secs) = (self.switches(), t0.elapsed().as_secs_f64());
        let work_cpu = super::overhead::cpu_s(pid)
            .zip(cpu0)
            .map_or(0.0, |(b, a)| b - a);
        let contention = watch.finish(work_cpu);
        let n = n1?
            .checked_sub(n0)
            .ok_or("the ping thread's switch count went back")?;
        Ok(Window {
            rate: n as f64 / secs,
            contention,
        })
    }
}

/// A thread's voluntary and involuntary context switches, from its `status` file.
fn context_switches(status: &str) -> Option<u64> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
    };
    Some(field("voluntary_ctxt_switches:")? + field("nonvoluntary_ctxt_switches:")?)
}

/// Every tracer of [`PAIRED`] in `cfg`, `windows` windows each, in rotating order.
pub fn measure(cfg: &Config, windows: u32) -> Vec<Paired> {
    let tracers: Vec<Tracer> = cfg
        .tracers
        .iter()
        .copied()
        .filter(|&t| PAIRED.contains(&t) && cfg.tracer_bin(t).is_ok())
        .collect();
    let mut out: Vec<Paired> = tracers
        .iter()
        .map(|&tracer| Paired {
            tracer,
            ratios: Vec::new(),
            contended: 0,
            failures: Vec::new(),
        })
        .collect();
    if tracers.is_empty() {
        return out;
    }
    let per_window = WINDOW * 2 + SETTLE + AFTERMATH + Duration::from_secs(3);
    eprintln!(
        "bench: W1 in paired windows: {} tracer(s) × {windows} windows of {} s, about {} min",
        tracers.len(),
        WINDOW.as_secs(),
        (per_window * windows * tracers.len() as u32)
            .as_secs()
            .div_ceil(60)
    );
    // Runs until dropped, however long the tracers take to attach and to end.
    let storm = match Storm::start(cfg, 24 * 3600) {
        Ok(s) => s,
        Err(e) => {
            for p in &mut out {
                p.failures.push(e.clone());
            }
            return out;
        }
    };
    let dir = cfg.dir.join("storm");
    let _ = std::fs::create_dir_all(&dir);
    let mut before = storm.window(None);
    for rep in 0..windows {
        let mut order: Vec<usize> = (0..tracers.len()).collect();
        order.rotate_left(rep as usize % tracers.len());
        for i in order {
            let t = tracers[i];
            let traced = traced_window(cfg, &storm, t, &dir);
            let after = storm.window(None);
            let p = &mut out[i];
            match (&before, &traced, &after) {
                (Ok(b), Ok(x), Ok(a)) => {
                    let ratio = x.rate / ((b.rate + a.rate) / 2.0);
                    let contended = [b, x, a].iter().find_map(|w| w.contention.clone());
                    eprintln!(
                        "bench: W1 paired window {} {}: {:.0} rounds/s between {:.0} and {:.0}: \
                         ratio {ratio:.3}{}",
                        rep + 1,
                        t.name(),
                        x.rate,
                        b.rate,
                        a.rate,
                        contended
                            .as_deref()
                            .map_or(String::new(), |c| format!(" [contended: {c}; dropped]"))
                    );
                    if contended.is_some() {
                        p.contended += 1;
                    } else {
                        p.ratios.push(ratio);
                    }
                }
                _ => {
                    let why = [&before, &traced, &after]
                        .into_iter()
                        .find_map(|w| w.as_ref().err().cloned())
                        .unwrap_or_default();
                    eprintln!("bench: W1 paired window {} {}: {why}", rep + 1, t.name());
                    p.failures.push(why);
                }
            }
            before = after;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// Attaches `t`, lets it settle, measures a window, and detaches it; the tracer has exited,
/// its report written, before this returns, so the next untraced window is untraced.
fn traced_window(
    cfg: &Config,
    storm: &Storm,
    t: Tracer,
    dir: &std::path::Path,
) -> Result<Window, String> {
    // Stopped by an interrupt after its window; the length only bounds a tracer left behind.
    let secs = (SETTLE + WINDOW).as_secs() + 60;
    let attached = tracers::attach(cfg, t, storm.proc.pid(), dir, secs)?
        .ok_or_else(|| format!("{} is no tracer", t.name()))?;
    std::thread::sleep(SETTLE);
    let window = storm.window(Some(attached.pid()));
    let cost = tracers::detach(attached, Duration::ZERO);
    std::thread::sleep(AFTERMATH);
    match cost.note {
        // A tracer that outlived its kill may still be attached: the next untraced window
        // would not be.
        Some(note) if t.is_stallscope() || cost.cpu_s.is_nan() => {
            Err(format!("{}: {note}", t.name()))
        }
        _ => window,
    }
}

/// Appends the table and stallscope's target, beside the peers measured in the same run.
pub fn print(paired: &[Paired]) {
    if paired.is_empty() {
        return;
    }
    println!();
    println!("### W1 in paired windows (one pingpong run, tracers attached in turn)");
    println!();
    println!(
        "| tracer | windows | median ratio | quartiles | min–max | contended (dropped) | failed |"
    );
    println!("|---|---|---|---|---|---|---|");
    for p in paired {
        let min = p.ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let max = p.ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            p.tracer.name(),
            p.ratios.len(),
            p.median().map_or("n/a".into(), |m| format!("{m:.3}")),
            p.quartiles()
                .map_or("n/a".into(), |(a, b)| format!("{a:.3}–{b:.3}")),
            if p.ratios.is_empty() {
                "n/a".into()
            } else {
                format!("{min:.3}–{max:.3}")
            },
            p.contended,
            p.failures.len()
        );
    }
    println!();
    println!(
        "The pingpong rate is its ping thread's context switches (one a round, counted by the \
         kernel). Each tracer is attached to the running pingpong, left {} s to settle, \
         measured over {} s, and detached; each such window is divided by the mean of the \
         untraced {} s windows just before and after it. The tracer's attach and first \
         seconds are outside the window: the table above, over whole runs, includes them.",
        SETTLE.as_secs(),
        WINDOW.as_secs(),
        WINDOW.as_secs()
    );
    if paired.iter().any(|p| p.tracer == Tracer::PerfSwitchCount) {
        println!();
        println!(
            "`perf stat -p` attached to the running pingpong opens a counter on each of its \
             threads. In the whole-run table it attaches before the workload starts its \
             threads, which then inherit their counters from one parent: the scheduler \
             swaps such clones' equivalent contexts at a switch between them, where here it \
             schedules each thread's counter out and in at every switch."
        );
    }
    let of = |t: Tracer| {
        paired
            .iter()
            .find(|p| p.tracer == t)
            .and_then(Paired::median)
    };
    let s = of(Tracer::Stallscope);
    // Too few clean windows to hold a median against the target.
    let clean = paired
        .iter()
        .find(|p| p.tracer == Tracer::Stallscope)
        .map_or(0, |p| p.ratios.len() as u32);
    let peers: Vec<String> = [Tracer::PerfSwitchCount, Tracer::Bpftrace]
        .into_iter()
        .filter_map(|t| Some(format!("{} {:.3}", t.name(), of(t)?)))
        .collect();
    println!();
    println!(
        "- {} W1 stallscope ratio ≥ 0.95 in paired windows: {}{}",
        match s {
            _ if clean < MIN_WINDOWS / 2 => "n/a",
            Some(r) if r >= 0.95 => "PASS",
            Some(_) => "MISS",
            None => "n/a",
        },
        s.map_or("n/a".into(), |r| format!("{r:.3}")),
        if peers.is_empty() {
            String::new()
        } else {
            format!(" (beside it: {})", peers.join(", "))
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threads_switches_are_both_kinds_summed() {
        let status = "Name:\tping\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t1200\n\
                      nonvoluntary_ctxt_switches:\t34\n";
        assert_eq!(context_switches(status), Some(1234));
        assert_eq!(context_switches("voluntary_ctxt_switches:\t5\n"), None);
    }

    #[test]
    fn quartiles_need_four_windows() {
        let p = |ratios: Vec<f64>| Paired {
            tracer: Tracer::Stallscope,
            ratios,
            contended: 0,
            failures: Vec::new(),
        };
        assert_eq!(p(vec![0.9, 1.0, 0.95]).quartiles(), None);
        let five = p(vec![0.99, 0.91, 0.95, 0.93, 0.97]);
        assert_eq!(five.quartiles(), Some((0.93, 0.97)));
        assert_eq!(five.median(), Some(0.95));
    }
}
