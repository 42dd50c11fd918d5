//! stallscope's developer commands: set-up, demo, tests and benchmarks.
mod bench;
mod cross;
mod dist;
mod fuzz;
mod setup;
mod test_run;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what the eBPF build needs (nightly rust-src, bpf-linker) and the tests' PyTorch
    /// virtualenv; idempotent.
    Setup,
    /// Set up and build the release binaries.
    Build,
    /// Build, start the bundled workload and attach stallscope to it by PID.
    Demo {
        /// How long to record, in seconds.
        #[arg(long, default_value = "20s")]
        duration: String,
    },
    /// Set up, build and run every test, including the root-only eBPF tests. Every test
    /// binary runs even when one fails; the failures are listed at the end.
    Test {
        /// Run the simulated host this many times faster than the presets (0.5: twice as
        /// slow): stallgen's CPU work and cold reads, and the simulated memcpy rate, scale by
        /// it. The tests' expectations must follow.
        #[arg(long, default_value_t = 1.0)]
        sim_speed: f64,
        /// Minutes of fuzzing after the tests, split between the fuzz targets (0: none).
        #[arg(long, default_value_t = 2.0)]
        fuzz_minutes: f64,
        /// Extra arguments for `cargo test` (after --).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Benchmarks: `overhead` (tracer cost against peers), `analyze`, `soak`, `agent-soak`,
    /// `gate`, `unwind`, `whatif` (predicted speedups against the fixes run; `--runs N
    /// --secs S --only torch`).
    Bench(bench::BenchArgs),
    /// Build what a user installs without building it into dist/, for x86_64 and aarch64: a
    /// manylinux2014 wheel each (glibc 2.17, linked with zig), a tarball each with the
    /// binary, README, licences, completions and man pages, and SHA256SUMS.
    Dist {
        /// Only this architecture; both by default.
        #[arg(long, value_enum)]
        target: Option<dist::Arch>,
    },
    /// The unit tests of the crates with no kernel or GPU dependency, and the recorder's
    /// unwinder, as aarch64 code under qemu-aarch64-static (a step of `test`).
    Aarch64Tests,
    /// Coverage-guided fuzzing (cargo-fuzz, nightly) of the recording decoder and the report.
    Fuzz {
        /// Total minutes, split evenly between the targets.
        #[arg(long, default_value_t = 1.0)]
        minutes: f64,
        /// Only this target; both by default.
        #[arg(long, value_parser = fuzz::TARGETS)]
        target: Option<String>,
    },
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

pub fn release_bin(name: &str) -> PathBuf {
    root().join("target/release").join(name)
}

pub fn build() -> anyhow::Result<()> {
    setup::setup()?;
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "profiler",
        "-p",
        "stallscope-tests",
        "-p",
        "stallgen",
        "-p",
        "simgpu-cuda",
        "-p",
        "simgpu-nvml",
        "-p",
        "simgpu-nccl",
    ]))
}

/// Whether this machine has an NVIDIA driver, and so a real GPU to run the demo on.
pub fn real_gpu() -> bool {
    Path::new("/proc/driver/nvidia/version").exists()
}

fn demo(duration: &str) -> anyhow::Result<()> {
    build()?;
    let secs: f64 = duration
        .trim_end_matches('s')
        .parse()
        .context("--duration is in seconds, e.g. 20s")?;
    let out_dir = root().join("stallscope-out");
    std::fs::create_dir_all(&out_dir)?;
    let mut job = Command::new(release_bin("stallgen"));
    job.args(["--scenario", "phases", "--secs", &format!("{}", secs + 4.0)])
        .stdout(std::process::Stdio::piped());
    let mut record = Command::new(release_bin("stallscope"));
    record.arg("record");
    if real_gpu() {
        eprintln!("xtask: an NVIDIA driver is present: the demo runs stallgen on the real GPU");
    } else {
        let lib = root().join("target/simgpu");
        simgpu_state::install_dir(&root().join("target/release"), &lib)?;
        let state = std::env::temp_dir().join(format!("stallscope-demo-{}", std::process::id()));
        eprintln!(
            "xtask: no GPU here: the demo runs stallgen on the simulated GPU ({} and {})",
            lib.join("libcuda.so.1").display(),
            lib.join("libnvidia-ml.so.1").display()
        );
        job.env("LD_LIBRARY_PATH", &lib)
            .env("STALLSCOPE_SIMGPU_STATE", &state);
        record
            .env("STALLSCOPE_SIMGPU_STATE", &state)
            .arg("--nvml-lib")
            .arg(lib.join("libnvidia-ml.so.1"));
    }
    let mut child = job.spawn().context("starting stallgen")?;
    let stdout = child.stdout.take().context("stallgen's stdout")?;
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let pid = loop {
        match lines.next() {
            Some(Ok(line)) if line.starts_with("ready pid=") => {
                break line["ready pid=".len()..]
                    .split_whitespace()
                    .next()
                    .and_then(|p| p.parse::<u32>().ok())
                    .context("stallgen's ready line has no pid")?;
            }
            Some(Ok(_)) => continue,
            _ => bail!("stallgen ended before it was ready"),
        }
    };
    eprintln!(
        "xtask: stallgen (a training loop whose bottleneck changes every {:.0} s: none, \
         dataloader CPU, host compute, disk) is PID {pid}; attaching: \
         stallscope record --pid {pid} --duration {duration}",
        (secs + 4.0) / 4.0
    );
    let result = run(record.args([
        "--pid",
        &pid.to_string(),
        "--duration",
        duration,
        "-o",
        &out_dir.join("demo.rec").display().to_string(),
    ]));
    let _ = child.kill();
    let _ = child.wait();
    eprintln!(
        "xtask: on a GPU host, attach to a real job the same way: sudo stallscope record --pid <PID of the training process>"
    );
    result
}

fn test(sim_speed: f64, fuzz_minutes: f64, extra: &[String]) -> anyhow::Result<()> {
    if !(sim_speed > 0.0 && sim_speed.is_finite()) {
        bail!("--sim-speed must be a positive number");
    }
    build()?;
    // bpftool is the independent oracle for "nothing left attached"; setcap and useradd make
    // the unprivileged user of the least-privilege test.
    setup::ensure_debian(&[
        ("bpftool", "bpftool"),
        ("setcap", "libcap2-bin"),
        ("useradd", "passwd"),
        // promtool checks and unit-tests the alert rules in deploy/prometheus.
        ("promtool", "prometheus"),
        // The fleet test's hosts are network namespaces joined by veth pairs.
        ("ip", "iproute2"),
        // `top`'s test runs it in a real terminal and reads the screen back.
        ("tmux", "tmux"),
    ])?;
    // The real PyTorch job of the tests (tests/pyjob/train.py) runs in this virtualenv.
    let torch = setup::ensure_torch()?;
    // The timeline tests decode traces with Perfetto's schema and open pages in Chromium;
    // the deploy tests validate deploy/ with tools from the same virtualenv.
    let (viewer_python, chromium) = setup::ensure_viewer()?;
    // The MCP test's client: the protocol's official Python SDK.
    let mcp_python = setup::ensure_mcp_client()?;
    // The deploy tests build deploy/Dockerfile with podman and run the agent in it.
    setup::ensure_container_base()?;
    // The install test installs dist/'s wheel into a virtualenv with no toolchain; the
    // aarch64 test runs the other architecture's binary under qemu.
    dist::dist(&dist::Arch::ALL)?;
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--release",
        "--workspace",
        "--exclude",
        "profiler-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--release",
        "--no-fail-fast",
        "--workspace",
        "--exclude",
        "profiler-ebpf",
    ])
    .env("STALLSCOPE_BIN", release_bin("stallscope"))
    .env("STALLSCOPE_TORCH_PYTHON", &torch)
    .env("STALLSCOPE_VIEWER_PYTHON", &viewer_python)
    .env("STALLSCOPE_MCP_PYTHON", &mcp_python)
    .env("STALLSCOPE_CHROMIUM", &chromium)
    .env("STALLSCOPE_DIST", dist::dir())
    .args(extra);
    test_run::set_sim_speed(&mut cmd, sim_speed);
    let tested = test_run::run(&mut cmd, &root().join("target/test-reruns.txt"));
    // The unit tests again, as aarch64 code under qemu.
    let cross = cross::unit_tests().context("the aarch64 unit tests under qemu");
    // The fuzzers' crash inputs again, built as the fuzzers build them: with overflow checks,
    // which the release tests above do not have.
    let replayed = run(cargo().args(["test", "-p", "profiler-core", "--test", "fuzz_regressions"]))
        .context("replaying the fuzzers' inputs with overflow checks");
    // The fuzzers run even when a test failed: both results are wanted from one CI run.
    let fuzzed = if fuzz_minutes > 0.0 {
        fuzz::run(fuzz_minutes, &fuzz::TARGETS).map(|_| ())
    } else {
        Ok(())
    };
    tested.and(replayed).and(cross).and(fuzzed)
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Cmd::Setup => setup::setup()
            .and_then(|()| setup::ensure_torch().map(drop))
            .and_then(|()| setup::ensure_viewer().map(drop)),
        Cmd::Build => build(),
        Cmd::Demo { duration } => demo(&duration),
        Cmd::Test {
            sim_speed,
            fuzz_minutes,
            args,
        } => test(sim_speed, fuzz_minutes, &args),
        Cmd::Bench(args) => bench::run(args),
        Cmd::Dist { target } => match target {
            Some(arch) => dist::dist(&[arch]),
            None => dist::dist(&dist::Arch::ALL),
        },
        Cmd::Aarch64Tests => cross::unit_tests(),
        Cmd::Fuzz { minutes, target } => fuzz::main(minutes, target.as_deref()),
    }
}
