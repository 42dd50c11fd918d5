//! `cargo xtask dist`: what a user installs without building it, in `dist/`, for x86_64 and
//! aarch64 (Grace hosts): a manylinux2014 wheel each (`pip install stallscope`, the binary
//! alone, as py-spy ships), a tarball each with the binary, README, licences, shell
//! completions and man pages, and their SHA-256 sums. The binaries are linked by zig against
//! glibc 2.17, so they start on RHEL 7 and every later distribution; each carries the eBPF
//! object built for its own architecture (aya-build passes the target's `bpf_target_arch`).
//!
//! aarch64 is cross-built on this x86_64 machine: no target's standard library can be
//! downloaded here, so the nightly builds it from rust-src (`-Zbuild-std`). What runs the
//! binary (its version, completions and man pages for the tarball) is qemu-aarch64-static.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use stallscope_tests::glibc;

use crate::{root, run, setup};

/// The newest glibc the binary may need: manylinux2014's.
pub const MAX_GLIBC: (u32, u32, u32) = (2, 17, 0);

/// An architecture a release is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    #[value(name = "x86_64")]
    X86_64,
    Aarch64,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    pub fn triple(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-unknown-linux-gnu",
            Arch::Aarch64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// A command that runs this architecture's binaries here, prefixed to the binary.
    pub fn runner(self) -> &'static [&'static str] {
        match self {
            Arch::X86_64 => &[],
            // The aarch64 dynamic linker and glibc are Debian's libc6-arm64-cross.
            Arch::Aarch64 => &["qemu-aarch64-static", "-L", "/usr/aarch64-linux-gnu"],
        }
    }

    /// The release binary of the dist build.
    pub fn binary(self) -> PathBuf {
        root()
            .join("target")
            .join(self.triple())
            .join("release/stallscope")
    }

    fn command(self, bin: &Path) -> Command {
        match self.runner() {
            [] => Command::new(bin),
            [runner, args @ ..] => {
                let mut cmd = Command::new(runner);
                cmd.args(args).arg(bin);
                cmd
            }
        }
    }
}

pub fn dir() -> PathBuf {
    root().join("dist")
}

pub fn dist(arches: &[Arch]) -> anyhow::Result<()> {
    // bpf-linker and the nightly's rust-src build the eBPF object, as for any build.
    setup::setup()?;
    setup::ensure_debian(&[("objdump", "binutils")])?;
    if arches.contains(&Arch::Aarch64) {
        setup::ensure_cross_aarch64()?;
    }
    let tools = setup::ensure_dist_tools()?;
    let out = dir();
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    let mut made = Vec::new();
    for &arch in arches {
        made.extend(build(arch, &tools, &out)?);
    }
    let names: Vec<_> = made
        .iter()
        .map(|p| p.file_name().unwrap().to_owned())
        .collect();
    let sums = Command::new("sha256sum")
        .current_dir(&out)
        .args(names)
        .output()
        .context("running sha256sum")?;
    if !sums.status.success() {
        bail!("sha256sum: {}", String::from_utf8_lossy(&sums.stderr));
    }
    std::fs::write(out.join("SHA256SUMS"), &sums.stdout)?;
    eprintln!("xtask: dist/ holds:");
    made.push(out.join("SHA256SUMS"));
    for p in &made {
        let len = std::fs::metadata(p)?.len();
        eprintln!(
            "  {} ({:.1} MiB)",
            p.file_name().unwrap().to_string_lossy(),
            len as f64 / (1 << 20) as f64
        );
    }
    eprintln!("xtask: install with `pip install dist/stallscope-*-ARCH.whl` or unpack a tarball");
    Ok(())
}

/// The wheel and the tarball for `arch`.
fn build(arch: Arch, tools: &Path, out: &Path) -> anyhow::Result<[PathBuf; 2]> {
    let started = std::time::Instant::now();
    let path = std::env::join_paths(std::iter::once(tools.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))?;
    let mut maturin = Command::new(tools.join("maturin"));
    maturin
        .current_dir(root())
        .args(["build", "--release", "--strip", "--zig"])
        .args([
            "--compatibility",
            "manylinux2014",
            "--target",
            arch.triple(),
        ])
        .args(["--manifest-path", "profiler/Cargo.toml", "--out"])
        .arg(out)
        .env("PATH", path);
    if arch == Arch::Aarch64 {
        // No aarch64 standard library can be downloaded here: the nightly builds it (through
        // rustup's cargo on PATH: `cargo xtask` points CARGO at the stable one).
        maturin
            .arg("-Zbuild-std=std,panic_abort")
            .env("RUSTUP_TOOLCHAIN", "nightly")
            .env_remove("CARGO");
    }
    run(&mut maturin)?;
    let bin = arch.binary();
    check_machine(&bin, arch)?;
    check_glibc(&bin)?;
    let version = version_of(arch, &bin)?;
    let tarball = tarball(arch, &bin, &version, out)?;
    let wheel = std::fs::read_dir(out)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.extension().is_some_and(|x| x == "whl")
                && p.to_string_lossy()
                    .ends_with(&format!("_{}.whl", arch.name()))
        })
        .with_context(|| format!("maturin left no {} wheel in {}", arch.name(), out.display()))?;
    eprintln!(
        "xtask: the {} release took {:.0} s",
        arch.name(),
        started.elapsed().as_secs_f64()
    );
    Ok([wheel, tarball])
}

/// Fails unless `bin` is an ELF executable for `arch` (e_machine, from its header).
fn check_machine(bin: &Path, arch: Arch) -> anyhow::Result<()> {
    let mut head = [0u8; 20];
    std::io::Read::read_exact(
        &mut std::fs::File::open(bin).with_context(|| format!("opening {}", bin.display()))?,
        &mut head,
    )
    .with_context(|| format!("reading {}", bin.display()))?;
    let machine = head
        .get(18..20)
        .filter(|_| head.starts_with(b"\x7fELF"))
        .map(|m| u16::from_le_bytes([m[0], m[1]]))
        .with_context(|| format!("{} is not an ELF file", bin.display()))?;
    let want = match arch {
        Arch::X86_64 => 62,
        Arch::Aarch64 => 183,
    };
    if machine != want {
        bail!(
            "{} is for ELF machine {machine}, not {} ({want})",
            bin.display(),
            arch.name()
        );
    }
    Ok(())
}

/// Fails naming each symbol that needs a glibc newer than [`MAX_GLIBC`].
fn check_glibc(bin: &Path) -> anyhow::Result<()> {
    let dump = Command::new("objdump")
        .arg("-T")
        .arg(bin)
        .output()
        .context("running objdump -T")?;
    if !dump.status.success() {
        bail!(
            "objdump -T {}: {}",
            bin.display(),
            String::from_utf8_lossy(&dump.stderr)
        );
    }
    let dump = String::from_utf8_lossy(&dump.stdout);
    let newer = glibc::newer_than(&dump, MAX_GLIBC);
    if !newer.is_empty() {
        bail!(
            "{} needs a glibc newer than 2.17: {}",
            bin.display(),
            newer.join(", ")
        );
    }
    let (a, b, _) = glibc::newest_needed(&dump).context("no GLIBC versions in objdump -T")?;
    eprintln!("xtask: {} needs glibc {a}.{b} at most", bin.display());
    Ok(())
}

/// The version `stallscope --version` prints.
fn version_of(arch: Arch, bin: &Path) -> anyhow::Result<String> {
    let out = arch
        .command(bin)
        .arg("--version")
        .output()
        .with_context(|| format!("running {} --version", bin.display()))?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .map(str::to_owned)
        .with_context(|| format!("{} --version printed no version", bin.display()))
}

/// `stallscope-VERSION-ARCH-linux.tar.gz`: the binary, README, licences, completions for
/// bash, zsh and fish, and the man pages, under one folder of that name.
fn tarball(arch: Arch, bin: &Path, version: &str, out: &Path) -> anyhow::Result<PathBuf> {
    let name = format!("stallscope-{version}-{}-linux", arch.name());
    let staging = root().join("target/dist-staging");
    let _ = std::fs::remove_dir_all(&staging);
    let top = staging.join(&name);
    std::fs::create_dir_all(top.join("completions"))?;
    std::fs::copy(bin, top.join("stallscope"))?;
    for doc in ["README.md", "LICENSE-MIT", "LICENSE-APACHE"] {
        std::fs::copy(root().join(doc), top.join(doc)).with_context(|| format!("copying {doc}"))?;
    }
    for (shell, file) in [
        ("bash", "stallscope.bash"),
        ("zsh", "_stallscope"),
        ("fish", "stallscope.fish"),
    ] {
        let script = arch.command(bin).args(["completions", shell]).output()?;
        if !script.status.success() || script.stdout.is_empty() {
            bail!("{} completions {shell} failed", bin.display());
        }
        std::fs::write(top.join("completions").join(file), script.stdout)?;
    }
    run(arch
        .command(bin)
        .arg("manpages")
        .arg(top.join("man/man1"))
        .stderr(std::process::Stdio::null()))?;
    let tarball = out.join(format!("{name}.tar.gz"));
    // Owned by root with fixed times, so the same tree makes the same tarball.
    run(Command::new("tar")
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mtime=@0",
            "-czf",
        ])
        .arg(&tarball)
        .arg("-C")
        .arg(&staging)
        .arg(&name))?;
    Ok(tarball)
}
