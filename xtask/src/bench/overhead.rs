//! Runs the overhead benchmark: every workload under every tracer (and none), repeated in
//! rotating order. Each run starts the workload behind a gate, attaches the tracer to its
//! PID, opens the gate once the tracer is attached, and so traces the workload's whole run.
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use super::{
    peers::Peers,
    proc::{self, Proc, tail},
    quiet::{self, Watch},
    tracers::{self, Cost, Tracer},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Workload {
    /// pingpong, traced as the target.
    W1,
    /// pingpong in an unrelated process while the tracer targets an idle process.
    W1u,
    /// mix, traced as the target.
    W2,
    /// stallgen's healthy training loop on the simulated GPU (or a real one), traced as the
    /// target: training steps per second.
    W3,
    /// stallgen's launch-bound loop (one feeder thread launching tiny kernels back to back),
    /// traced as the target with the CUDA probes on: kernel launches per second.
    W4,
    /// A real PyTorch job (tests/pyjob/train.py, healthy): a DataLoader with 8 worker
    /// processes feeding a loop on the simulated GPU, traced as the target, with and without
    /// its Python frames: training steps per second.
    W5,
}

impl Workload {
    pub fn label(self) -> &'static str {
        match self {
            Self::W1 => "W1 pingpong (target)",
            Self::W1u => "W1u pingpong (not the target)",
            Self::W2 => "W2 mix (target)",
            Self::W3 => "W3 stallgen training (target)",
            Self::W4 => "W4 stallgen launch-bound (target)",
            Self::W5 => "W5 torch DataLoader, 8 workers (target)",
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Self::W1 | Self::W1u => "rounds/s",
            Self::W2 => "ops/s",
            Self::W3 | Self::W5 => "steps/s",
            Self::W4 => "launches/s",
        }
    }

    /// Whether `t` runs on this workload: the launch-probe variant only where launches are
    /// the load, and the scheduler peers not there, where they would measure nothing new.
    pub fn runs_with(self, t: Tracer) -> bool {
        match (self, t) {
            (Self::W4, Tracer::None | Tracer::Stallscope | Tracer::StallscopeEveryLaunch) => true,
            (Self::W5, Tracer::None | Tracer::Stallscope | Tracer::StallscopeNoPython) => true,
            (Self::W1 | Self::W3, Tracer::Agent) => true,
            (Self::W1 | Self::W1u | Self::W5, Tracer::StallscopeWakers) => true,
            (Self::W1 | Self::W1u, Tracer::StallscopePerThread | Tracer::StallscopeTracepoint) => {
                true
            }
            (Self::W4 | Self::W5, _)
            | (
                _,
                Tracer::StallscopeEveryLaunch
                | Tracer::StallscopeNoPython
                | Tracer::StallscopeWakers
                | Tracer::StallscopePerThread
                | Tracer::StallscopeTracepoint
                | Tracer::Agent,
            ) => false,
            _ => true,
        }
    }
}

/// W5's DataLoader worker processes.
pub const TORCH_WORKERS: u32 = 8;

/// How long after the gate opens the tracer's steady CPU starts being counted.
const WARM_UP: Duration = Duration::from_secs(3);

pub struct Config {
    pub secs: u64,
    pub reps: u32,
    pub workloads: Vec<Workload>,
    /// Always starts with [`Tracer::None`].
    pub tracers: Vec<Tracer>,
    pub cpu: usize,
    pub stallwork: PathBuf,
    pub stallgen: PathBuf,
    pub stallscope: PathBuf,
    /// The PyTorch virtualenv's interpreter, when W5 runs.
    pub torch_python: Option<PathBuf>,
    pub peers: Peers,
    pub dir: PathBuf,
    /// How often a run that something else contended with is run again.
    pub retries: u32,
    /// How long to wait before each run for the machine to go quiet.
    pub settle: Duration,
    /// Retries and settling stop when they would push the whole benchmark past this.
    pub budget: Duration,
}

impl Config {
    /// A generous guess at one run's wall time: the window plus start-up and teardown.
    pub fn run_estimate(&self) -> Duration {
        Duration::from_secs(self.secs + 2)
    }

    /// The peer's binary, or why it is not there.
    pub fn tracer_bin(&self, t: Tracer) -> Result<&Path, &str> {
        let peer = match t {
            Tracer::None
            | Tracer::Stallscope
            | Tracer::StallscopeEveryLaunch
            | Tracer::StallscopeNoPython
            | Tracer::StallscopeWakers
            | Tracer::StallscopePerThread
            | Tracer::StallscopeTracepoint
            | Tracer::Agent => {
                return Ok(&self.stallscope);
            }
            Tracer::Bpftrace => &self.peers.bpftrace,
            Tracer::Runqlat => &self.peers.runqlat,
            Tracer::Offcputime => &self.peers.offcputime,
            Tracer::PerfSwitchCount => &self.peers.perf,
        };
        peer.as_deref().map_err(String::as_str)
    }
}

pub struct RunRecord {
    pub workload: Workload,
    pub tracer: Tracer,
    pub rep: u32,
    pub result: Result<Sample, String>,
}

pub struct Sample {
    /// Workload throughput over its whole run, by its own count and clock.
    pub throughput: f64,
    /// The tracer's CPU from [`WARM_UP`] after the gate opened to the workload's end, % of
    /// one core: what tracing a running job costs once its symbols are known, without the
    /// tracer's start-up and report.
    pub window_cpu_pct: Option<f64>,
    pub cost: Option<Cost>,
    /// What else loaded the machine during the run; None for a clean run.
    pub contention: Option<String>,
}

pub fn run_all(cfg: &Config) -> anyhow::Result<Vec<RunRecord>> {
    std::fs::create_dir_all(&cfg.dir)?;
    let total = cfg.reps as usize
        * cfg
            .workloads
            .iter()
            .map(|w| cfg.tracers.iter().filter(|t| w.runs_with(**t)).count())
            .sum::<usize>();
    let mut records: Vec<RunRecord> = Vec::with_capacity(total);
    let started = Instant::now();
    for rep in 0..cfg.reps {
        for &workload in &cfg.workloads {
            // Rotate so no tracer always runs first, or always right after another one.
            let mut order = cfg.tracers.clone();
            let shift = rep as usize % order.len();
            order.rotate_left(shift);
            for tracer in order {
                if cfg.tracer_bin(tracer).is_err() || !workload.runs_with(tracer) {
                    continue;
                }
                let left = total - records.len();
                let result = run_with_retries(cfg, workload, tracer, rep, started, left);
                let baseline = records.iter().find_map(|r| match &r.result {
                    Ok(s) if r.workload == workload && r.tracer == Tracer::None && r.rep == rep => {
                        Some(s.throughput)
                    }
                    _ => None,
                });
                progress(
                    records.len() + 1,
                    total,
                    workload,
                    tracer,
                    rep,
                    &result,
                    baseline,
                );
                records.push(RunRecord {
                    workload,
                    tracer,
                    rep,
                    result,
                });
            }
        }
    }
    Ok(records)
}

/// Runs once, and again while something else contended with the run, as long as the time
/// left allows it.
fn run_with_retries(
    cfg: &Config,
    w: Workload,
    t: Tracer,
    rep: u32,
    started: Instant,
    runs_left: usize,
) -> Result<Sample, String> {
    let mut attempt = 0;
    loop {
        let spare = cfg
            .budget
            .saturating_sub(started.elapsed())
            .saturating_sub(cfg.run_estimate() * runs_left as u32);
        // Spread the spare time over the runs left, so early runs cannot use it all up.
        let settle = cfg.settle.min(spare / runs_left.max(1) as u32);
        if !settle.is_zero() {
            quiet::settle(settle);
        }
        let result = run_one(cfg, w, t, rep);
        let contention = result.as_ref().ok().and_then(|s| s.contention.as_deref());
        match contention {
            Some(why) if attempt < cfg.retries && spare > cfg.run_estimate() + settle => {
                attempt += 1;
                eprintln!(
                    "bench: {w:?} {} rep {}: contended ({why}); again",
                    t.name(),
                    rep + 1
                );
            }
            _ => return result,
        }
    }
}

fn progress(
    n: usize,
    total: usize,
    w: Workload,
    t: Tracer,
    rep: u32,
    result: &Result<Sample, String>,
    baseline: Option<f64>,
) {
    let what = match result {
        Err(e) => format!("FAILED: {e}"),
        Ok(s) => {
            let mut line = format!("{:.0} {}", s.throughput, w.unit());
            if let (Some(b), false) = (baseline, t == Tracer::None) {
                line += &format!(", ratio {:.3}", s.throughput / b);
            }
            if let Some(c) = &s.cost {
                line += &format!(
                    ", tracer CPU {:.2} s, RSS {:.1} MiB, attach {:.2} s",
                    c.cpu_s,
                    c.maxrss_kib as f64 / 1024.0,
                    c.attach_s
                );
                if let Some(sc) = &c.scope {
                    line += &format!(", {:.0} events/s, lost {}", sc.events_per_s, sc.lost);
                }
                if let Some(note) = &c.note {
                    line += &format!(" ({note})");
                }
            }
            if let Some(why) = &s.contention {
                line += &format!(" [contended: {why}]");
            }
            line
        }
    };
    eprintln!(
        "bench: [{n}/{total}] {w:?} {} rep {}: {what}",
        t.name(),
        rep + 1
    );
}

fn run_one(cfg: &Config, w: Workload, t: Tracer, rep: u32) -> Result<Sample, String> {
    let tag = format!("{w:?}-{t:?}-{rep}").to_lowercase();
    let mut work_args: Vec<String> = match w {
        Workload::W1 | Workload::W1u => vec!["pingpong".into()],
        Workload::W2 => vec!["mix".into()],
        Workload::W3 => vec!["--scenario".into(), "healthy".into()],
        Workload::W4 => vec!["--scenario".into(), "launch-bound".into()],
        Workload::W5 => vec![
            crate::root()
                .join("tests/pyjob/train.py")
                .to_string_lossy()
                .into_owned(),
            "--scenario".into(),
            "healthy".into(),
            "--workers".into(),
            TORCH_WORKERS.to_string(),
        ],
    };
    // The torch job runs long enough for a steady stretch after the warm-up.
    let secs = if w == Workload::W5 {
        cfg.secs.max(WARM_UP.as_secs() * 4)
    } else {
        cfg.secs
    };
    work_args.extend(["--secs".into(), secs.to_string()]);
    if matches!(w, Workload::W1 | Workload::W1u) {
        work_args.extend(["--cpu".into(), cfg.cpu.to_string()]);
    }
    let run_dir = cfg.dir.join(&tag);
    let _ = std::fs::remove_dir_all(&run_dir);
    std::fs::create_dir_all(&run_dir).map_err(|e| format!("{}: {e}", run_dir.display()))?;
    let result = match w {
        Workload::W1 | Workload::W2 | Workload::W3 | Workload::W4 | Workload::W5 => {
            let program = match w {
                Workload::W3 | Workload::W4 => &cfg.stallgen,
                Workload::W5 => cfg
                    .torch_python
                    .as_ref()
                    .ok_or("W5 needs the PyTorch virtualenv")?,
                _ => &cfg.stallwork,
            };
            // The torch job imports torch and forks its workers before it is ready: it is
            // traced from then on (its own gate), as a running job is attached to.
            let mut work = if w == Workload::W5 {
                let mut cmd = Command::new(program);
                cmd.args(&work_args).arg("--gate").stdin(Stdio::piped());
                let work = Proc::spawn(&mut cmd).map_err(|e| format!("{e:#}"))?;
                let ready =
                    work.wait_line(Duration::from_secs(120), |l| l.starts_with("ready pid="));
                if ready.is_none() {
                    let (_, _, err) = work.stop(Duration::ZERO, Duration::from_secs(2));
                    return Err(format!("the torch job never became ready: {}", tail(&err)));
                }
                work
            } else {
                Proc::spawn(&mut proc::gated(program, &work_args)).map_err(|e| format!("{e:#}"))?
            };
            let tracer = tracers::attach(cfg, t, work.pid(), &run_dir, secs)?;
            let watch = Watch::start(tracer.as_ref().map(tracers::Attached::pid));
            // The tracer's CPU is read once its caches have warmed up (the first stacks of
            // every library named and unwound), and again when the workload ends.
            let warm = tracer.as_ref().map(|a| {
                let pid = a.pid();
                std::thread::spawn(move || {
                    std::thread::sleep(WARM_UP);
                    (Instant::now(), cpu_s(pid))
                })
            });
            work.release().map_err(|e| format!("{e:#}"))?;
            let ready_within = (w != Workload::W5).then_some(Duration::from_secs(15));
            let (throughput, work_cpu_s) = finish_workload(work, secs, true, ready_within)?;
            let window_cpu_pct = warm.zip(tracer.as_ref()).and_then(|(warm, a)| {
                let (at, before) = warm.join().ok()?;
                let secs = at.elapsed().as_secs_f64();
                (secs > 1.0).then_some(100.0 * (cpu_s(a.pid())? - before?) / secs)
            });
            let contention = watch.finish(work_cpu_s);
            // With the target gone, stallscope ends by itself; the others are interrupted.
            let cost = tracer.map(|a| tracers::detach(a, Duration::from_secs(3)));
            Ok(Sample {
                throughput,
                window_cpu_pct,
                cost,
                contention,
            })
        }
        Workload::W1u => {
            let idle = Proc::spawn(
                Command::new(&cfg.stallwork)
                    .args(["sleep", "--secs", &(cfg.secs + 120).to_string()])
                    .stdin(Stdio::null()),
            )
            .map_err(|e| format!("{e:#}"))?;
            let tracer = tracers::attach(cfg, t, idle.pid(), &run_dir, secs)?;
            let watch = Watch::start(tracer.as_ref().map(tracers::Attached::pid));
            let work = Proc::spawn(
                Command::new(&cfg.stallwork)
                    .args(&work_args)
                    .stdin(Stdio::null()),
            )
            .map_err(|e| format!("{e:#}"))?;
            let (throughput, work_cpu_s) =
                finish_workload(work, cfg.secs, false, Some(Duration::from_secs(15)))?;
            let contention = watch.finish(work_cpu_s);
            let cost = tracer.map(|a| tracers::detach(a, Duration::ZERO));
            drop(idle);
            Ok(Sample {
                throughput,
                window_cpu_pct: None,
                cost,
                contention,
            })
        }
    };
    // Recordings of a fast workload are large; keep the disk clean between runs.
    let _ = std::fs::remove_dir_all(&run_dir);
    result
}

/// A process's CPU time so far (user and system, all its threads), in seconds.
pub fn cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which may hold spaces: utime and stime are the
    // 12th and 13th of them.
    let rest = stat.rsplit_once(')')?.1;
    let mut f = rest.split_whitespace().skip(11);
    let ticks: f64 = f.next()?.parse::<f64>().ok()? + f.next()?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks / hz)
}

/// Waits for the workload's `ready pid=` line and its closing totals; returns count/secs
/// and the workload's CPU seconds.
/// `ready_within`: how long to wait for the `ready pid=` line, None when it was already
/// read.
fn finish_workload(
    work: Proc,
    secs: u64,
    gated: bool,
    ready_within: Option<Duration>,
) -> Result<(f64, f64), String> {
    let pid = work.pid();
    let ready = match ready_within {
        Some(within) => work.wait_line(within, |l| l.starts_with("ready pid=")),
        None => Some(format!("ready pid={pid}")),
    };
    let Some(ready) = ready else {
        let (exit, _, err) = work.stop(Duration::ZERO, Duration::from_secs(2));
        return Err(format!(
            "workload never printed `ready pid=` ({}): {}",
            exit.map_or("still running".into(), |e| e.describe()),
            tail(&err)
        ));
    };
    if gated && ready.trim_start_matches("ready pid=").trim() != pid.to_string() {
        eprintln!("bench: warning: workload says `{ready}` but was started as PID {pid}");
    }
    let totals = work.wait_line(Duration::from_secs(secs + 30), |l| {
        l.starts_with("rounds=") || l.starts_with("ops=") || l.starts_with("steps=")
    });
    let (exit, _, err) = work.stop(Duration::from_secs(5), Duration::from_secs(2));
    let totals = totals.ok_or_else(|| format!("workload printed no totals: {}", tail(&err)))?;
    let exit = exit.ok_or_else(|| format!("workload did not exit: {}", tail(&err)))?;
    if !exit.success() {
        return Err(format!(
            "workload ended with {}: {}",
            exit.describe(),
            tail(&err)
        ));
    }
    let throughput =
        parse_totals(&totals).ok_or_else(|| format!("cannot parse workload totals `{totals}`"))?;
    Ok((throughput, exit.cpu_s))
}

/// `rounds=<count> secs=<f64>` or `ops=<count> secs=<f64>`, as count per second.
pub fn parse_totals(line: &str) -> Option<f64> {
    let mut count = None;
    let mut secs = None;
    for kv in line.split_whitespace() {
        match kv.split_once('=')? {
            // launch-bound prints `steps=` then `launches=`: launches are its throughput.
            ("rounds" | "ops" | "steps" | "launches", v) => count = v.parse::<f64>().ok(),
            ("secs", v) => secs = v.parse::<f64>().ok(),
            _ => {}
        }
    }
    let (count, secs) = (count?, secs?);
    (secs > 0.0).then(|| count / secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_lines_parse_to_a_rate() {
        assert_eq!(parse_totals("rounds=1000 secs=2.000000"), Some(500.0));
        assert_eq!(parse_totals("ops=30 secs=3.0"), Some(10.0));
        assert_eq!(parse_totals("ops=30 secs=0"), None);
        assert_eq!(parse_totals("rounds=12"), None);
        assert_eq!(parse_totals("ready pid=7"), None);
        assert_eq!(
            parse_totals("steps=10 secs=2.0 steps_per_sec=5 launches=40000 launches_per_sec=20000"),
            Some(20000.0)
        );
    }
}
