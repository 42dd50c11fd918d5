//! The in-kernel cost of stallscope's switch program (`sched_switch`, or `switch_out` where
//! the recorder chose per-thread events) and of its wake-up program (`sched_waking`, which
//! runs for every wake-up on the host), per run, from the kernel's own
//! BPF statistics (`kernel.bpf_stats_enabled`): the throughput ratios of a two-CPU machine
//! swing by several percent from run to run, while this figure holds still. Measured in
//! runs of its own, after the others, since the statistics slow every BPF program a little.
use std::{
    process::{Command, Stdio},
    time::Duration,
};

use super::{
    overhead::Config,
    proc::Proc,
    tracers::{self, Tracer},
};

const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// One measurement: how many times the program ran and its mean time per run.
pub struct SwitchCost {
    pub case: &'static str,
    /// The program the recorder ran for switches.
    pub program: &'static str,
    pub runs: u64,
    pub ns_per_run: f64,
    /// `sched_waking`'s runs and mean ns per run (a wake-up), when it ran.
    pub waking: Option<(u64, f64)>,
}

/// Stallscope's `sched_switch` under pingpong, with pingpong as the target (every switch
/// tracked) and beside an idle target (every switch untracked).
pub fn measure(cfg: &Config) -> Vec<SwitchCost> {
    // Before the statistics are switched on, so that no early return leaves them on.
    if let Err(e) = crate::setup::ensure_debian(&[("bpftool", "bpftool")]) {
        eprintln!(
            "bench: bpftool is needed to read the statistics ({e:#}): per-switch cost not measured"
        );
        return Vec::new();
    }
    let Ok(before) = std::fs::read_to_string(STATS_SYSCTL) else {
        eprintln!("bench: no {STATS_SYSCTL}: per-switch cost not measured");
        return Vec::new();
    };
    if std::fs::write(STATS_SYSCTL, "1").is_err() {
        eprintln!("bench: cannot enable BPF statistics: per-switch cost not measured");
        return Vec::new();
    }
    let mut out = Vec::new();
    for (case, tracked) in [("tracked (W1)", true), ("untracked (W1u)", false)] {
        match one(cfg, tracked) {
            Ok(((program, runs, ns), waking)) => out.push(SwitchCost {
                case,
                program,
                runs,
                ns_per_run: ns,
                waking,
            }),
            Err(e) => eprintln!("bench: per-switch cost, {case}: {e}"),
        }
    }
    let _ = std::fs::write(STATS_SYSCTL, before.trim());
    out
}

/// The switch program's (name, runs, ns per run) and the wake-up program's (runs, ns per run).
type Costs = ((&'static str, u64, f64), Option<(u64, f64)>);

fn one(cfg: &Config, tracked: bool) -> Result<Costs, String> {
    let secs = cfg.secs.min(3).to_string();
    let cpu = cfg.cpu.to_string();
    let dir = cfg.dir.join(format!("switch-cost-{tracked}"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let spawn = |args: &[&str]| {
        Proc::spawn(Command::new(&cfg.stallwork).args(args).stdin(Stdio::null()))
            .map_err(|e| format!("{e:#}"))
    };
    let idle = spawn(&["sleep", "--secs", "120"])?;
    let work = spawn(&["pingpong", "--secs", &secs, "--cpu", &cpu])?;
    let target = if tracked { work.pid() } else { idle.pid() };
    // With `--wakers`, so that the wake-up program's runs are counted too; the switch
    // program's own time per run does not change with it.
    let tracer = tracers::attach(cfg, Tracer::StallscopeWakers, target, &dir, cfg.secs)?
        .ok_or("stallscope did not attach")?;
    let stats = work
        .wait_line(Duration::from_secs(cfg.secs + 30), |l| {
            l.starts_with("rounds=")
        })
        .ok_or("pingpong printed no totals")
        .and_then(|_| {
            ["sched_switch", "switch_out"]
                .into_iter()
                .find_map(|p| program_stats(p).map(|(runs, ns)| (p, runs, ns)))
                .ok_or("no statistics for sched_switch or switch_out")
                .map(|switch| (switch, program_stats("sched_waking")))
        });
    drop(work);
    tracers::detach(tracer, Duration::from_secs(3));
    drop(idle);
    let _ = std::fs::remove_dir_all(&dir);
    stats.map_err(str::to_owned)
}

/// (run count, mean ns per run) of the loaded program `name`, from bpftool.
fn program_stats(name: &str) -> Option<(u64, f64)> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output()
        .ok()?;
    let progs: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    progs.as_array()?.iter().find_map(|p| {
        let runs = p.get("run_cnt")?.as_u64()?;
        let ns = p.get("run_time_ns")?.as_u64()?;
        (p.get("name")?.as_str()? == name && runs > 0).then(|| (runs, ns as f64 / runs as f64))
    })
}

/// Appends the figures to the report.
pub fn print(costs: &[SwitchCost]) {
    if costs.is_empty() {
        return;
    }
    println!();
    println!("### stallscope's switch program, per run (kernel BPF statistics)");
    println!();
    println!("| switches | program | runs | ns per run | note |");
    println!("|---|---|---|---|---|");
    for c in costs {
        // Under per-thread events no program runs at an untracked switch: what ran was the
        // idle target's own few switch-outs, each with its off-CPU sample.
        let note = if c.program == "switch_out" && c.case.starts_with("untracked") {
            "per-thread events: an untracked switch runs no program; these are the idle target's own switch-outs"
        } else {
            ""
        };
        println!(
            "| {} | `{}` | {} | {:.0} | {note} |",
            c.case, c.program, c.runs, c.ns_per_run
        );
    }
    println!();
    println!(
        "Mean time inside the program, clock reads of the statistics themselves included; \
         measured under pingpong after the runs above."
    );
    if costs.iter().any(|c| c.waking.is_some()) {
        println!();
        println!("### stallscope's wake-up program (`sched_waking`), per wake-up");
        println!();
        println!("| wake-ups | runs | ns per wake-up |");
        println!("|---|---|---|");
        for c in costs {
            if let Some((runs, ns)) = c.waking {
                println!("| {} | {runs} | {ns:.0} |", c.case);
            }
        }
        println!();
        println!(
            "Every wake-up on the host runs it: pingpong's own (tracked, or beside an idle \
             target) and the rest of the machine's; what it adds to each."
        );
    }
}
