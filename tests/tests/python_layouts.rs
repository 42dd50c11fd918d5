//! The CPython layout table is LP64's, not only x86_64's: `layouts.c`, compiled against each
//! installed CPython's own headers once for x86_64 and once for aarch64 (Debian's cross gcc,
//! the program run under qemu-aarch64-static; both installed by `cargo xtask dist` and
//! `cargo xtask test`), prints the same entry on both, and that entry is the one `LAYOUTS`
//! holds for the version.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// pyenv's CPython 3.8 to 3.13 include directories, those installed; 3.11 must be.
fn include_dirs() -> Vec<(String, PathBuf)> {
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root/.pyenv"));
    let mut found = Vec::new();
    for entry in std::fs::read_dir(pyenv.join("versions"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let version = entry.file_name().to_string_lossy().into_owned();
        let minor: Option<u32> = version
            .strip_prefix("3.")
            .and_then(|r| r.split('.').next()?.parse().ok());
        let Some(minor) = minor.filter(|m| (8..=13).contains(m)) else {
            continue;
        };
        let inc = entry.path().join(format!("include/python3.{minor}"));
        if inc.join("Python.h").is_file() {
            found.push((version, inc));
        }
    }
    found.sort();
    assert!(
        found.iter().any(|(v, _)| v.starts_with("3.11.")),
        "pyenv's CPython 3.11 headers are not under {}",
        pyenv.display()
    );
    found
}

/// What layouts.c prints for the headers in `inc`, built by `cc` and run by `runner`.
fn layout(cc: &str, runner: &[&str], inc: &Path, out: &Path) -> String {
    let src = root().join("profiler/src/capture/python/layouts.c");
    let built = Command::new(cc)
        .args(["-O0", "-Wall", "-static", "-DPy_BUILD_CORE"])
        .arg(format!("-I{}", inc.display()))
        .arg(format!("-I{}", inc.join("internal").display()))
        .arg("-o")
        .arg(out)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("running {cc} (cargo xtask setup installs it): {e}"));
    assert!(
        built.status.success(),
        "{cc} {}: {}",
        src.display(),
        String::from_utf8_lossy(&built.stderr)
    );
    let (prog, args) = match runner {
        [prog, args @ ..] => (*prog, args),
        [] => (out.to_str().unwrap(), &[][..]),
    };
    let mut cmd = Command::new(prog);
    cmd.args(args);
    if !runner.is_empty() {
        cmd.arg(out);
    }
    let run = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {prog}: {e}"));
    assert!(
        run.status.success(),
        "{}: {}",
        out.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8(run.stdout).unwrap()
}

#[test]
fn the_table_holds_for_x86_64_and_aarch64() {
    let table = std::fs::read_to_string(root().join("profiler/src/capture/python/layout.rs"))
        .expect("layout.rs");
    let dir = std::env::temp_dir().join(format!("stallscope-layouts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let versions = include_dirs();
    for (version, inc) in &versions {
        let x86 = layout("gcc", &[], inc, &dir.join(format!("x86_64-{version}")));
        let arm = layout(
            "aarch64-linux-gnu-gcc",
            &["qemu-aarch64-static"],
            inc,
            &dir.join(format!("aarch64-{version}")),
        );
        assert_eq!(x86, arm, "CPython {version}: x86_64 and aarch64 differ");
        assert!(
            x86.contains(&format!("CPython {version},")) && x86.contains("Layout {"),
            "{x86}"
        );
        // The entry, less its first line (which names the patch release it came from).
        let entry = x86.split_once('\n').map(|(_, rest)| rest).unwrap();
        assert!(
            table.contains(entry),
            "CPython {version}: LAYOUTS has no entry\n{entry}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "layouts.c: the same table on x86_64 and aarch64 for {:?}",
        versions.iter().map(|(v, _)| v).collect::<Vec<_>>()
    );
}
