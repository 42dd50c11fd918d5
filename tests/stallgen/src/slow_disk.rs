//! The disk of the `disk` scenario, as slow as a real data set's: the job's reads are limited
//! to `--disk-iops` per second by the kernel's block-IO throttling, in a cgroup of the job's
//! own. A VM's disk that its host caches answers a cold 128 KiB read in 0.2 ms, about the CPU
//! the read costs the worker (open, evict, copy), and the scenario's cause then depended on
//! the host's cache: a data set on a busy disk or a network filesystem answers in
//! milliseconds, and the worker waits on it, which is what the scenario is about.
//!
//! cgroup v1's `blkio.throttle.read_iops_device` where the blkio hierarchy is mounted, else
//! cgroup v2's `io.max`. Needs root, as the tests have.
use std::{
    fs,
    io::{self, Write as _},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

const V1: &str = "/sys/fs/cgroup/blkio";
const V2: &str = "/sys/fs/cgroup";

/// The cgroup this process was moved into; leaving it moves the process back to the root and
/// removes the cgroup (its children, the workers, have exited by then).
pub struct SlowDisk {
    dir: PathBuf,
    root: PathBuf,
}

/// The whole disk (`major:minor`) holding `path`: throttling applies to the disk a request
/// is sent to, not to a partition of it.
fn disk_of(path: &Path) -> io::Result<String> {
    let dev = fs::metadata(path)?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    if major == 0 {
        return Err(io::Error::other(format!(
            "{} is on no block device (tmpfs, overlay?): its reads cannot be throttled",
            path.display()
        )));
    }
    let node = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if node.join("partition").exists() {
        return fs::read_to_string(node.join("../dev")).map(|d| d.trim().to_owned());
    }
    Ok(format!("{major}:{minor}"))
}

fn write(path: &Path, text: &str) -> io::Result<()> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("writing {text:?} to {}: {e}", path.display()),
            )
        })
}

impl SlowDisk {
    /// Limits this process and those it starts from now on to `iops` reads per second from
    /// the disk holding `data_dir`.
    pub fn apply(data_dir: &Path, iops: u32) -> io::Result<Self> {
        let disk = disk_of(data_dir)?;
        let name = format!("stallgen-{}", std::process::id());
        let (root, limit_file, limit) = if Path::new(V1)
            .join("blkio.throttle.read_iops_device")
            .exists()
        {
            (
                PathBuf::from(V1),
                "blkio.throttle.read_iops_device",
                format!("{disk} {iops}"),
            )
        } else if fs::read_to_string(Path::new(V2).join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|x| x == "io"))
        {
            // The io controller must be on for the root's children.
            write(&Path::new(V2).join("cgroup.subtree_control"), "+io")?;
            (PathBuf::from(V2), "io.max", format!("{disk} riops={iops}"))
        } else {
            return Err(io::Error::other(
                "neither cgroup v1's blkio hierarchy nor cgroup v2's io controller is here: \
                 the disk scenario cannot slow its reads (--disk-iops 0 reads at the disk's \
                 own speed)",
            ));
        };
        remove_left_over(&root);
        let dir = root.join(name);
        fs::create_dir_all(&dir)
            .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", dir.display())))?;
        let me = Self { dir, root };
        write(&me.dir.join(limit_file), &limit)?;
        write(
            &me.dir.join("cgroup.procs"),
            &std::process::id().to_string(),
        )?;
        Ok(me)
    }
}

/// The cgroups of earlier jobs that were killed before they could remove theirs: empty once
/// their processes are gone.
fn remove_left_over(root: &Path) {
    for entry in fs::read_dir(root).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("stallgen-") else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir(entry.path());
        }
    }
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        let _ = write(
            &self.root.join("cgroup.procs"),
            &std::process::id().to_string(),
        );
        // A worker still exiting keeps the cgroup a moment.
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_of_a_file_on_tmpfs_is_refused_by_name() {
        let e = disk_of(Path::new("/dev/shm")).unwrap_err();
        assert!(e.to_string().contains("/dev/shm"), "{e}");
    }
}
