//! `cargo xtask test`'s run of `cargo test`: every test binary runs even when one fails, the
//! failures are listed together at the end, and so are the reruns the timing tests allowed
//! themselves (see `stallscope_tests::reruns`).
use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
};

use anyhow::{Context as _, bail};

/// Where the tests note their reruns; read back and removed by [`run`].
const RERUNS_ENV: &str = "STALLSCOPE_TEST_RERUNS";

/// How much faster than the presets the simulated host is: stallgen's CPU work and cold reads,
/// and the simulated GPU's memcpy rate for pageable copies (default 2 GB/s), all scale by it.
pub fn set_sim_speed(cmd: &mut Command, speed: f64) {
    if speed == 1.0 {
        return;
    }
    eprintln!(
        "xtask: simulated host {speed}x the presets' speed: CPU work and cold reads take 1/{speed} \
         of their time, pageable copies stage at {} GB/s",
        2.0 * speed
    );
    cmd.env("STALLGEN_CPU_SPEED", speed.to_string())
        .env("STALLGEN_DISK_SPEED", speed.to_string())
        .env("STALLSCOPE_SIMGPU_HOST_GBPS", (2.0 * speed).to_string());
}

/// Runs `cmd` (a `cargo test --no-fail-fast`), echoing its output, then lists what failed and
/// what needed a rerun. Fails if any test failed.
pub fn run(cmd: &mut Command, reruns: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(reruns);
    cmd.env(RERUNS_ENV, reruns)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("running {cmd:?}"))?;
    let failed_tests = Arc::new(Mutex::new(Vec::<String>::new()));
    let failed_targets = Arc::new(Mutex::new(Vec::<String>::new()));
    let stdout = child.stdout.take().context("cargo test's stdout")?;
    let stderr = child.stderr.take().context("cargo test's stderr")?;
    let tests = Arc::clone(&failed_tests);
    let out = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("{line}");
            if let Some(name) = line
                .strip_prefix("test ")
                .and_then(|l| l.strip_suffix(" ... FAILED"))
            {
                tests
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(name.into());
            }
        }
    });
    let targets = Arc::clone(&failed_targets);
    let err = std::thread::spawn(move || {
        let mut listing = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            // cargo ends a --no-fail-fast run with `error: N targets failed:` and one indented
            // `-p PKG --test NAME` line per target.
            if line.starts_with("error:") && line.contains("target") && line.ends_with("failed:") {
                listing = true;
            } else if listing && line.starts_with(' ') {
                targets
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(line.trim().into());
            } else {
                listing = false;
            }
        }
    });
    let status = child.wait()?;
    let _ = out.join();
    let _ = err.join();
    let reran = std::fs::read_to_string(reruns).unwrap_or_default();
    let _ = std::fs::remove_file(reruns);
    eprintln!();
    if reran.trim().is_empty() {
        eprintln!("xtask: no test needed its allowed rerun");
    } else {
        eprintln!(
            "xtask: {} test run(s) failed once and were run again (each must pass on its own):",
            reran.lines().count()
        );
        for line in reran.lines() {
            eprintln!("  {line}");
        }
    }
    let tests = failed_tests.lock().unwrap_or_else(|e| e.into_inner());
    let targets = failed_targets.lock().unwrap_or_else(|e| e.into_inner());
    if status.success() && tests.is_empty() {
        eprintln!("xtask: every test passed");
        return Ok(());
    }
    eprintln!("xtask: {} test(s) failed:", tests.len());
    for t in tests.iter() {
        eprintln!("  {t}");
    }
    if !targets.is_empty() {
        eprintln!("xtask: in {} test binaries:", targets.len());
        for t in targets.iter() {
            eprintln!("  {t}");
        }
    }
    bail!("cargo test failed ({status})")
}
