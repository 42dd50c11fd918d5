//! Laying the built simulated libraries out under the names the real driver installs.
//!
//! Copies, not symlinks, because a profiler finds the libraries by name in /proc/PID/maps, and
//! maps shows the target of a symlink: the files must themselves be called `libcuda.so.1`,
//! `libnvidia-ml.so.1` and `libnccl.so.2`.
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// (cdylib cargo builds, name the real driver installs, development symlink pointing at it).
const LIBRARIES: [(&str, &str, &str); 3] = [
    ("libcuda.so", "libcuda.so.1", "libcuda.so"),
    ("libnvidia_ml.so", "libnvidia-ml.so.1", "libnvidia-ml.so"),
    ("libnccl.so", "libnccl.so.2", "libnccl.so"),
];

/// How to build what `install_dir` copies.
pub const BUILD_HINT: &str = "cargo build --release -p simgpu-cuda -p simgpu-nvml -p simgpu-nccl";

/// `target/release` of this workspace: `$CARGO_TARGET_DIR/release` when set at run time,
/// else the `target/release` next to the workspace manifest.
pub fn target_release_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("release");
    }
    // This crate lives in <workspace>/tests/simgpu/state.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../target/release")
}

/// Copies `libcuda.so`, `libnvidia_ml.so` and `libnccl.so` from `target_release` to
/// `out/libcuda.so.1`, `out/libnvidia-ml.so.1` and `out/libnccl.so.2`, plus `libcuda.so`,
/// `libnvidia-ml.so` and `libnccl.so` symlinks to them (as a driver and NCCL install have, for
/// code that dlopens the unversioned name). Creates `out` if needed.
///
/// Each copy is written to a temporary name and renamed into place, so a process that already
/// mapped an older copy keeps a consistent file.
pub fn install_dir(target_release: &Path, out: &Path) -> io::Result<()> {
    fs::create_dir_all(out)?;
    for (built, installed, dev_link) in LIBRARIES {
        let from = target_release.join(built);
        if !from.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} is missing: build it first with `{BUILD_HINT}`",
                    from.display()
                ),
            ));
        }
        let partial = out.join(format!(".{installed}.partial"));
        fs::copy(&from, &partial)?;
        fs::rename(&partial, out.join(installed))?;
        let link = out.join(dev_link);
        match fs::remove_file(&link) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        symlink(installed, &link)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_copies_under_driver_names() {
        let root = std::env::temp_dir().join(format!("simgpu-install-{}", std::process::id()));
        let built = root.join("release");
        let out = root.join("lib");
        fs::create_dir_all(&built).unwrap();
        fs::write(built.join("libcuda.so"), b"cuda").unwrap();
        let missing = install_dir(&built, &out).unwrap_err();
        assert!(missing.to_string().contains("libnvidia_ml.so is missing"));
        fs::write(built.join("libnvidia_ml.so"), b"nvml").unwrap();
        let missing = install_dir(&built, &out).unwrap_err();
        assert!(missing.to_string().contains("libnccl.so is missing"));
        assert!(missing.to_string().contains("-p simgpu-nccl"));
        fs::write(built.join("libnccl.so"), b"nccl").unwrap();
        install_dir(&built, &out).unwrap();
        // Twice, as a test suite re-running in the same directory does.
        install_dir(&built, &out).unwrap();
        let cuda = out.join("libcuda.so.1");
        assert!(!fs::symlink_metadata(&cuda).unwrap().is_symlink());
        assert_eq!(fs::read(&cuda).unwrap(), b"cuda");
        assert_eq!(fs::read(out.join("libnvidia-ml.so.1")).unwrap(), b"nvml");
        assert_eq!(fs::read(out.join("libnvidia-ml.so")).unwrap(), b"nvml");
        assert_eq!(fs::read(out.join("libnccl.so.2")).unwrap(), b"nccl");
        fs::remove_dir_all(&root).unwrap();
    }
}
