//! The aarch64 unit tests, run under qemu-aarch64-static: the crates with no kernel or GPU
//! dependency whole (the recording format, the timeline, attribution, reports and goldens,
//! the prescription), and the recorder's DWARF unwinder, which walks this very test's aarch64
//! stack. The nightly builds aarch64's standard library from rust-src (no target can be
//! downloaded here); Debian's cross gcc links, qemu runs each test binary.
use std::process::Command;

use crate::{root, run, setup};

const TRIPLE: &str = "aarch64-unknown-linux-gnu";

/// Crates whose every test runs under qemu.
pub const WHOLE: [&str; 3] = ["profiler-common", "profiler-core", "simgpu-state"];

/// Tests of the recorder crate that need no kernel: the unwinder over a copy of the test's
/// own stack, judged by addresses (qemu-user's /proc does not give this process's symbols
/// back, so the tests that name frames run natively only), the stack copy's bounds, the
/// pthread TID search, the dynamic linkers' names.
pub const RECORDER_FILTERS: [&str; 6] = [
    "capture::stacks::dwarf::tests::unwinds_this_thread_through_its_callers_by_address",
    "capture::stacks::dwarf::tests::a_short_copy_truncates_and_no_registers_fail",
    "capture::stacks::dwarf::tests::a_process_that_is_gone_is_named_once",
    "capture::stacks::symbolize::tests::stack_lengths_are_clamped",
    "capture::python::interpreter::",
    "capture::probes::dlopen::tests::loaders_are_known_by_name",
];

fn cargo() -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo"])
        .current_dir(root())
        .env(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
            "aarch64-linux-gnu-gcc",
        )
        .env(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER",
            "qemu-aarch64-static -L /usr/aarch64-linux-gnu",
        )
        // cc-built C code (ring's, for one) is compiled by the same cross gcc.
        .env("CC_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-gcc")
        .env("AR_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-ar")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR");
    cmd.args(["test", "--release", "--target", TRIPLE])
        .arg("-Zbuild-std=std,panic_abort");
    cmd
}

pub fn unit_tests() -> anyhow::Result<()> {
    setup::ensure_cross_aarch64()?;
    let started = std::time::Instant::now();
    let mut whole = cargo();
    for krate in WHOLE {
        whole.args(["-p", krate]);
    }
    let whole = run(&mut whole);
    let mut recorder = cargo();
    recorder
        .args(["-p", "profiler", "--bins", "--"])
        .args(RECORDER_FILTERS);
    let recorder = run(&mut recorder);
    eprintln!(
        "xtask: the aarch64 unit tests took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    whole.and(recorder)
}
