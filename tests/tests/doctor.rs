//! `stallscope doctor` on the simulated GPU: a clean GPU passes; each fault injected through
//! the simulated NVML (ECC errors, a link trained down, thermal throttling, a MIG slice, a dead
//! holder of memory, a driver too old for the target's real libcudart) is named, and nothing
//! else is; kernel-log checks read real lines written to /dev/kmsg.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{
    collections::BTreeSet,
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use common::{
    Scratch, serial,
    simgpu::{Sim, release_dir},
    spawned::Spawned,
    stallscope::command,
    torch_python,
};
use serde_json::Value;

/// What the kernel module of the simulated driver would say.
fn module_file(dir: &Scratch, version: &str) -> PathBuf {
    let path = dir.join("nvidia-version");
    std::fs::write(
        &path,
        format!(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Tue Jul  8 18:48:33 UTC 2025\n\
             GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
        ),
    )
    .unwrap();
    path
}

struct Diagnosis {
    code: i32,
    checks: Vec<Value>,
}

impl Diagnosis {
    /// The names of the checks that warned or failed, with their status.
    fn flagged(&self) -> BTreeSet<(String, String)> {
        self.checks
            .iter()
            .filter(|c| matches!(c["status"].as_str(), Some("warn" | "fail")))
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_owned(),
                    c["status"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    fn check(&self, name: &str) -> &Value {
        self.checks
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no {name} check in {:#?}", self.checks))
    }

    fn evidence(&self, name: &str) -> String {
        self.check(name)["evidence"].as_str().unwrap().to_owned()
    }
}

/// `doctor --format json` against the simulated NVML, reading only the kernel log written
/// since `since` (so lines other tests wrote are not this run's).
fn doctor(
    sim: &Sim,
    module: &Path,
    env: &[(&str, &str)],
    since: Instant,
    extra: &[&str],
) -> Diagnosis {
    let window = format!("{}ms", since.elapsed().as_millis() + 50);
    let out = command()
        .args(["doctor", "--format", "json", "--nvml-lib"])
        .arg(sim.libs.join("libnvidia-ml.so.1"))
        .arg("--driver-version-file")
        .arg(module)
        .args(["--kernel-log-since", &window, "--trend", "1s"])
        .args(extra)
        .env("STALLSCOPE_SIMGPU_STATE", &sim.state)
        .envs(env.iter().copied())
        .output()
        .expect("runs stallscope doctor");
    let code = out.status.code().expect("doctor exited");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "doctor's JSON does not parse ({e}); exit {code}\nstdout:\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    Diagnosis {
        code,
        checks: v["checks"].as_array().expect("a checks array").clone(),
    }
}

/// The GPU checks every healthy run must have passed.
const GPU_CHECKS: [&str; 12] = [
    "ECC",
    "memory repair",
    "PCIe link",
    "PCIe replays",
    "clocks",
    "temperature",
    "power",
    "P-state",
    "persistence mode",
    "MIG",
    "memory",
    "memory holders",
];

fn stallgen(sim: &Sim) -> Spawned {
    let stallgen = release_dir().join("stallgen");
    let job = Spawned::start(
        Command::new(&stallgen)
            .env("LD_LIBRARY_PATH", &sim.libs)
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state)
            .args(["--scenario", "healthy", "--secs", "60"]),
    );
    job.wait_stdout(Duration::from_secs(60), |l| l.starts_with("ready pid="))
        .unwrap_or_else(|| panic!("stallgen never became ready:\n{}", job.stderr_so_far()));
    job
}

#[test]
fn a_clean_simulated_gpu_passes_with_every_check_said() {
    let _serial = serial();
    let since = Instant::now();
    let sim = Sim::new("doctor-clean");
    let dir = Scratch::new("doctor-clean");
    let module = module_file(&dir, "580.65.06");
    let job = stallgen(&sim);
    let pid = job.pid.to_string();
    let d = doctor(&sim, &module, &[], since, &["--pid", &pid]);
    assert_eq!(d.flagged(), BTreeSet::new(), "{:#?}", d.checks);
    assert_eq!(d.code, 0, "{:#?}", d.checks);
    for name in GPU_CHECKS.iter().chain(&[
        "kernel module",
        "NVML",
        "driver version",
        "kernel log",
        "CUDA devices",
    ]) {
        assert_eq!(
            d.check(name)["status"],
            "pass",
            "{name}: {:#?}",
            d.check(name)
        );
    }
    assert!(
        d.evidence("memory holders")
            .contains(&format!("pid {pid} stallgen (the target)")),
        "{}",
        d.evidence("memory holders")
    );
    assert!(
        d.evidence("CUDA devices")
            .contains("cuda:0 = GPU 0 (GPU-5eed"),
        "{}",
        d.evidence("CUDA devices")
    );
    drop(job);
}

/// A fault, its environment, the checks it flags (name, status), and (check, evidence it must
/// hold).
type Fault = (
    &'static str,
    Vec<(&'static str, &'static str)>,
    BTreeSet<(String, String)>,
    (&'static str, &'static str),
);

#[test]
fn each_injected_fault_is_named_and_nothing_else() {
    let _serial = serial();
    let dir = Scratch::new("doctor-faults");
    let module = module_file(&dir, "580.65.06");
    let fail = |n: &str| (n.to_owned(), "fail".to_owned());
    let warn = |n: &str| (n.to_owned(), "warn".to_owned());
    let cases: Vec<Fault> = vec![
        (
            "ecc",
            vec![("STALLSCOPE_SIMGPU_FAULTS", "ecc")],
            [fail("ECC"), warn("memory repair")].into(),
            ("ECC", "volatile 12 corrected / 2 uncorrected"),
        ),
        (
            "link",
            vec![("STALLSCOPE_SIMGPU_PCIE", "4,8")],
            [fail("PCIe link"), warn("PCIe replays")].into(),
            ("PCIe link", "trained down to x8 of x16"),
        ),
        (
            "thermal",
            vec![("STALLSCOPE_SIMGPU_THROTTLE", "0:2")],
            [fail("clocks"), fail("temperature")].into(),
            ("clocks", "software thermal slowdown, hardware slowdown"),
        ),
        (
            "mig",
            vec![("STALLSCOPE_SIMGPU_FAULTS", "mig")],
            [warn("MIG")].into(),
            (
                "MIG",
                "you have 1 of 7 slices, 20.0 GiB of the GPU's 80.0 GiB",
            ),
        ),
        (
            "dead-holder",
            vec![("STALLSCOPE_SIMGPU_FAULTS", "dead-holder")],
            [warn("memory holders")].into(),
            ("memory holders", "pid 4194000 (NOT VISIBLE"),
        ),
        (
            "no-persistence",
            vec![("STALLSCOPE_SIMGPU_FAULTS", "no-persistence")],
            [warn("persistence mode")].into(),
            ("persistence mode", "off"),
        ),
    ];
    for (fault, env, flagged, (check, evidence)) in cases {
        let sim = Sim::new(&format!("doctor-{fault}"));
        let d = doctor(&sim, &module, &env, Instant::now(), &[]);
        assert_eq!(d.flagged(), flagged, "{fault}: {:#?}", d.checks);
        let want_code = if flagged.iter().any(|(_, s)| s == "fail") {
            2
        } else {
            1
        };
        assert_eq!(d.code, want_code, "{fault}");
        assert!(
            d.evidence(check).contains(evidence),
            "{fault}: {check} says {:?}",
            d.evidence(check)
        );
        assert!(
            d.check(check)["fix"]
                .as_str()
                .is_some_and(|f| !f.is_empty()),
            "{fault}: no fix"
        );
    }
}

/// A Python process that loaded PyTorch's real libcudart (from its pip wheel), as a job does
/// before its first CUDA call.
const LOADS_CUDART: &str = r#"
import ctypes, glob, os, sys, time, nvidia
roots = list(nvidia.__path__)
libs = sorted(p for r in roots for p in glob.glob(os.path.join(r, "**", "libcudart.so*"), recursive=True))
if not libs:
    sys.exit("no libcudart under " + str(roots))
ctypes.CDLL(libs[0])
print("ready", libs[0], flush=True)
time.sleep(120)
"#;

#[test]
fn a_driver_too_old_for_the_targets_cudart_fails_before_it_runs() {
    let _serial = serial();
    let dir = Scratch::new("doctor-old-driver");
    let job = Spawned::start(Command::new(torch_python()).args(["-c", LOADS_CUDART]));
    let ready = job
        .wait_stdout(Duration::from_secs(60), |l| l.starts_with("ready "))
        .unwrap_or_else(|| {
            panic!(
                "the cudart loader never became ready:\n{}",
                job.stderr_so_far()
            )
        });
    let lib = ready.trim_start_matches("ready ").trim().to_owned();
    let pid = job.pid.to_string();

    // The driver this simulation normally is (CUDA 13.0) runs PyTorch's CUDA 13 runtime.
    let sim = Sim::new("doctor-new-driver");
    let d = doctor(
        &sim,
        &module_file(&dir, "580.65.06"),
        &[],
        Instant::now(),
        &["--pid", &pid],
    );
    // The wheel's runtime may be a newer minor than the simulated driver's 13.0: that runs by
    // minor-version compatibility, a warning, not a failure.
    let c = d.check("CUDA runtime vs driver");
    let e = d.evidence("CUDA runtime vs driver");
    assert!(
        c["status"] == "pass"
            || (c["status"] == "warn" && e.contains("minor-version compatibility")),
        "{c:#}"
    );
    assert!(e.contains(&lib), "{c:#}");

    let sim = Sim::new("doctor-old-driver");
    let d = doctor(
        &sim,
        &module_file(&dir, "535.104.05"),
        &[("STALLSCOPE_SIMGPU_FAULTS", "old-driver")],
        Instant::now(),
        &["--pid", &pid],
    );
    let fail = |n: &str| (n.to_owned(), "fail".to_owned());
    assert_eq!(
        d.flagged(),
        [fail("CUDA runtime vs driver")].into(),
        "{:#?}",
        d.checks
    );
    assert_eq!(d.code, 2);
    let e = d.evidence("CUDA runtime vs driver");
    assert!(
        e.contains("runtime 13.") && e.contains("up to CUDA 12.2") && e.contains("insufficient"),
        "{e}"
    );
    drop(job);
}

#[test]
fn kernel_log_lines_are_read_from_dev_kmsg_and_named() {
    let _serial = serial();
    let since = Instant::now();
    let sim = Sim::new("doctor-kmsg");
    let dir = Scratch::new("doctor-kmsg");
    let module = module_file(&dir, "580.65.06");
    let lines = [
        "<3>NVRM: Xid (PCI:0000:e7:00): 48, pid=4242, name=python, DBE (double bit error) detected",
        "<4>NVRM: Xid (PCI:0000:e7:00): 13, pid=4242, name=python, Graphics Exception: ESR 0x50",
        "<3>NVRM: GPU at PCI:0000:e8:00: GPU has fallen off the bus.",
        "<3>pcieport 0000:00:e7.0: AER: Uncorrected (Fatal) error received: 0000:e7:00.0",
    ];
    let mut kmsg = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        .expect("root can write /dev/kmsg");
    for l in lines {
        // One write per record, ended by a newline: without it the kernel holds the line back
        // as the start of a continued one.
        kmsg.write_all(format!("{l}\n").as_bytes())
            .expect("writes a kernel log line");
    }
    let d = doctor(&sim, &module, &[], since, &[]);
    let flagged = d.flagged();
    let kernel: BTreeSet<_> = flagged
        .iter()
        .filter(|(n, _)| n.starts_with("kernel log"))
        .cloned()
        .collect();
    let fail = |n: &str| (n.to_owned(), "fail".to_owned());
    let warn = |n: &str| (n.to_owned(), "warn".to_owned());
    assert_eq!(
        kernel,
        [
            fail("kernel log: Xid"),
            warn("kernel log: Xid"),
            fail("kernel log: GPU fallen off the bus"),
            fail("kernel log: PCIe bus errors"),
        ]
        .into(),
        "{:#?}",
        d.checks
    );
    assert_eq!(d.code, 2);
    let xids: Vec<_> = d
        .checks
        .iter()
        .filter(|c| c["name"] == "kernel log: Xid")
        .map(|c| c["evidence"].as_str().unwrap())
        .collect();
    assert!(
        xids.iter()
            .any(|e| e.contains("Xid 48 on PCI:0000:e7:00: double-bit ECC error")),
        "{xids:?}"
    );
    assert!(xids.iter().any(|e| e.contains("Xid 13")), "{xids:?}");
    assert!(
        d.evidence("kernel log: GPU fallen off the bus")
            .contains("PCI:0000:e8:00"),
        "{:#?}",
        d.checks
    );
}

#[test]
fn a_missing_pid_is_an_error_that_names_it() {
    let out = command()
        .args(["doctor", "--pid", "4194301"])
        .output()
        .expect("runs stallscope doctor");
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no process 4194301"), "{err}");
}
